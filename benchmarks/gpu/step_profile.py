"""Where a decode step's time goes on the device: `torch.profiler` over `num_steps` eager
decode steps (CUDA graphs off, so each kernel is seen) of `batch` sequences at `context`.

`llmbench profile` profiles CPU steps only (`roofline.profile` forces the engine onto the CPU),
so on a GPU this part profiles the engine step's own CUDA engine instead: CPU and CUDA
activities, every kernel's device time grouped by kernel name.

  wall_ms   = mean `StepRecord` time of the profiled steps (with the profiler's overhead)
  busy_ms   = Σ kernel device time / steps   (CPU: Σ op self time / steps)
  busy_fraction = busy_ms / wall_ms          (the rest: launches, Python, the host waiting)
  each kernel: calls and ms per step, share of busy_ms
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.gpu.decode import start_decoding, stop

NUM_TOP = 12


def profile_point(
    engine: Any, batch: int, context: int, num_steps: int, deadline: float
) -> dict[str, Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    is_cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
    graphs = engine.runner.decode_graphs
    ids = start_decoding(engine, batch, context, num_steps + 1, deadline)
    try:
        engine.runner.decode_graphs = None
        engine.step()  # warm-up, eager
        with profile(activities=activities) as prof:
            for _ in range(num_steps):
                engine.step()
        records = list(engine.step_records)[-num_steps:]
    finally:
        engine.runner.decode_graphs = graphs
        stop(engine, ids)
    wanted = DeviceType.CUDA if is_cuda else DeviceType.CPU
    ops = []
    for avg in prof.key_averages():
        if avg.device_type != wanted or avg.key.startswith("ProfilerStep"):
            continue
        us = _self_device_us(avg) if is_cuda else avg.self_cpu_time_total
        if us > 0:
            ops.append((avg.key, avg.count, us))
    busy_ms = sum(us for _, _, us in ops) / num_steps / 1e3
    wall_ms = statistics.mean((r.t_end_ns - r.t_start_ns) / 1e6 for r in records)
    top = sorted(ops, key=lambda op: -op[2])[:NUM_TOP]
    return {
        "batch": batch,
        "context_mean": round(statistics.mean(c for r in records for c in r.context_lens)),
        "num_steps": num_steps,
        "activities": "cpu+cuda" if is_cuda else "cpu",
        "wall_ms": wall_ms,
        "busy_ms": busy_ms,
        "busy_fraction": busy_ms / wall_ms if wall_ms else None,
        "top": [
            {
                "name": name[:80],
                "calls_per_step": count / num_steps,
                "ms_per_step": us / num_steps / 1e3,
                "share": us / num_steps / 1e3 / busy_ms if busy_ms else None,
            }
            for name, count, us in top
        ],
    }


def _self_device_us(avg: Any) -> float:
    """A kernel's device time (torch >= 2.4 names it `self_device_time_total`)."""
    value = getattr(avg, "self_device_time_total", None)
    return value if value is not None else avg.self_cuda_time_total
