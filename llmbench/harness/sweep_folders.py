"""A sweep's point folders: one run folder a load, `point-<load>` under the sweep's root
(`point-4`, `point-0.5`: the load as `{:g}` writes it), read back in sweep order, the lowest
load first. Every part of llmbench that names, finds or orders them does it here."""

from __future__ import annotations

import math
from pathlib import Path

PREFIX = "point-"
GLOB = f"{PREFIX}*"


def point_name(load: float) -> str:
    """The folder name of the point at `load` ("point-4")."""
    return f"{PREFIX}{load:g}"


def point_load(name: str) -> float | None:
    """The load a point folder's name carries; None for a name that is not a point's."""
    if not name.startswith(PREFIX):
        return None
    try:
        load = float(name.removeprefix(PREFIX))
    except ValueError:
        return None
    return load if math.isfinite(load) else None


def point_folders(root: Path) -> list[Path]:
    """The point folders under `root`, in sweep order (none: not a sweep, or none started)."""
    points = [
        (load, folder.name, folder)
        for folder in root.glob(GLOB)
        if folder.is_dir() and (load := point_load(folder.name)) is not None
    ]
    return [folder for *_, folder in sorted(points)]
