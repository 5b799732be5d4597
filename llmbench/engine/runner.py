"""Turns a scheduled batch into one forward pass: flat token ids, positions, slots, block tables.

A step of plain decodes (one token per sequence, each needing its next token) runs through
`cuda_graphs.DecodeGraphs` when the runner has them (CUDA, `cuda_graphs` on); every other step,
and every step on a CPU, builds its index tensors and runs the forward pass eagerly. Sampling
then reads the logits on the device; the sampled ids reach the host with one `.tolist()`.
"""

from __future__ import annotations

import torch

from llmbench.engine import spans
from llmbench.engine.cuda_graphs import DecodeGraphs, DecodeRow
from llmbench.engine.host_to_device import to_device
from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch
from llmbench.engine.sampling import sample
from llmbench.engine.scheduler import ScheduledSeq
from llmbench.engine.spans import span
from llmbench.engine.verification import verify


def decode_rows(batch: list[ScheduledSeq]) -> list[DecodeRow] | None:
    """The step as decode rows when every sequence runs exactly its one last token (no
    drafts, no prefill chunk), else None."""
    rows = []
    for item in batch:
        if item.num_new_tokens != 1 or item.spec_token_ids or not item.needs_logits:
            return None
        seq = item.seq
        position = seq.num_computed_tokens
        rows.append(DecodeRow(seq.token_ids[position], position, seq.block_table))
    return rows


class ModelRunner:
    def __init__(
        self, model: LlamaModel, kv_cache: KVCache, decode_graphs: DecodeGraphs | None = None
    ):
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.device
        # Plain decode steps through static buffers / CUDA graphs (None: every step eager).
        self.decode_graphs = decode_graphs

    def execute(self, batch: list[ScheduledSeq]) -> list[list[int]]:
        """Run one step; returns the new tokens of every sequence whose chunk needs logits, in
        batch order: one sampled token, or (speculative decoding) the accepted draft tokens and
        one more. The returned ids are on the host, so the step is complete on return."""
        if self.decode_graphs is not None:
            rows = decode_rows(batch)
            if rows is not None and self.decode_graphs.can_run(rows):
                return self._sample(self.decode_graphs.run(rows), batch)
        with span(spans.INPUTS):
            input_ids: list[int] = []
            positions: list[int] = []
            chunks: list[Chunk] = []
            logit_rows: list[int] = []
            for item in batch:
                seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
                num_drafts = len(item.spec_token_ids)
                chunks.append(Chunk(start, n, seq.block_table))
                input_ids += seq.token_ids[start : start + n - num_drafts]
                input_ids += item.spec_token_ids  # verified after the last token, k + 1 rows
                positions += range(start, start + n)
                if item.needs_logits:
                    logit_rows += range(len(input_ids) - 1 - num_drafts, len(input_ids))
            attention = build_attention_batch(
                chunks, self.kv_cache.block_size, self.device, self.model.dtype
            )
            ids = to_device(input_ids, self.device, torch.long)
            pos = to_device(positions, self.device, torch.long)
        hidden = self.model.forward(ids, pos, attention, self.kv_cache)
        if not logit_rows:
            return []
        # Only rows that end a sequence's known tokens get logits (and the rows of the drafts
        # it verifies): the lm_head is ~20% of SmolLM2's weights, and a 1,000-token prefill
        # needs just one row of it. The rows are distinct and ascending: as many as the step has are
        # all of them, in order, and need no gather.
        if len(logit_rows) < len(input_ids):
            hidden = hidden[to_device(logit_rows, self.device, torch.long)]
        return self._sample(self.model.compute_logits(hidden), batch)

    def _sample(self, logits: torch.Tensor, batch: list[ScheduledSeq]) -> list[list[int]]:
        """logits [N, V]: one row per sequence that needs logits (with its drafts' rows) → its
        new tokens on the host (the step's one device→host read)."""
        with span(spans.SAMPLING):
            needing = [item for item in batch if item.needs_logits]
            if any(item.spec_token_ids for item in needing):
                return verify(logits, needing)
            sampled = [item.seq for item in needing]
            tokens = sample(logits, [s.params for s in sampled], [s.generator for s in sampled])
            return [[token] for token in tokens.tolist()]

    def score(
        self, token_ids: list[int], block_table: list[int], max_chunk_tokens: int
    ) -> torch.Tensor:
        """Logits [T, V] (float32) of every position of token_ids: row i is the model's
        distribution of token i + 1. Prefill chunks of at most max_chunk_tokens go through the
        paged cache at `block_table` (which must hold T tokens); nothing is sampled. For
        scoring a text (perplexity), not for serving: every row pays for the lm_head."""
        rows = []
        for start in range(0, len(token_ids), max_chunk_tokens):
            end = min(start + max_chunk_tokens, len(token_ids))
            attention = build_attention_batch(
                [Chunk(start, end - start, block_table)],
                self.kv_cache.block_size,
                self.device,
                self.model.dtype,
            )
            ids = torch.tensor(token_ids[start:end], dtype=torch.long, device=self.device)
            pos = torch.arange(start, end, dtype=torch.long, device=self.device)
            hidden = self.model.forward(ids, pos, attention, self.kv_cache)
            rows.append(self.model.compute_logits(hidden))
        return torch.cat(rows)
