"""Hostile connections against a real server on 127.0.0.1 (raw sockets): a request head or body
that never finishes is cut off after its timeout, a connection over `--max-connections` is
refused at once with a 503, and the server answers the connections it has meanwhile.

The timeouts here are short (0.5 s) so the tests are quick; every upper bound is generous
(a busy machine delays a close, it never makes one happen early)."""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import time

import aiohttp
import pytest

from llmbench.errors import UserError
from llmbench.serve import ServeConfig, connections
from llmbench.serve.connections import ConnectionCap
from tests.serve.helpers import serving, tiny_engine

NAME = "tiny"
TIMEOUT_S = 0.5  # --header-timeout and --body-timeout in these tests
HELD_S = 20.0  # a connection still open after this long is held, not cut off
HALF_A_REQUEST_LINE = b"POST /v1/chat/completions HTT"


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def stalled(port: int, sent: bytes = HALF_A_REQUEST_LINE) -> socket.socket:
    """A connection that sends `sent` and then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=HELD_S)
    sock.sendall(sent)
    return sock


def until_closed(sock: socket.socket, limit_s: float = HELD_S) -> tuple[bytes, float | None]:
    """What the server sends until it closes the connection, and after how long (None: still
    open after `limit_s`)."""
    sock.settimeout(limit_s)
    started = time.monotonic()
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return received, None
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return received, time.monotonic() - started


def status_and_error(reply: bytes) -> tuple[int, dict]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def health(url: str) -> int:
    async def go():
        timeout = aiohttp.ClientTimeout(total=HELD_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url + "/health") as response:
                return response.status

    return asyncio.run(go())


def test_connections_that_stall_in_their_request_head_are_closed_after_the_timeout(engine):
    config = ServeConfig(NAME, header_timeout_s=TIMEOUT_S)
    with serving(engine, config) as url:
        socks = [stalled(port_of(url)) for _ in range(3)]
        socks.append(socket.create_connection(("127.0.0.1", port_of(url))))  # sends nothing
        for sock in socks:
            received, closed_after_s = until_closed(sock)
            assert closed_after_s is not None, "a stalled connection was held open"
            assert received == b""  # closed unanswered: nothing was read, no key was checked
        assert health(url) == 200


def test_a_body_that_stalls_gets_a_408_and_the_connection_is_closed(engine):
    config = ServeConfig(NAME, body_timeout_s=TIMEOUT_S)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    with serving(engine, config) as url:
        started = time.monotonic()
        received, closed_after_s = until_closed(stalled(port_of(url), head + b'{"prompt": '))
        assert closed_after_s is not None, "a stalled body was waited for"
        assert time.monotonic() - started >= TIMEOUT_S * 0.9  # not before its time
        status, error = status_and_error(received)
        assert status == 408
        assert error["message"] == "the request body did not arrive within 0.5 s (--body-timeout)"
        assert error["type"] == "invalid_request_error"
        assert health(url) == 200


def test_a_request_running_longer_than_the_header_timeout_is_not_cut(engine, monkeypatch):
    # The header timeout counts while a connection waits for a request head, not while its
    # request runs: each forward pass is slowed so that 30 tokens take >= 1.5 s (> 0.5 s).
    forward = engine.model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.05)
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", slow_forward)
    body = {"prompt": "hi", "max_tokens": 30, "ignore_eos": True, "temperature": 0}

    async def go(url: str):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            async with session.post(url + "/v1/completions", json=body) as response:
                return response.status, await response.json()

    with serving(engine, ServeConfig(NAME, header_timeout_s=TIMEOUT_S)) as url:
        started = time.monotonic()
        status, reply = asyncio.run(go(url))
        assert time.monotonic() - started >= 1.5
    assert status == 200 and reply["usage"]["completion_tokens"] == 30


def test_a_connection_over_the_cap_is_refused_at_once_and_the_others_are_served(engine):
    config = ServeConfig(NAME, max_connections=3)

    async def go(url: str) -> list:
        timeout = aiohttp.ClientTimeout(total=HELD_S)
        connector = aiohttp.TCPConnector(limit=1)  # one kept-alive connection, reused
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            async with session.get(url + "/health") as response:
                statuses = [response.status]  # connection 1 of 3, kept alive
            held = [stalled(port_of(url)) for _ in range(2)]  # connections 2 and 3
            started = time.monotonic()
            refused = await asyncio.to_thread(until_closed, stalled(port_of(url)))  # the 4th
            refused_after_s = time.monotonic() - started
            async with session.get(url + "/health") as response:  # on connection 1
                statuses.append(response.status)
            for sock in held:
                sock.close()
            return [statuses, refused, refused_after_s]

    with serving(engine, config) as url:
        statuses, (received, closed_after_s), refused_after_s = asyncio.run(go(url))
        assert closed_after_s is not None and refused_after_s < 10  # at once, not held
        status, error = status_and_error(received)
        assert status == 503 and error["type"] == "server_error"
        assert "3 connections open (--max-connections)" in error["message"]
        assert statuses == [200, 200]  # the server kept answering the connection it had
        # Once the stalled ones have gone, a new connection is served again.
        deadline = time.monotonic() + HELD_S
        while (answer := _health_or_refused(url)) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answer == 200


def _health_or_refused(url: str) -> int:
    try:
        return health(url)
    except aiohttp.ClientError:  # refused while the server has not yet seen a close
        return 0


def test_the_cap_counts_open_connections_and_refuses_past_it():
    made = []

    class Handler:  # stands in for aiohttp's handler
        def connection_lost(self, exc):
            made.remove(self)

    def factory():
        made.append(Handler())
        return made[-1]

    cap = ConnectionCap(factory, max_connections=2)
    first, second = cap(), cap()
    refusal = cap()
    assert (cap.num_open, cap.num_refused, len(made)) == (2, 1, 2)
    assert type(refusal).__name__ == "_Refusal"
    first.connection_lost(None)
    assert (cap.num_open, len(made)) == (1, 1)
    cap()
    assert (cap.num_open, cap.num_refused) == (2, 1)
    second.connection_lost(None)
    assert cap.num_open == 1


@pytest.mark.parametrize(
    ("soft", "hard", "raised_to"),
    [
        (2048, 4096, None),  # 1000 + 128 fit already
        (1024, 4096, (1128, 4096)),  # raised to what the cap needs
        (1024, resource.RLIM_INFINITY, (1128, resource.RLIM_INFINITY)),
        (resource.RLIM_INFINITY, resource.RLIM_INFINITY, None),
    ],
)
def test_the_open_files_limit_is_raised_to_fit_the_cap(monkeypatch, soft, hard, raised_to):
    calls = []
    monkeypatch.setattr(connections.resource, "getrlimit", lambda which: (soft, hard))
    monkeypatch.setattr(connections.resource, "setrlimit", lambda which, v: calls.append(v))
    connections.check_open_files(1000)
    assert calls == ([] if raised_to is None else [raised_to])


def test_a_cap_past_the_hard_open_files_limit_is_one_line(monkeypatch):
    monkeypatch.setattr(connections.resource, "getrlimit", lambda which: (1024, 1024))
    with pytest.raises(UserError) as excinfo:
        connections.check_open_files(1000)
    assert str(excinfo.value) == (
        "serve: --max-connections 1000 needs 1128 open files and this process may open 1024 "
        "(ulimit -Hn); lower --max-connections to at most 896"
    )
