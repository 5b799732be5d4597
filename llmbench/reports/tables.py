"""The numbers both reports show, as rows of formatted cells: one source for HTML and Markdown."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from llmbench.harness import capacity, failures, metrics, summary_lines
from llmbench.harness.spread import metric_value
from llmbench.reports.rundata import RunData

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
QUANTILES = ("mean", "p50", "p90", "p95", "p99", "max")


def si(value: float, unit: str = "") -> str:
    """1234 → '1.23k', 2.5e12 → '2.5T' (three significant digits), with an optional unit."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}{unit}"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}{unit}"
    if abs(value) >= 1e-3 or unit == "":
        return f"{value:.3g}{unit}"
    return f"{value:.2e}{unit}"


def num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def headline(run: RunData) -> list[tuple[str, str]]:
    """(label, value) of the summary cards."""
    s = run.summary
    cards = [
        ("requests", f"{s['num_completed']} ok, {s['num_failed']} failed"),
        ("duration", f"{num(s['duration_s'])} s"),
        ("output tokens/s", num(s["output_tok_per_s"])),
        ("requests/s", num(s["request_per_s"], 2)),
        ("TTFT p50 / p99", f"{num(s['ttft_ms']['p50'])} / {num(s['ttft_ms']['p99'])} ms"),
        ("TPOT p50 / p99", f"{num(s['tpot_ms']['p50'])} / {num(s['tpot_ms']['p99'])} ms"),
        ("ITL p99", f"{num(s['itl_ms']['p99'])} ms"),
    ]
    if run.results.get("spec", {}).get("slo"):
        cards.append(
            (
                "goodput",
                f"{num(s['goodput_request_per_s'], 2)} req/s "
                f"({ratio(s['goodput_fraction'])} of requests)",
            )
        )
    estimated = " (est.)" if s.get("roofline_is_estimated") else ""
    if "decode_mbu" in s:
        cards.append(("decode MBU" + estimated, ratio(s["decode_mbu"])))
    if "prefill_mfu" in s:
        cards.append(("prefill MFU" + estimated, ratio(s["prefill_mfu"])))
    cards.append(("prefix-cache hit rate", ratio(s.get("prefix_cache_hit_rate"))))
    cards += quality_cards(s.get("quality"))
    return cards


def quality_cards(quality: dict | None) -> list[tuple[str, str]]:
    """The run's configuration against the unquantised model (`summary.quality`), beside its
    speed: perplexity (the reference's), mean KL, top-1 and greedy agreement."""
    if not quality:
        return []
    reference, row = quality["rows"][0], quality["rows"][-1]
    kv = row["kv_cache_dtype"]
    config = f"weights {row['weights'] or 'as loaded'}, kv " + (
        kv["k"] if kv["k"] == kv["v"] else f"k={kv['k']},v={kv['v']}"
    )
    greedy = row["greedy_agreement"]
    return [
        (
            f"perplexity ({config})",
            f"{row['perplexity']:.3f} (unquantised {reference['perplexity']:.3f})",
        ),
        (
            "vs unquantised: KL / top-1 / greedy",
            f"{row['mean_kl']:.4f} / {row['top1_agreement']:.3f} / "
            + ("-" if greedy is None else f"{greedy:.3f}"),
        ),
    ]


def what_ran(run: RunData) -> str:
    """The page's subtitle: what ran (a server's weights and hardware as far as they are
    known) and the git commit."""
    return f"{summary_lines.what_ran(run.results)} · git {run.provenance.get('git_sha') or '-'}"


def failure_banner(run: RunData) -> str | None:
    """The run's failures, when every measured request failed or more than the spec's
    `max_failed_fraction` did: the page says so first, loudly. None otherwise."""
    spec = run.results.get("spec", {})
    limit = spec.get("max_failed_fraction", failures.DEFAULT_MAX_FAILED_FRACTION)
    if not failures.is_failed_fraction_high(run.summary, limit):
        return None
    return failures.failure_line(run.summary, limit)


