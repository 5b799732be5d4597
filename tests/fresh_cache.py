"""A fresh llmbench cache for a test's subprocesses that shares this machine's compiled CPU
extensions: what the test checks starts empty (models, roofs, runs), while the extension, a
~55 s compile per machine and source on 2 cores, is built once into the session's own cache
and linked in (a fresh cache without the links compiled it again, once for each such test)."""

from __future__ import annotations

from pathlib import Path

from llmbench.kernels import cpu_extension


def fresh_cache(directory: Path) -> Path:
    """`directory` (created) as an llmbench cache whose `cpp_extensions/` links every build in
    the session's cache, the one this process's extension is first built into."""
    cpu_extension.default()
    directory.mkdir(parents=True, exist_ok=True)
    built = cpu_extension.cache_dir()
    if built.is_dir():
        (directory / "cpp_extensions").mkdir(exist_ok=True)
        for build in built.iterdir():
            (directory / "cpp_extensions" / build.name).symlink_to(build)
    return directory
