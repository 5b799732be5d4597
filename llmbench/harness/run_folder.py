"""A run's output folder: claimed and checked before any work, and what a write into it that
fails (a full disk, a quota) becomes.

A folder that cannot be written is one line naming it, before anything slow. A folder that holds
a run already is refused (its records would be overwritten) unless `--force`, which removes that
run's files and nothing else; an empty folder, or one holding only files of its own, is used as
it is. A write that fails during the run is a `WriteFailed`: one line naming the file and the
space left there.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from llmbench.errors import UserError
from llmbench.harness import sweep_folders

# What `llmbench run` writes into a run folder (a sweep's and a variants run's root included):
# a folder holding any of these holds a run. `--force` removes exactly these.
RUN_FILES = (
    "results.json",
    "run-start.json",
    "requests.jsonl",
    "steps.jsonl",
    "sessions.jsonl",
    "telemetry.csv",
    "experts.json",
    "variants.json",
    "report.html",
    "report.md",
    "ab.json",  # an A/B run's (`llmbench ab`), with its round-NN/ folders
)
RUN_FOLDERS = (sweep_folders.GLOB, "variants", "shards", "figures", "export", "round-*")

# The errors of a disk that has no room left: the message then says how much is free.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class WriteFailed(BaseException):
    """A file of a run folder that could not be written: the run stops, keeping what it
    measured where it can. The message is the one line a person reads: the file, the reason,
    the space left there, then (`with_outcome`) what was kept.

    Like `RunInterrupted`, it is no `Exception`, so no `except Exception` on the way (a
    variant's, a request's) takes it for one part's failure and goes on writing to a full disk.
    """

    def __init__(
        self, path: Path, reason: str, free_bytes: int | None, fix: str, outcome: str = ""
    ):
        self.path, self.reason, self.free_bytes = path, reason, free_bytes
        self.fix, self.outcome = fix, outcome  # fix: what to do first ("free some space")
        free = "" if free_bytes is None else f"; {bytes_text(free_bytes)} free there"
        super().__init__(
            f"{path}: cannot write ({reason}{free}); {outcome or fix + ' and try again'}"
        )

    def with_outcome(self, outcome: str) -> WriteFailed:
        """The same failure, its line ending with what the run kept (instead of "try again")."""
        return WriteFailed(self.path, self.reason, self.free_bytes, self.fix, outcome)


def write_failed(path: Path, error: OSError) -> WriteFailed:
    """`error`, raised writing `path`, as the run's `WriteFailed` (with the free space there)."""
    reason = error.strerror or f"{type(error).__name__}: {error}"
    fix = "free some space" if error.errno in _NO_SPACE else "make it writable"
    return WriteFailed(Path(path), reason, free_bytes(path), fix)


def free_bytes(path: Path) -> int | None:
    """Bytes free on the file system of `path` (or of its nearest folder that exists)."""
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def bytes_text(num_bytes: int) -> str:
    """`0 B`, `512 B`, `12.5 KiB`, `3.2 GiB`."""
    value, unit = float(num_bytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{num_bytes} B" if unit == "B" else f"{value:.1f} {unit}"


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
        free = free_bytes(folder) if e.errno in _NO_SPACE else None
        if free is not None:
            reason += f"; {bytes_text(free)} free there"
        raise UserError(
            f"--out {folder}: cannot write there ({reason}); pass a folder you can write to"
        ) from None


def run_entries(folder: Path) -> list[Path]:
    """The files and folders of a run in `folder`: those of `RUN_FILES`, then of `RUN_FOLDERS`,
    in their order."""
    if not folder.is_dir():
        return []
    found = [folder / name for name in RUN_FILES if (folder / name).exists()]
    for pattern in RUN_FOLDERS:
        found += sorted(p for p in folder.glob(pattern) if p.is_dir())
    return found


def claim_folder(folder: Path, *, force: bool = False) -> None:
    """Make `folder` this run's, before any work: a folder that holds a run already is a
    one-line `UserError` (exit 2) naming what it holds, unless `force`, which removes that run's
    files (`run_entries`) and leaves any other file; then `prepare_folder`."""
    found = run_entries(folder)
    if found and not force:
        names = [p.name + ("/" if p.is_dir() else "") for p in found]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise UserError(
            f"--out {folder}: holds a run already ({shown}); pass --force to replace it, or "
            "another folder"
        )
    for path in found:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as e:
            raise UserError(
                f"--out {folder}: cannot remove {path.name} of the old run ({e.strerror}); "
                "remove it yourself or pass another folder"
            ) from None
    prepare_folder(folder)


@contextlib.contextmanager
def removed_if_left_empty(folder: Path) -> Iterator[None]:
    """Work that fills `folder`: where the folder was not there before and the work fails
    having written nothing into it (a model refused at load, an engine that cannot be built),
    the empty folder is removed again, so that a folder of runs holds runs only (`compare
    --history` refuses anything else). A folder holding anything, or there before, stays."""
    existed = folder.exists()
    try:
        yield
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):  # not empty: what the run wrote stays
                folder.rmdir()
        raise


def default_folder(output_dir: str, name: str) -> Path:
    """`<output_dir>/<name>-<time>` for a run without `--out`; when a run of the same second
    took that name, `-2`, `-3`, ... after it (never another run's folder)."""
    base = Path(output_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder, number = base, 1
    while run_entries(folder):
        number += 1
        folder = base.with_name(f"{base.name}-{number}")
    return folder
