"""MoE GGUF files (Mixtral as "llama", qwen2moe, qwen3moe), written from the tiny HF MoE
checkpoints the way llama.cpp's converter writes them: experts stacked [E, out, in] per
projection, Llama Q/K rows permuted, dims innermost first. The loader must give back the HF
folder's tensors, and the engine the same tokens from either file."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.gguf_file import GGUFSource
from llmbench.engine.hf_folder import HFFolderSource
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import UserError
from tests.engine.helpers import VOCAB
from tests.engine.test_gguf_file import add_tokenizer, llama_cpp_permute, roundtrip
from tests.engine.test_moe import ARCHS, write_tiny_moe_checkpoint

T = gguf.GGMLQuantizationType
GGUF_ARCH = {"mixtral": "llama", "qwen2-moe": "qwen2moe", "qwen3-moe": "qwen3moe"}
# HF name suffix (Qwen-MoE names) -> GGUF name suffix, per layer.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
EXPERT_NAMES = {
    "gate_proj": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
}


def write_moe_gguf(folder: Path, arch: str, path: Path, expert_type: T = T.F32) -> Path:
    """Convert a tiny HF MoE folder to GGUF; experts stored as `expert_type`."""
    source = HFFolderSource(folder)
    cfg = source.config
    hf = {k: v.numpy() for k, v in source.load(torch.float32, torch.device("cpu")).items()}
    writer = gguf.GGUFWriter(path, GGUF_ARCH[arch])
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(512)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(cfg.num_experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    if arch == "mixtral":  # llama.cpp writes the experts' width as the feed-forward length
        writer.add_feed_forward_length(cfg.moe_intermediate_size)
    else:
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if cfg.shared_expert_intermediate_size:
        writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if arch == "qwen3-moe":
        writer.add_expert_weights_norm(True)
    add_tokenizer(writer)

    writer.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", hf["model.norm.weight"])
    writer.add_tensor("output.weight", hf["lm_head.weight"])
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        for hf_suffix, gguf_suffix in LAYER_NAMES.items():
            if p + hf_suffix not in hf:
                continue
            x = hf[p + hf_suffix]
            if arch == "mixtral" and gguf_suffix == "attn_q.weight":
                x = llama_cpp_permute(x, cfg.num_heads)
            elif arch == "mixtral" and gguf_suffix == "attn_k.weight":
                x = llama_cpp_permute(x, cfg.num_kv_heads)
            elif gguf_suffix == "ffn_gate_inp_shexp.weight":
                x = x.reshape(-1)  # llama.cpp reads it as [h]
            writer.add_tensor(f"blk.{n}.{gguf_suffix}", x)
        for hf_name, gguf_name in EXPERT_NAMES.items():
            stacked = np.stack(
                [hf[f"{p}mlp.experts.{e}.{hf_name}.weight"] for e in range(cfg.num_experts)]
            )  # [E, out, in]
            data = gguf.quants.quantize(stacked, expert_type)
            raw_dtype = None if expert_type == T.F32 else expert_type
            writer.add_tensor(f"blk.{n}.{gguf_name}.weight", data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=ARCHS)
def moe_files(request, tmp_path_factory):
    folder = write_tiny_moe_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    return folder, write_moe_gguf(folder, request.param, folder / "model.gguf")


def test_gguf_gives_back_the_hf_tensors_and_config(moe_files):
    folder, path = moe_files
    hf_source, gguf_source = HFFolderSource(folder), GGUFSource(path)
    for field in (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "norm_topk_prob",
        "router_scoring",
        "qk_norm",
        "qkv_bias",
    ):
        assert getattr(gguf_source.config, field) == getattr(hf_source.config, field), field
    cpu = torch.device("cpu")
    ours, expected = gguf_source.load(torch.float32, cpu), hf_source.load(torch.float32, cpu)
    assert ours.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(ours[name], tensor), name


def test_engine_tokens_from_gguf_equal_those_from_the_hf_folder(moe_files):
    folder, path = moe_files
    prompts = [
        torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in (7, 30)
    ]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    outputs = [
        LLMEngine(EngineConfig(model=str(m), device="cpu", kv_cache_memory=1 << 22)).generate(
            prompts, params
        )
        for m in (folder, path)
    ]
    assert outputs[0] == outputs[1]


def test_quantized_stacked_experts_dequantize_per_expert(tmp_path):
    folder = write_tiny_moe_checkpoint(tmp_path, "qwen3-moe")
    path = write_moe_gguf(folder, "qwen3-moe", tmp_path / "q8.gguf", expert_type=T.Q8_0)
    source = GGUFSource(path)
    assert {i.dtype for i in source.tensor_infos() if "_exps" in i.name} == {"Q8_0"}
    ours = source.load(torch.float32, torch.device("cpu"))
    hf = HFFolderSource(folder).load(torch.float32, torch.device("cpu"))
    name = "model.layers.1.mlp.experts.2.down_proj.weight"
    assert torch.equal(ours[name], torch.from_numpy(roundtrip(hf[name].numpy(), T.Q8_0)))


def test_a_missing_expert_stack_is_refused(tmp_path):
    folder = write_tiny_moe_checkpoint(tmp_path, "qwen3-moe")
    path = write_moe_gguf(folder, "qwen3-moe", tmp_path / "m.gguf")
    # Rename one stack (same length: offsets stay valid): the expected one is then missing.
    path.write_bytes(path.read_bytes().replace(b"blk.1.ffn_up_exps", b"blk.1.ffn_up_expz"))
    with pytest.raises(UserError, match="unexpected tensor 'blk.1.ffn_up_expz.weight'"):
        GGUFSource(path)
