"""Expert statistics of a mixture-of-experts run: `experts.json` in the run folder (tokens
routed, routing weight and co-activation per layer and expert and phase, pooled over the
measured repetitions and per repetition), its reader, and the MoE keys of the run summary.

The engine keeps cumulative counts (`LLMEngine.expert_stats.to_dict()`: `num_layers`,
`num_experts`, `top_k`, `phases` → `prefill` / `decode` → `tokens` [L][E], `weight` [L][E],
`coactivation` [L][E][E]). A run snapshots them when each repetition starts (the engine is idle
then: the previous repetition's requests have all ended) and at the end; the difference of two
snapshots is what happened between them, so the warm-up (before repetition 1) is left out, as
it is from every other number of the run. Torch-free: the counts are plain lists.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from llmbench.errors import UserError

EXPERTS_FILE = "experts.json"
# What each repetition's entry keeps of a phase: co-activation ([L][E][E], 786k numbers per phase
# for 48 layers of 128 experts) only in the pooled `phases`.
REPETITION_KEYS = ("tokens", "weight")

Stats = dict[str, Any]


def subtract(later: Any, earlier: Any) -> Any:
    """`later` − `earlier`, element by element, for nested lists of numbers of one shape (and
    for dicts of them, key by key: a key `earlier` lacks counts from zero)."""
    if isinstance(later, dict):
        return {k: subtract(v, (earlier or {}).get(k)) for k, v in later.items()}
    if isinstance(later, list):
        earlier = earlier or [None] * len(later)
        return [subtract(a, b) for a, b in zip(later, earlier, strict=True)]
    return later - (earlier or 0)


def phases_between(later: Stats, earlier: Stats | None, keys: Sequence[str] | None = None) -> Stats:
    """The per-phase statistics accumulated from snapshot `earlier` (None: the engine's start)
    to snapshot `later`, only `keys` of each phase when given."""
    out = {}
    for phase, stats in later["phases"].items():
        before = (earlier or {}).get("phases", {}).get(phase)
        wanted = {k: v for k, v in stats.items() if keys is None or k in keys}
        out[phase] = subtract(wanted, before)
    return out


class ExpertSnapshots:
    """The engine's cumulative expert statistics, read when each repetition starts and at the
    end, turned into `experts.json`.

    `read()` returns a fresh `expert_stats.to_dict()`; `start_repetition(k)` is called as
    repetition k starts (k = 1, 2, ... in order) and rewrites the file with the repetitions that
    ended, so a killed run keeps them; `write(folder, num_whole)` writes the final file.
    """

    def __init__(self, read: Callable[[], Stats], folder: Path):
        self.read, self.folder = read, folder
        self.starts: list[Stats] = []  # the snapshot at the start of repetition 1, 2, ...

    def start_repetition(self, number: int) -> None:
        if number != len(self.starts) + 1:
            raise ValueError(f"repetition {number} after {len(self.starts)}")
        self.starts.append(self.read())
        if number > 1:
            write_experts(self.folder, experts_file(self.starts, number - 1))

    def write(self, num_whole: int) -> Path:
        """experts.json at the end of the run: repetitions 1 to the last started, those past
        `num_whole` marked `is_partial`."""
        return write_experts(self.folder, experts_file([*self.starts, self.read()], num_whole))


def snapshots_of(engine, folder: Path) -> ExpertSnapshots | None:
    """The snapshots of an `LLMEngine`'s expert statistics, written into `folder`; None for a
    dense model."""
    if not engine.model_config.is_moe:
        return None
    return ExpertSnapshots(engine.expert_stats.to_dict, folder)


def experts_file(snapshots: Sequence[Stats], num_whole: int) -> Stats:
    """experts.json from snapshots [start of repetition 1, ..., start of k, end of k]
    (one snapshot alone: no repetition ran, everything is zero).

    Formula: repetition r's counts = snapshot r+1 − snapshot r; the pooled `phases` = last −
    first (the warm-up, before the first snapshot, left out).
    """
    first, last = snapshots[0], snapshots[-1]
    repetitions = [
        {
            "repetition": number,
            "is_partial": number > num_whole,
            "phases": phases_between(after, before, REPETITION_KEYS),
        }
        for number, (before, after) in enumerate(pairwise(snapshots), 1)
    ]
    return {
        "num_layers": last["num_layers"],
        "num_experts": last["num_experts"],
        "top_k": last["top_k"],
        "phases": phases_between(last, first),
        "repetitions": repetitions,
    }


def write_experts(folder: Path, data: Stats) -> Path:
    """Write `folder/experts.json` atomically."""
    path = folder / EXPERTS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    tmp.replace(path)
    return path


def read_experts(folder: Path) -> Stats | None:
    """The folder's experts.json (None when absent: a dense model, or a run killed before its
    first repetition ended); a damaged one is a `UserError` naming it."""
    path = folder / EXPERTS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read it ({e})") from None
    keys = ("num_layers", "num_experts", "top_k", "phases")
    if not isinstance(data, dict) or any(k not in data for k in keys):
        raise UserError(f"{path}: not an llmbench experts file (needs {', '.join(keys)})")
    return data


def moe_summary(points: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The MoE keys of a summary from its steps (roofline points); {} without MoE steps.

    Formula: moe_decode_experts_touched = mean over decode steps of the mean over layers of
    the distinct experts the step reached (`experts_touched`); moe_load_max_over_mean = mean
    over steps that have one of `expert_load_max_over_mean` (max tokens on one expert / mean
    tokens per expert; 1 = even).
    """
    touched = [
        sum(p["experts_touched"]) / len(p["experts_touched"])
        for p in points
        if p.get("phase") == "decode" and p.get("experts_touched")
    ]
    loads = [
        p["expert_load_max_over_mean"]
        for p in points
        if p.get("expert_load_max_over_mean") is not None
    ]
    out = {}
    if touched:
        out["moe_decode_experts_touched"] = sum(touched) / len(touched)
    if loads:
        out["moe_load_max_over_mean"] = sum(loads) / len(loads)
    return out
