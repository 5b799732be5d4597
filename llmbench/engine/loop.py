"""`EngineLoop`: the engine's step loop on its own thread, for servers and async drivers.

Other threads submit and abort, and hand it calls to make between steps (`call`: the engine is
not thread-safe beyond submit and abort); the loop thread steps whenever there is work and hands
every `RequestOutput` to a callback (called on the loop thread: an asyncio user forwards it with
`loop.call_soon_threadsafe`). If a step raises, the loop stops, keeps the error, and hands it to
`on_error` once, so whoever waits on outputs can be told at once instead of waiting forever.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from llmbench.engine.engine import LLMEngine
from llmbench.engine.omp_workers import release_omp_workers
from llmbench.engine.records import RequestOutput
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import BackendFailure

_IDLE_WAIT_S = 0.05  # how long an idle loop sleeps before looking again (a submit wakes it)


class EngineLoop:
    def __init__(
        self,
        engine: LLMEngine,
        on_output: Callable[[RequestOutput], None],
        on_error: Callable[[BaseException], None] = lambda error: None,
    ):
        self.engine = engine
        self._on_output = on_output
        self._on_error = on_error
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llmbench-engine", daemon=True)
        self.error: BaseException | None = None  # what stopped the loop, if it crashed

    def start(self) -> EngineLoop:
        """Start stepping on the loop's thread. The calling thread's OpenMP workers end first
        (`omp_workers`): the engine's parallel regions then have the CPUs to themselves."""
        release_omp_workers()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def submit(
        self, prompt: str | Sequence[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        if self.error is not None:
            raise BackendFailure(f"the engine has stopped: {describe(self.error)}")
        request_id = self.engine.add_request(prompt, params, request_id)
        self._wake.set()
        return request_id

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run `fn()` on the loop thread before its next step; its result (or exception)
        arrives in the returned future. Refused with `BackendFailure` once the loop crashed."""
        if self.error is not None:
            raise BackendFailure(f"the engine has stopped: {describe(self.error)}")
        future: Future = Future()
        self._calls.put((fn, future))
        self._wake.set()
        return future

    def _run_calls(self) -> None:
        while not self._calls.empty():
            fn, future = self._calls.get()
            try:
                future.set_result(fn())
            except Exception as e:  # noqa: BLE001 — the caller's to handle, not the loop's
                future.set_exception(e)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._run_calls()
                if not self.engine.has_unfinished():
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                for output in self.engine.step():
                    self._on_output(output)
        except BaseException as e:  # kept and handed on: the thread must not die silently
            self.error = e
            self._on_error(e)
        failure = BackendFailure(
            "the engine has stopped" if self.error is None else describe(self.error)
        )
        while not self._calls.empty():  # no call waits on a loop that has ended
            self._calls.get()[1].set_exception(failure)


def describe(error: BaseException) -> str:
    """`TypeName: message`, the one line that names an engine crash."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
