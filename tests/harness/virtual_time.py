"""Virtual time for tests of timing logic: a clock that moves only when the code under test
waits or declares work, so what a test asserts about schedules and lags is exact and no busy
machine can make it fail (a wall-clock check failed in CI with 1 s of lag on a loaded host).

`clock()` is the `perf_counter_ns` of the code under test; `clock.work(s)` stands for s seconds
of blocking work (a slow tokenizer, a callback that holds the event loop); `clock.run(coro)` runs
a coroutine on an event loop whose time is this clock and which, when nothing is ready to run,
jumps straight to its next timer instead of sleeping. The loop keeps time as float seconds, so a
wake-up may land up to `LOOP_ROUNDING_NS` after the nanosecond asked for.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Coroutine
from typing import Any

LOOP_ROUNDING_NS = 1_000


class VirtualClock:
    def __init__(self, start_ns: int = 1_000_000_000_000):
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def work(self, seconds: float) -> None:
        """`seconds` of blocking work: the clock moves, nothing else runs meanwhile."""
        self.now_ns += round(seconds * 1e9)

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        loop = _VirtualLoop(self)
        try:
            return loop.run_until_complete(coroutine)
        finally:
            loop.close()


class _IdleJumpSelector(selectors.DefaultSelector):
    """Polls for I/O without waiting; where the loop would have slept, the clock moves on."""

    def __init__(self, clock: VirtualClock):
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None):
        events = super().select(None if timeout is None else 0)
        if not events and timeout:
            self._clock.now_ns += max(1, math.ceil(timeout * 1e9))
        return events


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock):
        super().__init__(_IdleJumpSelector(clock))
        self._virtual_clock = clock

    def time(self) -> float:
        return self._virtual_clock.now_ns / 1e9
