"""LLMEngine as a serving engine: batching, chunking, preemption and prefix caching change
nothing in the results, only the speed."""

from __future__ import annotations

import threading

import pytest
import torch

from llmbench.engine.engine import EngineConfig, KVCacheDemand, LLMEngine, kv_blocks_for
from llmbench.engine.loop import EngineLoop
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import UserError
from tests.engine.helpers import VOCAB, run_staggered, write_tiny_checkpoint

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny")))


def _prompts(num: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (5 + 7 * i,), generator=g).tolist() for i in range(num)]


def test_batching_chunking_and_preemption_do_not_change_greedy_outputs(tiny_folder):
    prompts = _prompts(16)
    alone_engine = LLMEngine(EngineConfig(model=tiny_folder, device="cpu", kv_cache_memory=1 << 22))
    alone = [alone_engine.generate([p], GREEDY)[0] for p in prompts]
    # 16 x 16-token blocks: far less than the 16 requests need at once (each needs 1-8 blocks).
    kv_bytes_per_block = 2 * 2 * 32 * 4 * 16  # K+V x layers x kv_size x float32 x block_size
    engine = LLMEngine(
        EngineConfig(
            model=tiny_folder,
            device="cpu",
            block_size=16,
            max_num_batched_tokens=40,
            kv_cache_memory=16 * kv_bytes_per_block,
        )
    )
    assert engine.blocks.num_blocks == 16
    together = run_staggered(engine, prompts, GREEDY, arrive_every=2)
    assert list(together.values()) == alone
    records = engine.step_records
    assert sum(r.num_preempted for r in records) > 0, "the small cache should force preemption"
    assert max(r.num_prefill_tokens + r.num_decode_seqs for r in records) <= 40
    assert any(r.num_prefill_tokens and r.num_decode_seqs for r in records), "no mixed step"
    assert engine.blocks.num_free_blocks == 16  # everything released at the end


def test_prefix_cache_hit_is_exact_and_changes_nothing(tiny_folder):
    shared = _prompts(1, seed=3)[0][:5] * 10  # 50 tokens: 3 full blocks of 16 + 2
    first, second = shared + [1, 2, 3], shared + [7, 8]
    outputs = {}
    for caching in (True, False):
        engine = LLMEngine(
            EngineConfig(
                model=tiny_folder,
                device="cpu",
                block_size=16,
                kv_cache_memory=1 << 22,
                enable_prefix_caching=caching,
            )
        )
        a = engine.generate([first], GREEDY)[0]
        rid = engine.add_request(second, GREEDY)
        b, cached = [], None
        while engine.has_unfinished():
            for out in engine.step():
                assert out.request_id == rid
                b += out.new_token_ids
                cached = out.num_cached_tokens
        outputs[caching] = (a, b, cached, engine.step_records[-len(b)].num_cached_tokens)
    a, b, cached, step_cached = outputs[True]
    assert cached == 3 * 16 and step_cached == 3 * 16
    assert (a, b) == outputs[False][:2]
    assert outputs[False][2] == 0


def test_abort_mid_generation_frees_every_block(tiny_folder):
    engine = LLMEngine(
        EngineConfig(
            model=tiny_folder, device="cpu", kv_cache_memory=1 << 22, enable_prefix_caching=False
        )
    )
    total = engine.blocks.num_free_blocks
    ids = [
        engine.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True)) for p in _prompts(3)
    ]
    for _ in range(5):
        engine.step()
    assert engine.blocks.num_free_blocks < total
    for rid in ids:
        engine.abort(rid)
    outputs = engine.step()
    assert {(o.request_id, o.finish_reason) for o in outputs} == {(i, "abort") for i in ids}
    assert not engine.has_unfinished()
    assert engine.blocks.num_free_blocks == total


@pytest.mark.parametrize("memory", [0, -5, float("nan")])
def test_a_kv_cache_of_no_memory_is_refused_before_loading(memory):
    """Not "a fractional kv_cache_memory needs a GPU", as 0 and -5 were told on a CPU."""
    with pytest.raises(UserError, match=f"engine: kv_cache_memory must be > 0 .*, got {memory}"):
        EngineConfig(model="no-such-model", kv_cache_memory=memory)


@pytest.mark.parametrize("threads", [0, -1])
def test_an_engine_of_no_threads_is_refused_before_loading(threads):
    """torch.set_num_threads would raise its own RuntimeError (a traceback) after the load."""
    with pytest.raises(UserError, match=f"engine: threads must be >= 1, got {threads}"):
        EngineConfig(model="no-such-model", num_threads=threads)


def test_request_that_can_never_fit_is_refused(tiny_folder):
    engine = LLMEngine(
        EngineConfig(
            model=tiny_folder, device="cpu", block_size=16, kv_cache_memory=4 * 2 * 2 * 32 * 4 * 16
        )
    )  # 4 blocks
    with pytest.raises(UserError, match="needs 5 KV blocks, the cache has 4"):
        engine.add_request(list(range(60)), SamplingParams(max_tokens=10))
    with pytest.raises(UserError, match="context window of 512"):
        engine.add_request(list(range(500)), SamplingParams(max_tokens=20))


