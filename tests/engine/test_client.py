"""The engine client: streams, aborts, and crashes injected into the forward pass and the
sampler end every waiter at once with the error named (bounded by a timeout: never a hang)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from llmbench.engine import runner
from llmbench.engine.client import EngineClient
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import BackendFailure
from tests.engine.helpers import crash_after

NO_HANG_S = 10.0  # far above any step of the tiny model; a hang fails here, not in CI's limit


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="synthetic:tiny", device="cpu", max_num_seqs=8))


def params(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


async def collect(client: EngineClient, request_id: str, max_tokens: int = 8) -> list:
    return [out async for out in client.generate([1, 2, 3], params(max_tokens), request_id)]


def test_streams_end_with_one_finished_output_each(engine):
    async def main():
        client = EngineClient(engine)
        await client.start()
        try:
            return await asyncio.wait_for(
                asyncio.gather(*(collect(client, f"r{i}", 5) for i in range(3))), NO_HANG_S
            )
        finally:
            await client.close()

    for outputs in asyncio.run(main()):
        assert sum(len(out.new_token_ids) for out in outputs) == 5
        assert [out.finished for out in outputs] == [False] * (len(outputs) - 1) + [True]
        assert outputs[-1].finish_reason == "length"


def test_a_consumer_that_leaves_early_aborts_its_request(engine):
    async def main():
        client = EngineClient(engine)
        await client.start()
        try:
            stream = client.generate([1, 2, 3], params(2_000), "leaver")
            async with contextlib.aclosing(stream):
                async for _ in stream:
                    break  # one token is enough
            for _ in range(100):  # the abort is taken in by the engine thread's next step
                if not engine.has_unfinished():
                    break
                await asyncio.sleep(0.01)
            return engine.has_unfinished(), engine.blocks.num_used_blocks
        finally:
            await client.close()

    has_unfinished, num_used_blocks = asyncio.run(main())
    assert not has_unfinished
    assert num_used_blocks == 0


@pytest.mark.parametrize("where", ["forward", "sampler"])
def test_a_crash_ends_every_waiting_request_at_once(monkeypatch, where):
    engine = LLMEngine(EngineConfig(model="synthetic:tiny", device="cpu", max_num_seqs=8))
    if where == "forward":
        error = RuntimeError("injected forward failure")
        monkeypatch.setattr(engine.model, "forward", crash_after(3, engine.model.forward, error))
    else:
        error = ValueError("injected sampler failure")
        monkeypatch.setattr(runner, "sample", crash_after(3, runner.sample, error))

    async def main():
        client = EngineClient(engine)
        await client.start()
        try:
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(collect(client, f"r{i}", 1_000) for i in range(4)), return_exceptions=True
                ),
                NO_HANG_S,
            )
            with pytest.raises(BackendFailure) as later:  # refused at once, not queued
                await asyncio.wait_for(collect(client, "late"), NO_HANG_S)
            return results, later.value, client.error
        finally:
            await client.close()

    results, later, client_error = asyncio.run(main())
    name = f"{type(error).__name__}: {error}"
    assert all(isinstance(r, BackendFailure) and name in str(r) for r in results), results
    assert name in str(later)
    assert client_error is not None and client_error.__cause__ is error


def test_reset_prefix_cache_runs_between_steps_and_refuses_while_requests_run():
    engine = LLMEngine(EngineConfig(model="synthetic:tiny", device="cpu", max_num_seqs=8))
    prompt = list(range(1, 41))  # 40 tokens: 2 full blocks of 16 can be cached

    async def cached_tokens(client: EngineClient, request_id: str) -> int:
        outputs = [out async for out in client.generate(prompt, params(2), request_id)]
        return outputs[-1].num_cached_tokens

    async def main():
        client = EngineClient(engine)
        await client.start()
        try:
            first = await cached_tokens(client, "a")
            warm = await cached_tokens(client, "b")
            stream = client.generate(prompt, params(2_000), "busy")
            async with contextlib.aclosing(stream):
                await anext(stream)  # running now
                refused = await asyncio.wait_for(client.reset_prefix_cache(), NO_HANG_S)
            while engine.has_unfinished():  # the abort is taken in by the next step
                await asyncio.sleep(0.01)
            reset = await asyncio.wait_for(client.reset_prefix_cache(), NO_HANG_S)
            cold = await cached_tokens(client, "c")
            return first, warm, refused, reset, cold
        finally:
            await client.close()

    first, warm, refused, reset, cold = asyncio.run(main())
    assert (first, warm) == (0, 32)  # the second request found the first one's 2 blocks
    assert refused is False and reset is True
    assert cold == 0  # after the reset: nothing cached
