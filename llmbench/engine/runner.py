"""Turns a scheduled batch into one forward pass: flat token ids, positions, slots, block tables."""

from __future__ import annotations

import torch

from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch
from llmbench.engine.sampling import sample
from llmbench.engine.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache):
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.device

    def execute(self, batch: list[ScheduledSeq]) -> list[int]:
        """Run one step; returns the sampled token of every sequence whose chunk needs logits,
        in batch order. The returned ids are on the host, so the step is complete on return."""
        input_ids: list[int] = []
        positions: list[int] = []
        chunks: list[Chunk] = []
        logit_rows: list[int] = []
        for item in batch:
            seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            chunks.append(Chunk(start, n, seq.block_table))
            input_ids += seq.token_ids[start : start + n]
            positions += range(start, start + n)
            if item.needs_logits:
                logit_rows.append(len(input_ids) - 1)
        attention = build_attention_batch(
            chunks, self.kv_cache.block_size, self.device, self.model.dtype
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
