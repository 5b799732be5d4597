"""The numbers a variants report compares, a row per variant: one source for the HTML page,
report.md and the table `llmbench run` prints at the end. Read from the variants' run folders
alone (`variants.json` and each `variants/<name>/results.json`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbench.harness import variant_index
from llmbench.harness.results import RESULTS_FILE
from llmbench.harness.spread import metric_value
from llmbench.harness.variant_index import VariantEntry, VariantIndex
from llmbench.harness.variants import describe
from llmbench.reports import rundata
from llmbench.reports.rundata import RunData
from llmbench.reports.tables import money, num, percent, ratio


@dataclass(frozen=True)
class VariantRun:
    """A variant as its folder holds it: its index entry and its run (None: no results.json,
    it failed before it measured, or it never started)."""

    entry: VariantEntry
    run: RunData | None

    @property
    def name(self) -> str:
        return self.entry.name


def load(folder: Path) -> tuple[VariantIndex, list[VariantRun]]:
    """A variants folder read back: its index and every variant's run, in the index's order."""
    index = variant_index.read_index(folder)
    runs = []
    for entry in index.variants:
        sub = folder / entry.folder
        run = rundata.load(sub) if (sub / RESULTS_FILE).is_file() else None
        runs.append(VariantRun(entry, run))
    return index, runs


def measured(variants: list[VariantRun]) -> list[VariantRun]:
    """The variants that have results, in order: the first is the reference of the ratios."""
    return [v for v in variants if v.run is not None]


# The speed columns: (header, metric as `spread.metric_value` names it, how a value shows).
SPEED_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("output tok/s", "output_tok_per_s", num),
    ("req/s", "request_per_s", lambda v: num(v, 2)),
    ("TTFT p50 (ms)", "ttft_ms.p50", num),
    ("TTFT p90 (ms)", "ttft_ms.p90", num),
    ("TPOT p50 (ms)", "tpot_ms.p50", num),
    ("TPOT p90 (ms)", "tpot_ms.p90", num),
    ("ITL p50 (ms)", "itl_ms.p50", num),
    ("ITL p90 (ms)", "itl_ms.p90", num),
    ("goodput req/s", "goodput_request_per_s", lambda v: num(v, 2)),
    ("decode MBU", "decode_mbu", ratio),
)
GOODPUT = "goodput_request_per_s"


def _speed_columns(variants: list[VariantRun]) -> list[tuple[str, str, Callable[[Any], str]]]:
    """Goodput only when a variant's spec has SLOs (without one every request is good)."""
    has_slo = any((v.run.results.get("spec") or {}).get("slo") for v in measured(variants))
    return [c for c in SPEED_COLUMNS if c[1] != GOODPUT or has_slo]


def speed_header(variants: list[VariantRun]) -> tuple[str, ...]:
    return ("variant", *(c[0] for c in _speed_columns(variants)))


def speed_rows(variants: list[VariantRun]) -> list[list[str]]:
    """A row per variant with results: throughput, latency percentiles, goodput, decode MBU."""
    columns = _speed_columns(variants)
    return [
        [v.name, *(show(metric_value(v.run.summary, key)) for _, key, show in columns)]
        for v in measured(variants)
    ]


def times(value: float | None, reference: float | None) -> str:
    """`value` against `reference` as a ratio ("1.93x"); "-" when either is missing or the
    reference is 0.

    Formula: ratio = value / reference."""
    if value is None or not reference:
        return "-"
    return f"{value / reference:.2f}x"


def ratio_rows(variants: list[VariantRun]) -> list[list[str]]:
    """The speed columns of every variant divided by the first measured variant's (its row
    all 1.00x); [] with fewer than two measured variants."""
    shown = measured(variants)
    if len(shown) < 2:
        return []
    reference = shown[0].run.summary
    columns = _speed_columns(variants)
    return [
        [
            v.name,
            *(
                times(metric_value(v.run.summary, key), metric_value(reference, key))
                for _, key, _ in columns
            ),
        ]
        for v in shown
    ]


CONFIG_HEADER = (
    "variant",
    "sets",
    "weights",
    "weight B/param",
    "K / V cache",
    "KV B/token",
    "KV tokens held",
)


def config_rows(variants: list[VariantRun]) -> list[list[str]]:
    """What each variant ran: what it sets over the spec, how the weights were stored and
    their bytes per parameter (scales included), the K/V cache's formats, bytes per token and
    the tokens it held."""
    rows = []
    for v in measured(variants):
        p, roof = v.run.provenance, v.run.results.get("roofline") or {}
        kv = p.get("kv_cache") or {}
        bpp = roof.get("weight_bytes_per_param")
        rows.append(
            [
                v.name,
                describe(v.entry.settings),
                roof.get("weights") or p.get("quantize") or str(p.get("dtype")),
                "-" if bpp is None else f"{bpp:.3f}",
                f"{kv['k_dtype']} / {kv['v_dtype']}" if kv else "-",
                f"{kv['kv_bytes_per_token']:,}" if kv else "-",
                f"{kv['kv_cache_tokens']:,}" if kv else "-",
            ]
        )
    return rows


