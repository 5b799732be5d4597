"""`--repeat`: the warm-up once, the measured workload N times on one engine, every record tagged
with its repetition, the summary pooled, per repetition and spread, each checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmbench.harness import metrics
from llmbench.harness.record_log import read_requests, read_sessions, read_steps
from llmbench.harness.run_repetitions import salt
from tests.harness.test_run import SMALL, TINY, llmbench

SUMMARY_OF_RECORDS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tok_per_s")


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> tuple[Path, str]:
    """An agentic run of 3 sessions on the tiny model, repeated 3 times: (folder, stdout)."""
    out = tmp_path_factory.mktemp("repeat") / "run"
    result = llmbench(
        "run", "agentic", *TINY, *SMALL["agentic"], "--repeat", "3", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_salts_repetition_1_is_the_plain_run():
    assert [salt(k) for k in (1, 2, 3)] == ["", "rep2-", "rep3-"]


def test_every_file_has_its_three_repetitions(three):
    out, _ = three
    requests = read_requests(out)
    steps, sessions = read_steps(out), read_sessions(out)
    results = json.loads((out / "results.json").read_text())
    assert results["schema_version"] == 9 and results["spec"]["repeat"] == 3
    warm = [r for r in requests if r.is_warmup]
    assert len(warm) == 1 and warm[0].repetition == 0
    for k in (1, 2, 3):
        own = [r for r in requests if r.repetition == k]
        # 3 sessions, each a turn per tool step (2 to 4, drawn per session) and the answer.
        own_sessions = [s for s in sessions if s["repetition"] == k]
        assert len(own_sessions) == 3
        assert len(own) == sum(s["num_requests"] for s in own_sessions) >= 3 * 3
        assert {r.session_id for r in own} == {f"{salt(k)}s{i}" for i in range(3)}
        assert not any(r.is_warmup for r in own)
        assert any(s["repetition"] == k and s["phase"] == "decode" for s in steps)
    # The warm-up's engine steps come first, before any repetition's.
    first_rep_1 = min(s["t_start_ns"] for s in steps if s["repetition"] == 1)
    assert {s["repetition"] for s in steps if s["t_start_ns"] < first_rep_1} == {0}
    assert [s["repetition"] for s in steps] == sorted(s["repetition"] for s in steps)
    summary = results["summary"]
    assert [(r["repetition"], r["is_partial"]) for r in summary["repetitions"]] == [
        (1, False),
        (2, False),
        (3, False),
    ]
    assert summary["num_completed"] == len(requests) - 1


def test_pooled_and_per_repetition_summaries_are_the_metrics_of_their_records(three):
    out, _ = three
    requests = read_requests(out)
    results = json.loads((out / "results.json").read_text())
    summary, slo = results["summary"], results["spec"]["slo"]
    pooled = metrics.summarize(requests, slo)
    for key in SUMMARY_OF_RECORDS:
        assert summary[key] == pooled[key], key
    read_bytes_per_s = results["roofline"]["roofs"]["read_bytes_per_s"]
    steps = read_steps(out)
    for alone in summary["repetitions"]:
        k = alone["repetition"]
        own = metrics.summarize([r for r in requests if r.repetition == k], slo)
        for key in SUMMARY_OF_RECORDS:
            assert alone[key] == own[key], (k, key)
        assert alone["num_completed"] == own["num_completed"]
        # Decode MBU of its own steps: Σ bytes / Σ seconds / the measured read bandwidth.
        decode = [s for s in steps if s["repetition"] == k and s["phase"] == "decode"]
        seconds = sum(s["t_end_ns"] - s["t_start_ns"] for s in decode) / 1e9
        mbu = sum(s["bytes"] for s in decode) / seconds / read_bytes_per_s
        assert alone["decode_mbu"] == pytest.approx(mbu, rel=1e-12)
    # The pooled roofline leaves the warm-up's steps out.
    measured = [s for s in steps if s["repetition"] >= 1 and s["phase"] == "decode"]
    assert results["roofline"]["phases"]["decode"]["num_steps"] == len(measured)


def test_the_spread_by_hand(three):
    out, stdout = three
    summary = json.loads((out / "results.json").read_text())["summary"]
    for name, value in (
        ("tpot_ms.p50", lambda s: s["tpot_ms"]["p50"]),
        ("ttft_ms.p99", lambda s: s["ttft_ms"]["p99"]),
        ("output_tok_per_s", lambda s: s["output_tok_per_s"]),
        ("decode_mbu", lambda s: s["decode_mbu"]),
        ("prefix_cache_hit_rate", lambda s: s["prefix_cache_hit_rate"]),
    ):
        x = [value(s) for s in summary["repetitions"]]
        mean = sum(x) / 3
        stdev = math.sqrt(sum((v - mean) ** 2 for v in x) / 2)
        assert summary["spread"][name] == pytest.approx(
            {"mean": mean, "stdev": stdev, "cv": stdev / mean}, rel=1e-12
        ), name
    cv = summary["spread"]
    assert (
        f"3 repetitions: TPOT p50 cv {cv['tpot_ms.p50']['cv']:.1%}, decode MBU cv "
        f"{cv['decode_mbu']['cv']:.1%}, output tok/s cv {cv['output_tok_per_s']['cv']:.1%}"
    ) in stdout.splitlines()
    md = (out / "report.md").read_text()
    assert "## Repetitions" in md
    assert f"| cv |  | {cv['output_tok_per_s']['cv']:.1%} |" in md
    html = (out / "report.html").read_text()
    assert "<h2>Repetitions</h2>" in html and "<td>3</td>" in html


def test_a_repetition_does_not_hit_the_cache_on_the_one_before(three):
    """Repetition 2's texts are its own: its first request finds in the prefix cache only what
    repetition 1's first request found there (the shared system prompt + tool schemas, cached by
    the warm-up), not repetition 1's own task text."""
    out, _ = three
    requests = read_requests(out)

    def first(k: int):
        return min((r for r in requests if r.repetition == k), key=lambda r: r.sent_ns)

    assert first(1).session_id == "s0" and first(2).session_id == "rep2-s0"
    assert first(1).cached_tokens > 0
    assert first(2).cached_tokens == first(1).cached_tokens == first(3).cached_tokens
    # Had repetition 2 replayed repetition 1's texts, each of its first turns would find its
    # whole prompt but the last block cached, not just the shared prefix.
    for k in (2, 3):
        firsts = [r for r in requests if r.repetition == k and r.turn == 0]
        assert all(r.cached_tokens == first(1).cached_tokens for r in firsts)
