"""RunSpec loading: every mistake is one line naming the file, the line and the key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbench.errors import UserError
from llmbench.harness.spec import Dist, load_spec

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
        ("slo:\n  latency: 5\n", "slo.latency: unknown SLO; use ttft_ms, tpot_ms, itl_ms, e2e_ms"),
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


def test_spec_hash_is_stable_and_sensitive(tmp_path):
    path = write(tmp_path, "name: t\n")
    assert load_spec(path).hash() == load_spec(path).hash()
    assert load_spec(path).hash() != load_spec(path, ["seed=1"]).hash()


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")
