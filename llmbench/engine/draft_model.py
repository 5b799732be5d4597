"""The draft-model proposer: a smaller model with the target's tokenizer guesses k tokens ahead.

The draft is any model the user names whose vocabulary and tokenizer are the target's, or the
target itself made cheaper: `self:layers=N`, its own first N layers with its final norm and
lm_head (no weights copied); `self:quantize=SCHEME`, a second copy with its linear layers
quantised (`int8`, `int4`, `int4:64`, ...); or both, `self:layers=N,quantize=SCHEME`.

A `self:` draft has the target's shapes, so it attends over the target's own K/V cache: every
verified token's K/V are there already. Each step it runs the sequence's last token, then
k - 1 one-token passes (draft token j gives draft token j + 1), all sequences batched, writing
its K/V past the sequence's computed tokens, where the verify pass overwrites them.

Any other draft keeps its own paged KV cache and block manager (prefix caching included) and
follows each decoding sequence with counters, like the scheduler does for the target:

- catch up: run the sequence's tokens the draft has not seen (its whole prompt the first
  time, then the tokens the last verification added), at most `max_num_batched_tokens` a step
  across sequences; the last row's logits give draft token 1;
- then the same k - 1 one-token passes.

Draft token j's K/V are written at its position while proposing; the next call keeps those the
target accepted (they are now the sequence's tokens) and forgets the rest, so a rejected draft
never becomes part of the cache, and only verified tokens' blocks are registered for reuse.
Greedy requests take the draft's argmax; sampled ones draw from the draft's own distribution
under the request's settings and keep it (`spec_probs`) for the rejection rule.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from llmbench.engine.checkpoint import check_tensors
from llmbench.engine.kv_cache import BlockManager
from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch
from llmbench.engine.quant.scheme import QuantScheme, parse_quantize
from llmbench.engine.sampling import apply_logit_bias, greedy_ids, sampling_probs
from llmbench.engine.sequence import Sequence
from llmbench.engine.speculative import SpeculativeConfig, max_draft_tokens
from llmbench.engine.tokenizer import Tokenizer
from llmbench.engine.weights import open_weights
from llmbench.errors import UserError

SELF_PREFIX = "self:"
# Text that draft and target encode alike when their tokenizers are the same one (with some
# 500 of the target's own tokens, `_tokenizer_probe`, so a word-level or reordered vocabulary
# is caught too).
_PROBE_TEXT = "The quick brown fox: 12 + 30 = 42, naïve café; def f(x): return x\n"


def truncated(model: LlamaModel, num_layers: int) -> LlamaModel:
    """The target's first `num_layers` layers with its embedding, final norm and lm_head: a
    view that shares every tensor (no weights copied)."""
    draft = copy.copy(model)
    draft.config = dataclasses.replace(model.config, num_layers=num_layers)
    draft.layers = model.layers[:num_layers]
    draft.plan_fused_layers()
    return draft


def self_options(name: str, num_layers: int) -> tuple[int, QuantScheme | None]:
    """(layers, quantisation) of a `self:...` draft: `layers=N` (1 <= N <= the target's
    layers; default all of them) and `quantize=SCHEME`, comma-separated, each at most once."""
    bad = UserError(
        f"draft model '{name}': expected self:layers=N (1 <= N <= {num_layers}, the target's "
        f"layers), self:quantize=SCHEME, or both: self:layers=N,quantize=SCHEME"
    )
    options: dict[str, str] = {}
    for part in name.removeprefix(SELF_PREFIX).split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in ("layers", "quantize") or key in options:
            raise bad
        options[key] = value
    layers = options.get("layers", str(num_layers))
    if not layers.isdigit() or not 1 <= int(layers) <= num_layers:
        raise bad
    scheme = parse_quantize(options["quantize"]) if "quantize" in options else None
    if "quantize" in options and scheme is None:
        raise bad  # quantize=none: that is the target itself
    return int(layers), scheme


def open_draft_model(
    name: str, target: LlamaModel, tokenizer: Tokenizer, target_name: str
) -> tuple[LlamaModel, str]:
    """The draft model `name` names, loaded like the target (dtype, device), and its
    description; a `UserError` when its vocabulary or tokenizer differ from the target's.
    `target_name` is what the target was loaded from (a quantised self-draft loads it again)."""
    if name.startswith(SELF_PREFIX):
        total = target.config.num_layers
        num_layers, scheme = self_options(name, total)
        model, description = target, f"self:layers={num_layers} (of {total})"
        if scheme is not None:
            source = open_weights(target_name)
            weights = source.load(target.dtype, target.device)
            check_tensors(weights, source.config, source.description)
            model = LlamaModel(source.config, weights, scheme)
            description += f", quantize={scheme.name}"
        if num_layers < total:
            model = truncated(model, num_layers)
        return model, description
    source = open_weights(name)
    vocab, target_vocab = source.config.vocab_size, target.config.vocab_size
    if vocab != target_vocab:
        raise UserError(
            f"draft model '{name}': its vocabulary has {vocab} tokens, the target's "
            f"{target_vocab}; a draft must share the target's tokenizer"
        )
    probe = _tokenizer_probe(tokenizer, vocab)
    if source.tokenizer().encode(probe) != tokenizer.encode(probe):
        raise UserError(
            f"draft model '{name}': its tokenizer splits text differently from the target's; "
            f"a draft must share the target's tokenizer"
        )
    weights = source.load(target.dtype, target.device)
    check_tensors(weights, source.config, source.description)
    return LlamaModel(source.config, weights), source.description


def _tokenizer_probe(tokenizer: Tokenizer, vocab_size: int) -> str:
    """Plain text, then every (V / 500)-th token of the vocabulary decoded."""
    step = max(1, vocab_size // 500)
    return _PROBE_TEXT + tokenizer.decode(list(range(0, vocab_size, step)))


@dataclass
class _DraftState:
    """What the draft's cache holds for one sequence."""

    block_table: list[int] = field(default_factory=list)
    prefix_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # leading tokens of the sequence whose draft K/V are cached
    # Draft tokens whose K/V sit right after those (positions num_computed_tokens, ...): kept
    # next time as far as they turned out to be the sequence's tokens.
    pending_ids: list[int] = field(default_factory=list)


