"""variants.json: the index of a variants folder, written here and read back here only.

A run with variants writes one ordinary run folder per variant under `variants/<name>/`; the
index beside them says, in the variants' order, what each one sets over the spec, how it ended
and where its folder is. It is rewritten (atomically) as each variant starts and ends, so a
killed run leaves an index that says which variant was under way. What the file holds is
docs/results-schema.md ("variants.json").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbench.errors import UserError

INDEX_FILE = "variants.json"
INDEX_VERSION = 1
# pending: not started; running: under way when the file was written (a killed run leaves it);
# done: its run ended whole; failed: `error` says why (its folder may still hold results);
# interrupted: a signal stopped it (its folder holds partial results).
STATUSES = ("pending", "running", "done", "failed", "interrupted")


@dataclass(frozen=True)
class VariantEntry:
    """One variant: its name, the dotted keys it sets (`set` in the file), how it ended, the
    one-line error of a failed or interrupted one, its run folder relative to the index."""

    name: str
    settings: Mapping[str, Any]
    status: str
    error: str | None
    folder: str


@dataclass(frozen=True)
class VariantIndex:
    name: str  # the spec's `name`
    variants: tuple[VariantEntry, ...]


def write_index(folder: Path, index: VariantIndex) -> Path:
    """Write `folder/variants.json` atomically (a reader never sees half a file)."""
    data = {
        "index_version": INDEX_VERSION,
        "name": index.name,
        "variants": [
            {
                "name": e.name,
                "set": dict(e.settings),
                "status": e.status,
                "error": e.error,
                "folder": e.folder,
            }
            for e in index.variants
        ],
    }
    path = folder / INDEX_FILE
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(partial, path)
    return path


def is_variants_folder(folder: Path) -> bool:
    return (folder / INDEX_FILE).is_file()


def read_index(folder: Path) -> VariantIndex:
    """`folder/variants.json` read back; a damaged or unknown file is one line naming it."""
    path = folder / INDEX_FILE
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    version = data.get("index_version") if isinstance(data, dict) else None
    if version != INDEX_VERSION:
        raise UserError(
            f"{path}: index_version {version!r}; this llmbench reads {INDEX_VERSION}: "
            "use the llmbench that wrote it"
        )
    try:
        entries = tuple(
            VariantEntry(v["name"], v["set"], v["status"], v["error"], v["folder"])
            for v in data["variants"]
        )
        index = VariantIndex(data["name"], entries)
    except (KeyError, TypeError) as e:
        raise UserError(f"{path}: damaged ({type(e).__name__}: {e})") from None
    for entry in entries:
        if (
            entry.status not in STATUSES
            or Path(entry.folder).is_absolute()
            or ".." in Path(entry.folder).parts
        ):
            raise UserError(f"{path}: damaged (variant {entry.name!r})")
    return index
