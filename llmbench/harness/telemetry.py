"""Machine telemetry sampled in the background during a run, on the run's clock.

A daemon thread samples this process's CPU and RSS, the whole machine's CPU and, where NVML can
see the GPU, its utilisation, clocks, power, temperature, memory and throttle reasons, every
`interval_s`. Each sample carries `t_ns = time.perf_counter_ns()`, the clock of every request and
step record, so a stall in the records can be lined up with a clock drop or a CPU spike.

A sample is two /proc reads (psutil) and eight NVML calls, ~0.1 ms of work. Each of those
releases the GIL, and while another thread runs pure Python, taking it back waits up to the
switch interval (5 ms): the sample then takes ~30 ms (measured, CPU part) and the busy thread
loses only the microseconds the sampler runs. So process CPU comes from `time.process_time_ns()`,
read with `t_ns` and no GIL release (psutil's /proc read adds ~15 ms and has 10 ms ticks).
"""

from __future__ import annotations

import contextlib
import csv
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import psutil

Sample = dict[str, int | float]  # column name -> value; every sample of a run has the same keys

CPU_COLUMNS = ("t_ns", "process_cpu_percent", "system_cpu_percent", "rss_bytes")

# Each GPU column and how to read it: (nvml module, device handle) -> value. The first reader
# that works when the device is opened is kept; a column none can read is left out, with a note.
_GpuReader = Callable[[Any, Any], int | float]
_GPU_COLUMNS: tuple[tuple[str, tuple[_GpuReader, ...]], ...] = (
    # % of the driver's last sample period (1/6 s to 1 s) in which a kernel ran / memory was
    # read or written. Read twice, once per column: one cheap call, and the table stays flat.
    ("gpu_util_percent", (lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,)),
    ("mem_util_percent", (lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).memory,)),
    ("sm_clock_mhz", (lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),)),
    ("mem_clock_mhz", (lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),)),
    ("power_w", (lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000,)),  # NVML gives mW
    (
        "temperature_c",
        (lambda nvml, h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),),
    ),
    ("gpu_memory_used_bytes", (lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).used,)),
    # The nvmlClocksEventReason* bitmask (power cap, thermal, idle...). NVML 12.2 renamed
    # "throttle reasons" to "clocks event reasons"; older bindings or drivers have only the old.
    (
        "throttle_reasons",
        (
            lambda nvml, h: nvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            lambda nvml, h: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        ),
    ),
)
GPU_COLUMNS = tuple(name for name, _ in _GPU_COLUMNS)