QUALITY_HEADER = (
    "variant",
    "weights / KV",
    "perplexity",
    "unquantised",
    "mean KL",
    "top-1 agreement",
    "greedy agreement",
)


def quality_rows(variants: list[VariantRun]) -> list[list[str]]:
    """Each variant's `summary.quality` (a spec with a `quality:` block): its configuration
    against the unquantised model; [] when no variant measured quality."""
    rows = []
    for v in measured(variants):
        quality = v.run.summary.get("quality")
        if not quality:
            continue
        reference, row = quality["rows"][0], quality["rows"][-1]
        kv = row["kv_cache_dtype"]
        kv_text = kv["k"] if kv["k"] == kv["v"] else f"k={kv['k']},v={kv['v']}"
        greedy = row.get("greedy_agreement")
        rows.append(
            [
                v.name,
                f"{row['weights'] or 'as loaded'} / {kv_text}",
                f"{row['perplexity']:.3f}",
                f"{reference['perplexity']:.3f}",
                f"{row['mean_kl']:.4f}",
                f"{row['top1_agreement']:.3f}",
                "-" if greedy is None else f"{greedy:.3f}",
            ]
        )
    return rows


SPECULATIVE_HEADER = (
    "variant",
    "method",
    "accepted / proposed",
    "acceptance",
    "accepted per verify",
    "tokens per verify",
    "draft s",
    "verify s",
    "draft share",
)


def speculative_rows(variants: list[VariantRun]) -> list[list[str]]:
    """Each speculating variant's `summary.speculative`: acceptance, tokens per verify and the
    time split; [] when no variant speculated."""
    rows = []
    for v in measured(variants):
        block = v.run.summary.get("speculative")
        if not block:
            continue
        method = ((v.run.results.get("spec") or {}).get("engine") or {}).get("speculative") or {}
        rows.append(
            [
                v.name,
                f"{method.get('method', '?')}, k={method.get('num_tokens', '?')}",
                *speculative_cells(block),
            ]
        )
    return rows


def speculative_cells(block: dict[str, Any]) -> list[str]:
    """A `summary.speculative` block as cells: accepted / proposed, acceptance rate, accepted
    drafts and tokens per verify, drafting and verifying seconds, drafting's share of step time."""
    return [
        f"{block['num_accepted_tokens']:,} / {block['num_proposed_tokens']:,}",
        percent(block.get("acceptance_rate")),
        ratio(block.get("mean_accepted_per_verify")),
        ratio(block.get("mean_tokens_per_verify")),
        num(block.get("draft_s"), 2),
        num(block.get("verify_s"), 2),
        percent(block.get("draft_fraction")),
    ]


def _endpoint_loads(summary: dict[str, Any]) -> str:
    """Requests per endpoint, in `backend.urls` order: "42 / 8" ("-": not routed)."""
    return " / ".join(str(e["requests"]) for e in summary.get("endpoints") or ()) or "-"


def _cost_per_session(summary: dict[str, Any]) -> str:
    cost = summary.get("cost")
    return money(cost["per_session"], cost["currency"]) if cost else "-"


def _self_hosted_per_mtok(summary: dict[str, Any]) -> str:
    hosted = summary.get("self_hosted")
    return money(hosted["per_million_output_tokens"], hosted["currency"]) if hosted else "-"


# The prefix-cache columns: (header, value of a variant's summary); the routing ones only when a
# variant was routed, the cost ones only when one was priced (`cache_columns`).
_CACHE_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("prefix-cache hit rate", lambda s: ratio(s.get("prefix_cache_hit_rate"))),
    ("TTFT p50 (ms)", lambda s: num(metric_value(s, "ttft_ms.p50"))),
    ("TTFT p99 (ms)", lambda s: num(metric_value(s, "ttft_ms.p99"))),
)
_ROUTING_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("requests per endpoint", _endpoint_loads),
    ("imbalance", lambda s: num(s.get("endpoint_imbalance"), 2)),
)
_COST_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("cost per session", _cost_per_session),
    ("cache discount", lambda s: percent((s.get("cost") or {}).get("cache_discount"))),
)


def _cache_columns(variants: list[VariantRun]) -> list[tuple[str, Callable[[dict], str]]]:
    """The cache table's columns; none when no variant reports a hit rate, routes or prices."""
    summaries = [v.run.summary for v in measured(variants)]
    is_routed = any(s.get("endpoints") for s in summaries)
    is_priced = any(s.get("cost") for s in summaries)
    is_hosted = any(s.get("self_hosted") for s in summaries)
    has_hits = any(s.get("prefix_cache_hit_rate") is not None for s in summaries)
    if not (is_routed or is_priced or is_hosted or has_hits):
        return []
    columns = list(_CACHE_COLUMNS)
    columns += list(_ROUTING_COLUMNS) if is_routed else []
    columns += list(_COST_COLUMNS) if is_priced else []
    if is_hosted:
        columns.append(("self-hosted per Mtok out", _self_hosted_per_mtok))
    return columns


def cache_header(variants: list[VariantRun]) -> tuple[str, ...]:
    return ("variant", *(h for h, _ in _cache_columns(variants)))


