"""Write a Hugging Face model folder that `hf_folder` loads back: config.json, the tensors as one
model.safetensors, and the tokenizer (the source folder's files, or the engine's tokenizer
written out as tokenizer.json + tokenizer_config.json + generation_config.json).

config.json is the source's own, with the expert count changed, when the model came from an HF
folder; otherwise it is made from the `ModelConfig`: Mixtral when the shape is Mixtral's (no
shared expert, no q/k norm, top-k renormalised, experts as wide as `intermediate_size`),
Qwen3-MoE for q/k norm without a shared expert, Qwen2-MoE otherwise. A shared expert with q/k
norm (the `tiny-moe` preset) is no published architecture: it is written as Qwen2-MoE with
llmbench's own `qk_norm: true` key, which only llmbench reads. Mixtral folders store the MoE
tensors under Mixtral's names (`block_sparse_moe`, w1/w3/w2).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from llmbench.engine.config import ModelConfig
from llmbench.engine.tokenizer import Tokenizer
from llmbench.errors import UserError

# What a tokenizer is made of in an HF folder (copied as they are when the source has them).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "tokenizer.model",
)
_TO_MIXTRAL = {
    ".mlp.": ".block_sparse_moe.",
    ".gate_proj.weight": ".w1.weight",
    ".up_proj.weight": ".w3.weight",
    ".down_proj.weight": ".w2.weight",
}


def hf_config(config: ModelConfig, source_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json for `config`: the source's config.json with the expert count set (Mixtral:
    `num_local_experts`, Qwen: `num_experts`), or one made from `config` (module docstring)."""
    if source_config is not None:
        raw = dict(source_config)
        key = "num_local_experts" if "num_local_experts" in raw else "num_experts"
        raw[key] = config.num_experts
        return raw
    if config.router_scoring != "softmax":
        raise UserError(
            "hf config: no HF architecture llmbench reads has a sigmoid router; cannot save it"
        )
    raw: dict[str, Any] = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
    }
    if config.rope_scaling is not None:
        s = config.rope_scaling
        raw["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    if not config.is_moe:
        arch = "Qwen2ForCausalLM" if config.qkv_bias else "LlamaForCausalLM"
        return {"architectures": [arch], **raw}
    shared = config.shared_expert_intermediate_size
    if is_mixtral_shaped(config):
        return {
            "architectures": ["MixtralForCausalLM"],
            **raw,
            "num_local_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok,
        }
    moe = {
        "num_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "moe_intermediate_size": config.moe_intermediate_size,
        "norm_topk_prob": config.norm_topk_prob,
    }
    if config.qk_norm and not shared and not config.qkv_bias:
        return {"architectures": ["Qwen3MoeForCausalLM"], **raw, **moe}
    extra = {"qk_norm": True} if config.qk_norm else {}
    return {
        "architectures": ["Qwen2MoeForCausalLM"],
        **raw,
        **moe,
        "shared_expert_intermediate_size": shared,
        "qkv_bias": config.qkv_bias,
        **extra,
    }


def is_mixtral_shaped(config: ModelConfig) -> bool:
    return (
        config.is_moe
        and not config.shared_expert_intermediate_size
        and not config.qk_norm
        and not config.qkv_bias
        and config.norm_topk_prob
        and config.moe_intermediate_size == config.intermediate_size
    )


def write_folder(
    folder: Path,
    config_json: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    tokenizer: Tokenizer,
    tokenizer_source: Path | None = None,
) -> Path:
    """Write config.json, model.safetensors and the tokenizer into `folder` (created; an existing
    non-empty folder is refused). `tensors` carry the engine's names; a Mixtral config gets them
    under Mixtral's. The tokenizer files are copied from `tokenizer_source` when it has
    tokenizer.json, else written from `tokenizer`."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder}: exists and is not an empty folder; give a new --out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{folder}: cannot create it ({e.strerror})") from None
    is_mixtral = "MixtralForCausalLM" in config_json.get("architectures", [])
    named = {(_mixtral_name(n) if is_mixtral else n): t for n, t in tensors.items()}
    save_file(_unshared(named), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    if tokenizer_source is not None and (tokenizer_source / "tokenizer.json").is_file():
        for name in TOKENIZER_FILES:
            if (tokenizer_source / name).is_file():
                shutil.copyfile(tokenizer_source / name, folder / name)
    else:
        write_tokenizer(folder, tokenizer)
    return folder


def write_tokenizer(folder: Path, tokenizer: Tokenizer) -> None:
    """The engine's tokenizer as `Tokenizer.from_hf_folder` reads it back: the same ids, stop
    ids, BOS policy and chat template."""
    tokenizer.hf_tokenizer.save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {"add_bos_token": tokenizer.add_bos}
    if tokenizer.bos_token is not None:
        config["bos_token"] = tokenizer.bos_token
    if tokenizer.eos_token is not None:
        config["eos_token"] = tokenizer.eos_token
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": list(tokenizer.eos_token_ids)}
    if tokenizer.bos_token_id is not None:
        generation["bos_token_id"] = tokenizer.bos_token_id
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _mixtral_name(name: str) -> str:
    """The engine's (Qwen-style) MoE name as Mixtral stores it; other names unchanged."""
    if ".mlp." not in name:
        return name
    for new, old in _TO_MIXTRAL.items():
        name = name.replace(new, old)
    return name


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, a copy of any that shares memory with an earlier one (safetensors
    refuses shared storage)."""
    out, seen = {}, set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().contiguous()
        if tensor.untyped_storage().data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out
