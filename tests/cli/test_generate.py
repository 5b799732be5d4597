"""`llmbench generate` end to end: streamed text, timings, one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import assert_user_error, llmbench
from tests.engine.helpers import write_tiny_checkpoint


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


@pytest.mark.parametrize(
    ("speculative", "says"),
    [
        ("ngram:3", "[speculative ngram (n 4 down to 2), k=3]"),
        ("draft:self:layers=1:2", "[speculative draft self:layers=1 (of 2), k=2, in the target"),
    ],
)
def test_speculative_generate_prints_the_same_text_and_its_acceptance(
    tiny_folder, speculative, says
):
    args = ("generate", "--model", str(tiny_folder), "--max-tokens", "12", "--ignore-eos")
    args += ("--device", "cpu", "w1 w2 w3 w1 w2 w3 w1 w2")
    plain = llmbench(*args)
    fast = llmbench(*args, "--speculative", speculative)
    assert fast.returncode == 0, fast.stderr
    assert fast.stdout == plain.stdout
    assert says in fast.stderr and "draft tokens accepted" in fast.stderr
    assert "output=12 tok" in fast.stderr  # every token counted, however many a step brought


@pytest.mark.parametrize(
    ("speculative", "message"),
    [
        (
            "eagle:3",
            "--speculative eagle:3: expected none | ngram[:K][:adaptive] | "
            "draft:MODEL[:K][:adaptive]",
        ),
        ("draft:synthetic:tiny", "its vocabulary has 512 tokens, the target's 300"),
        ("draft:self:layers=9", "expected self:layers=N (1 <= N <= 2, the target's layers)"),
    ],
)
def test_a_bad_speculative_setting_is_one_line(tiny_folder, speculative, message):
    result = llmbench(
        "generate",
        "--model",
        str(tiny_folder),
        "--speculative",
        speculative,
        "--device",
        "cpu",
        "w1",
    )
    assert_user_error(result, message)
