"""The measured phase of a run, `repeat` times on one backend: the warm-up once, then each
repetition replays the workload with its own prompt salt through its own driver, and every record
it makes is logged tagged with its number (0: the warm-up).

Repetition k > 1 salts every session's own text (`rep<k>-`), so it cannot hit the prefix cache on
what repetition k − 1 sent and look faster for it; the salt changes words only, never a token
count, output length or delay, and what the workload shares between its sessions (system prompt,
tool schemas, RAG corpus) stays shared, as within one repetition.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from collections.abc import Awaitable, Callable

from llmbench.harness.driver import DriveOptions, Driver, SessionStats
from llmbench.harness.record_log import RecordLog
from llmbench.harness.records import Backend, RequestRecord
from llmbench.harness.workloads import Session

WARMUP = 0  # the repetition number of the warm-up's records


def salt(number: int) -> str:
    """The prompt salt of repetition `number`: none for the first (a run of one repetition
    sends what it always sent), `rep<k>-` for the k-th."""
    return "" if number == 1 else f"rep{number}-"


class Repetitions:
    """Drives the warm-up and the repetitions of one run point, keeping what they measured.

    `records` and `sessions` hold every record made so far, tagged, in the order they ended;
    `num_started` / `num_whole` count the repetitions begun and run to their end, so a run
    stopped in repetition k keeps 1..k and knows k is partial.
    """

    def __init__(
        self,
        backend: Backend,
        tokenizer,
        options: DriveOptions,
        log: RecordLog,
        workloads: list[list[Session]],
        on_start: Callable[[int], object] | None = None,
        reset: Callable[[], Awaitable[object]] | None = None,
    ):
        self.backend, self.tokenizer, self.options, self.log = backend, tokenizer, options, log
        # Called with each repetition's number as it starts, before its first request (the
        # backend is idle then: the warm-up's or the last repetition's requests have all ended).
        self.on_start = on_start
        # Awaited before each repetition's first request, before `on_start`: empties the
        # backend's prefix cache (`backend.reset_prefix_cache`), so each repetition starts cold.
        self.reset = reset
        self.workloads = workloads  # repetition k's sessions at index k - 1
        self.records: list[RequestRecord] = []
        self.sessions: list[SessionStats] = []
        self.num_started = 0
        self.num_whole = 0
        self._driver: Driver | None = None  # the repetition under way

    async def warm_up(self, sessions: list[Session]) -> None:
        await self._new_driver(WARMUP, None).warm_up(sessions)

    async def run(self, measure: Callable[[Driver, list[Session]], Awaitable[object]]) -> None:
        """Each repetition in turn: `measure(driver, sessions)` runs its load pattern."""
        for number, sessions in enumerate(self.workloads, 1):
            # Everything allocated so far lives for the whole run: keep the garbage collector
            # off it, or a full collection (torch is imported) stalls every stream for 20-40 ms.
            # Nothing is in flight here (after the warm-up, between repetitions).
            gc.collect()
            gc.freeze()
            label = (
                f"repetition {number}/{len(self.workloads)}: " if len(self.workloads) > 1 else ""
            )
            progress = Progress(sum(len(s.turns) for s in sessions), label)
            if self.reset is not None:
                await self.reset()
            self.num_started = number
            if self.on_start is not None:
                self.on_start(number)
            self.log.start_repetition(number, time.perf_counter_ns())
            self._driver = self._new_driver(number, progress)
            await measure(self._driver, sessions)
            self._keep_sessions(number)
            self.num_whole = number

    def close(self) -> None:
        """Keep the sessions that ended in a repetition cut short (call once the drive ended)."""
        if self.num_started > self.num_whole:
            self._keep_sessions(self.num_started)

    def _new_driver(self, number: int, progress: Progress | None) -> Driver:
        def on_record(record: RequestRecord) -> None:
            tagged = dataclasses.replace(record, repetition=number)
            self.records.append(tagged)
            self.log.request(tagged)
            if progress is not None:
                progress(tagged)

        self._driver = Driver(self.backend, self.tokenizer, self.options, on_record=on_record)
        return self._driver

    def _keep_sessions(self, number: int) -> None:
        for stats in self._driver.result.sessions:
            tagged = dataclasses.replace(stats, repetition=number)
            self.sessions.append(tagged)
            self.log.session(tagged)


class Progress:
    """One status line on stderr: requests done, output tokens/s, errors."""

    def __init__(self, total: int, label: str = ""):
        self.total, self.label = total, label
        self.done = self.failed = self.tokens = 0
        self.start = time.perf_counter()
        self.is_tty = sys.stderr.isatty()

    def __call__(self, record: RequestRecord) -> None:
        if record.is_warmup:
            return
        self.done += 1
        self.failed += not record.ok
        self.tokens += record.num_output_tokens
        if self.is_tty or self.done == self.total or self.done % max(1, self.total // 10) == 0:
            rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
            end = "\n" if not self.is_tty or self.done == self.total else ""
            print(
                f"\r  {self.label}{self.done}/{self.total} requests, {rate:.1f} output tok/s, "
                f"{self.failed} errors",
                end=end,
                file=sys.stderr,
                flush=True,
            )
