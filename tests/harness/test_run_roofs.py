"""The roofs a run is measured against: measured, cached or from a datasheet, each number with
its source; the openai backend's estimated decode points."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from llmbench.errors import UserError
from llmbench.harness import provenance, run_roofs
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import HardwareCeilings, Probe, Roofs


def test_openai_roofline_is_estimated_against_a_named_datasheet(tmp_path):
    """A remote server on an H100: MBU of the estimated decode against the datasheet's 3.35
    TB/s; without `backend.hardware`, achieved numbers only."""
    from llmbench.engine.presets import PRESETS
    from llmbench.harness.records import RequestRecord
    from llmbench.harness.run_roofs import estimated_points, roofline_setup
    from llmbench.harness.spec_load import load_spec
    from llmbench.roofline.analysis import phase_utilization
    from llmbench.roofline.cost_model import decode_cost

    spec_file = tmp_path / "remote.yaml"
    spec_file.write_text("dtype: bfloat16\nbackend: {kind: openai, url: 'http://x/v1'}\n")
    # One stream decoding alone: 11 tokens 10 ms apart after a 10-token prompt (1.6 TB/s).
    record = RequestRecord(
        "r",
        "s",
        0,
        scheduled_ns=0,
        sent_ns=0,
        end_ns=100_000_000,
        num_prompt_tokens=10,
        chunk_ns=[i * 10_000_000 for i in range(11)],
        chunk_tokens=[1] * 11,
    )
    config = PRESETS["llama-3.1-8b"]
    step = decode_cost(config, 1, 16, 2, 2)  # contexts 11..20: mean 15.5 → 16
    for hardware, mbu in (("h100", step.bytes / 1e-2 / 3.35e12), (None, None)):
        spec = load_spec(spec_file, [f"backend.hardware={hardware}"] if hardware else [])
        setup, cost_step = roofline_setup(spec, None, config, None)
        assert cost_step is None and setup.is_estimated and setup.phases == {}
        points = estimated_points(spec, config, [record])
        assert len(points) == 1
        roofs = setup.roofs
        decode = phase_utilization(
            points, roofs and roofs.read_bytes_per_s, roofs and roofs.flops_per_s
        )["decode"]
        assert decode["bytes_per_s"] == pytest.approx(step.bytes / 1e-2)
        assert decode["mbu"] == (None if mbu is None else pytest.approx(mbu))
    assert setup.roofs is None and setup.datasheet_roofs is None


@pytest.mark.parametrize(
    ("weights", "bytes_per_param", "label"),
    [
        (["backend.weights=q4_1"], 20 / 32, "q4_1"),  # 32 weights in 16 B of nibbles + 2 f16
        (["backend.weights=int8"], 1.0, "int8"),
        (["backend.weights_bytes_per_param=0.6"], 0.6, "0.6 bytes/param"),
        ([], 2.0, None),  # unknown: the bytes assume the spec's dtype, and the label says so
    ],
)
def test_a_servers_weights_set_the_estimated_decode_bytes(
    tmp_path, weights, bytes_per_param, label
):
    """A server running Q4_1 moves ~0.63 bytes per parameter, not bfloat16's 2: its estimated
    decode bandwidth follows `backend.weights`; the KV cache stays in the spec's dtype."""
    from llmbench.engine.presets import PRESETS
    from llmbench.harness.records import RequestRecord
    from llmbench.harness.run_roofs import estimated_points, roofline_setup
    from llmbench.harness.spec_load import load_spec
    from llmbench.roofline.cost_model import decode_cost

    spec_file = tmp_path / "remote.yaml"
    spec_file.write_text("dtype: bfloat16\nbackend: {kind: openai, url: 'http://x/v1'}\n")
    spec = load_spec(spec_file, weights)
    record = RequestRecord(
        "r", "s", 0, scheduled_ns=0, sent_ns=0, end_ns=10_000_000, num_prompt_tokens=10,
        chunk_ns=[i * 1_000_000 for i in range(11)], chunk_tokens=[1] * 11,
    )  # fmt: skip
    config = PRESETS["llama-3.1-8b"]
    setup, _ = roofline_setup(spec, None, config, None)
    assert setup.weights == label and setup.weight_bytes_per_param == bytes_per_param
    assert setup.kv_bytes_per_elem == 2.0
    assert ("weights unknown (the bytes assume bfloat16" in setup.method) == (label is None)
    (point,) = estimated_points(spec, config, [record])
    step = decode_cost(config, 1, 16, bytes_per_param, 2.0)  # contexts 11..20: mean 16
    assert point["bytes"] == pytest.approx(10 * step.bytes)  # 10 decode steps in the window