def cache_rows(variants: list[VariantRun]) -> list[list[str]]:
    """A row per variant: its prefix-cache hit rate and TTFT p50 / p99 (what a cache miss
    costs), with the requests each endpoint got and the imbalance when routed (`routing`), and
    the cost per session and the cache discount when priced (`prices`); [] when no variant
    reports any of them."""
    columns = _cache_columns(variants)
    if not columns:
        return []
    return [[v.name, *(show(v.run.summary) for _, show in columns)] for v in measured(variants)]


STATUS_HEADER = ("variant", "status", "sets", "error")


def status_rows(variants: list[VariantRun]) -> list[list[str]]:
    """The variants that did not end whole: failed (with the one-line error), interrupted,
    never started or cut off (`running` in a killed run's index); [] when all are done."""
    return [
        [v.name, v.entry.status, describe(v.entry.settings), v.entry.error or "-"]
        for v in variants
        if v.entry.status != "done"
    ]


def terminal_table(variants: list[VariantRun]) -> str:
    """The comparison `llmbench run` prints after the variants: a row per variant (output
    tok/s, TTFT and TPOT p50, decode MBU, weights; the prefix-cache hit rate when routed, the
    cost per session when priced, perplexity and acceptance when measured),
    and each one that did not end whole with its status."""
    shown = measured(variants)
    columns = [
        ("output tok/s", lambda v: num(metric_value(v.run.summary, "output_tok_per_s"))),
        ("TTFT p50", lambda v: num(metric_value(v.run.summary, "ttft_ms.p50"))),
        ("TPOT p50", lambda v: num(metric_value(v.run.summary, "tpot_ms.p50"))),
        ("decode MBU", lambda v: ratio(v.run.summary.get("decode_mbu"))),
        ("weight B/param", lambda v: _bpp(v.run)),
    ]
    if any(v.run.summary.get("quality") for v in shown):
        columns.append(("perplexity", lambda v: _perplexity(v.run)))
    if any(v.run.summary.get("endpoints") for v in shown):
        columns.append(("hit rate", lambda v: ratio(v.run.summary.get("prefix_cache_hit_rate"))))
    if any(v.run.summary.get("cost") for v in shown):
        columns.append(("cost/session", lambda v: _cost_per_session(v.run.summary)))
    if any(v.run.summary.get("speculative") for v in shown):
        columns.append(
            (
                "acceptance",
                lambda v: percent((v.run.summary.get("speculative") or {}).get("acceptance_rate")),
            )
        )
    width = max([len("variant"), *(len(v.name) for v in variants)]) + 2
    header = ["variant", *(h for h, _ in columns)]
    rows = [[v.name, *(show(v) for _, show in columns)] for v in shown]
    lines = text_table(header, rows, [width, *[16] * len(columns)])
    for v in variants:
        if v.entry.status != "done":
            lines.append(f"{v.name:<{width}}{v.entry.status}: {v.entry.error or '-'}")
    return "\n".join(lines)


def text_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int] | None = None
) -> list[str]:
    """A table's lines for the terminal (the variants', a sweep's): the first column
    left-aligned, the others right-aligned, each `widths` wide (default: as wide as its widest
    cell, and two spaces before each column but the first)."""
    if widths is None:
        widths = [
            max(len(row[i]) for row in (header, *rows)) + (2 if i else 0)
            for i in range(len(header))
        ]
    return [
        f"{row[0]:<{widths[0]}}"
        + "".join(f"{cell:>{w}}" for cell, w in zip(row[1:], widths[1:], strict=True))
        for row in (header, *rows)
    ]


def _bpp(run: RunData) -> str:
    bpp = (run.results.get("roofline") or {}).get("weight_bytes_per_param")
    return "-" if bpp is None else f"{bpp:.3f}"


def _perplexity(run: RunData) -> str:
    quality = run.summary.get("quality")
    return f"{quality['rows'][-1]['perplexity']:.3f}" if quality else "-"


def common_line(variants: list[VariantRun]) -> str:
    """What the variants share, for the page's subtitle: the first measured one's workload and
    load, the backend, model, dtype and device when every measured variant ran the same ones
    (each one's weights are in its row), and the git commit."""
    shown = measured(variants)
    if not shown:
        return ""
    spec = shown[0].run.results.get("spec") or {}
    workload, load = spec.get("workload") or {}, spec.get("load") or {}
    key = "concurrency" if load.get("kind") == "concurrency" else "rate_per_s"
    ran = {_model_on_device(v.run.provenance) for v in shown}
    model = ran.pop() if len(ran) == 1 else "models or devices differ (see each variant's report)"
    sha = shown[0].run.provenance.get("git_sha") or "-"
    return (
        f"{workload.get('kind')} workload, {workload.get('sessions')} sessions, load "
        f"{load.get('kind')} {load.get(key)}; {model} · git {sha}"
    )


def _model_on_device(p: dict[str, Any]) -> str:
    device = p.get("device") or {}
    where = device.get("name") or device.get("url") or device.get("type") or "?"
    return f"{p.get('backend')} {p.get('model')} {p.get('dtype')} on {where}"
