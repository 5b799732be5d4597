"""Turns a scheduled batch into one forward pass: flat token ids, positions, slots, block tables."""

from __future__ import annotations

import torch

from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import AttentionBatch, KVCache, SeqSlice
from llmbench.engine.sampling import sample
from llmbench.engine.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache):
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.device
        bs = kv_cache.block_size
        self._block_offsets = torch.arange(bs, device=self.device)  # [bs]

    def _slots(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        """Cache slots of positions [0, num_tokens): block * block_size + offset, [num_tokens]."""
        blocks = torch.tensor(block_table, dtype=torch.long, device=self.device)
        slots = blocks[:, None] * self.kv_cache.block_size + self._block_offsets[None, :]
        return slots.flatten()[:num_tokens]

    def execute(self, batch: list[ScheduledSeq]) -> list[int]:
        """Run one step; returns the sampled token of every sequence whose chunk needs logits,
        in batch order. The returned ids are on the host, so the step is complete on return."""
        input_ids: list[int] = []
        positions: list[int] = []
        slot_parts: list[torch.Tensor] = []
        seqs: list[SeqSlice] = []
        logit_rows: list[int] = []
        for item in batch:
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            context_len = start + n
            kv_slots = self._slots(seq.block_table, context_len)
            seqs.append(SeqSlice(len(input_ids), n, context_len, kv_slots))
            slot_parts.append(kv_slots[start:])
            input_ids += seq.token_ids[start:context_len]
            positions += range(start, context_len)
            if item.needs_logits:
                logit_rows.append(len(input_ids) - 1)
        attention = AttentionBatch(
            slot_mapping=torch.cat(slot_parts), seqs=seqs, max_position=max(positions)
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model.forward(ids, pos, attention, self.kv_cache)
        if not logit_rows:
            return []
        # Only rows that end a sequence's known tokens get logits: the lm_head is ~20% of
        # SmolLM2's weights, and a 1,000-token prefill needs just one row of it.
        logits = self.model.compute_logits(hidden[logit_rows])
        sampled = [item.seq for item in batch if item.needs_logits]
        tokens = sample(logits, [s.params for s in sampled], [s.generator for s in sampled])
        return tokens.tolist()
