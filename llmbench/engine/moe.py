"""The mixture-of-experts MLP: a router picks each token's top-k SwiGLU experts, and the step's
tokens run grouped by expert (one gate/up and one down matmul per touched expert).

Shapes: T = tokens in the step, h = hidden size, E = experts, k = experts per token, I = an
expert's width, I_s = the shared expert's width. A "slot" is one (token, choice) pair: T·k of
them, slot s belongs to token s // k.

Execution sorts the T·k slots by expert id, gathers their hidden rows once, and walks the
touched experts in id order, each over its contiguous run of rows; the weighted outputs are
scattered back onto the residual with one `index_add_`. Matmul calls grow with the experts
touched (≤ min(E, T·k)), never with the tokens. The per-expert row counts come to the host (one
sync per layer) because they size the matmuls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from llmbench.engine.config import ModelConfig


class Matmul(Protocol):
    """What the model's `Linear` offers: y = x @ W^T (+ bias) (+ residual)."""

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor: ...


# tokens_per_expert → (gate_up, down) matmuls, each indexable by the id of a touched expert.
ExpertFetch = Callable[[tuple[int, ...]], tuple[Mapping[int, Matmul], Mapping[int, Matmul]]]


@dataclass(frozen=True)
class Routing:
    """What one MoE layer routed in one step.

    `expert_ids` [T, k] (long) and `weights` [T, k] (float32, what scales each expert's output)
    stay on the device; `tokens_per_expert` [E] is on the host (the execution needed it there).
    """

    expert_ids: torch.Tensor
    weights: torch.Tensor
    tokens_per_expert: tuple[int, ...]

    @property
    def num_experts_touched(self) -> int:
        """Distinct experts that at least one of the step's tokens was routed to."""
        return sum(1 for n in self.tokens_per_expert if n)

    @property
    def load_max_over_mean(self) -> float:
        """Formula: max tokens on one expert / (T·k / E), the mean over all E experts.

        1.0 is a perfectly even load; E / k when every token picks the same k experts.
        """
        num_slots = sum(self.tokens_per_expert)
        if not num_slots:
            return 0.0
        return max(self.tokens_per_expert) * len(self.tokens_per_expert) / num_slots


def mean_load_max_over_mean(routing: Sequence[Routing]) -> float | None:
    """Formula: mean over MoE layers of `Routing.load_max_over_mean`; None when dense."""
    if not routing:
        return None
    return sum(r.load_max_over_mean for r in routing) / len(routing)


