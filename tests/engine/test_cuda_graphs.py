"""llmbench.engine.cuda_graphs: batch buckets and padding by hand; the static-buffer decode step
(padded to its bucket) gives the eager step's logits, K/V and tokens — on this CPU through
Triton's interpreter, eagerly; captured and replayed as CUDA graphs only in the `gpu` tests."""

from __future__ import annotations

import os

import pytest
import torch

from llmbench.engine.cuda_graphs import (
    DecodeGraphs,
    DecodeRow,
    batch_buckets,
    bucket_for,
    decode_graphs_for,
    pack_decode_rows,
    why_not_graphed,
)
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.kv_dtype import KVCacheDtype
from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch
from llmbench.engine.runner import ModelRunner, decode_rows
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.scheduler import ScheduledSeq
from llmbench.engine.sequence import Sequence
from llmbench.engine.synthetic import SyntheticSource
from tests.engine.test_kernel_ops import tiny_model_weights

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK_SIZE = 4
NUM_BLOCKS = 16
TABLES = {"A": [5, 2, 7, 9], "B": [1, 6], "C": [3, 8, 4]}
PROMPT_LENS = {"A": 11, "B": 4, "C": 7}


@pytest.fixture
def triton_path(monkeypatch):
    """The Triton path: compiled on CUDA, else Triton's CPU interpreter (switched on by
    tests/conftest.py before anything imports Triton)."""
    if DEVICE.type == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1"
        monkeypatch.setenv("LLMBENCH_KERNELS", "triton")
    else:
        monkeypatch.delenv("LLMBENCH_KERNELS", raising=False)


def test_buckets_are_the_powers_of_two_below_max_num_seqs_then_max_num_seqs():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(2) == (1, 2)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 32, 64)


def test_a_batch_runs_in_the_smallest_bucket_that_holds_it():
    buckets = (1, 2, 4, 6)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 4, 6, 6]
    assert bucket_for(7, buckets) is None


def test_rows_pack_into_the_buffer_and_padding_rows_store_nothing():
    # block_size 4: A's position 5 is in its block 1 (2), offset 1 → slot 9, 6 tokens = 2
    # blocks; B's position 0 is block 3, offset 0 → slot 12, 1 block. Two padding rows.
    rows = [DecodeRow(11, 5, [7, 2, 9]), DecodeRow(22, 0, [3])]
    packed = pack_decode_rows(rows, bucket=4, max_blocks=3, block_size=4)
    assert packed == [
        *(11, 22, 0, 0),  # token ids
        *(5, 0, 0, 0),  # positions
        *(9, 12, -1, -1),  # slots: -1 writes no K/V
        *(6, 1, 1, 1),  # context lens
        *(7, 2, 0),  # block tables [4, 3]: only the blocks the context covers
        *(3, 0, 0),
        *(0, 0, 0),
        *(0, 0, 0),
    ]
    with pytest.raises(ValueError, match="3 rows do not fit bucket 2"):
        pack_decode_rows([*rows, rows[0]], bucket=2, max_blocks=3, block_size=4)


def make_seq(name: str, token_ids: list[int]) -> Sequence:
    seq = Sequence(
        request_id=name,
        prompt_ids=token_ids,
        params=SamplingParams(max_tokens=8, temperature=0),
        generator=None,
        detokenizer=None,
        stop_matcher=None,
        arrival_ns=0,
    )
    seq.block_table = list(TABLES[name])
    return seq


def test_only_a_step_of_plain_decodes_becomes_decode_rows():
    a, b = make_seq("A", [4, 5, 6]), make_seq("B", [7, 8])
    a.num_computed_tokens, b.num_computed_tokens = 2, 1  # each has its last token to run
    rows = decode_rows([ScheduledSeq(a, 1), ScheduledSeq(b, 1)])
    assert rows == [DecodeRow(6, 2, a.block_table), DecodeRow(8, 1, b.block_table)]
    b.num_computed_tokens = 0
    assert decode_rows([ScheduledSeq(a, 1), ScheduledSeq(b, 2)]) is None  # a prefill chunk
    assert decode_rows([ScheduledSeq(a, 1), ScheduledSeq(b, 1)]) is None  # no logits for b
    assert decode_rows([ScheduledSeq(a, 2, (9,))]) is None  # a draft to verify