def sentence(line: str) -> str:
    """A warning line as a page shows it: capitalised, ending in a full stop."""
    return line[:1].upper() + line[1:] + ("" if line.endswith(".") else ".")


# How `run_warnings.busy_line` starts the line it adds to `summary.warnings`.
BUSY_LINE_START = "the machine was busy:"


def busy_warning(run: RunData) -> str | None:
    """The run's busy-machine warning as every page shows it (`summary.machine_busy`): the line
    of `summary.warnings`, or for a result from before them the load it recorded. None when
    the machine was quiet."""
    s = run.summary
    if not s.get("machine_busy"):
        return None
    line = next((w for w in s.get("warnings", ()) if w.startswith(BUSY_LINE_START)), None)
    if line is not None:
        return sentence(line)
    load = run.provenance.get("machine_load", {})
    return (
        f"The machine was busy: other processes used {load.get('other_processes_cores')} "
        f"cores during the run (of {load.get('cpu_count')}); the numbers are pessimistic."
    )


def busy_warnings(runs: Sequence[tuple[str, RunData | None]]) -> list[str]:
    """The busy-machine warning of each named run of a page of several (sweep points,
    variants), prefixed by its name: "point-4: The machine was busy: ..."."""
    found = [(name, busy_warning(run)) for name, run in runs if run is not None]
    return [f"{name}: {line}" for name, line in found if line is not None]


def warnings(run: RunData) -> list[str]:
    """What makes the numbers less than clean, in words: `summary.warnings` (the failure
    banner's line aside), whether the run was interrupted and whether its roofline is
    estimated. A result written before `summary.warnings` gets the warnings it can still say."""
    out = []
    s = run.summary
    if run.results.get("interrupted"):
        out.append("The run was interrupted: these are partial results.")
    if "warnings" in s:
        banner = failure_banner(run)
        out += [sentence(line) for line in s["warnings"] if line != banner]
    else:
        busy = busy_warning(run)
        if busy is not None:
            out.append(busy)
        if s["num_failed"]:
            out.append(f"{s['num_failed']} requests failed; latencies are over completed ones.")
        if s.get("token_count_mismatches"):
            out.append(
                f"{s['token_count_mismatches']} requests: the server counted a different number "
                "of prompt tokens than the client tokenizer."
            )
    if s.get("roofline_is_estimated"):
        out.append(
            "The roofline is estimated from the client (a remote server's steps are not "
            "visible): a step per inter-token gap, batch = streams decoding."
        )
    return out


def latency_rows(run: RunData) -> list[list[str]]:
    rows = []
    for name in LATENCIES:
        d = run.summary[name]
        rows.append([name, *(num(d[q]) for q in QUANTILES), str(d.get("count", "-"))])
    return rows


SERVER_CLIENT_HEADER = ("ms", *QUANTILES[:-1], "count")
SERVER_CLIENT_NOTE = (
    "The server's own timings beside the client's, per request: server prompt and decode are "
    "what the server reported; an overhead is the client's number minus the server's on the "
    "same request (HTTP, templating, tokenization, sending, the network, the client's parsing). "
    "Its percentiles are over those differences, not differences of the percentiles above it."
)


def server_client_rows(run: RunData) -> list[list[str]]:
    """The client's TTFT and TPOT beside the server's prompt and decode times and the
    overheads between them; no rows when the server reported no timings."""
    s = run.summary
    if all(s.get(key) is None for key in metrics.SERVER_TIMINGS):
        return []
    rows = []
    for label, key in summary_lines.SERVER_CLIENT_ROWS:
        d = s.get(key) or {}
        rows.append(
            [
                f"{label.strip()} ({key})",
                *(num(d.get(q)) for q in QUANTILES[:-1]),
                str(d.get("count", 0)),
            ]
        )
    return rows


ENDPOINT_HEADER = (
    "endpoint",
    "requests",
    "failed",
    "in flight",
    "prefix-cache hit rate",
    "TTFT p50 ms",
    "TPOT p50 ms",
)


