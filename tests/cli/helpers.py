"""Running the `llmbench` command in a subprocess, and what a user error must look like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


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


def streaming_server(tpot_ms: float, record: Path) -> tuple[subprocess.Popen, str]:
    """The known-timing server (`tests.harness.streaming_server`) on a free loopback port: the
    process (close its stdin to stop it) and its base URL."""
    command = [sys.executable, "-m", "tests.harness.streaming_server", "--port", "0"]
    command += ["--ttft-ms", "20", "--tpot-ms", str(tpot_ms), "--record", str(record)]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    port = process.stdout.readline().strip()
    assert port.isdigit(), f"the streaming server did not start (exit {process.poll()})"
    return process, f"http://127.0.0.1:{port}/v1"
