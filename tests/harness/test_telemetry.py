"""Telemetry samples the real machine on the run's clock; GPU columns only where NVML reads them."""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import threading
import time
from itertools import pairwise
from types import SimpleNamespace

import psutil
import pytest

from llmbench.harness.telemetry import (
    CPU_COLUMNS,
    GPU_COLUMNS,
    Telemetry,
    read_csv,
    summarize,
)


@pytest.fixture
def no_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError


def _burn_cpu(duration_s: float) -> None:
    end = time.perf_counter() + duration_s
    x = 0
    while time.perf_counter() < end:
        x += 1


def test_samples_a_busy_process_on_the_run_clock(no_pynvml):
    num_threads = threading.active_count()
    rss_bytes = psutil.Process().memory_info().rss
    start_ns = time.perf_counter_ns()
    with Telemetry(interval_s=0.02) as tel:
        _burn_cpu(0.3)
    end_ns = time.perf_counter_ns()
    assert threading.active_count() == num_threads  # the sampler thread was joined

    samples = tel.samples
    # Not 15: the busy loop holds the GIL, and each of the sampler's /proc reads waits up to 5 ms
    # to take it back, so here a sample takes ~30 ms and comes every ~55 ms.
    assert len(samples) >= 3
    t_ns = [s["t_ns"] for s in samples]
    assert all(a < b for a, b in pairwise(t_ns))
    assert start_ns < t_ns[0] and t_ns[-1] < end_ns
    gaps_s = [(b - a) / 1e9 for a, b in pairwise(t_ns)]
    assert 0.01 < statistics.median(gaps_s) < 0.2
    for s in samples:
        assert list(s) == list(CPU_COLUMNS)
        assert 0.5 * rss_bytes < s["rss_bytes"] < 2 * rss_bytes
        assert 0 <= s["system_cpu_percent"] <= 100
    # The loop held a core throughout (~100 each); the mean allows a window lost to other jobs.
    assert statistics.fmean(s["process_cpu_percent"] for s in samples) > 20


def test_exit_returns_promptly_with_a_long_interval(no_pynvml):
    num_threads = threading.active_count()
    t0 = time.perf_counter()
    with Telemetry(interval_s=10.0) as tel:
        assert threading.active_count() == num_threads + 1
    assert time.perf_counter() - t0 < 1.0  # the wait is interrupted, not slept out
    assert threading.active_count() == num_threads
    assert tel.samples == []  # nothing before the first interval ended


def test_csv_has_the_cpu_columns_and_one_row_per_sample(no_pynvml, tmp_path):
    with Telemetry(interval_s=0.02) as tel:
        _burn_cpu(0.15)
    path = tmp_path / "telemetry.csv"
    tel.write_csv(path)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["t_ns", "process_cpu_percent", "system_cpu_percent", "rss_bytes"]
    assert len(rows) - 1 == len(tel.samples) > 0
    for row, sample in zip(rows[1:], tel.samples, strict=True):
        assert int(row[0]) == sample["t_ns"] and int(row[3]) == sample["rss_bytes"]
        assert float(row[1]) == sample["process_cpu_percent"]
        assert float(row[2]) == sample["system_cpu_percent"]
    assert not (tmp_path / "telemetry.csv.tmp").exists()


def test_with_csv_path_each_sample_is_on_disk_while_sampling(no_pynvml, tmp_path):
    """A run killed mid-way keeps its telemetry: rows are flushed as they are taken."""
    path = tmp_path / "telemetry.csv"
    with Telemetry(interval_s=0.02, csv_path=path) as tel:
        _burn_cpu(0.15)
        on_disk = read_csv(path)  # read while the sampler still runs
        # A row reaches the disk just before its sample joins `samples`: compare what both have.
        taken = [{k: float(v) for k, v in s.items()} for s in tel.samples]
        n = min(len(on_disk), len(taken))
        assert n >= 1
        assert on_disk[:n] == taken[:n]
    assert read_csv(path) == [{k: float(v) for k, v in s.items()} for s in tel.samples]
    assert path.read_text().splitlines()[0] == ",".join(CPU_COLUMNS)


def test_read_csv_drops_a_row_cut_by_a_kill_and_empty_cells(tmp_path):
    path = tmp_path / "telemetry.csv"
    path.write_text("t_ns,rss_bytes,power_w\n1,10,\n2,20,5.5\n3,3")
    assert read_csv(path) == [
        {"t_ns": 1.0, "rss_bytes": 10.0},
        {"t_ns": 2.0, "rss_bytes": 20.0, "power_w": 5.5},
    ]
    assert read_csv(tmp_path / "none.csv") == []
    # A column some samples lack is summarised over the samples that have it.
    assert summarize(read_csv(path))["rss_bytes"] == {"mean": 15.0, "max": 20.0}


