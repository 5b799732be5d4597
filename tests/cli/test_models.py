"""`llmbench inspect` and `llmbench models`: models looked into without loading, and pulls."""

from __future__ import annotations

import subprocess
import sys

from tests.cli.helpers import llmbench


def test_inspect_synthetic_70b_without_loading():
    result = llmbench("inspect", "synthetic:llama-3.1-70b")
    assert result.returncode == 0, result.stderr
    assert "model.layers.79.mlp.down_proj.weight" in result.stdout
    # 70.55 B parameters: the published count for Llama-3.1-70B.
    assert "70,553,706,496" in result.stdout


def test_models_list_shows_presets(tmp_path):
    result = llmbench("models", "list", cache=tmp_path)
    assert result.returncode == 0
    assert "smollm2-135m" in result.stdout and "not pulled" in result.stdout
    assert "llama-3.1-8b" in result.stdout


def test_pull_failure_is_one_line(tmp_path):
    """No index reachable: pip fails, and the message points at the synthetic preset."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        LLMBENCH_CACHE=str(tmp_path),
        PIP_CONFIG_FILE=os.devnull,
        PIP_RETRIES="0",
        PIP_INDEX_URL="http://127.0.0.1:9/simple",
        PIP_DEFAULT_TIMEOUT="2",
    )
    result = subprocess.run(
        [sys.executable, "-m", "llmbench", "models", "pull", "smollm2-135m"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: models pull smollm2-135m") and "synthetic:smollm2-135m" in last
