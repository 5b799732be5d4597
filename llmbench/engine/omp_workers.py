"""Handing torch's OpenMP worker threads over to the thread that steps the engine.

libgomp keeps a pool of worker threads for every thread that has started a parallel region, and
while it manages more threads than the machine has CPUs, a waiting worker spins only ~1,000
iterations before it sleeps on a futex (libgomp's `do_spin`: the throttled spin count), so that
every parallel region pays a sleep and a wake-up. The engine's step loop runs on its own thread
(`loop.EngineLoop`; `llmbench run`'s engine backend, `llmbench serve`), while the process loaded
the model and measured the roofs on its main thread, whose pool stays: on 2 cores with torch's
2 threads, 3 managed threads. Measured on the 2-core Intel Xeon (SmolLM2-135M bfloat16, 1,400
tokens of context, the same engine and config): decode steps of 14.4 ms on the main thread,
24.3 ms on a second one; the 120 layer matmuls of a decode step 8.4 ms against 17.8, and 8.4
again once the main thread's pool was released.

`release_omp_workers()` ends the calling thread's pool (OpenMP 5's `omp_pause_resource_all`, in
the libgomp torch loaded), so that the next thread to start parallel regions has the machine's
CPUs to itself; the caller's next parallel region builds its pool again.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

MAPS = Path("/proc/self/maps")
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: threads end, their state may be rebuilt later


@functools.cache
def _pause_resource_all():
    """`omp_pause_resource_all` of the libgomp this process has loaded (torch's own copy), or
    None where there is none to find (not Linux, another OpenMP runtime, an old libgomp)."""
    try:
        maps = MAPS.read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "libgomp" in line.split()[-1]}
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
    return None


def release_omp_workers() -> bool:
    """End the OpenMP worker threads of the calling thread's pool; False where libgomp (or its
    `omp_pause_resource_all`) is not found or refused."""
    pause = _pause_resource_all()
    return pause is not None and pause(OMP_PAUSE_SOFT) == 0