def measured(matmul: dict[str, float]) -> HardwareCeilings:
    return HardwareCeilings(
        device="NVIDIA H100 80GB HBM3",
        device_type="cuda",
        threads=1,
        torch="2.13.0",
        copy_bytes_per_s=2.9e12,
        read_bytes_per_s=3.0e12,
        matmul_flops_per_s=matmul,
        method="m",
        sources={"read": "measured now", "bfloat16": "cache /c.json (measured 2026-11-22 10:00)"},
    )


SHEET = Roofs("datasheet H100-SXM", 3.35e12, 989e12, {})


def test_measured_roofs_say_where_each_number_came_from():
    roofs = run_roofs._measured_roofs(measured({"bfloat16": 700e12}), "bfloat16", SHEET)
    assert (roofs.read_bytes_per_s, roofs.flops_per_s) == (3.0e12, 700e12)
    assert roofs.label == "measured NVIDIA H100 80GB HBM3"
    assert roofs.sources == {
        "read_bytes_per_s": "measured now",
        "flops_per_s": "cache /c.json (measured 2026-11-22 10:00)",
    }


def test_a_dtype_the_budget_skipped_takes_the_datasheet_rate_or_none():
    roofs = run_roofs._measured_roofs(measured({}), "bfloat16", SHEET)
    assert roofs.flops_per_s == 989e12
    assert roofs.sources["flops_per_s"] == "datasheet H100-SXM"
    bare = run_roofs._measured_roofs(measured({}), "bfloat16", None)
    assert bare.flops_per_s is None and bare.read_bytes_per_s == 3.0e12
    assert bare.sources["flops_per_s"].startswith("none: bfloat16 matmul not measured")


def test_the_roofs_budget_comes_from_the_environment(monkeypatch):
    assert run_roofs._roofs_budget_s(60.0) == 60.0
    monkeypatch.setenv("LLMBENCH_ROOFS_BUDGET_S", "2.5")
    assert run_roofs._roofs_budget_s(60.0) == 2.5
    for bad in ("soon", "0", "nan"):
        monkeypatch.setenv("LLMBENCH_ROOFS_BUDGET_S", bad)
        with pytest.raises(UserError, match=f"LLMBENCH_ROOFS_BUDGET_S={bad}: give a number"):
            run_roofs._roofs_budget_s(60.0)


def decode_record(num_tokens: int = 11) -> RequestRecord:
    """One stream alone: `num_tokens` one-token chunks 1 ms apart after a 10-token prompt."""
    return RequestRecord(
        "r", "s", 0, scheduled_ns=0, sent_ns=0, end_ns=num_tokens * 1_000_000,
        num_prompt_tokens=10, chunk_ns=[i * 1_000_000 for i in range(num_tokens)],
        chunk_tokens=[1] * num_tokens,
    )  # fmt: skip


def openai_spec(tmp_path, url: str, *sets: str):
    from llmbench.harness.spec_load import load_spec

    spec_file = tmp_path / "remote.yaml"
    spec_file.write_text(f"dtype: bfloat16\nbackend: {{kind: openai, url: '{url}'}}\n")
    return load_spec(spec_file, list(sets))


def test_a_llmbench_server_says_its_dtype_and_the_roofline_costs_its_bytes(tmp_path, capsys):
    """`llmbench serve` in float32 with a bfloat16 spec: the estimated roofline reads 4 bytes a
    weight and a K/V element, as the server says, not the spec's 2 (MBU 2× too high before)."""
    from llmbench.engine.engine import EngineConfig, LLMEngine
    from llmbench.harness.backends.openai import OpenAIBackend
    from llmbench.roofline.cost_model import decode_cost
    from llmbench.serve import ServeConfig
    from tests.serve.helpers import serving

    engine = LLMEngine(
        EngineConfig(model="synthetic:tiny", dtype="float32", device="cpu", kv_cache_memory=2**22)
    )
    config = engine.model_config
    with serving(engine, ServeConfig(served_model_name="tiny")) as url:
        spec = openai_spec(tmp_path, url + "/v1")
        backend = OpenAIBackend(spec.backend.url)
        setup, _ = run_roofs.roofline_setup(spec, backend, config, None)
    assert (backend.served.id, backend.served.dtype, backend.served.quantization) == (
        "tiny",
        "float32",
        None,
    )
    assert (setup.dtype, setup.weights) == ("float32", "float32")
    assert (setup.weight_bytes_per_param, setup.kv_bytes_per_elem) == (4.0, 4.0)
    assert setup.method.endswith("; weights float32, as the server says")
    assert capsys.readouterr().err == ""  # nothing assumed
    (point,) = run_roofs.estimated_points(spec, config, [decode_record()], setup)
    step = decode_cost(config, 1, 16, 4.0, 4.0)  # contexts 11..20: mean 16
    assert point["bytes"] == pytest.approx(10 * step.bytes)  # 10 decode steps in the window
    # Told by the spec, the spec wins over the server.
    told = openai_spec(tmp_path, "http://x/v1", "backend.weights=int8")
    assert run_roofs.server_weights(told, backend.served) == (1.0, "int8")


