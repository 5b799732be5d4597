"""Lines of the summary printed after a run, beside its latency table: the header naming what
ran (never a dtype or a device it does not know), the server-vs-client timing split and the
run's warnings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmbench.harness.metrics import SERVER_TIMINGS

# The server-vs-client block: (label, summary key), the client's number then the server's.
SERVER_CLIENT_ROWS = (
    ("TTFT from send", "ttft_from_send_ms"),
    ("  server prompt", "server_prompt_ms"),
    ("  overhead", "ttft_overhead_ms"),
    ("TPOT", "tpot_ms"),
    ("  server decode", "server_decode_ms_per_token"),
    ("  overhead", "tpot_overhead_ms"),
)
SERVER_CLIENT_QUANTILES = ("p50", "p90", "p99")


def what_ran(results: Mapping[str, Any]) -> str:
    """What ran, from a result as results.json holds it: `<backend> <model> <dtype> on
    <device>` here (`<dtype> weights int8` when the engine quantised them); for a server, its
    URL, how its weights are stored ("weights q4_1", "weights ?" when unknown) and what it runs
    on (`backend.hardware`, or "server hardware unknown")."""
    p = results.get("provenance") or {}
    device = p.get("device") or {}
    if device.get("type") != "remote":
        where = device.get("name") or device.get("type") or "?"
        quantized = f" weights {p['quantize']}" if p.get("quantize") else ""
        return f"{p.get('backend')} {p.get('model')} {p.get('dtype')}{quantized} on {where}"
    weights = (results.get("roofline") or {}).get("weights") or "?"
    hardware = ((results.get("spec") or {}).get("backend") or {}).get("hardware")
    if hardware == "measured":
        where = f"this machine ({(p.get('hardware') or {}).get('device', 'measured')})"
    else:
        where = hardware or "server hardware unknown"
    return (
        f"{p.get('backend')} {p.get('model')} weights {weights} at {device.get('url') or '?'} "
        f"on {where}"
    )


def server_client_lines(summary: Mapping[str, Any]) -> list[str]:
    """The server's own timings beside the client's (p50, p90, p99 in ms), when the server
    reported any; [] otherwise. An overhead is a per-request difference: its percentiles are
    not the differences of the percentiles above it."""
    if all(summary.get(key) is None for key in SERVER_TIMINGS):
        return []
    lines = [
        f"{'server vs client (ms)':<24}" + "".join(f"{q:>10}" for q in SERVER_CLIENT_QUANTILES)
    ]
    for label, key in SERVER_CLIENT_ROWS:
        d = summary.get(key) or {}
        cells = "".join(
            f"{'-':>10}" if d.get(q) is None else f"{d[q]:>10.1f}" for q in SERVER_CLIENT_QUANTILES
        )
        lines.append(f"{label:<24}{cells}")
    return lines


def warning_lines(summary: Mapping[str, Any]) -> list[str]:
    """`summary.warnings`, each as a WARNING line."""
    return [f"WARNING: {line}" for line in summary.get("warnings") or []]
