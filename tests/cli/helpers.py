"""Running the `llmbench` command in a subprocess, and what a user error must look like."""

from __future__ import annotations

import os
import subprocess
import sys


def llmbench(*args: str, cache=None) -> subprocess.CompletedProcess:
    """`python -m llmbench ARGS`, optionally with its own LLMBENCH_CACHE."""
    env = None if cache is None else {**os.environ, "LLMBENCH_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "llmbench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 2, one `error:` line holding every fragment, no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
