"""A variants folder written through the project's own writers: two synthetic runs (the second
twice as slow, with a quality and a speculative block) and a variant that failed to load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llmbench.harness.results import read_results, write_results
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
