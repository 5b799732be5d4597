"""A run routed over several loopback `llmbench serve` replicas (`backend.urls`, `routing`): every
request names its endpoint, the summary has a line per endpoint, and a replica that does not
answer is skipped with a note."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from llmbench.harness.record_log import read_requests
from tests.serve.load import ServerProcess

SERVE = ["--model", "synthetic:tiny", "--dtype", "float32", "--kv-cache-memory", str(4 * 2**20)]
# 4 chat sessions of 3 turns, two at a time: later turns extend earlier prompts.
WORKLOAD = [
    *("--set", "model=synthetic:tiny", "--set", "dtype=float32", "--set", "warmup_requests=0"),
    *("--set", "workload.sessions=4", "--set", "workload.turns=3"),
    *("--set", "workload.think_time_s=0", "--set", "workload.output_tokens=8"),
    *("--set", "load.kind=concurrency", "--set", "load.concurrency=2"),
]


@pytest.fixture(scope="module")
def replicas():
    servers = [ServerProcess(SERVE) for _ in range(2)]
    yield [f"{s.url}/v1" for s in servers]
    for server in servers:
        server.stop()


def run(tmp_path, urls: list[str], policy: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / policy
    result = subprocess.run(
        [sys.executable, "-m", "llmbench", "run", "chat", *WORKLOAD, "--out", str(out),
         "--set", "backend.kind=openai", "--set", f"backend.urls=[{','.join(urls)}]",
         "--set", f"routing.policy={policy}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result, json.loads((out / "results.json").read_text())


def test_session_sticky_keeps_each_session_on_one_replica(replicas, tmp_path):
    result, results = run(tmp_path, replicas, "session_sticky")
    records = [r for r in read_requests(tmp_path / "session_sticky") if not r.is_warmup]
    assert len(records) == 12 and {r.endpoint for r in records} == {0, 1}
    homes = {}
    for r in records:
        homes.setdefault(r.session_id, set()).add(r.endpoint)
    assert all(len(h) == 1 for h in homes.values())
    endpoints = results["summary"]["endpoints"]
    assert [e["endpoint"] for e in endpoints] == [0, 1]
    assert sum(e["requests"] for e in endpoints) == 12
    assert all(e["failed"] == 0 and e["mean_in_flight"] > 0 for e in endpoints)
    assert results["summary"]["endpoint_imbalance"] >= 1.0
    assert "routing session_sticky over 2 endpoints: imbalance" in result.stdout
    assert f"  {replicas[1]}: " in result.stdout
    device = results["provenance"]["device"]["name"]
    assert device.endswith("× 2 endpoints")
    for report in ("report.md", "report.html"):  # an endpoint table in both reports
        text = (tmp_path / "session_sticky" / report).read_text()
        assert "Endpoints" in text and replicas[0] in text and "Routed by session_sticky" in text


def test_a_replica_that_does_not_answer_is_skipped(replicas, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    result, results = run(tmp_path, [dead, replicas[0]], "round_robin")
    assert f"note: endpoint {dead}: " in result.stderr
    records = [r for r in read_requests(tmp_path / "round_robin") if not r.is_warmup]
    served = [r for r in records if r.ok]
    assert served and {r.endpoint for r in served} == {1}
    for r in records:  # any request the dead one got (after its pause) failed, naming it
        if r.endpoint == 0:
            assert not r.ok and dead in r.error


def first_cached_tokens(folder) -> list[int]:
    """Each measured request's cached prompt tokens, in the order sent."""
    records = sorted((r for r in read_requests(folder) if not r.is_warmup), key=lambda r: r.sent_ns)
    return [r.cached_tokens for r in records]


@pytest.mark.parametrize("reset", [False, True])
def test_variants_on_shared_replicas_start_cold_with_reset_prefix_cache(replicas, tmp_path, reset):
    """Two variants, one after the other, against the same two replicas, one request at a time
    (the order is fixed): without a reset the second finds the first one's prompts cached; with
    `backend.reset_prefix_cache` both start cold and see the same hits, request for request."""
    out = tmp_path / "fleet"
    result = subprocess.run(
        [sys.executable, "-m", "llmbench", "run", "chat", *WORKLOAD, "--out", str(out),
         "--set", "load.concurrency=1", "--set", "backend.kind=openai",
         "--set", f"backend.urls=[{','.join(replicas)}]", "--set", "routing.policy=session_sticky",
         "--set", f"backend.reset_prefix_cache={str(reset).lower()}",
         "--vary", "routing.down_s=5,6"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    first, second = (first_cached_tokens(out / "variants" / v) for v in ("5", "6"))
    assert len(first) == len(second) == 12
    if reset:
        assert first[0] == second[0] == 0  # the first request after the reset: nothing cached
        assert first == second
    else:
        assert second[0] > 0  # the first variant left the same prompt cached
    report = (out / "report.md").read_text()
    assert "## Prefix cache, routing and cost" in report
    assert "| requests per endpoint | imbalance |" in report