@pytest.mark.parametrize(
    ("served", "weights", "dtype"),
    [
        ({"dtype": "float16"}, "float16", "float16"),
        ({"dtype": "torch.float32"}, "float32", "float32"),
        ({"dtype": "float16", "quantization": "int4:32"}, None, "float16"),  # bytes unknown
        ({"dtype": "auto"}, None, "bfloat16"),  # not a dtype: the spec's is assumed
        ({}, None, "bfloat16"),  # vLLM, SGLang, llama.cpp: nothing said
    ],
)
def test_what_a_server_says_sets_the_weights_and_what_is_assumed(served, weights, dtype):
    from llmbench.harness.backends.openai import served_model
    from llmbench.harness.spec import BackendSpec, RunSpec
    from llmbench.roofline.cost_model import BYTES_PER_ELEM

    card = served_model({"data": [{"id": "m", **served}]}, None)
    spec = RunSpec(model="synthetic:tiny", dtype="bfloat16", backend=BackendSpec(kind="openai"))
    assert run_roofs.server_weights(spec, card) == (BYTES_PER_ELEM[dtype], weights)
    assert (run_roofs.served_dtype(card) or spec.dtype) == dtype


def test_a_server_that_says_nothing_gets_the_spec_dtype_and_a_warning(tmp_path, capsys):
    """A server with no dtype in its model card (the test streaming server, as vLLM): today's
    bytes (the spec's bfloat16), and the run says so: on stderr now, in its warnings at the end."""
    from llmbench.engine.presets import PRESETS
    from llmbench.harness.backends.openai import OpenAIBackend
    from llmbench.harness.run_warnings import assumed_weights_line
    from tests.harness.backends.test_openai import REPO_ROOT

    process = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.streaming_server", "--port", "0", "--record",
         str(tmp_path / "server.jsonl")],
        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{process.stdout.readline().strip()}/v1"
        spec = openai_spec(tmp_path, url)
        backend = OpenAIBackend(url)
        setup, _ = run_roofs.roofline_setup(spec, backend, PRESETS["llama-3.1-8b"], None)
    finally:
        process.stdin.close()  # the server exits when its stdin closes
        process.wait(timeout=10)
    assert backend.served is not None and backend.served.dtype is None
    assert (setup.dtype, setup.weights, setup.weight_bytes_per_param) == ("bfloat16", None, 2.0)
    line = assumed_weights_line(setup)
    assert line == (
        "the server does not say how it stores its weights: the estimated roofline assumes "
        "bfloat16 (2 bytes/param); set backend.weights if it is another"
    )
    assert capsys.readouterr().err == f"roofline: {line}\n"


def probe(best_per_s: float, spread: float, converged: bool, measured_unix_s: float) -> Probe:
    return Probe(
        size=1,
        repeats=6,
        seconds=1 / best_per_s,
        measured_unix_s=measured_unix_s,
        best_per_s=best_per_s,
        spread=spread,
        converged=converged,
    )


def cpu_roofs(sources: dict[str, str], read: Probe, bf16: Probe) -> HardwareCeilings:
    return HardwareCeilings(
        device="cpu0",
        device_type="cpu",
        threads=2,
        torch="2.13.0",
        copy_bytes_per_s=8e9,
        read_bytes_per_s=read.best_per_s,
        matmul_flops_per_s={"bfloat16": bf16.best_per_s},
        method="m",
        probes={"read": read, "bfloat16": bf16},
        sources=sources,
    )


T = 1_795_000_000.0  # the roofs' measurement, wall clock
QUIET_LOAD = {
    "is_busy": False,
    "cpu_count": 2,
    "other_processes_cores_before": 0.02,
    "other_processes_cores": 0.04,
}
BUSY_LOAD = {**QUIET_LOAD, "is_busy": True, "other_processes_cores": 0.98}


def test_the_roofs_line_says_which_roofs_how_old_how_settled_and_how_quiet():
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(T))
    cache = f"cache /c.json (measured {date})"
    roofs = cpu_roofs(
        {"read": cache, "bfloat16": cache},
        probe(9.5e9, 0.02, True, T),
        probe(57e9, 0.05, True, T - 60),
    )
    loads = {"read": QUIET_LOAD, "bfloat16": QUIET_LOAD}
    # 3 h 5 min after the older one (bfloat16's).
    line = run_roofs.roofs_line(roofs, loads, "bfloat16", T - 60 + 3 * 3600 + 300)
    older = time.strftime("%Y-%m-%d %H:%M", time.localtime(T - 60))
    assert line == (
        f"roofs: cached {older} (3 h old), read 9.5 GB/s ±2%, bfloat16 57.0 GFLOP/s ±5%; "
        "measured on a quiet machine"
    )


