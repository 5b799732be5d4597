"""One asyncio client over the engine thread: submit, stream, abort, and crashes that reach
every waiter at once. `llmbench serve` and the in-process `engine` backend both use it.

The engine steps on its own thread (`EngineLoop`); outputs cross into the event loop with
`call_soon_threadsafe` and land in one queue per request. When the engine thread raises, every
open stream gets a `BackendFailure` naming the error in the same event-loop turn, and every
later submit is refused with it: nothing waits on a dead engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

from llmbench.engine.engine import LLMEngine
from llmbench.engine.loop import EngineLoop, describe
from llmbench.engine.records import RequestOutput
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import BackendFailure


class EngineClient:
    def __init__(
        self,
        engine: LLMEngine,
        on_output: Callable[[RequestOutput], None] = lambda output: None,
    ) -> None:
        """`on_output` sees every output on the event loop (a server's token counters)."""
        self.engine = engine
        self._on_output = on_output
        self._engine_loop: EngineLoop | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        # request id -> its outputs (or the failure that ends it); an entry leaves when its
        # final output arrives.
        self._queues: dict[str, asyncio.Queue[RequestOutput | BackendFailure]] = {}
        self.error: BackendFailure | None = None  # set once the engine thread has died

    async def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self._engine_loop = EngineLoop(self.engine, self._forward, self._forward_error).start()

    async def close(self) -> None:
        """Stop the engine thread (after its current step) and end every open stream."""
        if self._engine_loop is not None:
            await asyncio.to_thread(self._engine_loop.stop)
            self._engine_loop = None
        self._fail_all(BackendFailure("the engine was shut down"))

    @property
    def is_running(self) -> bool:
        return self._engine_loop is not None and self.error is None

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine makes them; the last has `finished` set.

        Raises `BackendFailure` if the engine dies first, and `UserError` if the engine refuses
        the request (too long for the context or the cache). A consumer that stops early (or is
        cancelled) aborts the request, which frees its KV blocks: use `contextlib.aclosing`
        when breaking out of the loop.
        """
        if self.error is not None:
            raise self.error
        if self._engine_loop is None:
            raise RuntimeError("EngineClient.generate before start()")
        queue: asyncio.Queue[RequestOutput | BackendFailure] = asyncio.Queue()
        self._queues[request_id] = queue  # before submitting: outputs may come at once
        try:
            self._engine_loop.submit(prompt_ids, params, request_id)
        except BaseException:
            del self._queues[request_id]
            raise
        is_finished = False
        try:
            while not is_finished:
                item = await queue.get()
                if isinstance(item, BackendFailure):
                    raise item
                is_finished = item.finished
                yield item
        finally:
            if not is_finished and self._queues.pop(request_id, None) is not None:
                self._engine_loop.abort(request_id)

    async def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache (between steps, on its thread); False while a
        request is queued or running. Raises the engine's `BackendFailure` once it died."""
        if self.error is not None:
            raise self.error
        if self._engine_loop is None:
            raise RuntimeError("EngineClient.reset_prefix_cache before start()")
        future = self._engine_loop.call(self.engine.reset_prefix_cache)
        return await asyncio.wrap_future(future)

    # -- the engine thread's side ---------------------------------------------------------

    def _forward(self, output: RequestOutput) -> None:  # on the engine thread
        with contextlib.suppress(RuntimeError):  # the event loop has closed: shutting down
            self._event_loop.call_soon_threadsafe(self._deliver, output)

    def _forward_error(self, error: BaseException) -> None:  # on the engine thread
        failure = BackendFailure(f"the engine stopped: {describe(error)}")
        failure.__cause__ = error
        with contextlib.suppress(RuntimeError):
            self._event_loop.call_soon_threadsafe(self._fail_all, failure)

    def _deliver(self, output: RequestOutput) -> None:
        self._on_output(output)
        queue = self._queues.get(output.request_id)
        if queue is None:
            return  # its consumer is gone
        if output.finished:
            del self._queues[output.request_id]
        queue.put_nowait(output)

    def _fail_all(self, failure: BackendFailure) -> None:
        if self.error is None and self._engine_loop is not None:
            self.error = failure
        for queue in self._queues.values():
            queue.put_nowait(failure)
        self._queues.clear()
