"""Lines of the summary printed after a run, beside its latency table: the header naming what
ran (never a dtype or a device it does not know), the server-vs-client timing split and the
run's warnings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmbench.harness import client_load
from llmbench.harness.metrics import SERVER_TIMINGS
from llmbench.harness.results import RunResult, to_dict
from llmbench.harness.speculative_stats import format_speculative
from llmbench.harness.spread import metric_value

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


def endpoint_url(spec: Mapping[str, Any], index: int) -> str:
    """The address of endpoint `index` of a routed run's `backend.urls` ("#3" if not listed)."""
    urls = (spec.get("backend") or {}).get("urls") or []
    return urls[index] if index < len(urls) else f"#{index}"


def endpoint_lines(summary: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """A routed run (`backend.urls`): the policy and imbalance, then a line per endpoint."""
    endpoints = summary.get("endpoints")
    if not endpoints:
        return []
    num_urls = len(spec.get("backend", {}).get("urls") or [])
    policy = spec.get("routing", {}).get("policy", "?")
    imbalance = summary.get("endpoint_imbalance")
    lines = [
        f"routing {policy} over {num_urls} endpoints: imbalance {_rate(imbalance, '.2f')} "
        "(max / mean requests in flight)"
    ]
    for e in endpoints:
        url = endpoint_url(spec, e["endpoint"])
        hit, ttft, tpot = e["prefix_cache_hit_rate"], e["ttft_ms_p50"], e["tpot_ms_p50"]
        lines.append(
            f"  {url}: {e['requests']} requests ({e['failed']} failed), "
            f"{_rate(e['mean_in_flight'], '.2f')} in flight, prefix-cache hit rate "
            f"{_rate(hit, '.2f')}, TTFT p50 {_rate(ttft, '.1f')} ms, "
            f"TPOT p50 {_rate(tpot, '.1f')} ms"
        )
    return lines


def cost_lines(summary: Mapping[str, Any]) -> list[str]:
    """A priced run (`prices`): what its tokens cost, and what the cache saved."""
    cost = summary.get("cost")
    if not cost:
        return []
    unit = cost["currency"]
    discount = cost["cache_discount"]
    per_session = cost["per_session"]
    return [
        f"cost ({cost['sheet']}): {cost['total']:.4f} {unit} for {cost['num_billed']} requests"
        f" ({_rate(per_session, '.4f')} a session); with no cache "
        f"{cost['no_cache_total']:.4f} {unit}, a discount of {_rate(discount, '.0%')}"
    ]


def self_hosted_lines(summary: Mapping[str, Any]) -> list[str]:
    """A run with a machine price (`gpu_hour_price`): its tokens at the measured throughput."""
    hosted = summary.get("self_hosted")
    if not hosted:
        return []
    unit = hosted["currency"]
    api = hosted["api_per_million_output_tokens"]
    line = (
        f"self-hosted at {hosted['price_per_hour']:g} {unit}/hour: "
        f"{_rate(hosted['per_million_output_tokens'], '.4f')} {unit} per million output tokens, "
        f"{_rate(hosted['per_million_tokens'], '.4f')} per million tokens in and out, at this "
        f"run's throughput ({hosted['run_total']:.4f} {unit} for its window)"
    )
    if api is not None:
        line += f"; the price sheet: {api:.4f} per million output tokens, input included"
    return [line]


def warning_lines(summary: Mapping[str, Any]) -> list[str]:
    """`summary.warnings`, each as a WARNING line."""
    return [f"WARNING: {line}" for line in summary.get("warnings") or []]


def format_summary(result: RunResult) -> str:
    """The table printed after a run (also what `report.md` will start from)."""
    s = result.summary
    header = (
        f"{result.name}: {what_ran(to_dict(result))} - {s['num_completed']} requests "
        f"completed, {s['num_failed']} failed in {s['duration_s'] or 0:.1f} s"
    )
    lines = [
        header,
        f"{'':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"):
        d = s[name]
        cells = "".join(
            f"{d[k]:>10.1f}" if d[k] is not None else f"{'-':>10}"
            for k in ("mean", "p50", "p90", "p99", "max")
        )
        lines.append(f"{name:<10}{cells}")
    hit = s.get("prefix_cache_hit_rate")
    lines.append(
        f"throughput: {_rate(s['output_tok_per_s'], '.1f')} output tok/s, "
        f"{_rate(s['input_tok_per_s'], '.1f')} input tok/s, {_rate(s['request_per_s'], '.2f')} "
        f"req/s; goodput {_rate(s['goodput_request_per_s'], '.2f')} req/s; "
        f"prefix-cache hit rate {'-' if hit is None else f'{hit:.2f}'}"
    )
    lines += server_client_lines(s)
    lines += endpoint_lines(s, result.spec)
    lines += cost_lines(s)
    lines += self_hosted_lines(s)
    roof = result.roofline
    estimated = ""
    if roof is not None and roof.is_estimated:
        guess = f"; bytes assume {roof.dtype} weights: set backend.weights"
        estimated = f" (estimated from the client{'' if roof.weights else guess})"
    if roof is not None and roof.roofs is not None:
        r = roof.roofs
        mbu, mfu = s.get("decode_mbu"), s.get("prefill_mfu")
        flops = "-" if r.flops_per_s is None else f"{r.flops_per_s / 1e9:.0f}"
        lines.append(
            f"roofline{estimated}: decode MBU {'-' if mbu is None else f'{mbu:.2f}'}, prefill MFU "
            f"{'-' if mfu is None else f'{mfu:.2f}'} against {r.label} "
            f"({r.read_bytes_per_s / 1e9:.1f} GB/s, {flops} GFLOP/s {roof.dtype})"
        )
    elif roof is not None and "decode" in roof.phases:
        lines.append(
            f"roofline{estimated}: decode at {roof.phases['decode'].bytes_per_s / 1e9:.2f} "
            "GB/s achieved (set backend.hardware for MBU/MFU)"
        )
    sessions = s.get("sessions", {})
    if sessions.get("num_sessions"):
        lines.append(
            f"sessions: {sessions['num_sessions']}, mean {sessions['mean_session_s']:.1f} s "
            f"(waiting on the model {sessions['mean_model_wait_s']:.1f} s, on tools "
            f"{sessions['mean_tool_wait_s']:.1f} s)"
        )
    for line in (client_load.summary_line(result.client), client_load.start_line(result.client)):
        if line is not None:
            lines.append(line)
    if s.get("speculative"):
        lines.append(format_speculative(s["speculative"]))
    repetitions = format_repetitions(result)
    if repetitions:
        lines.append(repetitions)
    if result.interrupted:
        lines.append(f"interrupted ({result.stop_reason}): partial results")
    lines += warning_lines(s)
    return "\n".join(lines)


# The spread the summary table shows: (metric, label).
SHOWN_SPREAD = (
    ("tpot_ms.p50", "TPOT p50"),
    ("decode_mbu", "decode MBU"),
    ("output_tok_per_s", "output tok/s"),
)


def format_repetitions(result: RunResult) -> str | None:
    """The summary table's line on repetitions: how many, and the between-repetition cv of a
    few metrics ("3 repetitions: TPOT p50 cv 2.1%, ..."); which ones a stop cut short. None for
    a run of one repetition."""
    s = result.summary
    repetitions = s.get("repetitions") or []
    asked = result.spec.get("repeat", 1)
    if asked <= 1 and len(repetitions) <= 1:
        return None
    spread = s.get("spread") or {}
    cvs = []
    for name, label in SHOWN_SPREAD:
        cv = (spread.get(name) or {}).get("cv")
        if cv is not None or metric_value(s, name) is not None:
            cvs.append(f"{label} cv {'-' if cv is None else f'{cv:.1%}'}")
    partial = [r["repetition"] for r in repetitions if r["is_partial"]]
    if not partial:
        return f"{len(repetitions)} repetitions: " + ", ".join(cvs)
    whole = len(repetitions) - len(partial)
    return (
        f"repetitions: {whole} whole, repetition {partial[0]} of {asked} cut short (its numbers "
        f"are partial); spread over the whole ones: " + ", ".join(cvs)
    )


def _rate(value: float | None, spec: str) -> str:
    """A rate as the table shows it: "-" when there is none (nothing completed)."""
    return "-" if value is None else format(value, spec)
