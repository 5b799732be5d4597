"""The built-in engine as a backend, in-process, through the shared `EngineClient`.

Token times are the engine's own `perf_counter_ns()` stamps, taken when each token is on the
host, so the thread hop to the event loop adds nothing to TTFT or ITL. Every engine step is
handed to `on_step` as it completes (on the engine thread), so a run can write it to disk at
once; if the engine thread dies, every open request ends with its `BackendFailure`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from llmbench.engine.client import EngineClient
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.records import StepRecord
from llmbench.engine.sampling import SamplingParams
from llmbench.harness.records import GenerationRequest, StreamEvent


class EngineBackend:
    name = "engine"

    def __init__(self, config: EngineConfig):
        self.engine = LLMEngine(config)
        self.client = EngineClient(self.engine)

    def record_steps(self, on_step: Callable[[StepRecord], None] | None) -> None:
        """Hand every engine step to `on_step` from now on (None: stop)."""
        self.engine.on_step = on_step

    async def start(self) -> None:
        await self.client.start()

    async def reset_prefix_cache(self) -> None:
        """Empty the engine's prefix cache (call with no request in flight)."""
        if not await self.client.reset_prefix_cache():
            raise RuntimeError("the engine kept its prefix cache: requests were still running")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        prompt_ids = request.prompt_ids
        if prompt_ids is None:
            tokenizer = self.engine.tokenizer
            if request.use_chat:
                prompt_ids = tokenizer.encode_chat(list(request.messages), tools=request.tools)
            else:
                prompt_ids = tokenizer.encode(request.prompt_text)
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            ignore_eos=request.ignore_eos,
        )
        speculates = self.engine.proposer is not None
        async for out in self.client.generate(prompt_ids, params, request.request_id):
            final = out.finished
            counts_drafts = final and speculates
            yield StreamEvent(
                t_ns=out.t_ns,
                num_tokens=len(out.new_token_ids),
                text=out.new_text,
                finish_reason=out.finish_reason,
                usage_prompt_tokens=out.num_prompt_tokens if final else None,
                usage_completion_tokens=None,
                cached_tokens=out.num_cached_tokens if final else None,
                num_draft_tokens=out.num_proposed_tokens if counts_drafts else None,
                num_accepted_draft_tokens=out.num_accepted_tokens if counts_drafts else None,
            )

    async def close(self) -> None:
        await self.client.close()
