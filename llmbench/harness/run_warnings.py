"""Run-level warnings: what makes a run's numbers less than clean, one line each
(`summary.warnings`).

Each check is a small pure function over the run's records and summary; `run_warnings` lists
the lines in a fixed order: failures, the machine's load, the server's behaviour (ignore_eos,
usage, prefix cache), token counts, the weight bytes an estimated roofline assumed, a closed
loop asked for more sessions in flight than its workload has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmbench.harness.driver import ChatTokenizer, Driver
from llmbench.harness.failures import failure_line
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import MachineLoad, Roofline
from llmbench.harness.workloads import Session

# A server may count a shared prefix a few tokens longer than the client does (a BOS token, its
# own rendering of the role markers); a first turn must hit this far beyond the prefix the run
# shares before its cache counts as warm from before the run.
WARM_CACHE_SLACK_TOKENS = 16


def shared_prefix_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """The most leading tokens any prompt shares with another prompt: what a run's own
    requests can put in a prefix cache for a prompt it never sent before.

    Formula: max over pairs i ≠ j of the common prefix length of prompts i and j; 0 for fewer
    than two prompts. In lexicographic order a prompt's longest common prefix with any other
    is with a neighbour, so the neighbours of the sorted list are enough.
    """
    ordered = sorted(tuple(p) for p in prompts)
    best = 0
    for a, b in zip(ordered, ordered[1:], strict=False):
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        best = max(best, n)
    return best


def first_turn_shared_tokens(sessions: Sequence[Session], tokenizer: ChatTokenizer) -> int:
    """`shared_prefix_tokens` of the sessions' first-turn prompts, rendered and tokenized as the
    driver sends them (the driver's own first messages: one definition of a first turn).

    Later turns need no prompt of their own: turn k of a session starts with its first turn,
    and two sessions' texts part before either first turn ends, so their later prompts share
    what their first turns share.
    """
    prompts = [
        tokenizer.encode_chat(Driver._first_messages(s), tools=list(s.tools) if s.tools else None)
        for s in sessions
    ]
    return shared_prefix_tokens(prompts)


def busy_line(load: MachineLoad, what: str = "run") -> str | None:
    """The machine was busy around the run (`MachineLoad.is_busy`); `what` names what was
    measured ("run", "profile")."""
    if not load.is_busy:
        return None

    def cores(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f}"

    return (
        f"the machine was busy: other processes used {cores(load.other_processes_cores_before)} "
        f"cores just before the {what} and {cores(load.other_processes_cores)} during it (of "
        f"{load.cpu_count}); the numbers are pessimistic"
    )


def ignore_eos_line(records: Sequence[RequestRecord]) -> str | None:
    """Requests sent with ignore_eos that the server ended on a stop before max_tokens: it does
    not honour ignore_eos, so output lengths follow the model instead of the spec.

    Formula: n = #completed with ignore_eos, max_tokens > 0, finish_reason "stop" and
    num_output_tokens (the server's count when given) < max_tokens, of m = #completed with
    ignore_eos and max_tokens > 0.
    """
    sent = [r for r in records if not r.is_warmup and r.ok and r.ignore_eos and r.max_tokens > 0]
    short = [r for r in sent if r.finish_reason == "stop" and r.num_output_tokens < r.max_tokens]
    if not short:
        return None
    return (
        f"{len(short)} of {len(sent)} requests ended before max_tokens although ignore_eos was "
        "sent: the server does not honour ignore_eos; output lengths follow the model"
    )


def usage_line(records: Sequence[RequestRecord], backend: str) -> str | None:
    """No completed request came with the server's usage, or none with its cached tokens: the
    token counts were not checked, or there is no prefix-cache hit rate, and why (the
    transformers baseline has no prefix cache to report)."""
    completed = [r for r in records if not r.is_warmup and r.ok]
    if not completed:
        return None
    has_usage = any(r.usage_reported or r.server_prompt_tokens is not None for r in completed)
    needs_cached = backend != "transformers" and all(r.cached_tokens is None for r in completed)
    no_hit_rate = "no prefix-cache hit rate (the server reports no cached tokens)"
    if not has_usage:
        line = (
            "the server reports no usage: prompt token counts are the client tokenizer's, not "
            "checked against the server's (token_count_mismatches: not checked)"
        )
        return f"{line}, and there is {no_hit_rate}" if needs_cached else line
    if needs_cached:
        return (
            "the server reports no cached tokens (no usage.prompt_tokens_details.cached_tokens): "
            "no prefix-cache hit rate"
        )
    return None


def warm_cache_line(records: Sequence[RequestRecord], shared_tokens: int | None) -> str | None:
    """The server's prefix cache held this run's prompts before the run: first turns (prompts
    the run never sent before) found more of themselves cached than the run's prompts share
    with each other (`shared_prefix_tokens`, the warm-up included).

    Formula: hits = completed measured first turns with cached_tokens > shared_tokens +
    WARM_CACHE_SLACK_TOKENS; warn when any; the hit rate shown is Σ cached / Σ prompt tokens
    (the server's count when given) over the first turns that report cached tokens.
    """
    firsts = [
        r
        for r in records
        if not r.is_warmup and r.ok and r.turn == 0 and r.cached_tokens is not None
    ]
    if shared_tokens is None or not firsts:
        return None
    hits = [r for r in firsts if r.cached_tokens > shared_tokens + WARM_CACHE_SLACK_TOKENS]
    if not hits:
        return None
    prompt = sum(
        r.server_prompt_tokens if r.server_prompt_tokens is not None else r.num_prompt_tokens
        for r in firsts
    )
    cached = sum(r.cached_tokens for r in firsts)
    rate = f"{cached / prompt:.0%}" if prompt else "-"
    return (
        f"the server's prefix cache was warm before this run (first requests hit {rate}: "
        f"{len(hits)} of {len(firsts)} first turns had more cached than the {shared_tokens} "
        "tokens this run's prompts share): restart the server or vary `seed` for cold-cache "
        "numbers"
    )


def mismatch_line(summary: Mapping[str, Any]) -> str | None:
    num = summary.get("token_count_mismatches")
    if not num:
        return None
    return (
        f"{num} requests: the server counted a different number of prompt tokens than the "
        "client tokenizer"
    )


def assumed_weights_line(roofline: Roofline | None) -> str | None:
    """An estimated roofline (a server's) whose weight bytes were assumed: neither the spec
    (`backend.weights`) nor the server said how it stores its weights, so the bytes are
    `roofline.dtype`'s (the server's dtype when it says one, else the spec's)."""
    if roofline is None or not roofline.is_estimated or roofline.weights is not None:
        return None
    return (
        f"the server does not say how it stores its weights: the estimated roofline assumes "
        f"{roofline.dtype} ({roofline.weight_bytes_per_param:g} bytes/param); set "
        "backend.weights if it is another"
    )


def concurrency_line(spec: Mapping[str, Any], sweep_point: float | None) -> str | None:
    """A closed loop whose concurrency (the sweep point's, or `load.concurrency`) is above the
    workload's sessions: no more than the sessions were ever in flight, so the run measured
    less load than it names (a sweep's or search's point above them too)."""
    load = spec.get("load") or {}
    if load.get("kind") != "concurrency":
        return None
    concurrency = int(sweep_point or load.get("concurrency") or 0)
    sessions = (spec.get("workload") or {}).get("sessions") or 0
    if concurrency <= sessions:
        return None
    return (
        f"concurrency {concurrency} asked, but the workload has {sessions} sessions: at most "
        f"{sessions} were in flight; set workload.sessions to {concurrency} or more to reach it"
    )


def run_warnings(
    records: Sequence[RequestRecord],
    summary: Mapping[str, Any],
    load: MachineLoad,
    *,
    backend: str,
    max_failed_fraction: float,
    shared_tokens: int | None,
    roofline: Roofline | None = None,
    spec: Mapping[str, Any] | None = None,
    sweep_point: float | None = None,
) -> list[str]:
    """Every warning of a run, one line each, in a fixed order (`summary.warnings`)."""
    lines = [
        failure_line(summary, max_failed_fraction),
        busy_line(load),
        ignore_eos_line(records),
        usage_line(records, backend),
        warm_cache_line(records, shared_tokens),
        mismatch_line(summary),
        assumed_weights_line(roofline),
        concurrency_line(spec or {}, sweep_point),
    ]
    return [line for line in lines if line is not None]
