"""Releasing the calling thread's OpenMP workers (`engine.omp_workers`): the worker threads end
and the next parallel region starts them again; the engine loop does it before it starts."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from llmbench.engine import loop as loop_module
from llmbench.engine import omp_workers
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.loop import EngineLoop


def _threads() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


def _parallel_region() -> None:
    """A torch op big enough to run on every intra-op thread (its OpenMP pool's workers)."""
    torch.ones(1 << 22).mul_(2.0).sum()


def test_release_ends_this_threads_workers_and_the_next_region_starts_them_again():
    workers = torch.get_num_threads() - 1  # a pool of n threads: this one and n - 1 workers
    _parallel_region()
    with_pool = _threads()
    assert omp_workers.release_omp_workers()
    assert _threads() == with_pool - workers  # ended and joined before the call returned
    _parallel_region()
    assert _threads() == with_pool


def test_no_libgomp_found_is_false_not_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(omp_workers, "MAPS", tmp_path / "absent")
    omp_workers._pause_resource_all.cache_clear()
    try:
        assert omp_workers.release_omp_workers() is False
    finally:
        omp_workers._pause_resource_all.cache_clear()


def test_the_engine_loop_releases_its_callers_workers_before_it_steps(monkeypatch):
    engine = LLMEngine(EngineConfig(model="synthetic:tiny", device="cpu"))
    calls = []
    monkeypatch.setattr(
        loop_module, "release_omp_workers", lambda: calls.append(threading.current_thread())
    )
    engine_loop = EngineLoop(engine, lambda output: None).start()
    engine_loop.stop()
    assert calls == [threading.current_thread()]
