"""benchmarks/gpu/sitting: its CPU dry run end to end (the GPU sitting's plumbing on tiny
shapes, Triton in its interpreter), with a step made to fail; and its time boxes by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu.budget import step_timeout_s
from benchmarks.gpu.plan import CPU_DRY_RUN, GPU, STEPS
from benchmarks.gpu.report import above_roof, markdown, roof_rows, steps_only, targets
from benchmarks.gpu.sitting import pytest_files
from benchmarks.gpu.step_process import StepOutcome, run_step
from tests.fresh_cache import fresh_cache

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_FILES = {
    "summary.md",
    "summary.json",
    "sitting.log",
    "pytest-gpu.xml",
    "agentic-report.html",
    "agentic-results.json",
    "agentic-telemetry.csv",
}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run with the roofs step made to fail: (exit code, stdout, OUT)."""
    out = tmp_path_factory.mktemp("sitting-out")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT")}
    env.update(
        PYTHON=sys.executable,
        OUT=str(out),
        LLMBENCH_SITTING_INJECT="roofs",
        LLMBENCH_CACHE=str(fresh_cache(tmp_path_factory.mktemp("llmbench-cache"))),
        OMP_NUM_THREADS="1",  # a shared 2-core machine: see tests/test_docs.py
    )
    done = subprocess.run(
        [str(ROOT / "benchmarks" / "gpu" / "sitting"), "--cpu-dry-run"],
        cwd=out,  # the wrapper finds the repo from its own path
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done.returncode, done.stdout, out


def test_the_dry_run_writes_its_files_and_records_the_failed_step(dry_run):
    code, stdout, out = dry_run
    assert code == 1, stdout  # a step failed
    assert {p.name for p in out.iterdir()} == EXPECTED_FILES
    assert len(EXPECTED_FILES) <= 8
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: (s["status"], s["error"]) for s in summary["steps"]}
    assert list(status) == list(STEPS)
    assert status["roofs"] == ("failed", "sitting: injected failure in roofs")
    assert all(status[s][0] == "ok" for s in STEPS if s != "roofs"), status
    assert summary["ceilings"] is None  # nothing from the failed step...
    # ...and the engine step measured the roofs it needed itself.
    assert summary["roofs_used"]["roofs"]["read_bytes_per_s"] > 0
    assert "measured now" in summary["roofs_used"]["sources"].values()


def test_the_dry_run_tables_hold_numbers(dry_run):
    _, _, out = dry_run
    summary = json.loads((out / "summary.json").read_text())
    tests = summary["pytest"]
    assert tests["passed"] >= 1 and tests["failures"] == tests["errors"] == 0
    parity = summary["parity"]
    assert {(r["arch"], r["dtype"]) for r in parity} == {
        (arch, dtype) for arch in CPU_DRY_RUN.parity_archs for dtype in CPU_DRY_RUN.parity_dtypes
    }
    assert all(
        r["is_pass"] and r["num_tokens"] == CPU_DRY_RUN.num_parity_decode_steps + 1 for r in parity
    )
    decode = summary["decode"]
    points = {(b, c) for b in CPU_DRY_RUN.decode_batches for c in CPU_DRY_RUN.decode_contexts}
    assert {(r["batch"], r["context"], r["graphs"]) for r in decode} == {
        (b, c, mode) for b, c in points for mode in ("on", "off")
    }
    for row in decode:
        assert row["num_steps"] == CPU_DRY_RUN.num_decode_steps
        assert row["tok_per_s"] == pytest.approx(row["batch"] / (row["tpot_ms"] / 1e3))
        assert row["context_max"] <= row["context"]  # no measured step past the point
        point = f"decode batch {row['batch']} context {row['context']} graphs {row['graphs']}:"
        assert is_within_roof_or_named(row["mbu"], point, summary["problems"])
        assert row["whatif_ms"] > 0
        assert row["measured_over_whatif"] == pytest.approx(row["tpot_ms"] / row["whatif_ms"])
        assert not row["is_graphed"]  # a CPU has no CUDA graphs
    (attention,) = summary["attention"]
    # tiny: 4 heads, 2 KV heads of 16, float32, batch 2 x 64 tokens, one partition:
    # q + out 2·2·4·16·4 + K/V 128·2·2·16·4 + tables 4·(4 + 4) + lengths 4·2
    assert attention["bytes"] == 1024 + 32768 + 32 + 8
    assert attention["bytes_per_s"] == pytest.approx(
        attention["bytes"] / attention["ms_best"] * 1e3
    )
    prefill = summary["prefill"]
    assert [r["num_tokens"] for r in prefill] == list(CPU_DRY_RUN.prefill_tokens)
    for row in prefill:
        point = f"prefill of {row['num_tokens']} tokens:"
        assert is_within_roof_or_named(row["mfu"], point, summary["problems"])
        assert row["step_ms"] > 0
    assert [r["batch"] for r in summary["profile"]] == list(CPU_DRY_RUN.profile_batches)
    assert all(r["top"] and r["busy_ms"] > 0 for r in summary["profile"])
    run = summary["run"]
    assert run["num_completed"] > 0 and run["num_failed"] == 0 and run["output_tok_per_s"] > 0
    for target in summary["targets"]:
        if target["value"] is None:  # an MBU or MFU left blank, named in the problems
            assert target["verdict"] == "no data"
            assert any("above the measured" in p for p in summary["problems"])
        else:
            assert target["value"] > 0 and target["verdict"] in ("met", "missed")
    text = (out / "summary.md").read_text()
    for heading in (
        "## Steps",
        "## Engine vs transformers",
        "## Decode",
        "## Prefill",
        "## Paged decode attention kernel alone",
        "## Targets",
        "## Profile",
    ):
        assert heading in text
    html = (out / "agentic-report.html").read_text()
    assert "<svg" in html and 'src="figures/' not in html  # one self-contained file