def endpoint_note(run: RunData) -> str:
    """The routing policy and the imbalance, above the endpoint table."""
    policy = (run.results.get("spec", {}).get("routing") or {}).get("policy", "?")
    imbalance = run.summary.get("endpoint_imbalance")
    return (
        f"Routed by {policy}. Imbalance {num(imbalance, 2)}: max / mean requests in flight over "
        "the endpoints (1 is even). In flight: the endpoint's requests' time from send to end "
        "over the run's window."
    )


def endpoint_rows(run: RunData) -> list[list[str]]:
    """One row per endpoint of a routed run (`backend.urls`); none otherwise."""
    spec = run.results.get("spec", {})
    rows = []
    for e in run.summary.get("endpoints") or []:
        rows.append(
            [
                summary_lines.endpoint_url(spec, e["endpoint"]),
                str(e["requests"]),
                str(e["failed"]),
                num(e["mean_in_flight"], 2),
                ratio(e["prefix_cache_hit_rate"]),
                num(e["ttft_ms_p50"]),
                num(e["tpot_ms_p50"]),
            ]
        )
    return rows


def cost_rows(run: RunData) -> list[tuple[str, str]]:
    """A priced run's bill (`summary.cost`) and its tokens on a machine by the hour
    (`summary.self_hosted`) as label/value pairs; none without a price sheet or a machine
    price."""
    return _bill_rows(run.summary.get("cost")) + _self_hosted_rows(run.summary.get("self_hosted"))


def money(value: float | None, unit: str) -> str:
    """An amount of `unit` to 4 decimals ("0.0118 USD"); "-" when there is none."""
    return "-" if value is None else f"{value:.4f} {unit}"


def _self_hosted_rows(hosted: dict | None) -> list[tuple[str, str]]:
    if not hosted:
        return []
    unit = hosted["currency"]
    rows = [
        ("machine price", f"{hosted['price_per_hour']:g} {unit} an hour"),
        (
            "self-hosted, per million tokens",
            f"{money(hosted['per_million_output_tokens'], unit)} output, "
            f"{money(hosted['per_million_tokens'], unit)} in and out (at this run's throughput)",
        ),
        ("self-hosted, this run's window", money(hosted["run_total"], unit)),
    ]
    api = hosted["api_per_million_output_tokens"]
    if api is not None:
        rows.append(
            ("the price sheet, per million output tokens (input included)", money(api, unit))
        )
    return rows


def _bill_rows(cost: dict | None) -> list[tuple[str, str]]:
    if not cost:
        return []
    unit = cost["currency"]
    writes = "cache write" if cost["writes_uncached_to_cache"] else "input"
    return [
        ("price sheet", cost["sheet"]),
        ("total", f"{money(cost['total'], unit)} for {cost['num_billed']} completed requests"),
        ("with no prompt cache", money(cost["no_cache_total"], unit)),
        ("cache discount", ratio(cost["cache_discount"])),
        (
            "per request, per session",
            f"{money(cost['per_request'], unit)}, {money(cost['per_session'], unit)}",
        ),
        (
            "tokens",
            f"{cost['uncached_tokens']:,} uncached input (priced as {writes}), "
            f"{cost['cache_hit_tokens']:,} cache hits, {cost['reply_tokens']:,} output, "
            f"{cost['reasoning_tokens']:,} reasoning",
        ),
    ]


PHASE_HEADER = ("phase", "steps", "seconds", "bandwidth", "compute", "FLOP/B", "MBU", "MFU")


def phase_rows(run: RunData) -> list[list[str]]:
    """Per-phase roofline numbers: steps, time, achieved bandwidth and FLOP/s, MBU, MFU."""
    roof = run.results.get("roofline") or {}
    rows = []
    for phase in ("decode", "prefill", "mixed"):
        d = roof.get("phases", {}).get(phase)
        if d is None:
            continue
        rows.append(
            [
                phase,
                num(d["num_steps"], 0),
                num(d["seconds"], 2),
                si(d["bytes_per_s"], "B/s"),
                si(d["flops_per_s"], "FLOP/s"),
                "-" if d["arithmetic_intensity"] is None else f"{d['arithmetic_intensity']:.3g}",
                ratio(d["mbu"]),
                ratio(d["mfu"]),
            ]
        )
    return rows


