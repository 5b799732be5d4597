"""`ExpertStats`: what the routers of an MoE model chose, accumulated per phase, layer and expert.

Per phase ("prefill": rows of sequences still in their prompt; "decode": the rest), per MoE
layer l and expert e:
- `tokens[l][e]`: tokens routed to e;
- `weight[l][e]`: the sum of their routing weights (the factor that scaled e's output);
- `coactivation[l][i][j]`: tokens that had both i and j in their top-k (the diagonal is `tokens`).

One step costs a few tensor ops over all layers at once, on the device the routing lives on:
a multi-hot [L, T, E] of the top-k ids, its sum over tokens, a scatter of the weights, and one
batched [E, T] @ [T, E] product (at E = 128, T = 2,048 and L = 48: 3.2 GFLOP, against ~2·10^13
for the step itself).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmbench.engine.moe import Routing

PHASES = ("prefill", "decode")


class ExpertStats:
    def __init__(self, num_layers: int, num_experts: int, top_k: int, device: torch.device):
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.top_k = top_k
        self.device = device
        self.reset()

    def reset(self) -> None:
        """Forget everything counted so far (e.g. after warm-up requests)."""
        shape = (self.num_layers, self.num_experts)
        self.tokens = {p: torch.zeros(shape, dtype=torch.int64, device=self.device) for p in PHASES}
        self.weight = {
            p: torch.zeros(shape, dtype=torch.float64, device=self.device) for p in PHASES
        }
        self.coactivation = {
            p: torch.zeros((*shape, self.num_experts), dtype=torch.int64, device=self.device)
            for p in PHASES
        }

    def add_step(
        self, routing: Sequence[Routing], query_lens: Sequence[int], is_prefill: Sequence[bool]
    ) -> None:
        """Count one step: `routing` per MoE layer over its T rows, which are the scheduled
        sequences' chunks in order (`query_lens` rows each, prefill or not per `is_prefill`)."""
        if not routing:
            return
        expert_ids = torch.stack([r.expert_ids for r in routing])  # [L, T, k]
        weights = torch.stack([r.weights for r in routing])  # [L, T, k]
        if all(is_prefill) or not any(is_prefill):
            self._add(PHASES[0] if is_prefill[0] else PHASES[1], expert_ids, weights)
            return
        row_is_prefill = torch.repeat_interleave(
            torch.tensor(is_prefill, dtype=torch.bool),
            torch.tensor(query_lens, dtype=torch.int64),
        ).to(expert_ids.device)  # [T]
        for phase, rows in (("prefill", row_is_prefill), ("decode", ~row_is_prefill)):
            self._add(phase, expert_ids[:, rows], weights[:, rows])

    def _add(self, phase: str, expert_ids: torch.Tensor, weights: torch.Tensor) -> None:
        """expert_ids, weights: [L, T, k] of one phase's rows."""
        num_layers, num_rows, top_k = expert_ids.shape
        # A token's k choices are distinct experts, so the multi-hot is 0/1: [L, T, E].
        hot = torch.zeros(
            (num_layers, num_rows, self.num_experts), dtype=torch.float32, device=self.device
        )
        hot.scatter_(2, expert_ids, 1.0)
        self.tokens[phase] += hot.sum(dim=1).to(torch.int64)
        self.weight[phase].scatter_add_(
            1,
            expert_ids.reshape(num_layers, num_rows * top_k),
            weights.reshape(num_layers, num_rows * top_k).to(torch.float64),
        )
        # [L, E, T] @ [L, T, E]: exact in float32 up to 2^24 rows per step.
        self.coactivation[phase] += torch.bmm(hot.transpose(1, 2), hot).to(torch.int64)

    def to_dict(self) -> dict:
        """Plain JSON: {"num_layers", "num_experts", "top_k", "phases": {phase: {"tokens":
        [[L × E]], "weight": [[L × E]], "coactivation": [[[L × E × E]]]}}}."""
        return {
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "phases": {
                p: {
                    "tokens": self.tokens[p].tolist(),
                    "weight": self.weight[p].tolist(),
                    "coactivation": self.coactivation[p].tolist(),
                }
                for p in PHASES
            },
        }