def tiny_setup(dtype: torch.dtype = torch.float32):
    config, weights = tiny_model_weights(dtype)
    model = LlamaModel(config, weights)
    shape = (config.num_layers, NUM_BLOCKS, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
    g = torch.Generator().manual_seed(3)
    prompts = {
        name: torch.randint(0, config.vocab_size, (n,), generator=g).tolist()
        for name, n in PROMPT_LENS.items()
    }
    return model, shape, prompts


def eager_step(model, cache, ids, chunks) -> torch.Tensor:
    """The normal path: index tensors built for this step, forward, logits of every row."""
    batch = build_attention_batch(chunks, BLOCK_SIZE, DEVICE, model.dtype)
    positions = torch.cat([torch.arange(c.start, c.start + c.num_tokens) for c in chunks])
    hidden = model.forward(torch.tensor(ids, device=DEVICE), positions.to(DEVICE), batch, cache)
    return model.compute_logits(hidden)


def decode_parity(model, shape, prompts, capture: bool, tolerance: float) -> DecodeGraphs:
    """Prefill A, B, C eagerly into one cache and clone it; then decode steps of 3 rows (bucket
    4: one padding row), 2 rows (bucket 2) and 3 again, eagerly on one cache and through the
    static buffers on the other: the same logits, and the same caches after every step."""
    eager_cache = KVCache(*shape, model.dtype, DEVICE)
    names = list(PROMPT_LENS)
    prefill = [Chunk(0, PROMPT_LENS[n], TABLES[n]) for n in names]
    eager_step(model, eager_cache, sum((prompts[n] for n in names), []), prefill)
    static_cache = KVCache(*shape, model.dtype, DEVICE)
    static_cache.kv.copy_(eager_cache.kv)
    graphs = DecodeGraphs(model, static_cache, max_num_seqs=4, capture=capture)
    assert graphs.buckets == (1, 2, 4)
    assert graphs.max_context_len == NUM_BLOCKS * BLOCK_SIZE  # the cache's 64 tokens
    g = torch.Generator().manual_seed(4)
    positions = dict(PROMPT_LENS)
    for step_names in (["A", "B", "C"], ["A", "C"], ["C", "B", "A"]):
        ids = torch.randint(0, model.config.vocab_size, (len(step_names),), generator=g).tolist()
        chunks = [Chunk(positions[n], 1, TABLES[n]) for n in step_names]
        expected = eager_step(model, eager_cache, ids, chunks)
        rows = [DecodeRow(i, positions[n], TABLES[n]) for i, n in zip(ids, step_names, strict=True)]
        assert graphs.can_run(rows)
        logits = graphs.run(rows)
        assert logits.shape == (len(rows), model.config.vocab_size)  # padding rows dropped
        torch.testing.assert_close(logits, expected, atol=tolerance, rtol=tolerance)
        # The K/V of the real rows, in the same slots, and nothing from the padding row.
        torch.testing.assert_close(static_cache.kv, eager_cache.kv, atol=tolerance, rtol=tolerance)
        for n in step_names:
            positions[n] += 1
    return graphs


def test_the_static_buffer_step_gives_the_eager_steps_logits_and_kv(triton_path):
    model, shape, prompts = tiny_setup()
    graphs = decode_parity(model, shape, prompts, capture=False, tolerance=1e-5)
    assert not graphs.is_captured
    assert not graphs.can_run([DecodeRow(0, 64, TABLES["A"])])  # past max_context_len
    assert not graphs.can_run([DecodeRow(0, 1, TABLES["A"])] * 5)  # more than the largest
    assert graphs.describe() == (
        "decode steps from static buffers: batch buckets 1, 2, 4; contexts up to 64 tokens"
    )


def test_the_runner_decodes_through_the_static_buffers_with_the_same_tokens(triton_path):
    model, shape, prompts = tiny_setup()
    runners = []
    for use_graphs in (False, True):
        cache = KVCache(*shape, model.dtype, DEVICE)
        graphs = DecodeGraphs(model, cache, max_num_seqs=4, capture=False) if use_graphs else None
        runners.append(
            (ModelRunner(model, cache, graphs), {n: make_seq(n, p) for n, p in prompts.items()})
        )
    tokens = []
    for runner, seqs in runners:
        out = []
        for _ in range(3):  # a prefill step (eager either way), then two decode steps
            batch = [ScheduledSeq(s, s.num_tokens - s.num_computed_tokens) for s in seqs.values()]
            new = runner.execute(batch)
            for item, (token,) in zip(batch, new, strict=True):
                item.seq.num_computed_tokens += item.num_new_tokens
                item.seq.token_ids.append(token)
            out.append(new)
        tokens.append(out)
    assert tokens[0] == tokens[1]
    # The last step went through bucket 4: its buffer holds the three sequences' inputs.
    graphs, seqs = runners[1][0].decode_graphs, runners[1][1]
    assert graphs.steps[4].input_ids.tolist()[:3] == [s.token_ids[-2] for s in seqs.values()]


def test_which_models_and_caches_can_run_from_static_buffers(triton_path, monkeypatch):
    model, shape, _ = tiny_setup()
    assert why_not_graphed(model, KVCache(*shape, model.dtype, DEVICE)) is None
    int8 = KVCache(*shape, model.dtype, DEVICE, KVCacheDtype("int8", "int8"))
    assert why_not_graphed(model, int8) == (
        "a K/V cache not in the model's dtype runs torch attention"
    )
    with pytest.raises(ValueError, match="runs torch attention; check why_not_graphed first"):
        DecodeGraphs(model, int8, max_num_seqs=4, capture=False)
    source = SyntheticSource("tiny-moe")
    moe = LlamaModel(source.config, source.load(torch.float32, DEVICE))
    cfg = source.config
    moe_shape = (cfg.num_layers, NUM_BLOCKS, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    assert why_not_graphed(moe, KVCache(*moe_shape, torch.float32, DEVICE)) == (
        "MoE routing counts tokens per expert on the host"
    )
    monkeypatch.setenv("LLMBENCH_KERNELS", "torch")
    torch_model = LlamaModel(model.config, tiny_model_weights(torch.float32)[1])
    cache = KVCache(*shape, torch.float32, DEVICE)
    assert why_not_graphed(torch_model, cache) == "the torch ops path"


def test_on_a_cpu_the_engine_gets_no_graphs_and_records_nothing_about_them(monkeypatch):
    monkeypatch.setenv("LLMBENCH_KERNELS", "torch")
    source = SyntheticSource("tiny")
    cpu = torch.device("cpu")
    model = LlamaModel(source.config, source.load(torch.float32, cpu))
    cfg = source.config
    cache = KVCache(
        cfg.num_layers, NUM_BLOCKS, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, torch.float32, cpu
    )
    assert decode_graphs_for(model, cache, max_num_seqs=4, is_enabled=True) == (None, None)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-4), (torch.float16, 3e-2)])