def roofs(run: RunData) -> list[tuple[str, str]]:
    """The roofs the run is placed under, with where they come from."""
    roof = run.results.get("roofline") or {}
    out = []
    dtype = roof.get("dtype", "")
    for r in (roof.get("roofs"), roof.get("datasheet_roofs")):
        if not r:
            continue
        flops = si(r["flops_per_s"], "FLOP/s") if r["flops_per_s"] else "(not measured)"
        out.append((r["label"], f"{si(r['read_bytes_per_s'], 'B/s')} read, {flops} {dtype} matmul"))
    return out


SLO_HEADER = ("SLO", "limit", "met", "share")


def slo_rows(run: RunData) -> list[list[str]]:
    """Each SLO alone: its limit and the share of measured requests that met it."""
    slo = run.results.get("spec", {}).get("slo") or {}
    rows = []
    for name, limit in slo.items():
        met = sum(metrics.is_slo_met(r, {name: limit}) for r in run.requests)
        share = met / len(run.requests) if run.requests else None
        rows.append([name, f"<= {limit:g} ms", f"{met} / {len(run.requests)}", ratio(share)])
    return rows


def session_rows(run: RunData) -> list[tuple[str, str]]:
    s = run.summary.get("sessions") or {}
    if not s.get("num_sessions"):
        return []
    return [
        ("sessions", f"{s['num_sessions']} ({s['num_failed_sessions']} with a failed request)"),
        ("mean session time", f"{num(s['mean_session_s'], 2)} s"),
        ("waiting on the model", f"{num(s['mean_model_wait_s'], 2)} s per session"),
        ("waiting on tools / the user", f"{num(s['mean_tool_wait_s'], 2)} s per session"),
        ("requests per session", num(s["mean_requests_per_session"], 1)),
        ("prefix-cache hit rate", ratio(s.get("prefix_cache_hit_rate"))),
    ]


def _model(run: RunData) -> str:
    """The model and how its weights are stored: the engine's dtype, a server's `weights`
    ("?" when unknown)."""
    p = run.provenance
    if p.get("device", {}).get("type") != "remote":
        return f"{p.get('model')} ({p.get('dtype')})"
    weights = (run.results.get("roofline") or {}).get("weights") or "?"
    return f"{p.get('model')} (weights {weights})"


def provenance_rows(run: RunData) -> list[tuple[str, str]]:
    p = run.provenance
    device = p.get("device", {})
    versions = ", ".join(f"{k} {v}" for k, v in p.get("versions", {}).items() if v)
    rows: list[tuple[str, Any]] = [
        ("model", _model(run)),
        ("backend", p.get("backend")),
        # What it has: an engine's device has no url, a server's no name, threads or kernels.
        ("device", ", ".join(f"{k}: {v}" for k, v in device.items() if v is not None)),
        ("git sha", p.get("git_sha") or "-"),
        ("versions", versions),
        ("spec hash / workload hash", f"{p.get('spec_hash')} / {p.get('workload_hash')}"),
        ("seed", p.get("seed")),
        ("host", f"{p.get('host')} ({p.get('platform')})"),
    ]
    kv = p.get("kv_cache")
    if kv:
        rows.append(
            (
                "kv cache",
                f"keys {kv['k_dtype']}, values {kv['v_dtype']}: {kv['kv_bytes_per_token']:,} "
                f"B/token, {kv['kv_cache_tokens']:,} tokens in {si(kv['kv_cache_bytes'], 'B')}",
            )
        )
    hw = p.get("hardware")
    if hw:
        flops = ", ".join(f"{k} {si(v, 'FLOP/s')}" for k, v in hw["matmul_flops_per_s"].items())
        rows.append(
            (
                "measured ceilings",
                f"{hw['device']}, {hw['threads']} threads: copy "
                f"{si(hw['copy_bytes_per_s'], 'B/s')}, read "
                f"{si(hw['read_bytes_per_s'], 'B/s')}; matmul {flops}",
            )
        )
    load = p.get("machine_load")
    if load:
        rows.append(("machine load", ", ".join(f"{k} {v}" for k, v in load.items())))
    telemetry = run.results.get("telemetry") or {}
    if telemetry.get("notes"):
        rows.append(("telemetry", "; ".join(telemetry["notes"])))
    return [(k, str(v)) for k, v in rows]


