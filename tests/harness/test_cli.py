"""The CLI end to end in a subprocess: real exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.engine.helpers import write_tiny_checkpoint


def llmbench(*args: str, cache=None) -> subprocess.CompletedProcess:
    env = None
    if cache is not None:
        import os

        env = {**os.environ, "LLMBENCH_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "llmbench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def test_generate_streams_text_and_prints_timings(tiny_folder):
    result = llmbench(
        "generate",
        "--model",
        str(tiny_folder),
        "--max-tokens",
        "7",
        "--ignore-eos",
        "--device",
        "cpu",
        "w1 w2 w3",
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) == 7  # seven word-level tokens, nothing else on stdout
    assert "prompt=3 tok" in result.stderr and "output=7 tok" in result.stderr
    assert "GB/s" in result.stderr


def test_generate_seed_is_reproducible(tiny_folder):
    args = (
        "generate",
        "--model",
        str(tiny_folder),
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--temperature",
        "1.0",
        "--seed",
        "3",
        "w1",
    )
    assert llmbench(*args).stdout == llmbench(*args).stdout


def test_missing_model_path(tmp_path):
    assert_user_error(
        llmbench("generate", "--model", str(tmp_path / "nope"), "hi"), "no such file or folder"
    )


def test_truncated_safetensors(tmp_path, tiny_folder):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_folder, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_user_error(llmbench("generate", "--model", str(broken), "w1"), "model.safetensors")


def test_truncated_gguf(tmp_path, smollm2_gguf_path):
    cut = tmp_path / "cut.gguf"
    with smollm2_gguf_path.open("rb") as f:
        cut.write_bytes(f.read(5_000_000))
    assert_user_error(llmbench("generate", "--model", str(cut), "hi"), "cut.gguf")


def test_unsupported_architecture(tmp_path, tiny_folder):
    import shutil

    other = tmp_path / "gpt2"
    shutil.copytree(tiny_folder, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (other / "config.json").write_text(json.dumps(config))
    assert_user_error(
        llmbench("inspect", str(other)), "unsupported architecture", "GPT2LMHeadModel"
    )


def test_prompt_longer_than_context(tiny_folder):
    prompt = " ".join(f"w{i % 200}" for i in range(600))  # the tiny model's window is 512
    assert_user_error(
        llmbench("generate", "--model", str(tiny_folder), prompt), "context window of 512"
    )


def test_invalid_sampling_value(tiny_folder):
    assert_user_error(
        llmbench("generate", "--model", str(tiny_folder), "--top-p", "1.5", "w1"), "top_p"
    )


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


def test_roofline_what_if_without_weights(tmp_path):
    html = tmp_path / "whatif.html"
    result = llmbench(
        "roofline",
        "--model",
        "synthetic:llama-3.1-8b",
        "--hardware",
        "h100",
        "--batch",
        "1,64",
        "--context",
        "1k",
        "--json",
        "--html",
        str(html),
    )
    assert result.returncode == 0, result.stderr
    points = json.loads(result.stdout)["points"]
    # The plots: a point per (context, batch) on the roofline, curves against the batch.
    page = html.read_text()
    for key in ("whatif-roofline", "whatif-decode_tok_per_s", "whatif-tpot_ms_bound"):
        assert f'<figure id="{key}">' in page
    start = page.index('<figure id="whatif-roofline">')
    roofline = page[start : page.index("</figure>", start)]
    assert roofline.count('class="tip"') == 2  # a point with its hover text per step
    assert [(p["context"], p["batch"]) for p in points] == [(1024, 1), (1024, 64)]
    one = points[0]
    # Batch 1 is memory-bound: ~15 GB of bf16 weights (the untied embedding gathers one row)
    # plus 1,024 tokens x 128 KiB of KV, at the datasheet's 3.35 TB/s.
    assert one["bound"] == "memory"
    assert one["decode_step_ms"] == pytest.approx(one["bytes_per_step"] / 3.35e12 * 1e3)
    assert 4.4 < one["decode_step_ms"] < 4.6
    assert one["kv_bytes_per_seq"] == 1024 * 2 * 32 * 8 * 128 * 2
    assert points[1]["decode_tok_per_s"] > 30 * one["decode_tok_per_s"]  # batching amortises


def test_roofline_on_the_measured_roofs_of_this_machine():
    from llmbench.harness import hardware

    result = llmbench(
        "roofline", "-m", "smollm2-135m", "--hardware", "measured", "--batch", "1", "--json"
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    measured = hardware.ceilings("cpu")  # the cache the command filled or read
    assert out["peak_bytes_per_s"] == measured["read_bytes_per_s"]
    assert out["peak_flops_per_s"] == measured["matmul_flops_per_s"]["bfloat16"]
    assert out["hardware"].startswith("measured")


def test_roofline_unknown_hardware_is_one_line():
    assert_user_error(
        llmbench("roofline", "--model", "tiny", "--hardware", "abacus"), "unknown hardware 'abacus'"
    )
