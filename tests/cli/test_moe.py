"""`llmbench moe prune`, and `generate` / `run` with offloaded experts, on tiny-moe: the report,
the checkpoint, the simulated link in a run folder, and one-line errors."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import assert_user_error, llmbench

SMALL = ("--tokens", "32", "--context", "16", "--decode-tokens", "4", "--device", "cpu")
SMALL_WORKLOAD = (
    "--set",
    "workload.sessions=2",
    "--set",
    "workload.turns={dist: fixed, value: 1}",
    "--set",
    "workload.output_tokens={dist: fixed, value: 4}",
)


def test_prune_prints_the_before_after_table_and_writes_a_loadable_folder(tmp_path):
    out = tmp_path / "pruned"
    result = llmbench(
        "moe", "prune", "synthetic:tiny-moe", "--workload", "chat", "--keep", "4",
        "--out", str(out), "--dtype", "float32", *SMALL, *SMALL_WORKLOAD,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        f"llmbench moe prune: synthetic:tiny-moe -> {out} (float32), 4 of 8 experts per layer"
    )
    rows = {line[:26].strip(): line[26:].split() for line in lines[2:9]}
    assert rows["parameters"] == ["181,760", "132,096"]  # 2 layers x 4 experts x (6,144 + 64)
    assert (out / "pruning.json").is_file() and (out / "tokenizer.json").is_file()
    generated = llmbench(
        "generate", "hi", "--model", str(out), "--max-tokens", "3", "--ignore-eos",
        "--device", "cpu",
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr


def test_generate_with_offloaded_experts_says_the_link_is_simulated():
    result = llmbench(
        "generate", "hello", "--model", "synthetic:tiny-moe", "--max-tokens", "4",
        "--ignore-eos", "--device", "cpu", "--moe-offload", "resident=2,cache=1,link=pcie3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith("[experts offloaded: 2 of 8 resident per layer (ids 0-1), LRU of 1")
    assert "link 16.0 GB/s simulated (recorded, not slept)] link " in line


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--keep", "0"), "--keep must be >= 1"),
        (("--keep", "9"), "more than the model's 8 experts"),
        (("--keep", "1"), "fewer than the 2 experts each token runs"),
        (("--keep", "2", "--workload", "nope"), "workload 'nope': no such file"),
        (("--keep", "2", "--model-is", "x"), None),
    ],
)
def test_prune_errors_are_one_line(tmp_path, args, fragment):
    base = ["moe", "prune", "synthetic:tiny-moe", "--out", str(tmp_path / "o")]
    if "--workload" not in args:
        base += ["--workload", "chat"]
    result = llmbench(*base, *args, *SMALL)
    if fragment is None:  # click's own usage error: no traceback either
        assert result.returncode == 2 and "Traceback" not in result.stderr
        return
    assert_user_error(result, fragment)


def test_prune_refuses_a_dense_model_and_a_full_out_folder(tmp_path):
    result = llmbench(
        "moe", "prune", "synthetic:tiny", "--workload", "chat", "--keep", "2",
        "--out", str(tmp_path / "o"), *SMALL,
    )  # fmt: skip
    assert_user_error(result, "has no experts")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    result = llmbench(
        "moe", "prune", "synthetic:tiny-moe", "--workload", "chat", "--keep", "2",
        "--out", str(tmp_path / "full"), *SMALL,
    )  # fmt: skip
    assert_user_error(result, "not an empty folder")


@pytest.mark.parametrize(
    ("offload", "fragment"),
    [
        ("resident=2,link=pcie9", "link 'pcie9'"),
        ("cache=2", "resident=N is required"),
        ("resident=2,link=real", "no host link to copy over"),
    ],
)
def test_generate_offload_errors_are_one_line(offload, fragment):
    result = llmbench(
        "generate", "x", "--model", "synthetic:tiny-moe", "--device", "cpu",
        "--moe-offload", offload,
    )  # fmt: skip
    assert_user_error(result, fragment)


def test_a_run_with_offloaded_experts_records_the_simulated_link(tmp_path):
    out = tmp_path / "run"
    result = llmbench(
        "run", "chat", "--set", "model=synthetic:tiny-moe", "--set", "dtype=float32",
        "--set", "device=cpu", "--set", "engine.moe_offload={resident: 2, cache: 1}",
        "--set", "workload.sessions=2", "--set", "workload.think_time_s=0",
        "--set", "load={kind: concurrency, concurrency: 2}", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    provenance = json.loads((out / "results.json").read_text())["provenance"]
    assert provenance["moe_offload"] == {
        "num_resident": 2,
        "num_cached": 1,
        "is_simulated": True,
        "link_bytes_per_s": 32e9,
        "is_slept": False,
        "expert_bytes": 3 * 64 * 32 * 4,
        "usage_profile": None,
    }
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    moved = [s for s in steps if s["link_bytes"]]
    assert moved and all(s["link_bytes"] % (3 * 64 * 32 * 4) == 0 for s in moved)
    assert all(s["link_s_simulated"] == pytest.approx(s["link_bytes"] / 32e9) for s in steps)
    assert "host link (simulated)" in (out / "report.html").read_text()
