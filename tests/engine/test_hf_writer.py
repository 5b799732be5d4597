"""Writing HF folders: config.json read back as the same `ModelConfig`, Mixtral's tensor names,
and the engine's tokenizer written out and read back."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from llmbench.engine.checkpoint import expected_tensors
from llmbench.engine.config import config_from_hf
from llmbench.engine.hf_folder import HFFolderSource
from llmbench.engine.hf_writer import hf_config, write_folder
from llmbench.engine.presets import PRESETS
from llmbench.engine.tokenizer import Tokenizer
from llmbench.errors import UserError


@pytest.mark.parametrize(
    ("preset", "arch"),
    [
        ("tiny", "LlamaForCausalLM"),
        ("qwen2.5-7b", "Qwen2ForCausalLM"),
        ("llama-3.1-8b", "LlamaForCausalLM"),
        ("tiny-moe", "Qwen2MoeForCausalLM"),
        ("olmoe-1b-7b", "Qwen2MoeForCausalLM"),
        ("qwen3-30b-a3b", "Qwen3MoeForCausalLM"),
        ("mixtral-8x7b", "MixtralForCausalLM"),
    ],
)
def test_config_json_reads_back_as_the_same_config(preset, arch):
    raw = hf_config(PRESETS[preset])
    assert raw["architectures"] == [arch]
    assert config_from_hf(raw, "config.json") == PRESETS[preset]


@pytest.mark.parametrize(
    ("preset", "model_type"),
    [
        ("tiny", "llama"),
        ("qwen2.5-7b", "qwen2"),
        ("tiny-moe", "qwen2_moe"),
        ("mixtral-8x7b", "mixtral"),
    ],
)
def test_a_config_json_without_architectures_is_read_by_its_model_type(preset, model_type):
    """As transformers reads one: `model_type` names the family where `architectures` is not
    given; a model_type of no family llmbench runs is refused by name."""
    raw = {k: v for k, v in hf_config(PRESETS[preset]).items() if k != "architectures"}
    assert config_from_hf({**raw, "model_type": model_type}, "config.json") == PRESETS[preset]
    with pytest.raises(UserError, match="config.json: unsupported architecture 'gpt2'"):
        config_from_hf({**raw, "model_type": "gpt2"}, "config.json")


def test_a_source_config_keeps_its_keys_with_the_new_expert_count():
    source = {"architectures": ["MixtralForCausalLM"], "num_local_experts": 8, "other": 1}
    config = dataclasses.replace(PRESETS["mixtral-8x7b"], num_experts=4)
    assert hf_config(config, source) == {**source, "num_local_experts": 4}
    qwen = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128}
    assert hf_config(config, qwen)["num_experts"] == 4


def test_a_sigmoid_router_has_no_hf_architecture():
    config = dataclasses.replace(PRESETS["tiny-moe"], router_scoring="sigmoid")
    with pytest.raises(UserError, match="sigmoid"):
        hf_config(config)


def _random_tensors(config):
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(shape, generator=g) for n, shape in expected_tensors(config).items()}


def test_a_mixtral_folder_stores_mixtrals_names_and_loads_back(tmp_path):
    config = dataclasses.replace(
        PRESETS["mixtral-8x7b"],
        vocab_size=300,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=16,
        moe_intermediate_size=16,
        num_experts=3,
    )
    tensors = _random_tensors(config)
    folder = write_folder(tmp_path / "m", hf_config(config), tensors, Tokenizer.byte_level())
    names = {info.name for info in HFFolderSource(folder).tensor_infos()}
    assert "model.layers.0.block_sparse_moe.experts.2.w3.weight" in names
    assert "model.layers.0.block_sparse_moe.gate.weight" in names
    source = HFFolderSource(folder)
    assert source.config == config
    loaded = source.load(torch.float32, torch.device("cpu"))
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[n], tensors[n]) for n in tensors)


def test_the_engines_tokenizer_reads_back_the_same(tmp_path):
    config = PRESETS["tiny"]
    tokenizer = Tokenizer.byte_level()
    folder = write_folder(tmp_path / "t", hf_config(config), _random_tensors(config), tokenizer)
    back = HFFolderSource(folder).tokenizer()
    text = "héllo <|im_start|>user\nworld<|im_end|>"
    assert back.encode(text) == tokenizer.encode(text)
    assert back.eos_token_ids == tokenizer.eos_token_ids == (258, 256)
    assert back.add_bos == tokenizer.add_bos
    messages = [{"role": "user", "content": "hi"}]
    assert back.encode_chat(messages) == tokenizer.encode_chat(messages)
    assert json.loads((folder / "generation_config.json").read_text()) == {
        "eos_token_id": [258, 256]
    }


def test_a_source_folders_tokenizer_files_are_copied(tmp_path):
    config = PRESETS["tiny"]
    source = tmp_path / "src"
    source.mkdir()
    Tokenizer.byte_level().hf_tokenizer.save(str(source / "tokenizer.json"))
    (source / "tokenizer_config.json").write_text('{"eos_token": "<|endoftext|>"}')
    folder = write_folder(
        tmp_path / "out", hf_config(config), _random_tensors(config), Tokenizer.byte_level(), source
    )
    assert (folder / "tokenizer_config.json").read_text() == '{"eos_token": "<|endoftext|>"}'
    assert not (folder / "generation_config.json").exists()


def test_a_non_empty_folder_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "file").write_text("")
    with pytest.raises(UserError, match="not an empty folder"):
        write_folder(tmp_path / "x", {}, {}, Tokenizer.byte_level())