def is_within_roof_or_named(value, point: str, problems: list[str]) -> bool:
    """An MBU or MFU in (0, 1], or left blank with a problem line saying the point ran above
    its roof: the dry run's 3-second roof probes can be measured while CI's other tests load
    the machine, and the point run faster later."""
    if value is not None:
        return 0 < value <= 1
    return any(p.startswith(point) and "above the measured" in p for p in problems)


def test_the_summary_is_printed_last(dry_run):
    _, stdout, _ = dry_run
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("GPU sitting (cpu-dry-run)") and "not ok: roofs" in lines[0]
    assert lines[-1].startswith(f"  {len(EXPECTED_FILES)} files: ")
    assert [line.split()[0] for line in lines[1 : 1 + len(STEPS)]] == list(STEPS)


def test_a_step_past_its_box_is_stopped_with_what_it_started(tmp_path):
    child = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
    )
    t0 = time.monotonic()
    outcome = run_step(
        "slow", [sys.executable, "-c", child], 2.0, tmp_path / "out", dict(os.environ), tmp_path
    )
    assert outcome.status == "timeout" and outcome.seconds < 10
    assert time.monotonic() - t0 < 10
    grandchild = int((tmp_path / "out").read_text().split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(grandchild, 0)


def test_a_step_gets_its_box_but_never_its_successors_reserve():
    assert step_timeout_s(90, 400, 240) == 90
    assert step_timeout_s(90, 300, 240) == 60
    assert step_timeout_s(90, 230, 240) == -10  # below MIN_STEP_S: skipped
    # The GPU plan's reserves fit in its total, and the last step has none after it.
    assert sum(b.reserve_s for _, b in GPU.budgets) < GPU.total_s
    assert GPU.later_reserve_s("run") == 0
    assert GPU.later_reserve_s("engine") == GPU.budget("run").reserve_s


def test_the_gpu_tests_are_the_gpu_marked_and_triton_kernel_files():
    files = pytest_files()
    assert "tests/engine/test_cuda_graphs.py" in files
    assert "tests/kernels/test_decode_attention.py" in files
    assert not any(Path(f).name.startswith("test_cpu_") for f in files)
    assert "tests/engine/test_scheduler.py" not in files


def test_roofs_beside_the_datasheet_by_hand():
    summary = {
        "ceilings": {
            "read_bytes_per_s": 3.0e12,
            "copy_bytes_per_s": 2.7e12,
            "matmul_flops_per_s": {"bfloat16": 7.0e14},
        },
        "datasheet": {"memory_bandwidth_bytes_per_s": 3.35e12, "flops_per_s": {"bfloat16": 989e12}},
        "fp8": {"best_per_s": 1.2e15},
    }
    assert roof_rows(summary) == [
        ["HBM read GB/s", "3000.0", "3350.0", "0.90"],
        ["HBM copy GB/s", "2700.0", "3350.0", "0.81"],
        ["matmul bfloat16 TFLOP/s", "700.0", "989.0", "0.71"],
        ["matmul fp8 TFLOP/s (sitting's probe)", "1200.0", "-", "-"],
    ]


def test_points_above_their_roof_are_named_by_hand():
    roofs = {"roofs": {"read_bytes_per_s": 2e9, "flops_per_s": 1e11}}
    decode = {"batch": 1, "context": 64, "graphs": "on", "bytes_per_s": 3e9, "mbu": None}
    records = [
        {"part": "roofs", "row": roofs},
        {"part": "decode", "row": decode},
        {"part": "decode", "row": decode | {"graphs": "off", "bytes_per_s": 1e9, "mbu": 0.5}},
        {"part": "prefill", "row": {"num_tokens": 256, "flops_per_s": 3.5e11, "mfu": None}},
        {"part": "prefill", "row": {"num_tokens": 64, "flops_per_s": 5e10, "mfu": 0.5}},
    ]
    assert above_roof(records) == [
        "decode batch 1 context 64 graphs on: read 3.00 GB/s, above the measured read roof "
        "2.00 GB/s; MBU left blank (measure the roofs again on a quiet device)",
        "prefill of 256 tokens: 0.350 TFLOP/s, above the measured matmul roof 0.100 TFLOP/s; "
        "MFU left blank (measure the roofs again on a quiet device)",
    ]
    assert above_roof([{"part": "roofs", "row": {"roofs": {"read_bytes_per_s": None}}}]) == []


def test_targets_are_judged_on_the_plans_points():
    decode = {"batch": 1, "graphs": "on", "context": 1024, "mbu": 0.8, "measured_over_whatif": 1.2}
    records = [
        {"part": "decode", "row": decode},
        {"part": "decode", "row": decode | {"context": 8192, "mbu": 0.5}},
        {"part": "prefill", "row": {"num_tokens": 2048, "mfu": 0.7}},
        {"part": "prefill", "row": {"num_tokens": 8192, "mfu": 0.55}},
    ]
    assert [(t["value"], t["verdict"]) for t in targets(records)] == [
        (0.8, "met"),
        (None, "no data"),
        (1.2, "missed"),
        (0.55, "missed"),
    ]


def test_a_gpu_shaped_summary_renders_its_datasheet_and_telemetry_cells():
    summary = steps_only("gpu", [StepOutcome("device", "ok", 4.0, 0)], 4.0)
    summary["device"] = {"card": "NVIDIA H200", "driver": "580.1", "datasheet": "H200"}
    summary["ceilings"] = {"read_bytes_per_s": 4.32e12, "matmul_flops_per_s": {}}
    summary["datasheet"] = {"memory_bandwidth_bytes_per_s": 4.8e12, "flops_per_s": {}}
    summary["run"] = {
        "num_completed": 40,
        "num_failed": 0,
        "output_tok_per_s": 2500.0,
        "ttft_ms_p50": 35.0,
        "tpot_ms_p50": 7.25,
        "decode_mbu": 0.61,
        "prefill_mfu": 0.4,
        "telemetry": {
            "power_w": {"mean": 412.4, "max": 655.0},
            "sm_clock_mhz": {"mean": 1980.0, "max": 1980.0},
            "gpu_memory_used_bytes": {"mean": 1.2e11, "max": 1.31e11},
        },
        "telemetry_notes": [],
    }
    text = markdown(summary)
    assert "NVIDIA H200, driver 580.1" in text
    assert "| HBM read GB/s | 4320.0 | 4800.0 | 0.90 |" in text
    assert "| 40 | 0 | 2500 | 35.0 | 7.25 | 0.61 | 0.40 | 412/655 | 1980 | 131.0 |" in text
    assert "| device | ok | 4 |  |" in text
