"""The one-line timing summary `llmbench generate` prints after the text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeStep:
    """What a decode step's bandwidth needs: its duration and the context it attended over."""

    duration_ns: int
    context_len: int


def achieved_decode_gb_per_s(
    steps: Sequence[DecodeStep], weight_bytes: int, kv_bytes_per_token: int
) -> float:
    """Bytes one decode step must read, summed over the steps, divided by their total time.

    Formula: Σ (weight_bytes + kv_bytes_per_token × context_len) / Σ duration, in GB/s (1e9).
    """
    total_ns = sum(s.duration_ns for s in steps)
    if total_ns == 0:
        return 0.0
    total_bytes = sum(weight_bytes + kv_bytes_per_token * s.context_len for s in steps)
    return total_bytes / total_ns  # bytes per ns == GB/s


def decode_tok_per_s(token_ns: Sequence[int]) -> float:
    """Formula: (n - 1) / (t_last - t_first) for a single stream's token timestamps."""
    if len(token_ns) < 2 or token_ns[-1] == token_ns[0]:
        return 0.0
    return (len(token_ns) - 1) / ((token_ns[-1] - token_ns[0]) / 1e9)


def format_summary(
    num_prompt_tokens: int, prefill_ms: float, token_ns: Sequence[int], gb_per_s: float
) -> str:
    return (
        f"prompt={num_prompt_tokens} tok, prefill={prefill_ms:.1f} ms, "
        f"output={len(token_ns)} tok, decode={decode_tok_per_s(token_ns):.1f} tok/s, "
        f"achieved={gb_per_s:.2f} GB/s"
    )
