"""The top report of a variants folder: `report.html` (self-contained, like a run's) and
`report.md` that put the variants side by side, each row linking to the variant's own report."""

from __future__ import annotations

from pathlib import Path

from llmbench.reports import tables, variant_plots, variant_tables
from llmbench.reports.html_report import Page, render_page
from llmbench.reports.markdown_report import markdown_table
from llmbench.reports.variant_tables import VariantRun

SPEED_NOTE = (
    "Each variant is one whole run of the same workload (its own engine, loaded for it); "
    "the numbers pool its measured requests, as its own report does."
)
RATIO_NOTE = (
    "Each number divided by the first variant's: above 1.00x is more throughput, or a longer "
    "latency (for the latencies, below 1.00x is faster)."
)
CONFIG_NOTE = (
    "What each variant set over the spec, and what it ran: the weights' storage and loaded "
    "bytes per parameter (scales and zero points included), the K/V cache's formats, its "
    "bytes per token and the tokens its memory held."
)
QUALITY_NOTE = (
    "llmbench quality of each variant's configuration against the unquantised model, on "
    "the same text: perplexity (the unquantised model's beside it), mean KL divergence of "
    "the next-token distributions, top-1 and greedy-token agreement."
)
SPECULATIVE_NOTE = (
    "Draft tokens proposed and accepted over each speculating variant's steps; a verify is "
    "one sequence's drafts checked in one step, its tokens the accepted drafts plus the one "
    "the target adds."
)
CACHE_NOTE = (
    "Prompt tokens served from the prefix cache over all prompt tokens, and the TTFT a miss "
    "shows up in; routed variants add the requests each endpoint got (in backend.urls order) "
    "and the imbalance (max / mean requests in flight), priced ones the mean cost of a "
    "session and what the cache took off the bill. Compare routing policies with "
    "backend.reset_prefix_cache on, so that no variant starts on another's cache."
)


def status_title(variants: list[VariantRun]) -> str:
    """The banner over the variants that did not end whole."""
    failed = sum(v.entry.status == "failed" for v in variants)
    other = sum(v.entry.status not in ("done", "failed") for v in variants)
    parts = [f"{failed} failed"] if failed else []
    parts += [f"{other} interrupted or not run"] if other else []
    return f"{len(variants)} variants: " + ", ".join(parts) + "; the others are compared below."


def render(folder: Path) -> tuple[Page, str]:
    """The page and the Markdown of a variants folder, from its files alone."""
    index, variants = variant_tables.load(folder)
    shown = variant_tables.measured(variants)
    plots = variant_plots.figures(variants)
    header = variant_tables.speed_header(variants)
    rows = {
        "speed": variant_tables.speed_rows(variants),
        "ratio": variant_tables.ratio_rows(variants),
        "config": variant_tables.config_rows(variants),
        "quality": variant_tables.quality_rows(variants),
        "speculative": variant_tables.speculative_rows(variants),
        "cache": variant_tables.cache_rows(variants),
        "status": variant_tables.status_rows(variants),
    }
    title = f"llmbench variants: {index.name}"
    subtitle = variant_tables.common_line(variants)
    busy = tables.busy_warnings([(v.name, v.run) for v in variants])  # as a run's report says
    page = render_page(
        "variants.html.j2",
        plots,
        title=title,
        subtitle=subtitle,
        links={v.name: f"{v.entry.folder}/report.html" for v in shown},
        reference=shown[0].name if shown else "",
        plots=plots,
        status_title=status_title(variants),
        status_header=variant_tables.STATUS_HEADER,
        status_rows=rows["status"],
        warnings=busy,
        speed_note=SPEED_NOTE,
        speed_header=header,
        speed_rows=rows["speed"],
        ratio_note=RATIO_NOTE,
        ratio_rows=rows["ratio"],
        config_note=CONFIG_NOTE,
        config_header=variant_tables.CONFIG_HEADER,
        config_rows=rows["config"],
        quality_note=QUALITY_NOTE,
        quality_header=variant_tables.QUALITY_HEADER,
        quality_rows=rows["quality"],
        speculative_note=SPECULATIVE_NOTE,
        speculative_header=variant_tables.SPECULATIVE_HEADER,
        speculative_rows=rows["speculative"],
        cache_note=CACHE_NOTE,
        cache_header=variant_tables.cache_header(variants),
        cache_rows=rows["cache"],
    )
    lines = [f"# {title}", "", subtitle, ""]
    if rows["status"]:
        lines += [f"> **{status_title(variants)}**", ""]
        lines += markdown_table(variant_tables.STATUS_HEADER, rows["status"])
    if busy:
        lines += [f"> **warning:** {line}" for line in busy] + [""]
    sections = (
        ("Speed", header, "speed"),
        (f"Against {shown[0].name if shown else ''}", header, "ratio"),
        ("Configuration and memory", variant_tables.CONFIG_HEADER, "config"),
        ("Quality", variant_tables.QUALITY_HEADER, "quality"),
        ("Speculative decoding", variant_tables.SPECULATIVE_HEADER, "speculative"),
        ("Prefix cache, routing and cost", variant_tables.cache_header(variants), "cache"),
    )
    for heading, section_header, key in sections:
        if rows[key]:
            lines += [f"## {heading}", ""] + markdown_table(section_header, rows[key])
    return page, "\n".join(lines)


def write_variants_report(folder: Path) -> tuple[Path, Path]:
    """Write the top `report.html` (+ `figures/`) and `report.md` of a variants folder; the
    variants' own reports are theirs (`render.write_reports` writes both)."""
    page, markdown = render(folder)
    md_path = folder / "report.md"
    md_path.write_text(markdown + "\n")
    return page.write(folder / "report.html"), md_path