def route(
    logits: torch.Tensor, top_k: int, scoring: str, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] → (weights [T, k] float32, expert ids [T, k]), best first.

    Scores are softmax or sigmoid of the logits in float32; the top-k scores are the weights,
    renormalised to sum to 1 per token when `normalize`.
    """
    logits = logits.float()
    scores = logits.softmax(dim=-1) if scoring == "softmax" else logits.sigmoid()
    weights, expert_ids = scores.topk(top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


@dataclass(frozen=True)
class MoEMLP:
    """Router + E SwiGLU experts (+ an optional sigmoid-gated shared expert) of one layer."""

    router: Matmul  # h → E
    expert_gate_up: tuple[Matmul, ...]  # per expert: h → 2·I (gate rows, then up rows)
    expert_down: tuple[Matmul, ...]  # per expert: I → h
    top_k: int
    scoring: str  # softmax | sigmoid
    normalize: bool
    expert_width: int  # I
    # Qwen2-MoE: shared expert gate/up with its sigmoid gate as one last row, h → 2·I_s + 1.
    shared_gate_up: Matmul | None = None
    shared_down: Matmul | None = None  # I_s → h
    shared_width: int = 0  # I_s
    # Where the experts' matmuls come from when not all are resident (`moe_offload`): called
    # with tokens_per_expert, returns (gate_up, down) indexable by each touched expert's id.
    # None: `expert_gate_up` / `expert_down` as they are.
    fetch: ExpertFetch | None = None
    # Called with (slot expert ids [T·k], slot routing weights [T·k], expert outputs [T·k, h]
    # before weighting), slots grouped by expert, when set (`moe_prune` measures output norms).
    observe: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None

    @classmethod
    def build(
        cls,
        config: ModelConfig,
        weights: Mapping[str, torch.Tensor],
        prefix: str,
        linear: Callable[[torch.Tensor], Matmul],
    ) -> MoEMLP:
        """From HF-named tensors under `prefix` (`model.layers.{i}.mlp.`); `linear` wraps a
        [out, in] weight as the model's matmul."""
        experts = [f"{prefix}experts.{e}." for e in range(config.num_experts)]
        shared_gate_up = shared_down = None
        if config.shared_expert_intermediate_size:
            s = prefix + "shared_expert."
            shared_gate_up = linear(
                torch.cat(
                    [
                        weights[s + "gate_proj.weight"],
                        weights[s + "up_proj.weight"],
                        weights[prefix + "shared_expert_gate.weight"],  # [1, h]
                    ]
                )
            )
            shared_down = linear(weights[s + "down_proj.weight"])
        return cls(
            router=linear(weights[prefix + "gate.weight"]),
            expert_gate_up=tuple(
                linear(torch.cat([weights[p + "gate_proj.weight"], weights[p + "up_proj.weight"]]))
                for p in experts
            ),
            expert_down=tuple(linear(weights[p + "down_proj.weight"]) for p in experts),
            top_k=config.num_experts_per_tok,
            scoring=config.router_scoring,
            normalize=config.norm_topk_prob,
            expert_width=config.moe_intermediate_size,
            shared_gate_up=shared_gate_up,
            shared_down=shared_down,
            shared_width=config.shared_expert_intermediate_size,
        )

    @property
    def num_experts(self) -> int:
        return len(self.expert_down)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, Routing]:
        """x: [T, h] (normed), residual: [T, h] → (residual + MoE(x) [T, h], what was routed)."""
        k, width = self.top_k, self.expert_width
        weights, expert_ids = route(self.router(x), k, self.scoring, self.normalize)  # [T, k]

        flat_ids = expert_ids.flatten()  # [T·k]
        order = torch.argsort(flat_ids, stable=True)  # slots grouped by expert, ids ascending
        tokens_per_expert = tuple(torch.bincount(flat_ids, minlength=self.num_experts).tolist())
        token_of_slot = order // k  # [T·k]: which token each sorted slot reads and writes
        rows = x[token_of_slot]  # [T·k, h]
        gate_ups, downs = (
            (self.expert_gate_up, self.expert_down)
            if self.fetch is None
            else self.fetch(tokens_per_expert)
        )
        outputs = []
        start = 0
        for expert, count in enumerate(tokens_per_expert):
            if not count:
                continue
            gate_up = gate_ups[expert](rows[start : start + count])  # [n, 2·I]
            act = F.silu(gate_up[:, :width]) * gate_up[:, width:]  # [n, I]
            outputs.append(downs[expert](act))  # [n, h]
            start += count
        expert_out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]  # [T·k, h]
        slot_weights = weights.flatten()[order]  # [T·k], grouped by expert as expert_out
        if self.observe is not None:
            self.observe(flat_ids[order], slot_weights, expert_out)
        expert_out *= slot_weights.unsqueeze(1).to(expert_out.dtype)

        if self.shared_gate_up is not None and self.shared_down is not None:
            s = self.shared_width
            gate_up = self.shared_gate_up(x)  # [T, 2·I_s + 1]
            act = F.silu(gate_up[:, :s]) * gate_up[:, s : 2 * s]  # [T, I_s]
            # sigmoid(g)·down(act) = down(sigmoid(g)·act): the gate is one scalar per token.
            act *= torch.sigmoid(gate_up[:, 2 * s :])
            out = self.shared_down(act, residual=residual)  # residual + shared expert
            out.index_add_(0, token_of_slot, expert_out)
        else:
            out = residual.index_add(0, token_of_slot, expert_out)
        return out, Routing(expert_ids, weights, tokens_per_expert)