class Telemetry:
    """Samples the machine every `interval_s` in a daemon thread while used as a context manager.

    `gpu_index` is NVML's index; None means the first GPU CUDA would give this process (the
    first entry of CUDA_VISIBLE_DEVICES, else index 0). Anything that stops GPU sampling
    (no nvidia-ml-py, no driver, no such GPU) becomes a line in `notes`, never an exception.
    With `csv_path`, every sample is also appended to that CSV as it is taken (header first,
    each row flushed), so a run killed with `kill -9` keeps its telemetry too.
    """

    def __init__(
        self, interval_s: float = 0.1, gpu_index: int | None = None, csv_path: Path | None = None
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"telemetry interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.gpu_index = gpu_index
        self.notes: list[str] = []
        self.columns: tuple[str, ...] = CPU_COLUMNS
        self._samples: list[Sample] = []
        self._process = psutil.Process()
        self._nvml: Any = None
        self._gpu_handle: Any = None
        self._gpu_readers: list[tuple[str, _GpuReader]] = []
        self._last_t_ns = 0  # the previous sample's clock and process CPU time
        self._last_cpu_ns = 0
        self._num_skipped = 0
        self._first_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._csv_path = csv_path
        self._csv_file: IO[str] | None = None
        self._csv: Any = None  # csv.writer of _csv_file

    @property
    def samples(self) -> list[Sample]:
        """The samples so far, oldest first (a copy: the thread may still be appending)."""
        return list(self._samples)

    def __enter__(self) -> Telemetry:
        self._gpu_readers = []
        self._open_gpu()
        self.columns = CPU_COLUMNS + tuple(name for name, _ in self._gpu_readers)
        if self._csv_path is not None:
            self._csv_file = self._csv_path.open("w", newline="")
            self._csv = csv.writer(self._csv_file)
            self._csv.writerow(self.columns)
            self._csv_file.flush()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="llmbench-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()  # wakes the thread's Event.wait at once
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # best effort: the samples are already taken
                self._nvml.nvmlShutdown()
            self._nvml = None
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = self._csv = None
        if self._num_skipped:
            self.notes.append(
                f"telemetry skipped {self._num_skipped} sample(s); first error: {self._first_error}"
            )

    def write_csv(self, path: Path) -> None:
        """Write a header of `columns`, then one row per sample (written whole or not at all)."""
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            writer.writerows([sample[c] for c in self.columns] for sample in self._samples)
        tmp.replace(path)

    def _run(self) -> None:
        # Both CPU figures are deltas since the previous sample; these readings start the first.
        # (psutil keeps cpu_percent(None)'s previous reading per thread: no other caller moves it.)
        self._last_t_ns, self._last_cpu_ns = time.perf_counter_ns(), time.process_time_ns()
        with contextlib.suppress(Exception):  # a failure here recurs, and is noted, in _sample
            psutil.cpu_percent(None)
        next_s = time.perf_counter() + self.interval_s
        while not self._stop.wait(max(0.0, next_s - time.perf_counter())):
            self._sample()
            next_s += self.interval_s
            if next_s < time.perf_counter():  # fell behind (a stall): resume, don't burst
                next_s = time.perf_counter() + self.interval_s

    def _sample(self) -> None:
        t_ns, cpu_ns = time.perf_counter_ns(), time.process_time_ns()  # no GIL release between
        # CPU time of all this process's threads over wall time, in % of one core: 250 means two
        # and a half cores busy (as `top` and psutil.Process.cpu_percent count it).
        process_cpu_percent = 100 * (cpu_ns - self._last_cpu_ns) / (t_ns - self._last_t_ns)
        self._last_t_ns, self._last_cpu_ns = t_ns, cpu_ns
        try:
            sample: Sample = {
                "t_ns": t_ns,
                "process_cpu_percent": round(process_cpu_percent, 1),
                "system_cpu_percent": psutil.cpu_percent(None),  # of all cores: 100 = all busy
                "rss_bytes": self._process.memory_info().rss,
            }
            for name, read in self._gpu_readers:
                sample[name] = read(self._nvml, self._gpu_handle)
            if self._csv is not None:
                self._csv.writerow([sample[c] for c in self.columns])
                self._csv_file.flush()
        # Anything (psutil.AccessDenied, a lost GPU) costs this sample only: a dead sampler
        # thread would silently end the telemetry for the rest of the run.
        except Exception as e:
            self._num_skipped += 1
            if not self._first_error:
                self._first_error = f"{type(e).__name__}: {e}"
            return
        self._samples.append(sample)

    def _open_gpu(self) -> None:
        """Initialise NVML and keep the GPU columns it can read; a note says why if none."""
        try:
            import pynvml  # PyPI nvidia-ml-py; optional
        except ImportError:
            self._note_no_gpu("nvidia-ml-py not installed")
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded...
            self._note_no_gpu(f"nvmlInit failed: {e}")
            return
        try:
            handle = _device_handle(pynvml, self.gpu_index)
        except Exception as e:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            which = "visible" if self.gpu_index is None else self.gpu_index
            self._note_no_gpu(f"no GPU {which}: {e}")
            return
        self._nvml, self._gpu_handle = pynvml, handle
        for name, readers in _GPU_COLUMNS:
            reader = _first_working(readers, pynvml, handle)
            if reader is None:
                self.notes.append(f"GPU column {name} not sampled: NVML cannot read it here")
            else:
                self._gpu_readers.append((name, reader))

    def _note_no_gpu(self, why: str) -> None:
        self.notes.append(f"no NVML: sampled CPU and RSS only ({why})")


def _device_handle(nvml: Any, gpu_index: int | None) -> Any:
    """NVML's handle for `gpu_index`, or for CUDA's first visible device when None.

    NVML numbers GPUs physically and ignores CUDA_VISIBLE_DEVICES, so "cuda:0" of a process
    started with CUDA_VISIBLE_DEVICES=3 is NVML index 3 (or a GPU-/MIG- UUID given there).
    """
    if gpu_index is not None:
        return nvml.nvmlDeviceGetHandleByIndex(gpu_index)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nvml.nvmlDeviceGetHandleByIndex(0)
    first = visible.split(",")[0].strip()
    if first.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(first))
    if first.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(first)
    raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} makes no GPU visible")


def _first_working(readers: Sequence[_GpuReader], nvml: Any, handle: Any) -> _GpuReader | None:
    for read in readers:
        try:
            read(nvml, handle)
        except Exception:  # NVMLError_NotSupported, a function missing from bindings or driver
            continue
        return read
    return None


def summarize(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    """Per column, the mean and max over the samples; {} when there are none.

    Formula: mean = sum(values) / num_samples, max = max(values). `t_ns` is left out, and the
    `throttle_reasons` bitmask, which has no meaningful mean, gets {"any": OR of all masks}
    (the reasons seen at least once).
    """
    if not samples:
        return {}
    summary: dict[str, dict[str, float]] = {}
    for column in samples[0]:
        values = [sample[column] for sample in samples if column in sample]
        if column == "throttle_reasons":
            mask = 0
            for value in values:
                mask |= int(value)
            summary[column] = {"any": mask}
        elif column != "t_ns":
            summary[column] = {"mean": statistics.fmean(values), "max": max(values)}
    return summary


def read_csv(path: Path) -> list[Sample]:
    """The samples of a telemetry CSV ([] when absent); a row cut by a kill mid-write is
    dropped, and so is an empty cell (a column the sample could not read)."""
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()  # cut by a kill mid-write
    rows = list(csv.reader(lines))
    header = rows[0] if rows else []
    return [
        {k: float(v) for k, v in zip(header, row, strict=True) if v != ""}
        for row in rows[1:]
        if len(row) == len(header)
    ]
