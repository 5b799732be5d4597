"""The model on the CPU with the C++ extension (`kernels.cpu_gemv`: decode matmuls;
`kernels.cpu_layer_ops`: RMSNorm, RoPE, decode attention) against the same model on torch's
ops: the same logits within 16-bit rounding (float32: within float32 rounding), prefill and
decode."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmbench.engine.hf_folder import HFFolderSource
from llmbench.engine.model import FUSED_MAX_ROWS, LlamaModel
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch
from llmbench.engine.quant.linear import ExtensionQuantLinear
from llmbench.engine.quant.scheme import parse_quantize
from llmbench.kernels import cpu_extension, cpu_gemv
from llmbench.kernels.cpu_info import has_native_bf16, this_cpu_flags
from tests.engine.helpers import VOCAB, write_tiny_checkpoint

VARIANTS = {
    "llama-untied": dict(arch="llama"),
    "llama-tied": dict(arch="llama", tied=True),
    "qwen2-bias": dict(arch="qwen2"),
}
NUM_DECODE_STEPS = 8


def _logits(
    folder,
    dtype: torch.dtype,
    prompt: list[int],
    fuse: bool = True,
    quantize: str | None = None,
    stacked: bool = True,
    op_ns: torch.Tensor | None = None,
) -> tuple[LlamaModel, list[torch.Tensor]]:
    """Prefill `prompt`, then decode greedily; the float32 logits of every step. `fuse`: decode
    steps run the dense layers in C++ where the model can, `stacked` all in one call
    (`decode_layers`), else one call a layer (`decode_layer`); `quantize`: the weights' scheme
    (None: as loaded); `op_ns`: the model's `layer_op_ns` (the stack's op clock)."""
    source = HFFolderSource(folder)
    cfg = source.config
    scheme = parse_quantize(quantize) if quantize else None
    model = LlamaModel(cfg, source.load(dtype, torch.device("cpu")), scheme)
    model.fuse_decode_layers = fuse
    if not stacked:
        model._stacked_layers = None
    model.layer_op_ns = op_ns
    cache = KVCache(
        cfg.num_layers, 8, 16, cfg.num_kv_heads, cfg.head_dim, dtype, torch.device("cpu")
    )
    table = list(range(8))

    def run(ids: list[int], start: int) -> torch.Tensor:
        batch = build_attention_batch([Chunk(start, len(ids), table)], 16, cache.kv.device, dtype)
        hidden = model.forward(
            torch.tensor(ids), torch.arange(start, start + len(ids)), batch, cache
        )
        return model.compute_logits(hidden[-1:])[0]

    steps = [run(prompt, 0)]
    for i in range(NUM_DECODE_STEPS):
        steps.append(run([int(steps[-1].argmax())], len(prompt) + i))
    return model, steps


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("prompt_len", [3, 37])  # prefill through the extension, and through torch
def test_logits_with_the_extension_match_torch(tmp_path, monkeypatch, variant, dtype, prompt_len):
    folder = write_tiny_checkpoint(tmp_path, **VARIANTS[variant])
    prompt = torch.randint(0, VOCAB, (prompt_len,), generator=torch.Generator().manual_seed(1))
    fast, ours = _logits(folder, dtype, prompt.tolist())
    assert fast.cpu_ops is not None
    assert "C++ extension (" in fast.kernels_description
    assert fast.kernels_description.endswith(
        "rope, silu_and_mul, paged_decode_attention, decode_layer"
    )
    is_16_bit = dtype != torch.float32
    assert fast.layers[0].qkv_proj.fast_op is not None
    description = fast.kernels_description
    assert f"extension ({cpu_extension.default().isa};" in description
    assert "): matmuls, rms_norm" in description
    assert fast.kernels_name == f"C++ extension ({cpu_extension.default().isa})"

    monkeypatch.setattr(
        cpu_extension, "default", lambda: cpu_extension.CpuExtension("torch", "test")
    )
    plain, reference = _logits(folder, dtype, prompt.tolist())
    assert plain.layers[0].qkv_proj.fast_op is None and plain.cpu_ops is None
    assert plain.kernels_description.endswith("; torch matmul (test)")
    assert plain.kernels_name == "torch ops"
    # Rounding in another order: well inside the bf16-vs-float32 gap (~1.3% of the scale).
    tolerance = 0.02 if is_16_bit else 1e-5
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        diff = (a - b).abs().max().item()
        assert diff < tolerance * b.abs().max().item(), f"step {step}: max abs logit diff {diff}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_fused_decode_layer_is_the_same_ops_bit_for_bit(tmp_path, variant, dtype):
    folder = write_tiny_checkpoint(tmp_path, **VARIANTS[variant])
    prompt = torch.randint(0, VOCAB, (21,), generator=torch.Generator().manual_seed(2)).tolist()
    fused_model, fused = _logits(folder, dtype, prompt, fuse=True)
    assert fused_model._fused_rows == [FUSED_MAX_ROWS] * 2
    assert fused_model.layers[0].qkv_proj.max_fast_rows == cpu_gemv.max_rows(
        dtype, cpu_extension.default().isa, has_native_bf16(this_cpu_flags())
    )
    assert fused_model._stacked_layers is not None
    _, op_by_op = _logits(folder, dtype, prompt, fuse=False)
    _, layer_by_layer = _logits(folder, dtype, prompt, stacked=False)
    for step, (a, b, c) in enumerate(zip(fused, op_by_op, layer_by_layer, strict=True)):
        assert torch.equal(a, b) and torch.equal(a, c), f"step {step}"


@pytest.mark.parametrize("quantize", [None, "int4"])
def test_the_stack_times_its_ops_on_its_own_clock_and_computes_the_same(tmp_path, quantize):
    """`layer_op_ns` (set by `llmbench profile`): every decode step adds each layer's ten op
    times into its row, the logits stay bit-identical, and the profiler records nothing inside
    the stack's call (without the clock it records each op there: the check can see them)."""
    from torch.profiler import ProfilerActivity, profile

    folder = write_tiny_checkpoint(tmp_path, arch="qwen2")
    prompt = torch.randint(0, VOCAB, (21,), generator=torch.Generator().manual_seed(7)).tolist()
    inside = []
    for op_ns in (None, torch.zeros(2, 10, dtype=torch.int64)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model, logits = _logits(folder, torch.bfloat16, prompt, quantize=quantize, op_ns=op_ns)
        inside.append(
            [
                e.name
                for e in prof.events()
                if e.cpu_parent is not None and e.cpu_parent.name.endswith("::decode_layers")
            ]
        )
        if op_ns is None:
            plain = logits
    if model._stacked_layers is None:  # int4 where the CPU has no VNNI: no fused stack
        assert not cpu_extension.default().has_quant_gemv
        return
    assert len(inside[0]) >= 10 * 2 * NUM_DECODE_STEPS and inside[1] == []
    assert all(torch.equal(a, b) for a, b in zip(logits, plain, strict=True))
    assert bool((op_ns > 0).all()), op_ns  # 8 steps of every op of both layers
    assert model.layer_op_ns is op_ns


def test_a_fused_layer_records_its_ops_as_the_dispatcher_would(tmp_path):
    """The fused layer calls the library's ops as C++ functions, not through the dispatcher,
    and makes each one's profiler event itself: under `decode_layer` (one call a layer) the
    profiler sees the layer's ten ops in order, named as the dispatcher names them, with their
    input shapes (by which `llmbench profile` tells the matmuls apart)."""
    from torch.profiler import ProfilerActivity, profile

    folder = write_tiny_checkpoint(tmp_path, arch="llama")
    prompt = torch.randint(0, VOCAB, (5,), generator=torch.Generator().manual_seed(3)).tolist()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model, _ = _logits(folder, torch.bfloat16, prompt, stacked=False)
    layers = [e for e in prof.events() if e.name.endswith("::decode_layer")]
    assert len(layers) == model.config.num_layers * NUM_DECODE_STEPS
    namespace = layers[0].name.removesuffix("::decode_layer")
    assert namespace.startswith(cpu_extension.LIBRARY_PREFIX)
    cfg = model.config
    weights = {  # each matmul's weight [out, in], in the layer's order
        1: [cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size],
        5: [cfg.hidden_size, cfg.q_size],
        7: [2 * cfg.intermediate_size, cfg.hidden_size],
        9: [cfg.hidden_size, cfg.intermediate_size],
    }
    for layer in layers:
        ops = sorted(layer.cpu_children, key=lambda e: e.time_range.start)
        assert [e.name.removeprefix(namespace + "::") for e in ops] == [
            *("rms_norm", "gemv", "rope_", "write_kv_", "paged_decode_attention"),
            *("gemv", "rms_norm", "gemv", "silu_and_mul", "gemv"),
        ]
        assert {i: ops[i].input_shapes[1] for i in weights} == weights
        assert ops[0].input_shapes[0] == [1, cfg.hidden_size]


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_a_fused_quantized_decode_layer_is_the_same_ops_bit_for_bit(tmp_path, quantize):
    # int8 / int4 matmuls run quant_gemv inside the fused layer, where the CPU has VNNI (both
    # kinds of CI machine do); without it the layers stay op by op.
    folder = write_tiny_checkpoint(tmp_path, arch="qwen2")  # with a qkv bias
    prompt = torch.randint(0, VOCAB, (21,), generator=torch.Generator().manual_seed(4)).tolist()
    fused_model, fused = _logits(folder, torch.bfloat16, prompt, True, quantize)
    has_vnni = cpu_extension.default().has_quant_gemv
    assert isinstance(fused_model.layers[0].down_proj, ExtensionQuantLinear) == has_vnni
    assert fused_model._fused_rows == [FUSED_MAX_ROWS if has_vnni else 0] * 2
    _, op_by_op = _logits(folder, torch.bfloat16, prompt, False, quantize)
    for step, (a, b) in enumerate(zip(fused, op_by_op, strict=True)):
        assert torch.equal(a, b), f"step {step}"


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
@pytest.mark.parametrize("num_seqs", [3, 20])  # 20 rows: above every CPU's gemv and VNNI rows
def test_a_fused_decode_step_of_several_sequences_matches_op_by_op(tmp_path, num_seqs, quantize):
    folder = write_tiny_checkpoint(tmp_path, arch="qwen2")  # with a qkv bias
    source = HFFolderSource(folder)
    cfg = source.config
    scheme = parse_quantize(quantize) if quantize else None
    model = LlamaModel(cfg, source.load(torch.bfloat16, torch.device("cpu")), scheme)
    calls = []
    fused_op = model.cpu_ops.decode_layers
    model.cpu_ops = dataclasses.replace(
        model.cpu_ops, decode_layers=lambda *args: calls.append(1) or fused_op(*args)
    )
    # Contexts after this step (5 .. 43 tokens), each sequence in its own 3 blocks of 16.
    lens = [5 + 2 * i for i in range(num_seqs)]
    tables = [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(num_seqs)]
    outs = []
    for fuse in (True, False):
        cache = KVCache(
            cfg.num_layers,
            3 * num_seqs,
            16,
            cfg.num_kv_heads,
            cfg.head_dim,
            torch.bfloat16,
            torch.device("cpu"),
        )
        cache.kv.copy_(torch.randn(cache.kv.shape, generator=torch.Generator().manual_seed(3)))
        model.fuse_decode_layers = fuse
        chunks = [Chunk(n - 1, 1, t) for n, t in zip(lens, tables, strict=True)]
        batch = build_attention_batch(chunks, 16, torch.device("cpu"), torch.bfloat16)
        ids, positions = torch.arange(7, 7 + num_seqs), torch.tensor([n - 1 for n in lens])
        outs.append((model.forward(ids, positions, batch, cache), cache.kv.clone()))
    (hidden_fused, kv_fused), (hidden, kv) = outs
    # The fused step ran the whole stack of layers as one call (int8/int4: where VNNI is).
    is_fused = quantize is None or cpu_extension.default().has_quant_gemv
    assert len(calls) == is_fused
    assert torch.equal(hidden_fused, hidden) and torch.equal(kv_fused, kv)


def test_a_fused_verification_step_matches_op_by_op(tmp_path):
    """Speculative verification's shape: two sequences each running their last token and 4
    drafts (5 rows) after 20 and 33 cached tokens, one decode-shaped step of 10 rows."""
    folder = write_tiny_checkpoint(tmp_path, arch="llama")
    source = HFFolderSource(folder)
    cfg = source.config
    model = LlamaModel(cfg, source.load(torch.bfloat16, torch.device("cpu")))
    chunks = [Chunk(20, 5, [0, 1, 2]), Chunk(33, 5, [3, 4, 5])]
    outs = []
    for fuse in (True, False):
        cache = KVCache(
            cfg.num_layers, 6, 16, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cpu"
        )
        cache.kv.copy_(torch.randn(cache.kv.shape, generator=torch.Generator().manual_seed(5)))
        model.fuse_decode_layers = fuse
        batch = build_attention_batch(chunks, 16, torch.device("cpu"), torch.bfloat16)
        assert batch.decodes.is_whole_batch and batch.decodes.context_lens.tolist() == [
            *range(21, 26),
            *range(34, 39),
        ]
        positions = torch.tensor([*range(20, 25), *range(33, 38)])
        outs.append((model.forward(torch.arange(10), positions, batch, cache), cache.kv.clone()))
    (hidden_fused, kv_fused), (hidden, kv) = outs
    assert torch.equal(hidden_fused, hidden) and torch.equal(kv_fused, kv)


def test_a_bfloat16_prompt_attends_in_the_extension_where_it_has_tiles_or_vectors(tmp_path):
    """head_dim 32 (hidden 128, 4 heads): a 37-token prompt's attention runs the extension's
    `prefill_attention` on a build with AMX tiles (this machine's and CI's) or AVX-512 BF16
    (test_cpu_lesser_isa.py's build), and its logits stay within bfloat16 rounding of torch's
    SDPA on the same model."""
    folder = write_tiny_checkpoint(tmp_path, hidden_size=128)
    prompt = torch.randint(0, VOCAB, (37,), generator=torch.Generator().manual_seed(6)).tolist()
    source = HFFolderSource(folder)
    cfg = source.config
    model = LlamaModel(cfg, source.load(torch.bfloat16, torch.device("cpu")))
    op = model.cpu_ops.prefill_attention
    assert (op is not None) == ("bf16" in cpu_extension.default().isa)
    calls = []
    logits = {}
    for name, prefill in (("tiles", op), ("sdpa", None)):
        wrapped = None if prefill is None else (lambda *a, op=prefill: calls.append(1) or op(*a))
        model.cpu_ops = dataclasses.replace(model.cpu_ops, prefill_attention=wrapped)
        cache = KVCache(
            cfg.num_layers, 8, 16, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cpu"
        )
        batch = build_attention_batch([Chunk(0, 37, list(range(8)))], 16, "cpu", torch.bfloat16)
        hidden = model.forward(torch.tensor(prompt), torch.arange(37), batch, cache)
        logits[name] = model.compute_logits(hidden)
    assert len(calls) == (cfg.num_layers if op is not None else 0)
    scale = logits["sdpa"].abs().max().item()
    assert (logits["tiles"] - logits["sdpa"]).abs().max().item() < 0.02 * scale
