"""Preset specs (`<name>?layers=N`) and the synthetic weights made from them."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.checkpoint import check_tensors
from llmbench.engine.presets import PRESETS, preset_config
from llmbench.engine.synthetic import SyntheticSource
from llmbench.errors import UserError


def test_layers_option_keeps_every_other_shape():
    config = preset_config("qwen3-30b-a3b?layers=2")
    assert config.num_layers == 2
    full = PRESETS["qwen3-30b-a3b"]
    assert config == type(full)(**{**full.__dict__, "num_layers": 2})
    assert preset_config("qwen3-30b-a3b") is full


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "synthetic:nope: unknown preset"),
        ("tiny?layers=0", "layers must be a whole number >= 1, got '0'"),
        ("tiny?layers=two", "layers must be a whole number >= 1, got 'two'"),
        ("tiny?depth=2", "unknown option 'depth=2'"),
    ],
)
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(UserError, match=message):
        preset_config(spec)


def test_synthetic_moe_weights_have_every_expert_at_reduced_depth():
    source = SyntheticSource("mixtral-8x7b?layers=1")
    infos = {info.name: info for info in source.tensor_infos()}
    expert = infos["model.layers.0.mlp.experts.7.down_proj.weight"]
    assert expert.shape == (4096, 14336) and expert.num_bytes == 4096 * 14336 * 2
    assert "model.layers.1.input_layernorm.weight" not in infos
    assert sum(i.num_bytes for i in infos.values()) == 2 * source.config.num_params()


def test_synthetic_tiny_moe_loads_complete_and_seeded():
    source = SyntheticSource("tiny-moe")
    a = source.load(torch.float32, torch.device("cpu"))
    check_tensors(a, source.config, source.description)  # nothing missing, shapes right
    assert a["model.layers.1.mlp.shared_expert_gate.weight"].shape == (1, 64)
    assert torch.equal(a["model.layers.0.self_attn.q_norm.weight"], torch.ones(16))
    b = SyntheticSource("tiny-moe").load(torch.float32, torch.device("cpu"))
    assert torch.equal(
        a["model.layers.1.mlp.experts.5.up_proj.weight"],
        b["model.layers.1.mlp.experts.5.up_proj.weight"],
    )
