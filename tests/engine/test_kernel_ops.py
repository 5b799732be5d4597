"""llmbench.engine.kernel_ops: the model's forward pass through the kernels layer's Triton ops
gives the torch path's logits (on CUDA compiled, on this CPU through Triton's interpreter), a
cache in another format keeps torch attention, and the dispatch line the run records."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from llmbench.engine import kernel_ops
from llmbench.engine.config import RopeScaling
from llmbench.engine.kv_dtype import KVCacheDtype
from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch
from llmbench.engine.synthetic import SyntheticSource
from llmbench.errors import UserError

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK_SIZE = 4
TABLES = {"A": [5, 2, 7, 9], "B": [1, 6, 3]}
# (sequence, start, num_tokens) per step: a prompt and a chunk, a chunk with a decode, decodes.
STEPS = [[("A", 0, 11), ("B", 0, 4)], [("B", 4, 5), ("A", 11, 1)], [("A", 12, 1), ("B", 9, 1)]]


def tiny_model_weights(dtype: torch.dtype):
    """synthetic:tiny with Llama-3 RoPE scaling, weights scaled up and norms not all ones, so
    the logits depend on every op."""
    source = SyntheticSource("tiny")
    scaling = RopeScaling(8.0, 1.0, 4.0, 8)
    config = dataclasses.replace(source.config, rope_scaling=scaling)
    weights = source.load(torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    for name, tensor in weights.items():
        if name.endswith("norm.weight"):
            tensor.copy_(1 + 0.3 * torch.randn(tensor.shape, generator=g))
        else:
            tensor.mul_(5)
    return config, {k: v.to(dtype).to(DEVICE) for k, v in weights.items()}


def run_steps(model: LlamaModel, kv_dtype: KVCacheDtype | None) -> list[torch.Tensor]:
    config = model.config
    shape = (config.num_layers, 16, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
    cache = KVCache(*shape, model.dtype, DEVICE, kv_dtype)
    g = torch.Generator().manual_seed(2)
    token_ids = {seq: torch.randint(0, config.vocab_size, (16,), generator=g) for seq in TABLES}
    logits = []
    for step in STEPS:
        chunks = [Chunk(start, n, TABLES[seq]) for seq, start, n in step]
        batch = build_attention_batch(chunks, BLOCK_SIZE, DEVICE, model.dtype)
        ids = torch.cat([token_ids[seq][start : start + n] for seq, start, n in step]).to(DEVICE)
        positions = torch.cat([torch.arange(start, start + n) for _, start, n in step])
        hidden = model.forward(ids, positions.to(DEVICE), batch, cache)
        logits.append(model.compute_logits(hidden))
    return logits


@pytest.fixture
def triton_path(monkeypatch):
    """The Triton path on this machine: compiled on CUDA, else the interpreter (which
    tests/conftest.py switches on before anything imports Triton)."""
    if DEVICE.type == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1"
        monkeypatch.setenv("LLMBENCH_KERNELS", "triton")
    else:
        monkeypatch.delenv("LLMBENCH_KERNELS", raising=False)


@pytest.mark.parametrize(
    ("dtype", "kv_dtype", "tolerance"),
    [
        (torch.float32, None, 1e-4),
        (torch.float16, None, 3e-2),
        # attention stays on torch's path; the other ops' last-bit differences may move a
        # K/V element across an int8 rounding boundary
        (torch.float32, KVCacheDtype("int8", "int8"), 2e-3),
    ],
)
def test_triton_path_gives_the_torch_paths_logits(
    triton_path, monkeypatch, dtype, kv_dtype, tolerance
):
    config, weights = tiny_model_weights(dtype)
    fast = LlamaModel(config, weights)
    assert fast.kernels is not None
    monkeypatch.setenv("LLMBENCH_KERNELS", "torch")
    reference = LlamaModel(config, weights)
    assert reference.kernels is None
    expected_logits = run_steps(reference, kv_dtype)
    for ours, expected in zip(run_steps(fast, kv_dtype), expected_logits, strict=True):
        assert ours.shape[1] == config.vocab_size  # every row of the step
        torch.testing.assert_close(ours, expected, atol=tolerance, rtol=tolerance)


def test_the_recorded_line_names_the_engines_ops(triton_path):
    dispatch = kernel_ops.dispatch_for(DEVICE)
    assert dispatch.uses_triton
    line = kernel_ops.describe(dispatch)
    assert "rms_norm, rope, silu_and_mul, kv_cache_write, paged_decode_attention" in line
    assert line.endswith("(int8, int4): torch reference")


def test_cpu_default_is_torch_and_a_bad_override_is_a_user_error(monkeypatch):
    monkeypatch.delenv("LLMBENCH_KERNELS", raising=False)
    cpu = kernel_ops.dispatch_for(torch.device("cpu"))
    assert kernel_ops.describe(cpu) == "torch reference ops (cpu: the Triton kernels are for CUDA)"
    monkeypatch.setenv("LLMBENCH_KERNELS", "fast")
    with pytest.raises(UserError, match="LLMBENCH_KERNELS=fast: unknown; use one of auto, trit"):
        kernel_ops.dispatch_for(torch.device("cpu"))


def test_prepare_builds_the_steps_index_and_hands_a_prepared_batch_its_own(triton_path):
    ops = kernel_ops.TritonOps(kernel_ops.dispatch_for(DEVICE))
    # A 5-token prompt (2 of its 3 blocks used) and a decode at position 8 (3 blocks).
    chunks = [Chunk(0, 5, [3, 1, 9]), Chunk(8, 1, [2, 4, 6])]
    batch = build_attention_batch(chunks, BLOCK_SIZE, DEVICE, torch.float32)
    angles = torch.arange(20, dtype=torch.float32).view(10, 2) / 7  # [P, d/2]
    rotations = torch.polar(torch.ones_like(angles), angles).to(DEVICE)
    step = ops.prepare(batch, BLOCK_SIZE, rotations)
    assert step.block_tables.tolist() == [[3, 1, 0], [2, 4, 6]]  # padded with block 0
    assert step.context_lens.tolist() == [5, 9]
    assert step.query_start_loc.tolist() == [0, 5, 6]
    assert (step.max_query_len, step.max_context_len, step.is_all_decode) == (5, 9, False)
    torch.testing.assert_close(step.cos.cpu(), torch.cos(angles))
    torch.testing.assert_close(step.sin.cpu(), torch.sin(angles))
    # A batch whose index lives in static buffers gets exactly that index back.
    prepared = kernel_ops.PreparedBatch(batch.slot_mapping, [], None, 9, step=step)
    assert ops.prepare(prepared, BLOCK_SIZE, rotations) is step