class DraftModelProposer:
    """Proposes with a draft model. A `self:` draft has the target's shapes and reads the
    target's own K/V cache (`shares_target_cache`): the target has computed every verified
    token's K/V already, so the draft never catches up; it writes its draft tokens' K/V past the
    sequence's computed tokens, where the verify pass overwrites them. Any other draft keeps its
    own cache and block manager and catches up on what it has not seen."""

    def __init__(
        self,
        config: SpeculativeConfig,
        model: LlamaModel,
        description: str,
        kv_cache: KVCache,
        blocks: BlockManager,
        max_num_batched_tokens: int,
        shares_target_cache: bool,
    ):
        self.config = config
        self.model = model
        self.model_config = model.config
        self.description = description
        self.kv_cache = kv_cache
        self.blocks = blocks
        self.max_num_batched_tokens = max_num_batched_tokens
        self.shares_target_cache = shares_target_cache
        self._states: dict[Sequence, _DraftState] = {}  # own cache only
        # The draft's forward passes of the last `propose`: per pass, (context_len, query_len)
        # of every sequence in it (what the cost model needs).
        self.draft_passes: tuple[tuple[tuple[int, int], ...], ...] = ()

    @classmethod
    def open(
        cls,
        config: SpeculativeConfig,
        target: LlamaModel,
        tokenizer: Tokenizer,
        target_name: str,
        target_kv_cache: KVCache,
        target_blocks: BlockManager,
        max_num_batched_tokens: int,
    ) -> DraftModelProposer:
        """The draft `config.draft_model` names; a `self:` one shares the target's cache, any
        other gets a cache of as many blocks as the target's."""
        model, description = open_draft_model(config.draft_model, target, tokenizer, target_name)
        if config.draft_model.startswith(SELF_PREFIX):
            kv_cache, blocks, shares = target_kv_cache, target_blocks, True
        else:
            cfg = model.config
            num_blocks, block_size = target_kv_cache.num_blocks, target_kv_cache.block_size
            kv_cache = KVCache(
                cfg.num_layers,
                num_blocks,
                block_size,
                cfg.num_kv_heads,
                cfg.head_dim,
                model.dtype,
                model.device,
            )
            blocks = BlockManager(num_blocks, block_size, target_blocks.enable_prefix_caching)
            shares = False
        return cls(config, model, description, kv_cache, blocks, max_num_batched_tokens, shares)

    def propose(self, seqs: list[Sequence], running: Collection[Sequence]) -> None:
        """Set every sequence's `spec_token_ids` (empty when the draft cannot run it this step:
        a prompt still catching up, or no free block)."""
        for seq in seqs:
            seq.spec_token_ids, seq.spec_probs = [], None
        if self.shares_target_cache:
            first = self._first_pass_in_target_cache(seqs)
        else:
            self._release_all_but(running)
            first = self._first_pass_catching_up(seqs)
        if not first:
            self.draft_passes = ()
            return
        # Pass 1: every sequence's unseen tokens (at least its last); the last row's logits give
        # draft token 1 to those that want drafts (k > 0).
        chunks = [chunk for _, chunk, _ in first]
        input_ids = [
            t for seq, c, _ in first for t in seq.token_ids[c.start : c.start + c.num_tokens]
        ]
        logit_rows, row = [], -1
        for _, chunk, k in first:
            row += chunk.num_tokens
            if k:
                logit_rows.append(row)
        logits = self._forward(chunks, input_ids, logit_rows)
        passes = [tuple((c.start + c.num_tokens, c.num_tokens) for c in chunks)]
        num_drafts = {seq: k for seq, _, k in first if k}
        drafting = list(num_drafts)
        if drafting:
            self._pick(logits, drafting)
        # Passes 2..k: draft token j-1 in, draft token j out, for those that want j drafts.
        for j in range(2, self.config.num_tokens + 1):
            drafting = [seq for seq in drafting if num_drafts[seq] >= j]
            if not drafting:
                break
            chunks = [Chunk(seq.num_tokens + j - 2, 1, self._table(seq)) for seq in drafting]
            input_ids = [seq.spec_token_ids[-1] for seq in drafting]
            if not self.shares_target_cache:
                for seq in drafting:
                    self._states[seq].pending_ids.append(seq.spec_token_ids[-1])
            logits = self._forward(chunks, input_ids, list(range(len(drafting))))
            passes.append(tuple((c.start + 1, 1) for c in chunks))
            self._pick(logits, drafting)
        self.draft_passes = tuple(passes)

    def _first_pass_in_target_cache(
        self, seqs: list[Sequence]
    ) -> list[tuple[Sequence, Chunk, int]]:
        """(sequence, its last token's chunk, k) for each sequence that can draft: slots for its
        last token and drafts 1 .. k-1 are taken in its own block table (the engine gives back
        what verification leaves unused)."""
        first = []
        for seq in seqs:
            k = max_draft_tokens(seq, self.config.num_tokens)
            if not k or not self.blocks.can_allocate(seq.block_table, seq.num_tokens + k - 1):
                continue
            self.blocks.allocate(seq.block_table, seq.num_tokens + k - 1)
            first.append((seq, Chunk(seq.num_tokens - 1, 1, seq.block_table), k))
        return first

    def _first_pass_catching_up(self, seqs: list[Sequence]) -> list[tuple[Sequence, Chunk, int]]:
        """(sequence, the chunk of its tokens the draft has not seen, k) for each sequence the
        draft runs, within the token budget; k = 0 for one that has not caught up yet."""
        first = []
        budget = self.max_num_batched_tokens
        for seq in seqs:
            k = max_draft_tokens(seq, self.config.num_tokens)
            state = self._state(seq) if k and budget else None
            if state is None:
                continue
            num_left = seq.num_tokens - state.num_computed_tokens
            num_run = min(num_left, budget)
            is_caught_up = num_run == num_left
            # Room for the tokens run now and, once caught up, for draft tokens 1 .. k-1.
            num_slots = state.num_computed_tokens + num_run + (k - 1 if is_caught_up else 0)
            if not self.blocks.can_allocate(state.block_table, num_slots):
                continue
            self.blocks.allocate(state.block_table, num_slots)
            chunk = Chunk(state.num_computed_tokens, num_run, state.block_table)
            first.append((seq, chunk, k if is_caught_up else 0))
            state.num_computed_tokens += num_run
            budget -= num_run
        return first

    def _table(self, seq: Sequence) -> list[int]:
        return seq.block_table if self.shares_target_cache else self._states[seq].block_table

    def _state(self, seq: Sequence) -> _DraftState | None:
        """The sequence's draft state, its cache rolled back to the tokens it now has (a new
        one starts past the leading blocks the draft's prefix cache holds); None: no room."""
        state = self._states.get(seq)
        if state is None:
            prefix = self.blocks.match_prefix(seq.token_ids, seq.num_tokens - 1)
            if not self.blocks.can_allocate([], 0, prefix):
                return None
            state = _DraftState(prefix_ids=list(prefix.prefix_ids))
            state.num_computed_tokens = prefix.num_tokens(self.blocks.block_size)
            self.blocks.allocate(state.block_table, state.num_computed_tokens, prefix)
            self._states[seq] = state
            return state
        # Keep the pending drafts' K/V as far as they are the tokens the target accepted; the
        # sequence's last token is always run again (its logits give the next draft).
        known = seq.token_ids[state.num_computed_tokens :]
        num_kept = 0
        while num_kept < min(len(state.pending_ids), len(known)) and (
            state.pending_ids[num_kept] == known[num_kept]
        ):
            num_kept += 1
        state.num_computed_tokens = min(state.num_computed_tokens + num_kept, seq.num_tokens - 1)
        state.pending_ids = []
        self.blocks.cache_full_blocks(
            state.block_table, seq.token_ids, state.num_computed_tokens, state.prefix_ids
        )
        return state

    def _release_all_but(self, running: Collection[Sequence]) -> None:
        """Free the draft blocks of sequences that finished or were preempted."""
        alive = set(running)
        for seq in [s for s in self._states if s not in alive]:
            self.blocks.free(self._states.pop(seq).block_table)

    def _forward(self, chunks: list[Chunk], input_ids: list[int], logit_rows: list[int]):
        """One draft forward pass over `chunks` (their tokens `input_ids` in order) → logits of
        `logit_rows` `[len(logit_rows), V]`."""
        device = self.model.device
        attention = build_attention_batch(
            chunks, self.kv_cache.block_size, device, self.model.dtype
        )
        positions = [p for c in chunks for p in range(c.start, c.start + c.num_tokens)]
        ids = torch.tensor(input_ids, dtype=torch.long, device=device)
        pos = torch.tensor(positions, dtype=torch.long, device=device)
        hidden = self.model.forward(ids, pos, attention, self.kv_cache)
        if not logit_rows:
            return None
        return self.model.compute_logits(hidden[logit_rows])

    def _pick(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Append each sequence's next draft token, chosen from its row of `logits`: the argmax
        for greedy requests, a draw from the draft's distribution (kept) for sampled ones."""
        params = [seq.params for seq in seqs]
        greedy = greedy_ids(apply_logit_bias(logits, params)).tolist()
        sampled = [i for i, seq in enumerate(seqs) if not seq.params.is_greedy]
        if sampled:
            index = torch.tensor(sampled, device=logits.device)
            probs = sampling_probs(logits[index], [params[i] for i in sampled])  # [S, V]
        j = 0  # the sampled row
        for i, seq in enumerate(seqs):
            if seq.params.is_greedy:
                seq.spec_token_ids.append(greedy[i])
                continue
            row = probs[j][None]  # [1, V]
            j += 1
            seq.spec_token_ids.append(torch.multinomial(row[0], 1, generator=seq.generator).item())
            seq.spec_probs = row if seq.spec_probs is None else torch.cat([seq.spec_probs, row])