def test_the_roofs_line_of_roofs_measured_now_on_a_busy_machine():
    now = {"read": "measured now", "bfloat16": "measured now"}
    roofs = cpu_roofs(now, probe(18.1e9, 0.32, False, T), probe(97e9, 0.29, False, T))
    line = run_roofs.roofs_line(
        roofs, {"read": BUSY_LOAD, "bfloat16": BUSY_LOAD}, "bfloat16", T, took_s=33.34
    )
    assert line == (
        "roofs: measured now in 33.3 s, read 18.1 GB/s ±32% unsettled, bfloat16 97.0 GFLOP/s "
        "±29% unsettled; measured on a busy machine (other processes used up to 0.98 of 2 "
        "cores): cached marked busy, not as this machine's; the next run on a quiet machine "
        "measures them again"
    )


def test_the_roofs_line_of_roofs_partly_cached_and_without_a_load_reading():
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(T))
    roofs = cpu_roofs(
        {"read": f"cache /c.json (measured {date})", "bfloat16": "measured now"},
        probe(9.5e9, 0.02, True, T),
        probe(57e9, 0.0, True, T + 7200),
    )
    line = run_roofs.roofs_line(roofs, {"read": None}, "bfloat16", T + 7200)
    assert line == (
        f"roofs: measured now and cached, read 9.5 GB/s ±2% (cached {date}), bfloat16 57.0 "
        "GFLOP/s ±0% (measured now); the machine's load was not watched when they were measured"
    )
    # A dtype the budget skipped: said so.
    roofs = cpu_roofs({"read": "measured now"}, probe(9.5e9, 0.02, True, T), probe(1, 0, True, T))
    roofs = replace(roofs, probes={"read": roofs.probes["read"]})
    line = run_roofs.roofs_line(roofs, {}, "bfloat16", T, took_s=1.0)
    assert line.startswith("roofs: measured now in 1.0 s, read 9.5 GB/s ±2%, bfloat16 not measured")


def test_a_runs_roofs_measured_busy_are_said_so_and_cached_marked_busy(
    tmp_path, monkeypatch, capsys
):
    """The run's LoadMonitor, on scripted readings (another process at 0.75 cores), watches the
    roofs' measurement: the run's line says busy, and the cache marks every probe busy."""
    import torch

    from llmbench.harness.spec import RunSpec
    from llmbench.roofline import ceilings
    from tests.harness.test_provenance import Machine
    from tests.roofline.test_ceilings import fake_measure

    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(ceilings, "measure", fake_measure([], skipped=()))
    machine = Machine(others=0.75, self_=1.0)
    monkeypatch.setattr(
        run_roofs, "LoadMonitor", lambda: provenance.LoadMonitor(readings=machine.readings())
    )
    backend = SimpleNamespace(engine=SimpleNamespace(device=torch.device("cpu")))
    roofs = run_roofs.measured_roofs(RunSpec(dtype="bfloat16"), backend)
    assert roofs.read_bytes_per_s == 3e9 and roofs.sources["read"] == "measured now"
    err = capsys.readouterr().err
    assert "roofs: measured now in " in err
    assert err.splitlines()[-1].endswith(
        "read 3.0 GB/s ±0%, bfloat16 1.0 GFLOP/s ±0%; measured on a busy machine (other "
        "processes used up to 0.75 of 2 cores): cached marked busy, not as this machine's; the "
        "next run on a quiet machine measures them again"
    )
    (cache_file,) = (tmp_path / "hardware").iterdir()
    loads = json.loads(cache_file.read_text())["probe_loads"]
    assert {name: load["is_busy"] for name, load in loads.items()} == dict.fromkeys(loads, True)
    assert roofs.notes[0].startswith("measured on a busy machine")  # kept in results.json


def test_the_kv_cache_line_says_its_size_and_why():
    engine = SimpleNamespace(
        kv_cache=SimpleNamespace(num_bytes=1210 * 16 * 23040, num_tokens=19_360),
        kv_cache_sizing="sized for the workload: 4 sequences of up to 3,872 tokens + 25%",
    )
    assert run_roofs.kv_cache_line(engine) == (
        "K/V cache: 425 MiB, 19,360 tokens (sized for the workload: 4 sequences of up to 3,872 "
        "tokens + 25%)"
    )
