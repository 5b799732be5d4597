"""Pruning experts: saliency against a hand computation, the kept experts, the tensor surgery,
a pruned tiny-moe saved as an HF folder and loaded back, and pruned HF folders against
transformers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from llmbench.engine.checkpoint import expected_tensors
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.hf_folder import HFFolderSource
from llmbench.engine.hf_writer import hf_config, write_folder
from llmbench.engine.moe_prune import (
    SaliencyCollector,
    experts_to_keep,
    prune_tensors,
    pruned_config,
    pruned_weight_share,
    saliency,
)
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.weights import open_weights
from llmbench.errors import UserError
from tests.engine.test_moe import write_tiny_moe_checkpoint

TINY_MOE = "synthetic:tiny-moe"  # 2 layers, 8 experts, top-2


def test_saliency_of_a_hand_built_routing():
    # One layer of 4 experts, top-2, two tokens: token 0 → experts 0 (0.75) and 1 (0.25),
    # token 1 → experts 0 (0.5) and 2 (0.5); expert 3 unused. Output rows of known norms.
    collector = SaliencyCollector(num_layers=1, num_experts=4, device=torch.device("cpu"))
    slot_ids = torch.tensor([0, 0, 1, 2])  # grouped by expert, as the MoE layer hands them
    slot_weights = torch.tensor([0.75, 0.5, 0.25, 0.5])
    outputs = torch.tensor([[3.0, 4.0], [6.0, 8.0], [0.0, 2.0], [1.0, 0.0]])  # norms 5, 10, 2, 1
    collector.add(0, slot_ids, slot_weights, outputs, top_k=2)
    assert collector.tokens.tolist() == [[2, 1, 1, 0]]
    assert collector.weight_sum.tolist() == [[1.25, 0.25, 0.5, 0.0]]
    assert collector.norm_sum.tolist() == [[15.0, 2.0, 1.0, 0.0]]
    assert collector.num_rows.tolist() == [2]
    # frequency × mean gate weight × mean norm: e0 (2/2)(1.25/2)(15/2), e1 (1/2)(0.25)(2),
    # e2 (1/2)(0.5)(1), e3 never routed.
    expected = [1.0 * 0.625 * 7.5, 0.5 * 0.25 * 2.0, 0.5 * 0.5 * 1.0, 0.0]
    assert collector.saliency()[0].tolist() == pytest.approx(expected)


def test_saliency_formula_on_two_layers():
    tokens = torch.tensor([[4.0, 0.0], [1.0, 3.0]], dtype=torch.float64)
    weight = torch.tensor([[2.0, 0.0], [0.5, 1.5]], dtype=torch.float64)
    norms = torch.tensor([[8.0, 0.0], [1.0, 6.0]], dtype=torch.float64)
    rows = torch.tensor([4.0, 4.0], dtype=torch.float64)
    # W·N / (T·n): [2·8/(4·4), 0], [0.5·1/(4·1), 1.5·6/(4·3)]
    assert saliency(tokens, weight, norms, rows).tolist() == [[1.0, 0.0], [0.125, 0.75]]


def test_experts_to_keep_takes_the_highest_ties_to_the_lower_id():
    scores = torch.tensor([[0.1, 0.5, 0.5, 0.2], [0.0, 0.0, 0.0, 1.0]])
    assert experts_to_keep(scores, 2) == [[1, 2], [0, 3]]
    with pytest.raises(UserError, match=r"--keep must be in 1\.\.4"):
        experts_to_keep(scores, 5)


def test_pruned_weight_share():
    weight = torch.tensor([[3.0, 1.0], [2.0, 2.0]])
    assert pruned_weight_share(weight, [[0], [1]]) == pytest.approx(3 / 8)
    assert pruned_weight_share(torch.zeros(1, 2), [[0]]) == 0.0


def test_the_collector_counts_what_the_routers_chose():
    engine = LLMEngine(EngineConfig(model=TINY_MOE, device="cpu", kv_cache_memory=2**22))
    collector = SaliencyCollector(2, 8, engine.device)
    collector.install(engine.model)
    engine.generate(["one prompt", "and another one"], SamplingParams(max_tokens=5))
    SaliencyCollector.remove(engine.model)
    stats = engine.expert_stats
    routed = stats.tokens["prefill"] + stats.tokens["decode"]
    weights = stats.weight["prefill"] + stats.weight["decode"]
    assert collector.tokens.tolist() == routed.double().tolist()
    assert torch.allclose(collector.weight_sum, weights, rtol=1e-6)
    assert collector.num_rows.tolist() == [float(routed[0].sum() / 2)] * 2
    assert bool((collector.norm_sum[routed > 0] > 0).all())
    assert all(layer.moe.observe is None for layer in engine.model.layers)


def test_prune_tensors_renumbers_the_kept_experts_and_cuts_the_router():
    source = open_weights(TINY_MOE)
    tensors = source.load(torch.float32, torch.device("cpu"))
    kept = [[1, 4, 6], [0, 2, 7]]
    out = prune_tensors(tensors, source.config, kept)
    p = "model.layers.1.mlp."
    assert torch.equal(out[p + "gate.weight"], tensors[p + "gate.weight"][[0, 2, 7]])
    assert torch.equal(
        out[p + "experts.2.down_proj.weight"], tensors[p + "experts.7.down_proj.weight"]
    )
    assert p + "experts.3.gate_proj.weight" not in out
    assert out[p + "shared_expert.up_proj.weight"] is tensors[p + "shared_expert.up_proj.weight"]
    assert set(out) == set(expected_tensors(pruned_config(source.config, 3)))


def test_pruned_config_keeps_the_top_k():
    config = open_weights(TINY_MOE).config
    assert pruned_config(config, 2).num_experts == 2
    with pytest.raises(UserError, match="fewer than the 2 experts each token runs"):
        pruned_config(config, 1)


def _save_pruned(folder, kept):
    source = open_weights(TINY_MOE)
    tensors = source.load(torch.float32, torch.device("cpu"))
    config = pruned_config(source.config, len(kept[0]))
    pruned = prune_tensors(tensors, source.config, kept)
    write_folder(folder, hf_config(config), pruned, source.tokenizer())
    return folder


def test_keeping_every_expert_is_the_identity_after_save_and_reload(tmp_path):
    folder = _save_pruned(tmp_path / "pruned", [list(range(8))] * 2)
    original = LLMEngine(EngineConfig(model=TINY_MOE, device="cpu", kv_cache_memory=2**22))
    reloaded = LLMEngine(EngineConfig(model=str(folder), device="cpu", kv_cache_memory=2**22))
    assert reloaded.model_config == original.model_config
    ids = original.tokenizer.encode("the same text through both models")
    assert reloaded.tokenizer.encode("the same text through both models") == ids
    assert torch.equal(reloaded.score(ids), original.score(ids))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert reloaded.generate([ids], params) == original.generate([ids], params)


def test_pruning_to_fewer_reloads_with_that_many_experts_and_finite_outputs(tmp_path):
    kept = [[0, 3, 5], [1, 2, 6]]
    folder = _save_pruned(tmp_path / "pruned", kept)
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", kv_cache_memory=2**22))
    assert engine.model_config.num_experts == 3
    logits = engine.score(engine.tokenizer.encode("some words to score"))
    assert bool(torch.isfinite(logits).all())
    original = open_weights(TINY_MOE).load(torch.float32, torch.device("cpu"))
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        name = "model.layers.1.mlp.experts.2.gate_proj.weight"
        assert torch.equal(f.get_tensor(name), original[name.replace("experts.2", "experts.6")])
    assert engine.generate(["more words"], SamplingParams(max_tokens=4, ignore_eos=True))


@pytest.mark.parametrize("arch", ["mixtral", "qwen2-moe"])
def test_a_pruned_hf_folder_keeps_its_architecture_and_matches_transformers(tmp_path, arch):
    from transformers import AutoModelForCausalLM

    folder = write_tiny_moe_checkpoint(tmp_path / "src", arch)  # 4 experts, top-2
    source = HFFolderSource(folder)
    tensors = source.load(torch.float32, torch.device("cpu"))
    kept = [[0, 2, 3], [1, 2, 3]]
    out = write_folder(
        tmp_path / "pruned",
        hf_config(
            pruned_config(source.config, 3), json.loads((folder / "config.json").read_text())
        ),
        prune_tensors(tensors, source.config, kept),
        source.tokenizer(),
        tokenizer_source=folder,
    )
    config = json.loads((out / "config.json").read_text())
    assert (
        config["architectures"] == json.loads((folder / "config.json").read_text())["architectures"]
    )
    assert config["num_local_experts" if arch == "mixtral" else "num_experts"] == 3
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    engine = LLMEngine(EngineConfig(model=str(out), device="cpu", kv_cache_memory=2**22))
    ids = [5, 17, 42, 99, 7, 250, 3, 64]
    ours = engine.score(ids)
    hf = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4)
