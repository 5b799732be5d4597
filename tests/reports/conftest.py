from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.test_run import SMALL, TINY, llmbench


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory) -> Path:
    """A real run folder: the agentic workload on the tiny model, with SLOs (read-only)."""
    out = tmp_path_factory.mktemp("report") / "run"
    slo = ["--set", "slo.ttft_ms=200", "--set", "slo.tpot_ms=50"]
    result = llmbench("run", "agentic", *TINY, *SMALL["agentic"], *slo, "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out
