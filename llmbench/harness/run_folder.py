"""A run's output folder, created and checked before any work: a folder that cannot be written
is one line naming it, before anything slow."""

from __future__ import annotations

from pathlib import Path

from llmbench.errors import UserError


def prepare_folder(folder: Path) -> None:
    """Create `folder` and check a file can be written in it, or raise a one-line `UserError`
    that names it (under a regular file, in /proc, read-only, no space...)."""
    probe = folder / ".llmbench-write-check"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UserError(
            f"--out {folder}: cannot write there ({reason}); pass a folder you can write to"
        ) from None
