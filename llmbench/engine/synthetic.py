"""`synthetic:<preset>`: seeded random weights with a real model's shapes, no download needed.

Outputs are gibberish; bytes moved and FLOPs are exactly the real model's, which is all a
throughput or roofline benchmark needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmbench.engine.checkpoint import TensorInfo, expected_tensors
from llmbench.engine.presets import preset_config
from llmbench.engine.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch is the engine extra: describing a model needs none
    import torch

# Released checkpoints of these models are stored in bfloat16; `inspect` reports that size.
_STORED_DTYPE, _STORED_BYTES = "bfloat16", 2
_INIT_STD = 0.02  # the HF `initializer_range` of Llama-family configs


class SyntheticSource:
    def __init__(self, preset: str, seed: int = 0):
        """`preset`: a preset name, optionally `?layers=N` (see `presets.preset_config`)."""
        self.config = preset_config(preset)
        self.description = f"synthetic:{preset} (seeded random weights, seed {seed})"
        self._seed = seed

    def tensor_infos(self) -> list[TensorInfo]:
        infos = []
        for name, shape in expected_tensors(self.config).items():
            numel = 1
            for dim in shape:
                numel *= dim
            infos.append(TensorInfo(name, shape, _STORED_DTYPE, numel * _STORED_BYTES))
        return infos

    def load(self, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
        import torch

        generator = torch.Generator(device="cpu").manual_seed(self._seed)
        tensors = {}
        for name, shape in expected_tensors(self.config).items():
            if name.endswith("norm.weight"):
                tensor = torch.ones(shape, dtype=dtype)
            else:
                tensor = torch.empty(shape, dtype=dtype).normal_(
                    0.0, _INIT_STD, generator=generator
                )
            tensors[name] = tensor.to(device)
        return tensors

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.byte_level()
