"""Reading a workload YAML and its `--set` overrides into a checked RunSpec: every mistake is one
line naming the file and line, or the `--set` as typed, and the key path; a `--set` of a kind
drops the old kind's keys with a note."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbench.errors import UserError
from llmbench.harness.spec import ConcurrencyLoad, Dist, RagWorkload, RateLoad
from llmbench.harness.spec_load import load_spec

SHIPPED = Path(__file__).resolve().parents[2] / "workloads"
CHAT = SHIPPED / "chat.yaml"  # load: poisson, rate_per_s 0.5; workload: chat, with turns


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def loaded(path: Path, sets: list[str]) -> tuple[object, list[str]]:
    """The spec and the notes its loading said."""
    notes: list[str] = []
    return load_spec(path, sets, notes.append), notes


def error_of(path: Path, sets: list[str]) -> str:
    with pytest.raises(UserError) as err:
        load_spec(path, sets, lambda _: None)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: t\nlod:\n  kind: poisson\n", "x.yaml:2: lod: unknown key; known keys here:"),
        (
            "load:\n  kind: poisson\n  rate_per_s: -1\n",
            "x.yaml:3: load.rate_per_s: must be > 0, got -1.0",
        ),
        ("load:\n  kind: poisson\n", "load.rate_per_s: required for load kind 'poisson'"),
        (
            "workload:\n  sessions: many\n",
            "x.yaml:2: workload.sessions: must be an integer, got 'many'",
        ),
        (
            "workload:\n  kind: poem\n",
            "workload.kind: must be one of chat, rag, agentic, got 'poem'",
        ),
        (
            "workload:\n  user_tokens: {dist: uniform, min: 5, max: 2}\n",
            "workload.user_tokens.min: must be <= max (2.0), got 5.0",
        ),
        (
            "workload:\n  user_tokens: {dist: normal, mean: 5}\n",
            "workload.user_tokens.std: required for dist 'normal'",
        ),
        (
            "workload:\n  user_tokens: {dist: fixed, value: 5, colour: red}\n",
            "x.yaml:2: workload.user_tokens.colour: unknown key",
        ),
        (
            "slo:\n  latency: 5\n",
            "slo.latency: unknown SLO; use ttft_ms, ttft_from_send_ms, tpot_ms, itl_ms, e2e_ms, "
            "queue_ms",
        ),
        ("backend:\n  kind: openai\n", "backend.url: required for backend kind 'openai'"),
        (
            "backend:\n  hardware: abacus\n",
            "backend.hardware: unknown 'abacus'; use measured or one of A100-40GB,",
        ),
        ("a: [1, 2\n", "x.yaml:2: not valid YAML"),
        ("- 1\n- 2\n", "the top level must be a mapping"),
    ],
)
def test_mistakes_are_named(tmp_path, text, message):
    with pytest.raises(UserError) as err:
        load_spec(write(tmp_path, text))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_overrides_go_through_the_same_checks(tmp_path):
    path = write(tmp_path, "load:\n  kind: concurrency\n")
    spec = load_spec(
        path, ["load.concurrency=8", "workload.output_tokens=16", "model=synthetic:tiny"]
    )
    assert spec.load.concurrency == 8
    assert spec.workload.output_tokens.value == 16
    assert spec.model == "synthetic:tiny"
    with pytest.raises(UserError, match="load.concurrency: must be > 0, got 0"):
        load_spec(path, ["load.concurrency=0"])
    with pytest.raises(UserError, match="workload.sesions: unknown key"):
        load_spec(path, ["workload.sesions=3"])
    with pytest.raises(UserError, match="expected key.path=value"):
        load_spec(path, ["load.concurrency"])


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


def test_a_set_kind_drops_the_old_kinds_keys_with_a_note():
    """The shipped chat workload has a poisson load: switching it to concurrency from the
    command line drops its rate (before: `load.rate_per_s: not a field of concurrency loads`)."""
    spec, notes = loaded(CHAT, ["load.kind=concurrency", "load.concurrency=2"])
    assert spec.load == ConcurrencyLoad(concurrency=2)
    assert notes == [
        "note: --set load.kind=concurrency drops load.rate_per_s (a field of poisson loads)"
    ]
    spec, notes = loaded(CHAT, ["workload.kind=rag"])
    assert type(spec.workload) is RagWorkload and spec.workload.sessions == 8  # kept: rag has it
    assert notes == [
        "note: --set workload.kind=rag drops workload.turns, workload.think_time_s (fields of "
        "chat workloads)"
    ]


def test_a_set_kind_over_a_default_kind_and_the_same_kind(tmp_path):
    path = write(tmp_path, "load:\n  concurrency: 3\n")  # no kind: concurrency
    spec, notes = loaded(path, ["load.kind=poisson", "load.rate_per_s=2"])
    assert spec.load == RateLoad(kind="poisson", rate_per_s=2.0)
    assert notes == [
        "note: --set load.kind=poisson drops load.concurrency (a field of concurrency loads)"
    ]
    # The same kind, or one that shares every key: nothing dropped, nothing said.
    chat = write(tmp_path, "workload:\n  kind: chat\n  turns: 2\n")
    spec, notes = loaded(chat, ["workload.kind=chat", "workload.think_time_s=0.5"])
    assert (spec.workload.turns, notes) == (Dist(dist="fixed", value=2), [])
    assert loaded(CHAT, ["load.kind=poisson"])[1] == []
    spec, notes = loaded(CHAT, ["load.kind=gamma"])
    assert (spec.load.kind, spec.load.rate_per_s, notes) == ("gamma", 0.5, [])


def test_a_kind_switch_keeps_what_a_later_set_gives_and_a_mixed_yaml_is_still_an_error(tmp_path):
    # A key of the old kind set after the switch is the user's: an error naming that --set.
    assert error_of(CHAT, ["load.kind=concurrency", "load.rate_per_s=null"]) == (
        "--set load.rate_per_s=null: load.rate_per_s: not a field of concurrency loads (it "
        "belongs to constant, poisson, gamma loads)"
    )
    # Only a --set switches: a YAML that mixes two kinds' keys is refused at its line.
    mixed = write(tmp_path, "workload:\n  kind: rag\n  turns: 2\n")
    assert error_of(mixed, []).endswith(
        "x.yaml:3: workload.turns: not a field of rag workloads (it belongs to chat workloads)"
    )
    assert error_of(mixed, ["workload.sessions=2"]).endswith(
        "x.yaml:3: workload.turns: not a field of rag workloads (it belongs to chat workloads)"
    )
    # An unknown kind drops nothing: its own error says what the kinds are.
    assert error_of(CHAT, ["load.kind=surge"]) == (
        "--set load.kind=surge: load.kind: must be one of concurrency, constant, poisson, gamma, "
        "trace, got 'surge'"
    )


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["load.rate_per_s=-1"],
            "--set load.rate_per_s=-1: load.rate_per_s: must be > 0, got -1.0",
        ),
        (
            ["workload.sesions=3"],
            "--set workload.sesions=3: workload.sesions: unknown key; known keys here: kind, "
            "output_tokens, sessions, system_prompt_tokens, think_time_s, turns, user_tokens",
        ),
        # The last --set of a key is the one that holds, and the one named.
        (
            ["load.rate_per_s=2", "load.rate_per_s=0"],
            "--set load.rate_per_s=0: load.rate_per_s: must be > 0, got 0",
        ),
        # A section on the way, a key under the one set.
        (["lod.kind=x"], "--set lod.kind=x: lod: unknown key; known keys here: backend, device,"),
        (
            ["engine.speculative={method: guess}"],
            "--set engine.speculative={method: guess}: engine.speculative.method: must be one of",
        ),
        (["model.x=1"], "--set model.x=1: model.x: 'model' is not a section"),
        # A key the file does not hold, required by a kind the --set chose.
        (["load.kind=trace"], "--set load.kind=trace: load.trace: required for load kind 'trace'"),
        (
            ["backend.kind=openai"],
            "--set backend.kind=openai: backend.url: required for backend kind 'openai'",
        ),
        # A list typed without brackets: YAML reads `1,2` as one string.
        (
            ["load.sweep=1,2"],
            "--set load.sweep=1,2: load.sweep: must be a list, got str; write load.sweep=[1,2]",
        ),
        (
            ["load.sweep=3"],
            "--set load.sweep=3: load.sweep: must be a list, got int; write load.sweep=[3]",
        ),
        (
            ["load.sweep=[]"],
            "--set load.sweep=[]: load.sweep: must be a non-empty list of values > 0",
        ),
    ],
)
def test_a_mistake_a_set_made_names_the_set_as_typed(sets, message):
    """Before, these named the shipped YAML with no line (`.../chat.yaml: load.rate_per_s: ...`),
    a file the user never wrote."""
    error = error_of(CHAT, sets)
    assert error.startswith(message), error


def test_a_mistake_the_file_made_keeps_its_line(tmp_path):
    path = write(tmp_path, "workload:\n  kind: rag\n  docs_per_query: 3\n")
    # Made impossible by a --set, but written in the file: the file's line.
    assert error_of(path, ["workload.num_documents=2"]) == (
        f"{path}:3: workload.docs_per_query: must be <= num_documents (2)"
    )
    bad = write(tmp_path, "load:\n  kind: poisson\n  rate_per_s: -1\n")
    assert error_of(bad, ["seed=3"]) == f"{bad}:3: load.rate_per_s: must be > 0, got -1.0"


def test_a_set_list_with_brackets_loads():
    spec = load_spec(CHAT, ["load.sweep=[1,2]"])
    assert spec.load.sweep == (1.0, 2.0)
