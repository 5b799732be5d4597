"""What the engine hands the harness: a record per engine step and an event per new token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """One forward pass. Times are `time.perf_counter_ns()`, taken with the results on the host."""

    t_start_ns: int
    t_end_ns: int
    num_prefill_tokens: int  # tokens of sequences that were still in their prompt
    num_decode_seqs: int  # sequences that ran exactly one token past their prompt (+ drafts)
    context_lens: tuple[int, ...]  # every scheduled sequence's context after the step
    query_lens: tuple[int, ...]  # the tokens each of them ran this step (1 for a decode)
    num_cached_tokens: int  # prompt tokens served from the prefix cache this step
    num_blocks_used: int
    num_blocks_total: int
    num_preempted: int
    num_waiting: int  # requests queued behind this step (not yet scheduled, or preempted)
    # Bytes fetched over the host link (offloaded weights) in this step, and the seconds that
    # transfer took on a simulated link (0.0: none, or a real link whose time is in the step's).
    link_bytes: int = 0
    link_s_simulated: float = 0.0
    # Mixture of experts (both empty for a dense model): per MoE layer, the distinct experts
    # the step's tokens were routed to; and max tokens on one expert / (T·k / E), the mean
    # load, averaged over the layers (1.0: perfectly even).
    experts_touched: tuple[int, ...] = ()
    expert_load_max_over_mean: float | None = None
    # Speculative decoding (all 0 / empty when off). A sequence that verifies k draft tokens
    # runs k + 1 query rows, all with logits (its query_len and context_len count the drafts).
    num_proposed_tokens: int = 0  # draft tokens verified this step
    num_accepted_tokens: int = 0  # of those, accepted by the target
    num_verify_seqs: int = 0  # sequences that verified drafts this step
    num_withheld_tokens: int = 0  # proposed drafts the adaptive budget kept out of this step
    draft_ns: int = 0  # time spent proposing, at the start of the step (inside t_start..t_end)
    # The draft model's forward passes this step: per pass, (context_len, query_len) of each
    # sequence in it (n-gram drafting runs no model: empty).
    draft_passes: tuple[tuple[tuple[int, int], ...], ...] = ()


@dataclass(frozen=True)
class RequestOutput:
    """New tokens of one request from one step (empty when a chunked prefill made no token)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    t_ns: int
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort" once finished
    num_prompt_tokens: int
    num_cached_tokens: int
    # Start of the first step that ran the request (0 if none did: aborted while waiting);
    # minus the request's arrival, it is its queue time.
    first_scheduled_ns: int = 0
    # Speculative decoding, the request's totals so far: draft tokens verified, and accepted.
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0