# The repetitions table: (column, spread metric or None, how a value is shown).
_REPETITION_COLUMNS = (
    ("output tok/s", "output_tok_per_s", num),
    ("TTFT p50 (ms)", "ttft_ms.p50", num),
    ("TPOT p50 (ms)", "tpot_ms.p50", num),
    ("TPOT p99 (ms)", "tpot_ms.p99", num),
    ("decode MBU", "decode_mbu", ratio),
    ("prefill MFU", "prefill_mfu", ratio),
    ("prefix-cache hit rate", "prefix_cache_hit_rate", ratio),
)
REPETITION_HEADER = ("repetition", "requests", *(c[0] for c in _REPETITION_COLUMNS))
REPETITION_NOTE = (
    "The numbers above pool every repetition; each row here is one repetition alone. mean and "
    "cv (stdev / mean, stdev with n - 1) are over the whole repetitions: how much the same "
    "workload moves from one measurement to the next."
)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def repetition_rows(run: RunData) -> list[list[str]]:
    """A row per repetition (its own summary), then the mean and the coefficient of variation
    between the whole repetitions (`summary.spread`); no rows for a run of one repetition."""
    s = run.summary
    repetitions = s.get("repetitions") or []
    if len(repetitions) < 2:
        return []
    rows = [
        [
            f"{r['repetition']}{' (partial)' if r['is_partial'] else ''}",
            str(r["num_completed"]),
            *(show(metric_value(r, name)) for _, name, show in _REPETITION_COLUMNS),
        ]
        for r in repetitions
    ]
    spread = s.get("spread") or {}
    for statistic, show_all in (("mean", None), ("cv", percent)):
        rows.append(
            [
                statistic,
                "",
                *(
                    (show_all or show)((spread.get(name) or {}).get(statistic))
                    for _, name, show in _REPETITION_COLUMNS
                ),
            ]
        )
    return rows


SWEEP_HEADER = (
    "point",
    "output tok/s",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "decode MBU",
)
# With SLOs (`spec.slo`): the requests a second that met every one, and their share.
SLO_HEADER = ("goodput req/s", "SLOs met")


def _has_slos(points: list[RunData]) -> bool:
    """Whether the sweep has SLOs (every point runs the same spec but for its load)."""
    return bool(points) and bool(capacity.slo_limits(points[0].result))


def sweep_header(points: list[RunData]) -> tuple[str, ...]:
    return SWEEP_HEADER + (SLO_HEADER if _has_slos(points) else ())


def sweep_rows(points: list[RunData]) -> list[list[str]]:
    """A row per sweep point: its load value, throughput, latency percentiles, decode MBU, and
    with SLOs its goodput and the share of requests that met them (`sweep_header`)."""
    with_slo = _has_slos(points)
    rows = []
    for run in points:
        s = run.summary
        row = [
            f"{run.results.get('sweep_point'):g}",
            num(s["output_tok_per_s"]),
            num(s["ttft_ms"]["p50"]),
            num(s["ttft_ms"]["p99"]),
            num(s["tpot_ms"]["p50"]),
            num(s["tpot_ms"]["p99"]),
            ratio(s.get("decode_mbu")),
        ]
        if with_slo:
            row += [num(s.get("goodput_request_per_s"), 2), percent(s.get("goodput_fraction"))]
        rows.append(row)
    return rows