def test_captured_graphs_replay_the_eager_steps_logits_on_the_gpu(triton_path, dtype, tolerance):
    model, shape, prompts = tiny_setup(dtype)
    graphs = decode_parity(model, shape, prompts, capture=True, tolerance=tolerance)
    assert graphs.is_captured and sorted(graphs.captured) == [1, 2, 4]
    assert graphs.describe().startswith(
        "decode CUDA graphs: batch buckets 1, 2, 4; contexts up to 64 tokens (captured in "
    )


@pytest.mark.gpu
def test_the_engine_generates_the_same_tokens_with_and_without_graphs_on_the_gpu():
    prompts = [[1, 2, 3], list(range(10, 30)), [7] * 9]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outputs, lines = [], []
    for cuda_graphs in (True, False):
        config = EngineConfig(
            model="synthetic:tiny", device="cuda", max_num_seqs=4, cuda_graphs=cuda_graphs
        )
        engine = LLMEngine(config)
        outputs.append(engine.generate(prompts, params))
        lines.append(engine.model.kernels_description)
    assert outputs[0] == outputs[1]
    assert "; decode CUDA graphs: batch buckets 1, 2, 4; contexts up to " in lines[0]
    assert lines[1].endswith("; decode CUDA graphs: off (cuda_graphs=False)")
