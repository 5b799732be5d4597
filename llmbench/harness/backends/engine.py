"""The built-in engine, in-process: its step loop on its own thread, outputs into asyncio.

Token times are the engine's own `perf_counter_ns()` stamps, taken when each token is on the
host, so the thread hop to the event loop adds nothing to TTFT or ITL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.loop import EngineLoop
from llmbench.engine.records import RequestOutput, StepRecord
from llmbench.engine.sampling import SamplingParams
from llmbench.harness.records import GenerationRequest, StreamEvent


class EngineBackend:
    name = "engine"

    def __init__(self, config: EngineConfig):
        self.engine = LLMEngine(config)
        self._loop: EngineLoop | None = None
        self._queues: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._event_loop: asyncio.AbstractEventLoop | None = None

    @property
    def step_records(self) -> list[StepRecord]:
        return self.engine.step_records

    async def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self._loop = EngineLoop(self.engine, self._deliver).start()

    def _deliver(self, output: RequestOutput) -> None:  # on the engine thread
        queue = self._queues.get(output.request_id)
        if queue is not None:
            self._event_loop.call_soon_threadsafe(queue.put_nowait, output)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        tokenizer = self.engine.tokenizer
        if request.use_chat:
            prompt_ids = tokenizer.encode_chat(list(request.messages))
        else:
            prompt_ids = tokenizer.encode(request.prompt_text)
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            ignore_eos=request.ignore_eos,
        )
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._queues[request.request_id] = queue
        finished = False
        try:
            self._loop.submit(prompt_ids, params, request.request_id)
            while True:
                out = await queue.get()
                final = out.finished
                yield StreamEvent(
                    t_ns=out.t_ns,
                    num_tokens=len(out.new_token_ids),
                    text=out.new_text,
                    finish_reason=out.finish_reason,
                    usage_prompt_tokens=out.num_prompt_tokens if final else None,
                    usage_completion_tokens=None,
                    cached_tokens=out.num_cached_tokens if final else None,
                )
                if final:
                    finished = True
                    return
        finally:
            del self._queues[request.request_id]
            if not finished and self._loop is not None:
                self._loop.abort(request.request_id)  # the consumer gave up: free the blocks

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
