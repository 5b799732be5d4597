"""Weights from a Hugging Face model folder: config.json, *.safetensors (sharded too), tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from llmbench.engine.checkpoint import TensorInfo
from llmbench.engine.config import ModelConfig, config_from_hf
from llmbench.engine.tokenizer import Tokenizer
from llmbench.errors import UserError

if TYPE_CHECKING:  # torch is the engine extra: describing a model needs none
    import torch

# Mixtral's MoE tensor names -> the Qwen-MoE names the engine uses (w1 gate, w3 up, w2 down).
_MIXTRAL_NAMES = {
    ".block_sparse_moe.": ".mlp.",
    ".w1.weight": ".gate_proj.weight",
    ".w3.weight": ".up_proj.weight",
    ".w2.weight": ".down_proj.weight",
}


def canonical_name(name: str) -> str:
    """A checkpoint tensor's name as the engine knows it: Mixtral's MoE names become Qwen's."""
    if ".block_sparse_moe." not in name:
        return name
    for old, new in _MIXTRAL_NAMES.items():
        name = name.replace(old, new)
    return name


_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1}


class HFFolderSource:
    def __init__(self, folder: Path):
        self.folder = folder
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise UserError(f"{folder}: no config.json; an HF model folder needs one")
        try:
            raw = json.loads(config_path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{config_path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        self.config: ModelConfig = config_from_hf(raw, str(config_path))
        self._shards = self._find_shards()
        self.description = f"HF folder {folder}"

    def _find_shards(self) -> list[Path]:
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            shards = sorted({self.folder / name for name in weight_map.values()})
        else:
            shards = sorted(self.folder.glob("*.safetensors"))
        if not shards:
            raise UserError(f"{self.folder}: no *.safetensors files; convert the weights first")
        for shard in shards:
            if not shard.is_file():
                raise UserError(f"{shard}: listed in the shard index but missing")
        return shards

    def _open(self, shard: Path):
        try:
            return safe_open(shard, framework="pt")
        except (SafetensorError, OSError) as e:
            raise UserError(f"{shard}: unreadable safetensors file ({e}); re-download it") from None

    def tensor_infos(self) -> list[TensorInfo]:
        infos = []
        for shard in self._shards:
            with self._open(shard) as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    shape = tuple(sl.get_shape())
                    dtype = sl.get_dtype()
                    numel = 1
                    for dim in shape:
                        numel *= dim
                    infos.append(TensorInfo(name, shape, dtype, numel * _DTYPE_BYTES.get(dtype, 0)))
        return infos

    def load(self, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:

        tensors = {}
        for shard in self._shards:
            with self._open(shard) as f:
                for name in f.keys():
                    if "rotary_emb.inv_freq" in name:
                        continue  # derived from the config, some old checkpoints store it
                    try:
                        tensor = f.get_tensor(name).to(device=device, dtype=dtype)
                        tensors[canonical_name(name)] = tensor
                    except (SafetensorError, RuntimeError) as e:
                        raise UserError(f"{shard}: tensor '{name}' unreadable ({e})") from None
        return tensors

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_hf_folder(self.folder)