def sweep_capacity(points: list[RunData]) -> str | None:
    """The sweep's line on the highest load that met its SLOs (`capacity.capacity_line`)."""
    return capacity.capacity_line([run.result for run in points])


def speculative_rows(run: RunData) -> list[tuple[str, str]]:
    """Speculative decoding over the run (`summary.speculative`): how it drafted, the drafts
    accepted, tokens per verify, the time split between drafting and verifying, and what a
    verify step costs against a decode step; [] when no step drafted."""
    block = run.summary.get("speculative")
    if not block:
        return []
    spec = ((run.results.get("spec") or {}).get("engine") or {}).get("speculative") or {}
    method = spec.get("method", "?")
    if method == "ngram":
        method += f" (n {spec.get('ngram_max')} down to {spec.get('ngram_min')})"
    elif method == "draft":
        method += f" ({spec.get('draft_model')})"
    adaptive = ", fewer where not worth their cost (adaptive)" if spec.get("adaptive") else ""
    withheld = block.get("num_withheld_tokens", 0)
    rows = [
        ("method", f"{method}, k={spec.get('num_tokens', '?')} draft tokens a step{adaptive}"),
        (
            "draft tokens accepted",
            f"{block['num_accepted_tokens']:,} of {block['num_proposed_tokens']:,} "
            f"({percent(block.get('acceptance_rate'))})"
            + (f"; {withheld:,} more withheld as not worth their cost" if withheld else ""),
        ),
        (
            "per verify",
            f"{ratio(block.get('mean_accepted_per_verify'))} drafts accepted, "
            f"{ratio(block.get('mean_tokens_per_verify'))} tokens made "
            f"({block['num_verifies']:,} verifies)",
        ),
        (
            "time",
            f"drafting {num(block.get('draft_s'), 2)} s, verifying {num(block.get('verify_s'), 2)}"
            f" s; drafting {percent(block.get('draft_fraction'))} of the step time",
        ),
    ]
    if block.get("verify_over_decode") is not None:
        rows.append(
            (
                "verify step",
                f"{ratio(block['verify_over_decode'])}x a decode step of as many sequences "
                f"(median {num(block.get('verify_step_ms'), 1)} ms against "
                f"{num(block.get('decode_step_ms'), 1)} ms)",
            )
        )
    if block.get("draft_flops") or block.get("draft_bytes"):
        rows.append(
            (
                "draft model cost",
                f"{si(block.get('draft_flops') or 0.0, 'FLOP')}, "
                f"{si(block.get('draft_bytes') or 0.0, 'B')} moved",
            )
        )
    return rows


def expert_rows(run: RunData) -> list[tuple[str, str]]:
    """A mixture of experts' routing in numbers: its shape, the tokens routed per phase, the
    summary's MoE keys; [] for a dense model."""
    s, experts = run.summary, run.experts or {}
    rows = []
    if experts:
        rows.append(
            (
                "experts",
                f"{experts['num_experts']} per layer, top-{experts['top_k']}, "
                f"{experts['num_layers']} layers",
            )
        )
        k = experts["top_k"] or 1
        for phase, stats in (experts.get("phases") or {}).items():
            first_layer = (stats.get("tokens") or [[]])[0]
            rows.append((f"{phase} tokens routed", f"{sum(first_layer) / k:,.0f} (per layer)"))
    if "moe_decode_experts_touched" in s:
        of = f" of {experts['num_experts']}" if experts else ""
        rows.append(
            (
                "experts a decode step reads",
                f"{s['moe_decode_experts_touched']:.2f}{of} per layer (mean over decode steps)",
            )
        )
    if "moe_load_max_over_mean" in s:
        rows.append(
            (
                "load imbalance",
                f"{s['moe_load_max_over_mean']:.2f} max / mean tokens per expert (mean over "
                "steps; 1 = even)",
            )
        )
    return rows
