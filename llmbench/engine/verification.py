"""Speculative verification: which draft tokens the target model accepts, and the token after.

A sequence that verifies k draft tokens ran k + 1 query rows (its last token, then the drafts),
so the target's logits give p_0 .. p_k: p_i is the next-token distribution after the i-th
draft. Greedy requests accept the longest prefix of drafts equal to the target's argmax and
then take the argmax after it, which is exactly the tokens plain greedy decoding makes.
Sampled requests use the speculative rejection-sampling rule (Leviathan et al. 2023, Chen et
al. 2023), under which the emitted tokens are distributed exactly as plain sampling from p:
accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw the
token from norm(max(0, p_i - q_i)) and stop; if every draft is accepted, draw a bonus token from
p_k. A proposer that picks its tokens deterministically (n-gram lookup, a greedy draft model)
has q_i = a point mass on x_i.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmbench.engine.sampling import apply_logit_bias, greedy_ids, sample, sampling_probs
from llmbench.engine.scheduler import ScheduledSeq


def accept_greedy(draft_ids: Sequence[int], target_ids: Sequence[int]) -> list[int]:
    """Greedy verification: the drafts up to the first that differs from the target's argmax,
    then the target's own token there. target_ids: argmax of each of the k + 1 rows.

    Example: drafts [5, 6, 7], target [5, 6, 9, 2] → [5, 6, 9] (two accepted).
    """
    accepted = 0
    while accepted < len(draft_ids) and draft_ids[accepted] == target_ids[accepted]:
        accepted += 1
    return [*draft_ids[:accepted], target_ids[accepted]]


def rejection_sample(
    target_probs: torch.Tensor,
    draft_ids: Sequence[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """The speculative rejection-sampling rule: accepted drafts, then one drawn token.

    target_probs: `[k + 1, V]` (rows may be unnormalised: top-k/top-p/min-p zeros, as
    `sampling_probs` leaves them); draft_probs: `[k, V]` the drafts were drawn from, or None when
    each draft was a point mass. Formula: accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
    at the first rejection draw from norm(max(0, p_i - q_i)); all accepted: draw from p_k.
    """
    p = target_probs.float()
    p = p / p.sum(dim=-1, keepdim=True)
    num_drafts = len(draft_ids)
    if num_drafts:
        ids = torch.tensor(draft_ids, device=p.device)
        rows = torch.arange(num_drafts, device=p.device)
        p_x = p[rows, ids]  # [k]
        if draft_probs is None:
            ratio = p_x  # q_i(x_i) = 1
        else:
            q = draft_probs.float()
            q = q / q.sum(dim=-1, keepdim=True)
            ratio = p_x / q[rows, ids]
        uniform = torch.rand(num_drafts, generator=generator, device=p.device)
        # u < ratio accepts with probability min(1, ratio); the first False is the rejection.
        rejected = (uniform >= ratio).tolist()
        accepted = rejected.index(True) if True in rejected else num_drafts
    else:
        accepted = 0
    if accepted == num_drafts:
        final = p[num_drafts]  # every draft accepted: the bonus token comes from p_k
    else:
        if draft_probs is None:
            residual = p[accepted].clone()
            residual[draft_ids[accepted]] = 0.0  # max(0, p - point mass at x)
        else:
            residual = (p[accepted] - q[accepted]).clamp_(min=0.0)
        # Rejection has probability sum(max(0, q - p)) = sum(max(0, p - q)) > 0, so the residual
        # is not all zero, unless rounding made it so: then p itself is the answer.
        final = residual if residual.sum() > 0 else p[accepted]
    token = torch.multinomial(final, 1, generator=generator).item()
    return [*draft_ids[:accepted], token]


def verify(logits: torch.Tensor, items: Sequence[ScheduledSeq]) -> list[list[int]]:
    """The tokens each sequence gets from one step: one sampled token for a plain chunk, the
    accepted drafts plus one token for a sequence that verified drafts.

    logits: `[R, V]`, the rows of every item that needs logits, in batch order: 1 row for a
    plain chunk, k + 1 for an item with k `spec_token_ids`. Plain rows go through `sample`
    exactly as without speculation; greedy verifications share one argmax and one host read.
    """
    plain_rows, verify_rows, row_params = [], [], []
    row = 0
    for item in items:
        num_rows = 1 + len(item.spec_token_ids)
        (verify_rows if item.spec_token_ids else plain_rows).append(row)
        row_params += [item.seq.params] * num_rows
        row += num_rows
    results: list[list[int] | None] = [None] * len(items)
    plain = [i for i, item in enumerate(items) if not item.spec_token_ids]
    if plain:
        seqs = [items[i].seq for i in plain]
        rows = torch.tensor(plain_rows, device=logits.device)
        tokens = sample(logits[rows], [s.params for s in seqs], [s.generator for s in seqs])
        for i, token in zip(plain, tokens.tolist(), strict=True):
            results[i] = [token]
    greedy = None
    if any(item.spec_token_ids and item.seq.params.is_greedy for item in items):
        greedy = greedy_ids(apply_logit_bias(logits, row_params)).tolist()  # [R]
    # The target's distributions of every sampled verification's rows, in one call.
    sampled_rows, row = [], 0
    for item in items:
        num_rows = 1 + len(item.spec_token_ids)
        if item.spec_token_ids and not item.seq.params.is_greedy:
            sampled_rows += range(row, row + num_rows)
        row += num_rows
    probs = None
    if sampled_rows:
        index = torch.tensor(sampled_rows, device=logits.device)
        probs = sampling_probs(logits[index], [row_params[r] for r in sampled_rows])
    row = sampled = 0
    for i, item in enumerate(items):
        num_drafts = len(item.spec_token_ids)
        if num_drafts:
            seq = item.seq
            if seq.params.is_greedy:
                target_ids = greedy[row : row + num_drafts + 1]
                results[i] = accept_greedy(item.spec_token_ids, target_ids)
            else:
                p = probs[sampled : sampled + num_drafts + 1]
                sampled += num_drafts + 1
                q = None if seq.spec_probs is None else seq.spec_probs[:num_drafts]
                results[i] = rejection_sample(p, item.spec_token_ids, q, seq.generator)
        row += 1 + num_drafts
    return results
