"""Pruning experts by usage, the engine's side: each expert's usage-weighted saliency measured
while the engine serves (`SaliencyCollector`, through `MoEMLP.observe`), the experts to keep,
and the tensor surgery that drops the others from a checkpoint.

Saliency of expert e of a layer, over the T tokens the layer routed while collecting:

    frequency (n_e / T) × mean gate weight (W_e / n_e) × mean output norm (N_e / n_e)

n_e: tokens routed to e; W_e: the sum of their routing weights (what scaled e's output);
N_e: the sum of the L2 norms of e's output rows for them, before the weight. An expert no token
chose scores 0. The N highest per layer are kept (ties: the lower id).

The router keeps the kept experts' rows, in id order (expert i of the pruned layer is the i-th
kept id), and nothing else changes. What routing becomes:
- softmax, top-k renormalised (`norm_topk_prob`: Mixtral, Qwen3-MoE): a token whose top-k were
  all kept routes exactly as before (the same k weights, renormalised over the same k); one that
  chose a pruned expert takes the next-best kept one instead;
- softmax, not renormalised (Qwen2-MoE, OLMoE): the softmax now runs over the kept experts, so
  each weight is divided by the probability mass the kept experts had for that token (<= 1):
  exact when the pruned experts had no mass, scaled up otherwise. A bias-free router cannot undo
  a per-token factor; keeping the salient experts keeps the lost mass small (`pruned_weight_share`
  says how small over the collected tokens);
- sigmoid: every expert's score is independent of the others, so a kept expert's weight is
  unchanged; only the choice of the top k moves past pruned experts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from llmbench.engine.config import ModelConfig
from llmbench.engine.model import LlamaModel
from llmbench.errors import UserError


class SaliencyCollector:
    """Per MoE layer and expert: tokens routed, routing weight and output norm, summed while
    installed on a model (`install` / `remove`). Every layer call adds three scatter-adds on the
    device; nothing comes to the host until read."""

    def __init__(self, num_layers: int, num_experts: int, device: torch.device):
        shape = (num_layers, num_experts)
        self.tokens = torch.zeros(shape, dtype=torch.float64, device=device)  # n_e
        self.weight_sum = torch.zeros(shape, dtype=torch.float64, device=device)  # W_e
        self.norm_sum = torch.zeros(shape, dtype=torch.float64, device=device)  # N_e
        self.num_rows = torch.zeros(num_layers, dtype=torch.float64, device=device)  # T

    def add(
        self,
        layer: int,
        slot_expert_ids: torch.Tensor,
        slot_weights: torch.Tensor,
        outputs: torch.Tensor,
        top_k: int,
    ) -> None:
        """One layer call: slot expert ids [T·k], their routing weights [T·k], and the experts'
        output rows [T·k, h] before the weight."""
        ids = slot_expert_ids.to(self.tokens.device)
        ones = torch.ones(ids.shape, dtype=torch.float64, device=ids.device)
        self.tokens[layer].index_add_(0, ids, ones)
        self.weight_sum[layer].index_add_(0, ids, slot_weights.to(ones))
        self.norm_sum[layer].index_add_(0, ids, outputs.float().norm(dim=1).to(ones))
        self.num_rows[layer] += ids.numel() // top_k

    def install(self, model: LlamaModel) -> None:
        """Observe every MoE layer of `model` (its layers are rewritten in place)."""
        for i, layer in enumerate(model.layers):
            moe = layer.moe
            if moe is None:
                continue

            def observe(ids, weights, outputs, layer_index=i, top_k=moe.top_k):
                self.add(layer_index, ids, weights, outputs, top_k)

            model.layers[i] = dataclasses.replace(
                layer, moe=dataclasses.replace(moe, observe=observe)
            )

    @staticmethod
    def remove(model: LlamaModel) -> None:
        """Stop observing `model`'s MoE layers."""
        for i, layer in enumerate(model.layers):
            if layer.moe is not None and layer.moe.observe is not None:
                model.layers[i] = dataclasses.replace(
                    layer, moe=dataclasses.replace(layer.moe, observe=None)
                )

    def saliency(self) -> torch.Tensor:
        """[L, E] float64 on the host (`saliency`)."""
        return saliency(self.tokens, self.weight_sum, self.norm_sum, self.num_rows).cpu()


def saliency(
    tokens: torch.Tensor, weight_sum: torch.Tensor, norm_sum: torch.Tensor, num_rows: torch.Tensor
) -> torch.Tensor:
    """Usage-weighted saliency [L, E] from per-expert sums [L, E] and tokens per layer [L].

    Formula: (n_e / T) · (W_e / n_e) · (N_e / n_e) = W_e · N_e / (T · n_e); 0 where n_e = 0.
    """
    rows = num_rows.unsqueeze(1).clamp(min=1)
    used = tokens > 0
    score = weight_sum * norm_sum / (rows * tokens.clamp(min=1))
    return torch.where(used, score, torch.zeros_like(score))


def experts_to_keep(scores: torch.Tensor, keep: int) -> list[list[int]]:
    """Per layer, the ids of the `keep` highest scores [L, E], ascending (ties: the lower id)."""
    num_experts = scores.shape[1]
    if not 1 <= keep <= num_experts:
        raise UserError(f"moe prune: --keep must be in 1..{num_experts}, got {keep}")
    kept = []
    for row in scores.tolist():
        ranked = sorted(range(num_experts), key=lambda e: (-row[e], e))
        kept.append(sorted(ranked[:keep]))
    return kept


def pruned_weight_share(weight_sum: torch.Tensor, kept: Sequence[Sequence[int]]) -> float:
    """Share of all routing weight collected that went to experts now pruned.

    Formula: Σ over layers of W_e of the pruned experts / Σ of all W_e.
    """
    total = float(weight_sum.sum())
    if total == 0:
        return 0.0
    kept_sum = sum(float(weight_sum[layer, ids].sum()) for layer, ids in enumerate(kept))
    return (total - kept_sum) / total


def pruned_config(config: ModelConfig, keep: int) -> ModelConfig:
    """The config with `keep` experts per layer (the top-k must still fit)."""
    if keep < config.num_experts_per_tok:
        raise UserError(
            f"moe prune: --keep {keep} is fewer than the {config.num_experts_per_tok} experts "
            "each token runs (top-k); keep at least that many"
        )
    return dataclasses.replace(config, num_experts=keep)


def prune_tensors(
    tensors: dict[str, torch.Tensor], config: ModelConfig, kept: Sequence[Sequence[int]]
) -> dict[str, torch.Tensor]:
    """HF-named tensors (the engine's names) with only the kept experts of each layer: expert
    `kept[l][i]` renamed to i, the router's rows [E, h] → [N, h]; the rest untouched."""
    if not config.is_moe:
        raise UserError("moe prune: the model has no experts (it is dense)")
    if len(kept) != config.num_layers:
        raise ValueError(f"kept lists {len(kept)} layers, the model has {config.num_layers}")
    out = {}
    expert_names = {}
    for layer, ids in enumerate(kept):
        p = f"model.layers.{layer}.mlp."
        index = torch.tensor(ids, dtype=torch.long)
        out[p + "gate.weight"] = tensors[p + "gate.weight"].index_select(0, index)
        for new, old in enumerate(ids):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                expert_names[f"{p}experts.{old}.{proj}.weight"] = f"{p}experts.{new}.{proj}.weight"
    for name, tensor in tensors.items():
        if name in out:
            continue
        if ".mlp.experts." in name:
            if name in expert_names:
                out[expert_names[name]] = tensor
            continue  # a pruned expert
        out[name] = tensor
    return out
