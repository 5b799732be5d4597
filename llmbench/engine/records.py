"""What the engine hands the harness: a record per engine step and an event per new token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """One forward pass. Times are `time.perf_counter_ns()`, taken with the results on the host."""

    t_start_ns: int
    t_end_ns: int
    num_prefill_tokens: int  # tokens of sequences that were still in their prompt
    num_decode_seqs: int  # sequences that ran exactly one token past their prompt
    context_lens: tuple[int, ...]  # every scheduled sequence's context after the step
    query_lens: tuple[int, ...]  # the tokens each of them ran this step (1 for a decode)
    num_cached_tokens: int  # prompt tokens served from the prefix cache this step
    num_blocks_used: int
    num_blocks_total: int
    num_preempted: int
    num_waiting: int  # requests queued behind this step (not yet scheduled, or preempted)


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
