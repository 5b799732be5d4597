"""The printed summary's header, server-vs-client block and warnings, on hand-built results."""

from __future__ import annotations

import dataclasses

from llmbench.harness import results
from llmbench.harness.metrics import distribution
from llmbench.harness.results import Device
from llmbench.harness.summary_lines import server_client_lines, warning_lines, what_ran
from tests.harness.test_results import a_result


def remote(weights: str | None, hardware: str | None) -> dict:
    """a_result() as an openai run against a server at a URL."""
    result = a_result()
    provenance = dataclasses.replace(
        result.provenance,
        backend="openai",
        device=Device("remote", url="http://10.0.0.2:8000/v1"),
        dtype="bfloat16",
    )
    roofline = dataclasses.replace(result.roofline, is_estimated=True, weights=weights)
    spec = {"backend": {"kind": "openai", "hardware": hardware}}
    return results.to_dict(
        dataclasses.replace(result, provenance=provenance, roofline=roofline, spec=spec)
    )


def test_what_ran_here_names_dtype_and_device():
    assert what_ran(results.to_dict(a_result())) == "engine synthetic:tiny float32 on AMD EPYC"


def test_what_ran_on_a_server_never_names_a_dtype_or_hardware_it_does_not_know():
    # Before: "openai smollm2-135m bfloat16 on ?" although the server ran Q4_1 on a CPU.
    assert what_ran(remote(None, None)) == (
        "openai synthetic:tiny weights ? at http://10.0.0.2:8000/v1 on server hardware unknown"
    )
    assert what_ran(remote("q4_1", "h100-sxm")) == (
        "openai synthetic:tiny weights q4_1 at http://10.0.0.2:8000/v1 on h100-sxm"
    )
    assert what_ran(remote("0.6 bytes/param", "measured")).endswith(
        "weights 0.6 bytes/param at http://10.0.0.2:8000/v1 on this machine (AMD EPYC)"
    )


def test_server_client_block_by_hand():
    summary = {
        "ttft_from_send_ms": distribution([100.0, 120.0]),
        "server_prompt_ms": distribution([90.0, 100.0]),
        "ttft_overhead_ms": distribution([10.0, 20.0]),
        "tpot_ms": distribution([20.0]),
        "server_decode_ms_per_token": None,
        "tpot_overhead_ms": None,
    }
    assert server_client_lines(summary) == [
        "server vs client (ms)          p50       p90       p99",
        "TTFT from send               110.0     118.0     119.8",
        "  server prompt               95.0      99.0      99.9",
        "  overhead                    15.0      19.0      19.9",
        "TPOT                          20.0      20.0      20.0",
        "  server decode                  -         -         -",
        "  overhead                       -         -         -",
    ]
    no_timings = {**summary, "server_prompt_ms": None, "ttft_overhead_ms": None}
    assert server_client_lines(no_timings) == []


def test_warning_lines():
    assert warning_lines({"warnings": ["a", "b"]}) == ["WARNING: a", "WARNING: b"]
    assert warning_lines({}) == []  # a result written before summary.warnings
