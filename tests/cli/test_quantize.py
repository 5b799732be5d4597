"""`--quantize` on `generate` and `serve`, `engine.quantize` in a run spec: what they print and
record, and one-line errors for a bad scheme."""

from __future__ import annotations

import json

import pytest

from llmbench.kernels import cpu_extension
from tests.cli.helpers import assert_user_error, llmbench
from tests.harness.test_run import SMALL, TINY


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_bad_scheme_is_one_line(command):
    args = ["--model", "synthetic:tiny", "--device", "cpu", "--quantize", "int4:48"]
    result = llmbench(command, *args, *(["w1"] if command == "generate" else []))
    assert_user_error(result, "quantize int4: group 48; use one of 32, 64, 128")


def test_generate_says_how_the_weights_are_held():
    result = llmbench(
        "generate",
        *("--model", "synthetic:tiny", "--device", "cpu", "--dtype", "bfloat16"),
        *("--quantize", "int4", "--max-tokens", "5", "--ignore-eos", "hello"),
    )
    assert result.returncode == 0, result.stderr
    assert "weights int4:32, lm_head int8, 0.1 MiB a step" in result.stderr
    assert "output=5 tok" in result.stderr


def test_a_run_records_the_quantisation(tmp_path):
    out = tmp_path / "run"
    result = llmbench(
        "run", "chat", *TINY, *SMALL["chat"], "--set", "engine.quantize=int8", "--no-report",
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "synthetic:tiny float32 weights int8 on" in result.stdout  # the summary's header
    results = json.loads((out / "results.json").read_text())
    assert results["spec"]["engine"]["quantize"] == "int8"
    assert results["provenance"]["quantize"] == "int8"
    roofline = results["roofline"]
    assert roofline["weights"] == "int8, lm_head int8"
    # tiny: vocab 512, hidden 64; the lm_head holds int8 codes + a scale per row: float32 in
    # the C++ extension's VNNI layout, bfloat16 in torch's kernel's.
    scale_bytes = 4 if cpu_extension.default().has_quant_gemv else 2
    assert roofline["lm_head_bytes_per_param"] == (512 * 64 + 512 * scale_bytes) / (512 * 64)


def test_a_bad_scheme_in_a_spec_is_one_line_naming_the_key(tmp_path):
    result = llmbench("run", "chat", *TINY, "--set", "engine.quantize=int3", "--out", str(tmp_path))
    assert_user_error(result, "engine.quantize", "quantize 'int3': unknown scheme")
