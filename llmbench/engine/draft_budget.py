"""The adaptive draft length: how many of the proposed draft tokens a step verifies.

A draft row is not free. Where the step is bound by its products (a CPU without bfloat16 or
int8 products, or many sequences at once), each verified draft lengthens the step for every
sequence in it, and a draft is worth only its chance of being emitted. The budget learns both
from the engine's own steps and keeps the drafts that buy more tokens than they cost:

- The step's time, per number of decoding sequences B, over the steps with no prompt tokens:
  t0[B], a running average over the steps that verified no drafts, and over those that did,
  a line through what n drafts in all added to t0[B] (running averages of n, the added time,
  their squares and product: least squares): T(B, n) = t0[B] + f[B] + c[B]·n for n ≥ 1. The
  fixed part f is a verify step's own (on an AVX2 EPYC, 4 sequences at ~2k tokens: 1 draft
  adds ~13 ms to a 25-31 ms step, 16 drafts ~80).
- A draft's worth: the j-th draft of a sequence is emitted only if it and the j − 1 before it
  are accepted, a^j, with a the sequence's acceptance rate (a draft accepted given the ones
  before it: accepted / (accepted + rejections)), which starts at the run's rate.

Of all the step's drafts ordered by worth (each sequence's in its own order, since a^j falls
with j), it keeps the first n that maximise the step's tokens per second,
(B + Σ worth of the first n) / T(B, n), T(B, 0) = t0[B]; the rest are withheld, and that step
verifies only the kept ones. Until both kinds of step were seen for B, every draft is kept:
those steps are what teach it; and every EXPLORE_EVERY-th step of B sequences keeps them all
too, so that f[B] and c[B] follow the run (contexts grow) rather than staying at what the first
verify steps cost. The engine asks only for a step without prompt tokens: beside a prefill
chunk a draft row adds little to the step. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine's types, for hints only
    from llmbench.engine.sequence import Sequence

# Weight of the newest step in the running averages of step time (about the last 10 steps).
STEP_WEIGHT = 0.1
# A sequence's acceptance rate starts as this many drafts at the run's rate.
PRIOR_DRAFTS = 4.0
# Every this many steps of one number of sequences, every draft is kept (f[B], c[B] stay current).
EXPLORE_EVERY = 8


def drafts_to_keep(
    num_drafts: Seq[int], rates: Seq[float], decode_s: float, verify_s: float, draft_row_s: float
) -> list[int]:
    """How many of its drafts each decoding sequence keeps: the first n drafts by worth
    (rate^j for a sequence's j-th) that maximise (B + Σ worth) / T(n), T(0) = decode_s,
    T(n) = decode_s + verify_s + draft_row_s·n, B = len(num_drafts); the fewest on a tie.

    Example: two sequences with 2 drafts each at rates 0.9 and 0.5, decode_s 10 ms,
    verify_s 0, draft_row_s 5 ms: worths 0.9, 0.81, 0.5, 0.25; tokens per ms for n = 0 … 4
    are 0.200, 0.193, 0.186, 0.168, 0.149: n = 0, nothing kept. At draft_row_s 2 ms: 0.200,
    0.242, 0.265, 0.263, 0.248: n = 2, the first sequence keeps both, the second none; with
    verify_s 4 ms too: 0.200, 0.181, 0.206, 0.210, 0.203: n = 3.
    """
    worths = sorted(
        (
            (rate**j, i)
            for i, (n, rate) in enumerate(zip(num_drafts, rates, strict=True))
            for j in range(1, n + 1)
        ),
        key=lambda w: -w[0],
    )
    tokens = float(len(num_drafts))
    best_n, best = 0, tokens / decode_s
    for n, (worth, _) in enumerate(worths, 1):
        tokens += worth
        per_s = tokens / (decode_s + verify_s + draft_row_s * n)
        if per_s > best:
            best_n, best = n, per_s
    keep = [0] * len(num_drafts)
    for _, i in worths[:best_n]:
        keep[i] += 1
    return keep


class DraftBudget:
    """Trims each step's proposals to the drafts worth verifying (`trim`), learning the step's
    cost (`observe_step`) and the acceptance rates (`observe_verify`) as the engine runs."""

    def __init__(self) -> None:
        self._decode_s: dict[int, float] = {}  # B → average step time, no drafts
        self._added: dict[int, _Line] = {}  # B → time n drafts add to it
        self._accepted = 0  # over the run: drafts accepted,
        self._rejections = 0  # and verifies that rejected one
        self._trims: dict[int, int] = {}  # B → steps asked about

    def observe_step(self, num_seqs: int, num_drafts: int, seconds: float) -> None:
        """A step of `num_seqs` decoding sequences and no prompt tokens that verified
        `num_drafts` drafts in all and took `seconds`."""
        if num_drafts == 0:
            self._decode_s[num_seqs] = _average(self._decode_s.get(num_seqs), seconds)
        elif (decode_s := self._decode_s.get(num_seqs)) is not None:
            self._added.setdefault(num_seqs, _Line()).add(num_drafts, seconds - decode_s)

    def step_cost(self, num_seqs: int) -> tuple[float, float, float] | None:
        """(t0, f, c) for `num_seqs` sequences: T(n) = t0 + f + c·n for n ≥ 1 drafts; None
        until both a plain step and a verify step of that many were seen."""
        decode_s, added = self._decode_s.get(num_seqs), self._added.get(num_seqs)
        if decode_s is None or added is None:
            return None
        return (decode_s, *added.intercept_slope())

    def observe_verify(self, seq: Sequence, num_drafts: int, num_accepted: int) -> None:
        """A sequence's verify: `num_accepted` of its `num_drafts` drafts accepted."""
        rejected = int(num_accepted < num_drafts)
        seq.num_draft_rejections += rejected
        self._accepted += num_accepted
        self._rejections += rejected

    def rate(self, seq: Sequence) -> float:
        """The sequence's acceptance rate, PRIOR_DRAFTS drafts at the run's rate added.

        Formula: a_run = (A + 1) / (A + R + 2) over the run (A accepted drafts, R verifies that
        rejected one); a = (A_seq + PRIOR_DRAFTS·a_run) / (A_seq + R_seq + PRIOR_DRAFTS).
        """
        run = (self._accepted + 1) / (self._accepted + self._rejections + 2)
        accepted, rejections = seq.num_accepted_tokens, seq.num_draft_rejections
        return (accepted + PRIOR_DRAFTS * run) / (accepted + rejections + PRIOR_DRAFTS)

    def trim(self, seqs: Seq[Sequence]) -> int:
        """Cut each sequence's proposal (`spec_token_ids`, `spec_probs`) to the drafts worth
        verifying beside the others; returns how many drafts were withheld."""
        b = len(seqs)
        self._trims[b] = asked = self._trims.get(b, 0) + 1
        cost = self.step_cost(b)
        if cost is None or asked % EXPLORE_EVERY == 0:
            return 0  # not learnt yet for this many sequences, or relearning: every draft runs
        counts = [len(seq.spec_token_ids) for seq in seqs]
        keep = drafts_to_keep(counts, [self.rate(seq) for seq in seqs], *cost)
        for seq, n, kept in zip(seqs, counts, keep, strict=True):
            if kept < n:
                seq.spec_token_ids = seq.spec_token_ids[:kept]
                if seq.spec_probs is not None:
                    seq.spec_probs = seq.spec_probs[:kept]
        return sum(counts) - sum(keep)


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + STEP_WEIGHT * (new - old)


class _Line:
    """y = f + c·x by least squares over running averages of x, y, x², x·y (the newest point
    weighing STEP_WEIGHT), with f, c ≥ 0: a line through 0 where f would be negative, a flat
    one where c would."""

    def __init__(self) -> None:
        self.x: float | None = None
        self.y: float | None = None
        self.xx: float | None = None
        self.xy: float | None = None

    def add(self, x: float, y: float) -> None:
        self.x, self.y = _average(self.x, x), _average(self.y, y)
        self.xx, self.xy = _average(self.xx, x * x), _average(self.xy, x * y)

    def intercept_slope(self) -> tuple[float, float]:
        var = self.xx - self.x * self.x
        slope = (self.xy - self.x * self.y) / var if var > 1e-9 * self.xx else None
        if slope is None or self.y - slope * self.x < 0:  # one x so far, or f < 0
            return 0.0, max(0.0, self.xy / self.xx)
        if slope < 0:
            return max(0.0, self.y), 0.0
        return self.y - slope * self.x, slope