def test_without_nvml_a_note_says_so_and_there_are_no_gpu_columns(no_pynvml):
    with Telemetry(interval_s=0.02) as tel:
        _burn_cpu(0.05)
    assert tel.notes == ["no NVML: sampled CPU and RSS only (nvidia-ml-py not installed)"]
    assert tel.columns == CPU_COLUMNS
    assert all(not set(GPU_COLUMNS) & set(s) for s in tel.samples)


def test_nvml_init_failure_is_a_note(monkeypatch):
    def fail():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=fail))
    with Telemetry(interval_s=10.0) as tel:
        pass
    assert tel.notes == [
        "no NVML: sampled CPU and RSS only (nvmlInit failed: NVML Shared Library Not Found)"
    ]
    assert tel.columns == CPU_COLUMNS


class _FakeNvml:
    """The nvidia-ml-py calls telemetry makes, with an older binding's throttle-reasons name and a
    board that cannot report power."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self):
        self.is_shut_down = False
        self.handle_indices = []

    def nvmlInit(self):  # noqa: N802 - the binding's names
        pass

    def nvmlShutdown(self):  # noqa: N802
        self.is_shut_down = True

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        self.handle_indices.append(index)
        return f"gpu{index}"

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetClockInfo(self, handle, clock):  # noqa: N802
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetPowerUsage(self, handle):  # noqa: N802
        raise RuntimeError("Not Supported")

    def nvmlDeviceGetTemperature(self, handle, sensor):  # noqa: N802
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 63

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        return SimpleNamespace(used=5 << 30, total=80 << 30)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):  # noqa: N802
        return 0x4  # SW power cap


def test_gpu_columns_come_from_nvml_and_an_unreadable_one_is_a_note(monkeypatch):
    nvml = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")  # cuda:0 is the physical GPU 3
    with Telemetry(interval_s=0.02) as tel:
        _burn_cpu(0.1)
    assert nvml.handle_indices == [3] and nvml.is_shut_down
    assert tel.notes == ["GPU column power_w not sampled: NVML cannot read it here"]
    gpu_columns = tuple(c for c in GPU_COLUMNS if c != "power_w")
    assert tel.columns == CPU_COLUMNS + gpu_columns
    assert tel.samples
    for s in tel.samples:
        assert {c: s[c] for c in gpu_columns} == {
            "gpu_util_percent": 87,
            "mem_util_percent": 41,
            "sm_clock_mhz": 1980,
            "mem_clock_mhz": 2619,
            "temperature_c": 63,
            "gpu_memory_used_bytes": 5 << 30,
            "throttle_reasons": 0x4,
        }


def test_power_is_read_in_watts_and_the_new_event_reasons_name_is_preferred(monkeypatch):
    nvml = _FakeNvml()
    nvml.nvmlDeviceGetPowerUsage = lambda handle: 412_500  # milliwatts
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: 0x20  # SW thermal slowdown
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with Telemetry(interval_s=0.02, gpu_index=1) as tel:
        _burn_cpu(0.1)
    assert nvml.handle_indices == [1] and tel.notes == []
    assert tel.samples
    assert all(s["power_w"] == 412.5 and s["throttle_reasons"] == 0x20 for s in tel.samples)


def test_a_failing_sample_is_skipped_with_one_note(no_pynvml, monkeypatch):
    def denied(interval=None):
        raise psutil.AccessDenied(msg="/proc/stat")

    monkeypatch.setattr(psutil, "cpu_percent", denied)
    with Telemetry(interval_s=0.02) as tel:
        _burn_cpu(0.1)
    assert tel.samples == []
    assert len(tel.notes) == 2  # no NVML; the skipped samples
    assert tel.notes[1].startswith("telemetry skipped ")
    assert "first error: AccessDenied" in tel.notes[1]


def test_summarize_gives_mean_and_max_per_column():
    samples = [
        {"t_ns": 100, "process_cpu_percent": 50.0, "rss_bytes": 1000, "throttle_reasons": 0x1},
        {"t_ns": 200, "process_cpu_percent": 150.0, "rss_bytes": 3000, "throttle_reasons": 0x4},
        {"t_ns": 300, "process_cpu_percent": 100.0, "rss_bytes": 2000, "throttle_reasons": 0x0},
    ]
    assert summarize(samples) == {
        "process_cpu_percent": {"mean": 100.0, "max": 150.0},  # (50 + 150 + 100) / 3
        "rss_bytes": {"mean": 2000.0, "max": 3000},
        "throttle_reasons": {"any": 0x5},  # 0x1 | 0x4 | 0x0
    }
    assert summarize([]) == {}


def test_module_imports_no_torch_and_no_engine():
    code = (
        "import sys, llmbench.harness.telemetry\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('llmbench.engine')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
