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
        (
            ["engine.kv_cache_memory=0"],
            "--set engine.kv_cache_memory=0: engine.kv_cache_memory: must be > 0, got 0",
        ),
        # Threads: none given is torch's default; 0 or fewer is no thread at all.
        (
            ["engine.threads=0"],
            "--set engine.threads=0: engine.threads: must be >= 1, got 0",
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


RAG = SHIPPED / "rag.yaml"
AGENTIC = SHIPPED / "agentic.yaml"
SWEEP_101 = "load.sweep=[" + ",".join(str(v) for v in range(1, 102)) + "]"
M = "1,000,000"  # tokens in one text or reply


@pytest.mark.parametrize(
    ("path", "override", "limit", "got"),
    [
        (CHAT, "workload.sessions=10000000", "100,000", "10,000,000"),
        (CHAT, "warmup_requests=100001", "100,000", "100,001"),
        (CHAT, "repeat=101", "100", "101"),
        (CHAT, SWEEP_101, "100 points", "101"),
        (CHAT, "workload.turns=1001", "1,000", "1,001"),
        (CHAT, "workload.user_tokens={dist: uniform, min: 1, max: 2000000}", M, "2,000,000"),
        (CHAT, "workload.output_tokens={dist: empirical, values: [8, 1000001]}", M, "1,000,001"),
        (CHAT, "workload.user_tokens={dist: lognormal, mean: 2000000, sigma: 1}", M, "2,000,000"),
        (CHAT, "workload.user_tokens={dist: fixed, value: .nan}", "1,000,000", "nan"),
        (CHAT, "workload.think_time_s=3600.5", "3,600", "3,600.5"),
        (CHAT, "workload.system_prompt_tokens=1000001", "1,000,000", "1,000,001"),
        (RAG, "workload.num_documents=10001", "10,000", "10,001"),
        (RAG, "workload.zipf_s=11", "10", "11"),
        (AGENTIC, "workload.tool_steps=1001", "1,000", "1,001"),
        (AGENTIC, "workload.tool_latency_s=3601", "3,600", "3,601"),
        (AGENTIC, "workload.tool_schema_tokens=1000001", "1,000,000", "1,000,001"),
        (AGENTIC, "quality={tokens: 1000001}", "1,000,000", "1,000,001"),
    ],
)  # fmt: skip
def test_what_a_spec_expands_to_is_bounded_and_the_limit_named(path, override, limit, got):
    """Before: `sessions: 10000000` was accepted and built sessions for minutes with no line,
    its memory growing 1.4 MB/s. Every count, length and delay a spec expands has a limit."""
    key = override.partition("=")[0]
    key = "quality.tokens" if key == "quality" else key
    assert error_of(path, [override]) == (
        f"--set {override}: {key}: at most {limit} (a limit of llmbench), got {got}"
    )


def test_a_limit_in_the_yaml_names_its_line(tmp_path):
    path = write(tmp_path, "workload:\n  kind: chat\n  sessions: 10000000\n")
    assert error_of(path, []) == (
        f"{path}:3: workload.sessions: at most 100,000 (a limit of llmbench), got 10,000,000"
    )


def test_the_whole_workload_text_is_bounded():
    """Each limit met, but together too much text: 100,000 sessions of 20 turns of 64 tokens,
    with the warm-up's (one more session) and the system prompt: 200 + 100,001 x 20 x 64
    tokens."""
    sets = [
        "workload.sessions=100000",
        "warmup_requests=1",
        "workload.turns=20",
        "workload.user_tokens=64",
        "workload.system_prompt_tokens=200",
    ]
    assert error_of(CHAT, sets) == (
        "--set workload.sessions=100000: workload.sessions: the workload makes up to "
        f"{200 + 100_001 * 20 * 64:,} tokens of text (100,001 sessions, warm-up and every "
        "repetition included), over the 100,000,000 of llmbench's limit; use fewer sessions "
        "or shorter texts"
    )


def test_drawing_rag_documents_is_bounded():
    """100 distinct documents of 100 under zipf_s 5: the last one is drawn once in ~1e10
    draws (`_rag_turns` draws until it has them all): refused, not a hang."""
    message = error_of(
        RAG,
        ["workload.num_documents=100", "workload.docs_per_query=100", "workload.zipf_s=5"],
    )
    assert message.startswith(
        "--set workload.docs_per_query=100: workload.docs_per_query: 100 distinct documents of "
        "100 under zipf_s 5 take about "
    )
    assert message.endswith(
        "draws a query, each over every document: for 13 queries, over the 5,000,000,000 of "
        "llmbench's limit; lower docs_per_query or zipf_s, or raise num_documents"
    )


def test_yaml_anchors_and_aliases_are_refused_in_specs_and_sets(tmp_path):
    path = write(tmp_path, "name: a\nslo: &s {ttft_ms: 1}\nother: *s\n")
    assert error_of(path, []) == (
        f"{path}:2: YAML anchor &s: not read (an alias can expand without bound); write the "
        "value out"
    )
    assert error_of(CHAT, ["slo=&x {ttft_ms: 1}"]) == (
        "--set slo=&x {ttft_ms: 1}: YAML anchor &x: not read (an alias can expand without "
        "bound); write the value out"
    )


def test_a_spec_file_over_the_limit_is_not_read(tmp_path):
    from llmbench.harness.yaml_source import MAX_BYTES

    path = write(tmp_path, "#" * (MAX_BYTES + 1))
    assert error_of(path, []) == (
        f"{path}: 1,048,577 bytes, over the 1,048,576 llmbench reads of a spec; give a workload "
        "YAML"
    )


@pytest.mark.parametrize("name", ["chat", "rag", "agentic"])
def test_the_shipped_workloads_are_plain_yaml_within_the_limits(name):
    from llmbench.harness.yaml_source import check_plain

    path = SHIPPED / f"{name}.yaml"
    check_plain(path.read_text(), str(path))  # no anchors, no aliases
    assert load_spec(path, [], lambda _: None).workload.kind == name


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["load.search.low=1"], "load.search.high: missing"),
        (["load.search.low=4", "load.search.high=2"], "needs 0 < low < high, got low 4.0"),
        (
            ["load.kind=concurrency", "load.search.low=1.5", "load.search.high=8"],
            "low and high are concurrencies: whole numbers",
        ),
        (
            ["load.search.low=1", "load.search.high=8", "load.search.points=1"],
            "load.search.points: must be 2 .. 100, got 1",
        ),
        (
            ["load.search.low=1", "load.search.high=8", "load.sweep=[1,2]"],
            "not with load.sweep: give the loads or a range to search",
        ),
        (
            ["load.search.low=1", "load.search.high=8", "slo={}"],
            "searches for the highest load that meets slo.*; set one",
        ),
        (  # chat.yaml has 8 sessions: a closed loop never has more than 8 in flight
            ["load.kind=concurrency", "load.search.low=1", "load.search.high=32"],
            "load.search.high: concurrency 32 is past workload.sessions (8): a closed loop",
        ),
    ],
)
def test_a_load_search_is_checked(sets, message):
    assert message in error_of(CHAT, sets)


def test_a_load_search_needs_no_rate_and_leaves_the_hash_of_a_spec_without_one():
    spec = load_spec(CHAT, ["load.rate_per_s=null", "load.search.low=0.5", "load.search.high=8"])
    assert (spec.load.search.low, spec.load.search.high, spec.load.search.points) == (0.5, 8, 6)
    assert spec.load.rate_per_s is None
    # The hashes of the shipped chat workload and of the default spec before load.search
    # existed (llmbench at b7efc05): runs recorded then still compare with runs now.
    assert load_spec(CHAT).hash() == "b1adec7f914905ac"
    from llmbench.harness.spec import RunSpec

    assert RunSpec().hash() == "81b284dbca759ef8"
    assert spec.hash() != load_spec(CHAT).hash()  # a search is part of what is measured
