"""A variants folder written through the project's own writers: two synthetic runs (the second
twice as slow, with a quality and a speculative block) and a variant that failed to load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llmbench.harness.results import MachineLoad, read_results, write_results
from llmbench.harness.run_warnings import busy_line
from llmbench.harness.variant_index import VariantEntry, VariantIndex, write_index
from tests.harness.synthetic_runs import write_run

QUALITY = {
    "rows": [
        {
            "weights": None,
            "kv_cache_dtype": {"k": "float32", "v": "float32"},
            "perplexity": 12.0,
            "mean_kl": 0.0,
            "top1_agreement": 1.0,
            "greedy_agreement": 1.0,
        },
        {
            "weights": "int4:32",
            "kv_cache_dtype": {"k": "int8", "v": "int4"},
            "perplexity": 12.5,
            "mean_kl": 0.0123,
            "top1_agreement": 0.875,
            "greedy_agreement": None,
        },
    ]
}
SPECULATIVE = {
    "num_proposed_tokens": 400,
    "num_accepted_tokens": 300,
    "acceptance_rate": 0.75,
    "num_verifies": 100,
    "mean_accepted_per_verify": 3.0,
    "mean_tokens_per_verify": 4.0,
    "draft_s": 0.25,
    "verify_s": 1.5,
    "draft_fraction": 0.125,
    "draft_flops": 0.0,
    "draft_bytes": 0.0,
}


def write_variants(folder: Path) -> Path:
    """`folder` as `llmbench run --vary` leaves it: variants `fast`, `slow` (done) and
    `broken` (failed before it measured: an empty folder)."""
    write_run(folder / "variants" / "fast", 1, num_repetitions=None, num_requests=8)
    slow = write_run(
        folder / "variants" / "slow", 2, slowdown=2.0, num_repetitions=None, num_requests=8
    )
    result = read_results(slow)
    summary = {**result.summary, "quality": QUALITY, "speculative": SPECULATIVE}
    write_results(slow, dataclasses.replace(result, summary=summary))
    (folder / "variants" / "broken").mkdir()
    entries = (
        VariantEntry("fast", {}, "done", None, "variants/fast"),
        VariantEntry("slow", {"engine.quantize": "int4"}, "done", None, "variants/slow"),
        VariantEntry(
            "broken", {"model": "nope"}, "failed", "nope: no such model", "variants/broken"
        ),
    )
    write_index(folder, VariantIndex("synthetic", entries))
    return folder


BUSY_LOAD = MachineLoad(2, 1.5, 2.0, 0.9, 1.0, True)  # other processes: 0.9, then 1.0 of 2 cores
BUSY_SENTENCE = (
    "The machine was busy: other processes used 0.90 cores just before the run and 1.00 during "
    "it (of 2); the numbers are pessimistic."
)


def mark_busy(run_folder: Path) -> Path:
    """Rewrite a run as one on a busy machine, as `llmbench run` writes it: the load in its
    provenance, `summary.machine_busy` and the warning line (`run_warnings.busy_line`)."""
    result = read_results(run_folder)
    warnings = [busy_line(BUSY_LOAD), *result.summary.get("warnings", [])]
    summary = {**result.summary, "machine_busy": True, "warnings": warnings}
    provenance = dataclasses.replace(result.provenance, machine_load=BUSY_LOAD)
    write_results(run_folder, dataclasses.replace(result, summary=summary, provenance=provenance))
    return run_folder
