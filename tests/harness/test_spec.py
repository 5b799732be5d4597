"""RunSpec, the schema: the fields and kinds a YAML gives, their defaults, what the hash holds,
and each kind taking only its own keys (reading a YAML and `--set`: test_spec_load)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from llmbench.errors import UserError
from llmbench.harness import metrics
from llmbench.harness.records import RequestRecord
from llmbench.harness.spec import (
    NOT_THE_BENCHMARK,
    AgenticWorkload,
    ChatWorkload,
    ConcurrencyLoad,
    Dist,
    GammaLoad,
    RagWorkload,
    RateLoad,
    TraceLoad,
)
from llmbench.harness.spec_load import load_spec

SHIPPED = Path(__file__).resolve().parents[2] / "workloads"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["chat", "rag", "agentic"])
def test_shipped_workloads_load(name):
    spec = load_spec(SHIPPED / f"{name}.yaml")
    assert spec.name == name and spec.workload.kind == name


def test_fields_and_shorthands(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            """
name: t
workload:
  kind: agentic
  output_tokens: 32
  tool_latency_s: {dist: uniform, min: 0.1, max: 0.3}
load: {kind: poisson, rate_per_s: 2}
slo: {ttft_ms: 500}
""",
        )
    )
    assert spec.workload.output_tokens == Dist(dist="fixed", value=32)
    assert spec.workload.tool_latency_s == Dist(dist="uniform", min=0.1, max=0.3)
    assert (spec.load.kind, spec.load.rate_per_s) == ("poisson", 2.0)
    assert spec.slo == {"ttft_ms": 500.0}


def test_spec_hash_is_stable_and_sensitive(tmp_path):
    path = write(tmp_path, "name: t\n")
    assert load_spec(path).hash() == load_spec(path).hash()
    assert load_spec(path).hash() != load_spec(path, ["seed=1"]).hash()


def test_keys_added_later_are_hashed_only_off_their_old_behaviour(tmp_path):
    """`load.search` (version 8) and `engine.speculative.adaptive` (version 9) at null and
    false hash as a spec from before them did: its canonical JSON without them."""
    path = write(tmp_path, "name: t\n")
    data = load_spec(path).to_dict()
    for key in NOT_THE_BENCHMARK:
        section, _, name = key.rpartition(".")
        (data[section] if section else data).pop(name, None)
    del data["load"]["search"], data["engine"]["speculative"]["adaptive"]
    before = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    assert load_spec(path).hash() == before
    assert load_spec(path, ["engine.speculative.adaptive=true"]).hash() != before


def test_the_system_under_test_is_not_the_benchmark(tmp_path):
    """A server's address, headers (API keys) and request-id header are what a user changes
    between BASE and NEW: left out of the hash. The model it serves is not."""
    openai = "backend:\n  kind: openai\n  url: http://127.0.0.1:8000/v1\n"
    path = write(tmp_path, f"name: t\n{openai}")
    base = load_spec(path).hash()
    other_server = [
        "backend.url=http://127.0.0.1:8001/v1",
        "backend.headers={Authorization: Bearer sk-new}",
        "backend.request_id_header=X-Request-Id",
        "backend.server_log=/tmp/server.log",
    ]
    assert load_spec(path, other_server).hash() == base
    assert load_spec(path, ["backend.served_model=other"]).hash() != base
    assert load_spec(path, ["workload.sessions=3"]).hash() != base


def test_repeat_is_at_least_1_and_not_part_of_the_hash(tmp_path):
    path = write(tmp_path, "name: t\nrepeat: 3\n")
    assert load_spec(path).repeat == 3
    assert load_spec(write(tmp_path, "name: t\n")).repeat == 1
    # How many times it is measured is not what is measured: runs with any repeat compare.
    assert load_spec(path).hash() == load_spec(path, ["repeat=1"]).hash()
    with pytest.raises(UserError) as err:
        load_spec(write(tmp_path, "name: t\nrepeat: 0\n"))
    assert str(err.value) == f"{tmp_path / 'x.yaml'}:2: repeat: must be >= 1, got 0"
    with pytest.raises(UserError, match="repeat: must be an integer, got 'twice'"):
        load_spec(path, ["repeat=twice"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "workload:\n  kind: chat\n  sessions: 2\n  zipf_s: 1.5\n",
            "x.yaml:4: workload.zipf_s: not a field of chat workloads (it belongs to rag "
            "workloads)",
        ),
        (
            "workload:\n  turns: 2\n  tool_steps: 3\n",  # kind defaults to chat
            "x.yaml:3: workload.tool_steps: not a field of chat workloads (it belongs to agentic",
        ),
        (
            "workload:\n  kind: rag\n  think_time_s: 1\n",
            "x.yaml:3: workload.think_time_s: not a field of rag workloads (it belongs to chat",
        ),
        (
            "workload:\n  kind: agentic\n  docs_per_query: 2\n",
            "x.yaml:3: workload.docs_per_query: not a field of agentic workloads",
        ),
        (
            "load:\n  kind: concurrency\n  rate_per_s: 2\n",
            "x.yaml:3: load.rate_per_s: not a field of concurrency loads (it belongs to constant, "
            "poisson, gamma loads)",
        ),
        (
            "load:\n  kind: poisson\n  rate_per_s: 2\n  burstiness: 0.5\n",
            "x.yaml:4: load.burstiness: not a field of poisson loads (it belongs to gamma loads)",
        ),
        (
            "load:\n  kind: constant\n  rate_per_s: 2\n  concurrency: 3\n",
            "x.yaml:4: load.concurrency: not a field of constant loads",
        ),
        (
            "load:\n  kind: trace\n  trace: t.jsonl\n  sweep: [1, 2]\n",
            "x.yaml:4: load.sweep: not a field of trace loads (it belongs to concurrency, "
            "constant,",
        ),
        (
            "load:\n  kind: gamma\n  burstiness: 0.5\n",
            "load.rate_per_s: required for load kind 'gamma'",
        ),
        ("load:\n  kind: gamma\n  rate_per_s: 1\n  burstiness: 0\n", "must be > 0, got 0.0"),
        ("load:\n  kind: trace\n", "load.trace: required for load kind 'trace'"),
        ("load:\n  kind: surge\n", "x.yaml:2: load.kind: must be one of concurrency, constant,"),
        (
            "workload:\n  kind: chat\n  colour: red\n",
            "x.yaml:3: workload.colour: unknown key; known keys here: kind, output_tokens, "
            "sessions, system_prompt_tokens, think_time_s, turns, user_tokens",
        ),
        (
            "workload:\n  kind: agentic\n  tools_as: json\n",
            "x.yaml:3: workload.tools_as: must be one of text, api, got 'json'",
        ),
        ("workload: 3\n", "x.yaml:1: workload: must be a mapping, got int"),
    ],
)
def test_each_kind_takes_only_its_own_keys(tmp_path, text, message):
    with pytest.raises(UserError) as err:
        load_spec(write(tmp_path, text))
    assert str(err.value).startswith(str(tmp_path))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "workload_type", "load_type"),
    [
        ("{}", ChatWorkload, ConcurrencyLoad),
        ("workload: {kind: rag}\nload: {kind: constant, rate_per_s: 1}", RagWorkload, RateLoad),
        (
            "workload: {kind: agentic}\nload: {kind: poisson, sweep: [1, 2]}",
            AgenticWorkload,
            RateLoad,
        ),
        ("load: {kind: gamma, rate_per_s: 1, burstiness: 0.5}", ChatWorkload, GammaLoad),
        ("load: {kind: trace, trace: t.jsonl}", ChatWorkload, TraceLoad),
    ],
)
def test_kind_chooses_the_dataclass(tmp_path, text, workload_type, load_type):
    spec = load_spec(write(tmp_path, text))
    assert type(spec.workload) is workload_type and type(spec.load) is load_type


def test_trace_load_has_no_rate_and_no_sweep(tmp_path):
    load = load_spec(write(tmp_path, "load: {kind: trace, trace: t.jsonl}")).load
    assert (load.kind, load.trace, load.rate_per_s, load.sweep) == ("trace", "t.jsonl", None, None)


def test_to_dict_holds_the_kind_and_its_fields_only(tmp_path):
    spec = load_spec(write(tmp_path, "workload: {kind: agentic, tools_as: api}\n"))
    workload = spec.to_dict()["workload"]
    assert workload["kind"] == "agentic" and workload["tools_as"] == "api"
    assert set(workload) == {
        "kind",
        "sessions",
        "system_prompt_tokens",
        "user_tokens",
        "output_tokens",
        "tool_schema_tokens",
        "tool_steps",
        "tool_result_tokens",
        "tool_latency_s",
        "final_output_tokens",
        "tools_as",
    }
    assert spec.to_dict()["load"] == {
        "kind": "concurrency",
        "concurrency": 4,
        "sweep": None,
        "search": None,
        "workers": 1,
    }
    trace = load_spec(write(tmp_path, "load: {kind: trace, trace: t.jsonl}\n"))
    assert trace.to_dict()["load"] == {"kind": "trace", "trace": "t.jsonl", "workers": 1}


def test_replace_keeps_the_kind():
    workload = replace(RagWorkload(num_documents=9), sessions=2)
    assert (type(workload), workload.sessions, workload.num_documents) == (RagWorkload, 2, 9)
    assert AgenticWorkload().tools_as == "text"


def test_every_slo_the_spec_accepts_is_computed(tmp_path):
    """One table: each accepted SLO name limits a per-request value and has a distribution in
    the summary. A request scheduled at 0, sent at 2 ms, tokens at 10, 30 and 40 ms (gaps 20
    and 10 ms), ended at 50 ms."""
    record = RequestRecord(
        "r", "s", 0, scheduled_ns=0, sent_ns=2_000_000, end_ns=50_000_000,
        chunk_ns=[10_000_000, 30_000_000, 40_000_000], chunk_tokens=[1, 1, 1],
    )  # fmt: skip
    value_ms = {
        "ttft_ms": 10.0,
        "ttft_from_send_ms": 8.0,
        "tpot_ms": 15.0,  # (40 − 10) / 2
        "itl_ms": 20.0,  # the worst gap
        "e2e_ms": 50.0,
        "queue_ms": 2.0,
    }
    assert set(value_ms) == set(metrics.SLO_METRICS)
    summary = metrics.summarize([record])
    for name, value in value_ms.items():
        spec = load_spec(write(tmp_path, f"slo: {{{name}: {value}}}\n"))
        assert spec.slo == {name: value}
        assert metrics.is_slo_met(record, spec.slo)
        assert not metrics.is_slo_met(record, {name: value * 0.99})
        assert summary[name]["count"] >= 1


def test_the_field_reference_lists_each_kinds_fields():
    """workloads/README.md: every workload and load field, with the kinds that take it."""
    text = (SHIPPED / "README.md").read_text()
    for section, kinds in (
        ("`workload`", {"chat": ChatWorkload, "rag": RagWorkload, "agentic": AgenticWorkload}),
        (
            "`load`",
            {
                "concurrency": ConcurrencyLoad,
                "constant": RateLoad,
                "poisson": RateLoad,
                "gamma": GammaLoad,
                "trace": TraceLoad,
            },
        ),
    ):
        table = text.split(f"\n{section}\n", 1)[1].strip().split("\n\n", 1)[0]
        documented = {}
        for row in table.splitlines()[2:]:
            key, _, where = (cell.strip() for cell in row.split("|")[1:4])
            if where == "all":
                where = ", ".join(kinds)
            elif where.startswith("all but "):
                where = ", ".join(k for k in kinds if k != where.removeprefix("all but "))
            documented[key.strip("`")] = set(where.split(", "))
        actual: dict[str, set[str]] = {}
        for kind, cls in kinds.items():
            for f in fields(cls):
                actual.setdefault(f.name, set()).add(kind)
        assert documented == actual


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["max_failed_fraction=1.5"], "max_failed_fraction: must be between 0 and 1, got 1.5"),
        (
            ["backend.kind=openai", "backend.url=http://h/v1", "backend.weights=q4_9"],
            "backend.weights: unknown 'q4_9'; use one of float32, bfloat16,",
        ),
        (
            ["backend.kind=openai", "backend.url=http://h/v1", "backend.weights_bytes_per_param=0"],
            "backend.weights_bytes_per_param: must be > 0, got 0.0",
        ),
        (
            [
                "backend.kind=openai",
                "backend.url=http://h/v1",
                "backend.weights=int8",
                "backend.weights_bytes_per_param=1",
            ],
            "backend.weights_bytes_per_param: give backend.weights or this, not both",
        ),
        (["backend.weights=int8"], "backend.weights: only for backend kind 'openai'"),
        (
            ["backend.kind=openai", "backend.url=http://a/v1", "backend.urls=[http://b/v1]"],
            "backend.urls: give backend.url (one server) or backend.urls, not both",
        ),
        (["backend.urls=[http://a/v1]"], "backend.urls: only for backend kind 'openai'"),
        (["backend.kind=openai"], "backend.url: required for backend kind 'openai' (or"),
        (
            ["backend.kind=openai", "backend.urls=[http://a/v1,http://a/v1]"],
            "backend.urls: lists an address twice",
        ),
        (
            ["backend.kind=openai", "backend.urls=[http://a/v1]", "load.workers=2"],
            "backend.urls: routed by one client process: set load.workers 1",
        ),
        (["routing.block_tokens=0"], "routing.block_tokens: must be >= 1, got 0"),
        (["routing.max_imbalance=0"], "routing.max_imbalance: must be >= 1, got 0"),
        (["routing.min_match=1.5"], "routing.min_match: must be between 0 and 1, got 1.5"),
        (["routing.policy=random"], "routing.policy: must be one of round_robin, least_loaded"),
        (["prices=nope"], "prices: 'nope': no such price sheet file"),
        (
            ["backend.kind=transformers", "backend.reset_prefix_cache=true"],
            "backend.reset_prefix_cache: the transformers backend has no cache",
        ),
        (
            [
                "backend.kind=openai",
                "backend.url=http://a/v1",
                "backend.reset_prefix_cache=true",
                "load.workers=2",
            ],
            "backend.reset_prefix_cache: one client process resets the caches: set load.workers 1",
        ),
    ],
)
def test_failure_fraction_server_weights_endpoints_and_prices_are_checked(tmp_path, sets, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_spec(write(tmp_path, "name: t\n"), sets)


def test_server_weights_and_the_failure_fraction_load(tmp_path):
    path = write(tmp_path, "backend: {kind: openai, url: 'http://h/v1', weights: q4_1}\n")
    spec = load_spec(path, ["max_failed_fraction=0.2"])
    assert (spec.backend.weights, spec.max_failed_fraction) == ("q4_1", 0.2)
    # How failures are judged is not what is measured: runs that differ in it compare.
    assert spec.hash() == load_spec(path).hash()
    assert load_spec(write(tmp_path, "name: t\n")).max_failed_fraction == 0.05


def test_backend_headers_and_the_request_id_header(tmp_path):
    path = write(tmp_path, "backend: {kind: openai, url: 'http://h/v1'}\n")
    spec = load_spec(path)
    assert (spec.backend.headers, spec.backend.request_id_header) == ({}, None)
    sets = ["backend.headers.X-Tenant=bench", "backend.request_id_header=X-Request-Id"]
    spec = load_spec(path, sets)
    assert spec.backend.headers == {"X-Tenant": "bench"}
    assert spec.backend.request_id_header == "X-Request-Id"
    with pytest.raises(UserError, match="request_id_header: not an HTTP header name: 'X Id'"):
        load_spec(path, ["backend.request_id_header=X Id"])
    with pytest.raises(UserError, match="backend.headers.X-A: must be a string, got 1"):
        load_spec(path, ["backend.headers.X-A=1"])


def test_backend_server_log_is_for_one_openai_client_and_not_hashed(tmp_path):
    path = write(tmp_path, "backend: {kind: openai, url: 'http://h/v1'}\n")
    spec = load_spec(path, ["backend.server_log=/tmp/server.log"])
    assert spec.backend.server_log == "/tmp/server.log"
    assert spec.hash() == load_spec(path).hash()  # where timings are read, not what is measured
    with pytest.raises(UserError, match="backend.server_log: only for backend kind 'openai'"):
        load_spec(path, ["backend.server_log=x.log", "backend.kind=engine"])
    with pytest.raises(UserError, match="backend.server_log: read by one client process"):
        load_spec(path, ["backend.server_log=x.log", "load.workers=2"])


def test_speculative_decoding_loads_and_overrides(tmp_path):
    path = write(tmp_path, "engine: {speculative: {method: ngram, num_tokens: 3}}\n")
    spec = load_spec(path)
    s = spec.engine.speculative
    assert (s.method, s.num_tokens, s.ngram_min, s.ngram_max) == ("ngram", 3, 2, 4)
    assert s.draft_model is None
    sets = ["engine.speculative.method=draft", "engine.speculative.draft_model=self:layers=8"]
    drafted = load_spec(path, sets).engine.speculative
    assert (drafted.method, drafted.draft_model) == ("draft", "self:layers=8")
    assert drafted.num_tokens == 3
    # Speculation is what is measured: it changes the spec hash.
    assert load_spec(path).hash() != load_spec(write(tmp_path, "name: t\n")).hash()
    assert load_spec(write(tmp_path, "name: t\n")).engine.speculative.method == "none"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["engine.speculative.method=medusa"], "must be one of none, ngram, draft, got 'medusa'"),
        (["engine.speculative.num_tokens=0"], "engine.speculative.num_tokens: must be >= 1, got 0"),
        (
            ["engine.speculative.ngram_min=5"],
            "engine.speculative.ngram_min: need 1 <= ngram_min <= ngram_max, got 5 and 4",
        ),
        (
            ["engine.speculative.method=draft"],
            "engine.speculative.draft_model: required for method 'draft'",
        ),
        (
            ["backend.kind=openai", "backend.url=http://h/v1", "engine.speculative.method=ngram"],
            "engine.speculative.method: only for backend kind 'engine'",
        ),
        (["engine.speculative.k=4"], "engine.speculative.k: unknown key"),
    ],
)
def test_speculative_decoding_mistakes_are_named(tmp_path, sets, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_spec(write(tmp_path, "name: t\n"), sets)


@pytest.mark.parametrize(
    ("text", "sets", "expected"),
    [
        ("", [], "auto"),
        ("engine: {kv_cache_dtype: int8}\n", [], "int8"),
        ("engine: {kv_cache_dtype: {k: bfloat16, v: int8}}\n", [], ("bfloat16", "int8")),
        ("engine: {kv_cache_dtype: {v: int4}}\n", [], ("auto", "int4")),
        ("", ["engine.kv_cache_dtype=int4"], "int4"),
        ("", ["engine.kv_cache_dtype.k=int8", "engine.kv_cache_dtype.v=int4"], ("int8", "int4")),
    ],
)
def test_kv_cache_dtype_one_format_or_keys_and_values_apart(tmp_path, text, sets, expected):
    spec = load_spec(write(tmp_path, text), sets)
    kv = spec.engine.kv_cache_dtype
    assert (kv if isinstance(kv, str) else (kv.k, kv.v)) == expected
    # results.json keeps it as written: a string, or a {k, v} mapping.
    as_dict = spec.to_dict()["engine"]["kv_cache_dtype"]
    if not isinstance(expected, str):
        expected = {"k": expected[0], "v": expected[1]}
    assert as_dict == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine: {kv_cache_dtype: int3}\n", "x.yaml:1: engine.kv_cache_dtype: must be one of"),
        ("engine: {kv_cache_dtype: {k: int8, w: int4}}\n", "engine.kv_cache_dtype: must be"),
        ("engine:\n  kv_cache_dtype: {k: int5}\n", "x.yaml:2: engine.kv_cache_dtype"),
    ],
)
def test_kv_cache_dtype_mistakes_are_named(tmp_path, text, message):
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        load_spec(write(tmp_path, text))


def test_quality_block_loads_and_is_left_out_of_the_hash(tmp_path):
    plain = load_spec(write(tmp_path, ""))
    spec = load_spec(write(tmp_path, "quality: {tokens: 256, generate: 8}\n"))
    assert (spec.quality.text, spec.quality.tokens, spec.quality.context) == (None, 256, 512)
    assert spec.quality.generate == 8 and plain.quality is None
    assert spec.hash() == plain.hash()  # the same workload, measured with quality beside it


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["quality.tokens=1"], "quality.tokens: must be >= 2, got 1"),
        (["quality.generate=-1"], "quality.generate: must be >= 0, got -1"),
        (
            ["quality.colour=red"],
            "quality.colour: unknown key; known keys here: context, generate,",
        ),
        (
            ["backend.kind=openai", "backend.url=http://h/v1", "quality.tokens=64"],
            "quality: only for backend kind 'engine'",
        ),
    ],
)
def test_quality_block_mistakes_are_named(tmp_path, sets, message):
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        load_spec(write(tmp_path, ""), sets)


def test_several_endpoints_are_not_the_benchmark_and_the_policy_is(tmp_path):
    path = write(tmp_path, "name: t\nbackend: {kind: openai}\n")
    one = load_spec(path, ["backend.urls=[http://a/v1,http://b/v1]"])
    other = load_spec(path, ["backend.urls=[http://c/v1,http://d/v1]"])
    assert one.backend.addresses == ["http://a/v1", "http://b/v1"]
    assert one.hash() == other.hash()
    affinity = load_spec(path, ["backend.urls=[http://a/v1]", "routing.policy=prefix_affinity"])
    assert affinity.hash() != one.hash()
    priced = load_spec(path, ["backend.urls=[http://a/v1,http://b/v1]", "prices=gpt-4.1"])
    assert priced.hash() == one.hash() and priced.prices == "gpt-4.1"
