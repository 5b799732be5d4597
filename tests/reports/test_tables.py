"""Formatted cells shared by report.html and report.md: numbers with SI prefixes, roofs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from llmbench.reports import tables
from llmbench.reports.rundata import RunData


@pytest.mark.parametrize(
    "value, unit, text",
    [
        (1234, "", "1.23k"),
        (2.5e12, "FLOP/s", "2.5TFLOP/s"),
        (18.2e9, "B/s", "18.2GB/s"),
        (0.5, "", "0.5"),
        (0, "", "0"),
        (999, "", "999"),
        (2.5e-5, "s", "2.50e-05s"),
    ],
)
def test_si_prefixes(value, unit, text):
    assert tables.si(value, unit) == text


def _run(roofline: dict) -> RunData:
    given = {"folder": Path("."), "results": {"roofline": roofline}}
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def test_roofs_name_each_roof_and_a_matmul_rate_not_measured():
    roofline = {
        "dtype": "bfloat16",
        "roofs": {"label": "measured X", "read_bytes_per_s": 19e9, "flops_per_s": None},
        "datasheet_roofs": {
            "label": "datasheet Y",
            "read_bytes_per_s": 3.35e12,
            "flops_per_s": 989e12,
        },
    }
    assert tables.roofs(_run(roofline)) == [
        ("measured X", "19GB/s read, (not measured) bfloat16 matmul"),
        ("datasheet Y", "3.35TB/s read, 989TFLOP/s bfloat16 matmul"),
    ]


def _summary_run(summary: dict) -> RunData:
    given = {"folder": Path("."), "results": {"summary": summary}}
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def test_repetition_rows_one_per_repetition_then_mean_and_cv():
    def alone(k: int, tpot: float, mbu: float | None, is_partial: bool = False) -> dict:
        return {
            "repetition": k,
            "is_partial": is_partial,
            "num_completed": 10 + k,
            "output_tok_per_s": 30.0 + k,
            "ttft_ms": {"p50": 700.0},
            "tpot_ms": {"p50": tpot, "p99": 2 * tpot},
            "decode_mbu": mbu,
            "prefill_mfu": 0.2,
            "prefix_cache_hit_rate": 0.875,
        }

    repetitions = [alone(1, 60.0, 0.15), alone(2, 66.0, 0.16), alone(3, 70.0, None, True)]
    spread = {
        "output_tok_per_s": {"mean": 31.5, "stdev": 0.7071, "cv": 0.02245},
        "tpot_ms.p50": {"mean": 63.0, "stdev": 4.2426, "cv": 0.06734},
        "decode_mbu": {"mean": 0.155, "stdev": 0.00707, "cv": 0.04562},
    }
    rows = tables.repetition_rows(_summary_run({"repetitions": repetitions, "spread": spread}))
    assert len(tables.REPETITION_HEADER) == len(rows[0]) == 9
    assert rows == [
        ["1", "11", "31.0", "700.0", "60.0", "120.0", "0.15", "0.20", "0.88"],
        ["2", "12", "32.0", "700.0", "66.0", "132.0", "0.16", "0.20", "0.88"],
        ["3 (partial)", "13", "33.0", "700.0", "70.0", "140.0", "-", "0.20", "0.88"],
        ["mean", "", "31.5", "-", "63.0", "-", "0.15", "-", "-"],  # what the spread has
        ["cv", "", "2.2%", "-", "6.7%", "-", "4.6%", "-", "-"],
    ]
    # One repetition: nothing to show (the rest of the report is the run).
    assert tables.repetition_rows(_summary_run({"repetitions": repetitions[:1]})) == []
    assert tables.repetition_rows(_summary_run({})) == []


def _results_run(results: dict) -> RunData:
    given = {"folder": Path("."), "results": results}
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def _failed(num_completed: int, num_failed: int, **summary) -> dict:
    return {
        "num_completed": num_completed,
        "num_failed": num_failed,
        "failed_fraction": num_failed / (num_completed + num_failed),
        "failure_reasons": {"HTTP 400: (empty body)": num_failed},
        **summary,
    }


def test_a_failure_banner_above_the_spec_fraction_only():
    everything = _results_run({"summary": _failed(0, 6), "spec": {}})
    assert tables.failure_banner(everything) == (
        "all 6 measured requests failed; most common error (6 of 6): HTTP 400: (empty body)"
    )
    some = _failed(9, 1)  # 10%
    assert tables.failure_banner(_results_run({"summary": some, "spec": {}})) is not None
    lenient = {"summary": some, "spec": {"max_failed_fraction": 0.2}}
    assert tables.failure_banner(_results_run(lenient)) is None


def test_warnings_are_the_summarys_the_banner_said_once():
    banner = "all 6 measured requests failed; most common error (6 of 6): HTTP 400: (empty body)"
    summary = _failed(0, 6, warnings=[banner, "the server reports no usage: x"])
    run = _results_run({"summary": summary, "spec": {}, "interrupted": True, "provenance": {}})
    assert tables.warnings(run) == [
        "The run was interrupted: these are partial results.",
        "The server reports no usage: x.",
    ]


def test_warnings_of_a_result_from_before_summary_warnings():
    summary = {"num_failed": 2, "machine_busy": True, "token_count_mismatches": 1}
    provenance = {"machine_load": {"other_processes_cores": 0.9, "cpu_count": 2}}
    run = _results_run({"summary": summary, "provenance": provenance})
    assert tables.warnings(run) == [
        "The machine was busy: other processes used 0.9 cores during the run (of 2); the "
        "numbers are pessimistic.",
        "2 requests failed; latencies are over completed ones.",
        "1 requests: the server counted a different number of prompt tokens than the client "
        "tokenizer.",
    ]


def test_server_client_rows_by_hand():
    from llmbench.harness.metrics import distribution

    summary = {
        "ttft_from_send_ms": distribution([100.0, 120.0]),
        "server_prompt_ms": distribution([90.0, 100.0]),
        "ttft_overhead_ms": distribution([10.0, 20.0]),
        "tpot_ms": distribution([20.0]),
        "server_decode_ms_per_token": None,
        "tpot_overhead_ms": None,
    }
    rows = tables.server_client_rows(_summary_run(summary))
    assert len(tables.SERVER_CLIENT_HEADER) == len(rows[0]) == 7
    assert rows[:3] == [
        ["TTFT from send (ttft_from_send_ms)", "110.0", "110.0", "118.0", "119.0", "119.8", "2"],
        ["server prompt (server_prompt_ms)", "95.0", "95.0", "99.0", "99.5", "99.9", "2"],
        ["overhead (ttft_overhead_ms)", "15.0", "15.0", "19.0", "19.5", "19.9", "2"],
    ]
    assert rows[4] == ["server decode (server_decode_ms_per_token)", *["-"] * 5, "0"]
    assert tables.server_client_rows(_summary_run({"tpot_ms": summary["tpot_ms"]})) == []


def test_the_model_row_never_names_a_dtype_a_server_did_not_say():
    engine = {"provenance": {"model": "m", "dtype": "float32", "device": {"type": "cpu"}}}
    assert dict(tables.provenance_rows(_results_run(engine)))["model"] == "m (float32)"
    server = {
        "provenance": {"model": "m", "dtype": "bfloat16", "device": {"type": "remote"}},
        "roofline": {"weights": None},
    }
    assert dict(tables.provenance_rows(_results_run(server)))["model"] == "m (weights ?)"
    server["roofline"]["weights"] = "q4_1"
    assert dict(tables.provenance_rows(_results_run(server)))["model"] == "m (weights q4_1)"


def test_the_device_row_leaves_out_what_the_device_does_not_have():
    """An engine run has no url ("url: None" ended the line), a server no name or threads."""
    engine = {"type": "cpu", "name": "EPYC", "threads": 2, "kernels": "torch", "url": None}
    server = {
        "type": "remote",
        "name": None,
        "threads": None,
        "kernels": None,
        "url": "http://h/v1",
    }
    rows = [
        dict(tables.provenance_rows(_results_run({"provenance": {"device": device}})))["device"]
        for device in (engine, server)
    ]
    assert rows == [
        "type: cpu, name: EPYC, threads: 2, kernels: torch",
        "type: remote, url: http://h/v1",
    ]


def test_speculative_rows_by_hand():
    block = {
        "num_proposed_tokens": 1200,
        "num_accepted_tokens": 900,
        "acceptance_rate": 0.75,
        "num_verifies": 300,
        "mean_accepted_per_verify": 3.0,
        "mean_tokens_per_verify": 4.0,
        "draft_s": 0.5,
        "verify_s": 2.25,
        "draft_fraction": 0.125,
        "draft_flops": 2.5e12,
        "draft_bytes": 4.0e9,
    }
    speculative = {"method": "draft", "num_tokens": 4, "draft_model": "self:layers=8"}
    results = {
        "summary": {"speculative": block},
        "spec": {"engine": {"speculative": speculative}},
    }
    assert tables.speculative_rows(_results_run(results)) == [
        ("method", "draft (self:layers=8), k=4 draft tokens a step"),
        ("draft tokens accepted", "900 of 1,200 (75.0%)"),
        ("per verify", "3.00 drafts accepted, 4.00 tokens made (300 verifies)"),
        ("time", "drafting 0.50 s, verifying 2.25 s; drafting 12.5% of the step time"),
        ("draft model cost", "2.5TFLOP, 4GB moved"),
    ]
    ngram = {"method": "ngram", "num_tokens": 3, "ngram_min": 2, "ngram_max": 4}
    results = {
        "summary": {"speculative": {**block, "draft_flops": 0.0, "draft_bytes": 0.0}},
        "spec": {"engine": {"speculative": ngram}},
    }
    rows = tables.speculative_rows(_results_run(results))
    assert rows[0] == ("method", "ngram (n 4 down to 2), k=3 draft tokens a step")
    assert len(rows) == 4  # no draft model: no draft cost row
    # The adaptive budget: k a most, and the drafts it withheld beside those verified.
    results["spec"]["engine"]["speculative"] = {**ngram, "adaptive": True}
    results["summary"]["speculative"]["num_withheld_tokens"] = 2345
    rows = tables.speculative_rows(_results_run(results))
    assert rows[:2] == [
        (
            "method",
            "ngram (n 4 down to 2), k=3 draft tokens a step, fewer where not worth their cost "
            "(adaptive)",
        ),
        (
            "draft tokens accepted",
            "900 of 1,200 (75.0%); 2,345 more withheld as not worth their cost",
        ),
    ]
    # Speculation off: `summary.speculative` is null, and no section.
    assert tables.speculative_rows(_results_run({"summary": {"speculative": None}})) == []