def test_engine_loop_serves_requests_from_other_threads(tiny_folder):
    engine = LLMEngine(EngineConfig(model=tiny_folder, device="cpu", kv_cache_memory=1 << 22))
    prompts = _prompts(4)
    expected = engine.generate(prompts, GREEDY)
    received: dict[str, list[int]] = {}
    done = threading.Event()

    def on_output(out):
        received.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.finished and sum(len(v) for v in received.values()) == 4 * GREEDY.max_tokens:
            done.set()

    loop = EngineLoop(engine, on_output).start()
    ids = []
    submitters = [
        threading.Thread(target=lambda p=p: ids.append((p, loop.submit(p, GREEDY))))
        for p in prompts
    ]
    for t in submitters:
        t.start()
    for t in submitters:
        t.join()
    assert done.wait(60)
    loop.stop()
    assert loop.error is None
    by_prompt = {tuple(p): received[rid] for p, rid in ids}
    assert [by_prompt[tuple(p)] for p in prompts] == expected


def test_step_records_describe_each_step(tiny_folder):
    engine = LLMEngine(
        EngineConfig(
            model=tiny_folder, device="cpu", kv_cache_memory=1 << 22, max_num_batched_tokens=16
        )
    )
    engine.generate([list(range(1, 21))], SamplingParams(max_tokens=3, ignore_eos=True))
    records = engine.step_records
    # 20-token prompt with a 16-token budget: chunks of 16 and 4, then 2 decodes.
    assert [r.num_prefill_tokens for r in records] == [16, 4, 0, 0]
    assert [r.num_decode_seqs for r in records] == [0, 0, 1, 1]
    assert [r.context_lens for r in records] == [(16,), (20,), (21,), (22,)]
    assert all(r.t_end_ns > r.t_start_ns for r in records)
    assert all(r.num_blocks_total == engine.blocks.num_blocks for r in records)


def test_step_records_count_the_requests_left_waiting(tiny_folder):
    engine = LLMEngine(
        EngineConfig(model=tiny_folder, device="cpu", kv_cache_memory=1 << 22, max_num_seqs=2)
    )
    engine.generate(_prompts(5), SamplingParams(max_tokens=2, ignore_eos=True))
    records = engine.step_records
    # 5 requests, 2 at a time: 3 wait behind the first pair; each finished pair lets 2 more in.
    assert records[0].num_waiting == 3
    assert [len(r.context_lens) for r in records] == [2, 2, 2, 2, 1, 1]
    assert [r.num_waiting for r in records] == [3, 3, 1, 1, 0, 0]


@pytest.mark.parametrize(
    ("demand", "window", "expected"),
    [
        # The agentic main job on smollm2-135m: 4 sessions of up to 3,872 tokens = 242 blocks
        # each; x 1.25 headroom: 1,210 blocks (19,360 tokens, 446 MB in bfloat16, not 2 GiB).
        (KVCacheDemand(4, 3872), 8192, 1210),
        (KVCacheDemand(2, 10_000), 512, 80),  # within the window: 32 blocks each, x 2 x 1.25
        (KVCacheDemand(3, None), 512, 120),  # unbounded lengths: the window, 3 x 32 x 1.25
        (KVCacheDemand(1, 17), 8192, 3),  # 2 blocks x 1.25 = 2.5: rounded up
    ],
)
def test_kv_blocks_for_a_workloads_demand(demand, window, expected):
    assert kv_blocks_for(demand, window, block_size=16) == expected


def test_a_cpu_engine_sizes_its_kv_cache_for_the_workload_unless_told(tiny_folder):
    """The tiny model: 2 layers x 2 KV heads x head_dim 16, float32: K + V of a token are
    2 x 2 x 2 x 16 x 4 = 512 bytes; a 512-token window is 32 blocks of 16."""
    sized = LLMEngine(
        EngineConfig(model=tiny_folder, device="cpu", kv_cache_demand=KVCacheDemand(3, 100))
    )
    # 3 x ceil(100 / 16) = 21 blocks, x 1.25 = 26.25: 27 blocks, 432 tokens, 221,184 bytes.
    assert (sized.kv_cache.num_tokens, sized.kv_cache.num_bytes) == (432, 432 * 512)
    assert sized.kv_cache_sizing == (
        "sized for the workload: 3 sequences of up to 100 tokens + 25%; engine.kv_cache_memory "
        "sets it"
    )
    told = LLMEngine(
        EngineConfig(
            model=tiny_folder,
            device="cpu",
            kv_cache_memory=64 * 16 * 512,
            kv_cache_demand=KVCacheDemand(3, 100),
        )
    )
    assert (told.kv_cache.num_tokens, told.kv_cache_sizing) == (64 * 16, "engine.kv_cache_memory")
    # No workload (generate, serve): 2 GiB, capped at 64 sequences x 32 blocks here.
    default = LLMEngine(EngineConfig(model=tiny_folder, device="cpu"))
    assert default.kv_cache.num_tokens == 64 * 512
    assert default.kv_cache_sizing == (
        "the 2 GiB CPU default, capped at 64 full 512-token contexts"
    )
