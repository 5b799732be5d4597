"""`llmbench run` of a spec with variants: each variant run as a plain run of its own spec would
be (`run.execute`: its backend opened, its engine loaded, its folder `variants/<name>/` whole),
one after another in this process, the previous engine freed before the next loads.

`variants.json` (`variant_index`) says after each variant how it ended. A variant that fails
(its engine does not load, the engine crashes, its requests fail) is recorded with its one-line
error and the next one runs; the run then raises `RunFailed` naming every failed variant. A
signal stops the variant under way as it stops a plain run (what it measured is kept) and runs
no more. The top report is written at the end either way, from the variants that have results.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from llmbench.errors import BackendFailure, UserError
from llmbench.harness.failures import RunFailed
from llmbench.harness.run import execute
from llmbench.harness.run_folder import prepare_folder
from llmbench.harness.run_signals import RunInterrupted, StopSignals
from llmbench.harness.spec import RunSpec
from llmbench.harness.variant_index import VariantEntry, VariantIndex, write_index
from llmbench.harness.variants import Variant, describe


def execute_variants(
    base: RunSpec,
    variants: Sequence[Variant],
    out_dir: Path | None,
    write_reports: Callable[[Path], object],
    write_index_report: Callable[[Path], object],
    *,
    is_strict: bool = False,
) -> Path:
    """Run every variant into `<root>/variants/<name>/` and write the index and the top report
    (`write_index_report(root)`); `write_reports(folder)` renders each variant's own reports.
    Returns the root folder; raises `RunInterrupted` after a signal, `RunFailed` when a variant
    failed (everything written first)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = out_dir or Path(base.output_dir) / f"{base.name}-{stamp}"
    prepare_folder(root)
    entries = [
        VariantEntry(v.name, dict(v.settings), "pending", None, f"variants/{v.name}")
        for v in variants
    ]

    def save() -> None:
        write_index(root, VariantIndex(base.name, tuple(entries)))

    save()
    with StopSignals() as stop:
        try:
            for i, variant in enumerate(variants):
                what = describe(variant.settings)
                _say(f"variant {i + 1}/{len(variants)} {variant.name}: {what}")
                entries[i] = replace(entries[i], status="running")
                save()
                entries[i] = _run_one(variant, entries[i], root, write_reports, is_strict)
                with stop.saving():
                    save()
                if entries[i].status == "failed":
                    _say(f"variant {variant.name} failed: {entries[i].error}")
                _release_memory()
        except RunInterrupted as e:
            with stop.saving():
                for i, entry in enumerate(entries):
                    if entry.status == "running":
                        entries[i] = replace(entry, status="interrupted", error=str(e))
                save()
                write_index_report(root)
            raise
        with stop.saving():
            write_index_report(root)
    if stop.signum is not None:
        raise RunInterrupted(stop.signum)
    failed = [e for e in entries if e.status == "failed"]
    if failed:
        raise RunFailed("; ".join(f"variant {e.name}: {e.error}" for e in failed))
    return root


def _run_one(
    variant: Variant,
    entry: VariantEntry,
    root: Path,
    write_reports: Callable[[Path], object],
    is_strict: bool,
) -> VariantEntry:
    """Run one variant into `root / entry.folder`; its entry as it ended (a `RunInterrupted`
    passes through: the caller marks it)."""
    try:
        execute(variant.spec, root / entry.folder, write_reports, is_strict=is_strict)
    except (RunFailed, BackendFailure, UserError) as e:
        return replace(entry, status="failed", error=str(e))
    except Exception as e:  # noqa: BLE001 — one configuration's crash: the others still run
        return replace(entry, status="failed", error=f"{type(e).__name__}: {e}")
    return replace(entry, status="done", error=None)


def _release_memory() -> None:
    """Free the engine the last variant loaded before the next one loads its own."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
