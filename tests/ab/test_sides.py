"""BASE and NEW of `llmbench ab` from their items, a server that does not answer, and the rounds'
order and commands."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from llmbench.ab.rounds import SideProcess, command, round_order
from llmbench.ab.sides import Side, check_reachable, parse_side
from llmbench.errors import UserError
from llmbench.harness.spec import BackendSpec, RunSpec


def test_items_become_overrides_a_url_and_a_ref():
    side = parse_side("NEW", ["http://127.0.0.1:8002/v1", "git:HEAD~1", "engine.quantize=int8"])
    assert side == Side(
        "NEW",
        ("backend.kind=openai", "backend.url=http://127.0.0.1:8002/v1", "engine.quantize=int8"),
        "HEAD~1",
        ("http://127.0.0.1:8002/v1", "git:HEAD~1", "engine.quantize=int8"),
    )
    assert side.items == "http://127.0.0.1:8002/v1 git:HEAD~1 engine.quantize=int8"
    assert side.given_overrides == "http://127.0.0.1:8002/v1 engine.quantize=int8"
    assert parse_side("BASE", []).items == "the spec as it is"


@pytest.mark.parametrize(
    "items, fragment",
    [
        (["quantize"], "--base 'quantize': expected KEY.PATH=VALUE"),
        (["=int8"], "--base '=int8': expected"),
        (["git:"], "--base git:: name a ref after git:"),
        (["git:a", "git:b"], "--base git:b: BASE already runs git:a; give one ref"),
    ],
)
def test_a_bad_item_is_one_line_naming_it(items, fragment):
    with pytest.raises(UserError) as e:
        parse_side("BASE", items)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def _spec(url: str) -> RunSpec:
    return RunSpec(backend=BackendSpec(kind="openai", url=url))


def test_a_server_that_refuses_connections_is_one_line():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    side = parse_side("NEW", [f"http://127.0.0.1:{port}/v1"])
    with pytest.raises(UserError) as e:
        check_reachable(side, _spec(f"http://127.0.0.1:{port}/v1"))
    message = str(e.value)
    assert message.startswith(f"NEW (http://127.0.0.1:{port}/v1): http://127.0.0.1:{port}/v1: ")
    assert "Connection refused" in message and "start the server there or fix the URL" in message


def test_a_listening_server_and_the_engine_pass():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        check_reachable(parse_side("BASE", [url]), _spec(url))
    check_reachable(parse_side("BASE", []), RunSpec())  # the engine: nothing to reach


def test_the_order_alternates_base_first_in_odd_rounds():
    assert [round_order(k) for k in (1, 2, 3, 4)] == [
        ("BASE", "NEW"),
        ("NEW", "BASE"),
        ("BASE", "NEW"),
        ("NEW", "BASE"),
    ]


def test_a_round_is_llmbench_run_with_the_sides_overrides():
    side = SideProcess("NEW", "dtype=bfloat16", Path("/b/python"), ("repeat=1", "dtype=bfloat16"))
    assert command(side, Path("/w/chat.yaml"), Path("/o/round-02/new")) == [
        "/b/python",
        "-m",
        "llmbench",
        "run",
        "/w/chat.yaml",
        "--out",
        "/o/round-02/new",
        "--set",
        "repeat=1",
        "--set",
        "dtype=bfloat16",
    ]
    assert side.folder_name == "new"
