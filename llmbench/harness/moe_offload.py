"""Expert offloading as a user writes it — `--moe-offload resident=4,cache=2,link=pcie4` or a
spec's `engine.moe_offload` — parsed into a `MoEOffloadSpec` (`engine_config` turns it into the
engine's config, the link's bandwidth from the hardware table, `datasheets.LINKS`), and the
summary line of the link traffic a run's steps recorded.

Compact syntax, comma-separated: `resident=N` (experts per layer kept in device memory,
required), `cache=C` (fetched experts kept per layer, LRU; default 0), `link=NAME|NUMBERGB/s|real`
(default: pcie4-x16, simulated, on a CPU; real copies on CUDA), `profile=PATH` (an experts.json:
its most-routed experts stay resident; default the first N ids), `sleep` (a simulated link
also sleeps each fetch's time so that wall time shows it; default: recorded only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmbench.errors import UserError
from llmbench.harness.spec import MoEOffloadSpec
from llmbench.roofline.datasheets import link_bandwidth

if TYPE_CHECKING:  # the engine is imported lazily: `llmbench` runs without torch
    pass

DEFAULT_SIMULATED_LINK = "pcie4-x16"
REAL_LINK = "real"  # copies over the machine's own link, timed: no simulated bandwidth
_KEYS = ("resident", "cache", "link", "profile", "sleep")


def parse_moe_offload(text: str) -> MoEOffloadSpec | None:
    """`resident=4,cache=2,link=pcie4,profile=PATH,sleep` → the spec; `none` → None."""
    if text.strip() in ("", "none"):
        return None
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if key == "sleep" and not sep:
            value, sep = "true", "="
        if not sep or key not in _KEYS or key in fields:
            raise UserError(
                f"--moe-offload {text!r}: expected resident=N[,cache=C][,link=NAME|GB/s|real]"
                f"[,profile=PATH][,sleep], each key once; got {part.strip()!r}"
            )
        fields[key] = value
    if "resident" not in fields:
        raise UserError(f"--moe-offload {text!r}: resident=N is required")
    counts = {}
    for key in ("resident", "cache"):
        value = fields.get(key, "0")
        if not value.isdigit():
            raise UserError(f"--moe-offload: {key} must be a whole number >= 0, got {value!r}")
        counts[key] = int(value)
    if fields.get("sleep", "true") not in ("true", "false"):
        raise UserError(f"--moe-offload: sleep is a flag (sleep, or sleep=true), got {text!r}")
    link = fields.get("link")
    if link not in (None, REAL_LINK):
        link_bandwidth(link)  # a bad name is its UserError
    return MoEOffloadSpec(
        resident=counts["resident"],
        cache=counts["cache"],
        link=link,
        profile=fields.get("profile"),
        sleep=fields.get("sleep") == "true",
    )


def link_line(records) -> str:
    """Link traffic of steps (`StepRecord`s), for a summary line: `link 3.4 MiB in 12 of 40
    steps, 0.11 ms simulated`."""
    moved = [r for r in records if r.link_bytes]
    total = sum(r.link_bytes for r in moved)
    simulated = sum(r.link_s_simulated for r in moved)
    line = f"link {total / 2**20:.2f} MiB in {len(moved)} of {len(records)} steps"
    return line + (f", {simulated * 1e3:.3g} ms simulated" if simulated else "")
