"""Speculative decoding settings and the n-gram (prompt-lookup) proposer.

A proposer guesses the next few tokens of every decoding sequence before a step; the target
model then checks all of them in that one step (`verification`), k + 1 query rows per sequence
beside the other sequences' prefill chunks and decodes. Proposals live on the `Sequence`
(`spec_token_ids`, with the draft's probabilities `spec_probs` when it sampled them) until the
step that verifies them.

Torch-free: the CLI parses `--speculative` without loading torch, and the n-gram proposer is a
byte search over each sequence's own tokens. The draft-model proposer is `draft_model`.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmbench.errors import UserError

if TYPE_CHECKING:  # the engine's types, for hints only (this module stays torch-free)
    from llmbench.engine.sequence import Sequence as EngineSequence

METHODS = ("none", "ngram", "draft")
# The one syntax `--speculative` takes, said in every error about it.
SYNTAX = (
    "none | ngram[:K][:adaptive] | draft:MODEL[:K][:adaptive]  "
    "(e.g. ngram:4, ngram:8:adaptive, draft:self:quantize=int8:3)"
)


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine speculates: `none`, `ngram` (prompt lookup: copy what followed the longest
    recent n-gram, n from `ngram_max` down to `ngram_min`), or `draft` (a smaller model with the
    target's tokenizer, `draft_model`: any model name, or the target made cheaper,
    `self:layers=N` (its first N layers), `self:quantize=SCHEME` (a quantised copy) or both,
    comma-separated). `num_tokens` is k, the most draft tokens verified per sequence and step;
    `adaptive`: each step verifies only the drafts worth their cost (`draft_budget`)."""

    method: str = "none"
    num_tokens: int = 4
    ngram_min: int = 2
    ngram_max: int = 4
    draft_model: str | None = None
    adaptive: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(
                f"speculative: method must be one of {', '.join(METHODS)}, got '{self.method}'"
            )
        if not _is_int(self.num_tokens) or self.num_tokens < 1:
            raise UserError(
                f"speculative: num_tokens must be an integer >= 1, got {self.num_tokens!r}"
            )
        if not (_is_int(self.ngram_min) and _is_int(self.ngram_max)) or not (
            1 <= self.ngram_min <= self.ngram_max
        ):
            raise UserError(
                f"speculative: need 1 <= ngram_min <= ngram_max, got {self.ngram_min!r} and "
                f"{self.ngram_max!r}"
            )
        if not isinstance(self.adaptive, bool):
            raise UserError(f"speculative: adaptive must be true or false, got {self.adaptive!r}")
        if self.method == "draft" and not self.draft_model:
            raise UserError("speculative: method draft needs a draft_model (e.g. self:layers=8)")

    @property
    def is_enabled(self) -> bool:
        return self.method != "none"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_speculative(text: str) -> SpeculativeConfig:
    """`--speculative` as typed: `none`, `ngram`, `ngram:4`, `draft:MODEL`, `draft:MODEL:4`,
    any but `none` with `:adaptive` last (`ngram:8:adaptive`).

    MODEL may itself hold colons (`synthetic:tiny`, `self:layers=8`); a trailing `:K` of digits
    is k. Anything else is a `UserError` that shows the syntax.
    """
    text = typed = text.strip()
    if text == "none":
        return SpeculativeConfig()
    adaptive = text.endswith(":adaptive")
    text = text.removesuffix(":adaptive")
    # MODEL may end in digits of its own (self:quantize=int4:64): then K must be given too.
    method, _, rest = text.partition(":")
    head, sep, tail = rest.rpartition(":")
    k = SpeculativeConfig.num_tokens
    if sep and tail.isdigit():
        rest, k = head, int(tail)
    elif rest.isdigit():
        rest, k = "", int(rest)
    if method == "ngram" and not rest:
        return SpeculativeConfig(method="ngram", num_tokens=k, adaptive=adaptive)
    if method == "draft" and rest:
        return SpeculativeConfig(method="draft", num_tokens=k, draft_model=rest, adaptive=adaptive)
    raise UserError(f"--speculative {typed}: expected {SYNTAX}")


class Proposer(Protocol):
    """Sets `spec_token_ids` (and `spec_probs`) of the sequences it is given."""

    model_config: object | None  # the draft model's `ModelConfig` (None: no model runs)
    draft_passes: tuple[tuple[tuple[int, int], ...], ...]  # the last propose's model passes

    def propose(self, seqs: list[EngineSequence], running: Collection[EngineSequence]) -> None:
        """Propose draft tokens for `seqs` (each with exactly one token left to compute);
        `running` are the scheduler's running sequences: state kept for any other is released."""
        ...


def max_draft_tokens(seq: EngineSequence, num_tokens: int) -> int:
    """Draft tokens worth proposing: at most k, and one fewer than the tokens the request may
    still generate (a verify step emits the accepted drafts plus one token of its own).

    Formula: min(k, max_tokens - num_output_tokens - 1), at least 0.
    """
    return max(0, min(num_tokens, seq.params.max_tokens - seq.num_output_tokens - 1))


def propose_ngram(
    token_ids: Sequence[int], ngram_min: int, ngram_max: int, num_tokens: int
) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the longest
    suffix n-gram (n from `ngram_max` down to `ngram_min`), at most `num_tokens` of them.

    Example: tokens `a b c d x a b` with n = 2 finds `a b` at 0 and proposes `c d x ...`.
    An occurrence must be followed by at least one token; none found: [].
    """
    length = len(token_ids)
    if num_tokens <= 0 or length < ngram_min + 1:
        return []
    # 4 bytes a token: bytes.rfind searches in C; only hits on a 4-byte boundary are tokens.
    data = array("i", token_ids).tobytes()
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        pattern = data[(length - n) * 4 :]
        end = (length - 1) * 4  # the hit must end before the last token, so one follows it
        while (hit := data.rfind(pattern, 0, end)) >= 0:
            if hit % 4 == 0:
                start = hit // 4 + n
                return list(token_ids[start : start + num_tokens])
            end = hit + len(pattern) - 1  # a misaligned hit: look further left
    return []


class NgramProposer:
    """Drafts by prompt lookup over each sequence's own prompt and output: no model, no state."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self.model_config = None  # no model runs
        self.draft_passes: tuple[tuple[tuple[int, int], ...], ...] = ()

    def propose(self, seqs: list[EngineSequence], running: Collection[EngineSequence]) -> None:
        cfg = self.config
        for seq in seqs:
            k = max_draft_tokens(seq, cfg.num_tokens)
            seq.spec_token_ids = propose_ngram(seq.token_ids, cfg.ngram_min, cfg.ngram_max, k)
            seq.spec_probs = None  # a point mass on each proposed token
