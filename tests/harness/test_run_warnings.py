"""Run-level warnings and the failure verdict, on hand-built records and summaries."""

from __future__ import annotations

import pytest

from llmbench.harness.metrics import summarize
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import MachineLoad, Roofline
from llmbench.harness.run_warnings import (
    WARM_CACHE_SLACK_TOKENS,
    assumed_weights_line,
    busy_line,
    concurrency_line,
    first_turn_shared_tokens,
    ignore_eos_line,
    run_warnings,
    shared_prefix_tokens,
    usage_line,
    warm_cache_line,
)
from llmbench.harness.workloads import Session, Turn

MS = 1_000_000


def req(
    turn: int = 0,
    *,
    tokens: int = 4,
    error: str | None = None,
    finish: str | None = "length",
    max_tokens: int = 4,
    ignore_eos: bool = True,
    prompt: int = 100,
    server_prompt: int | None = None,
    server_completion: int | None = None,
    cached: int | None = None,
    usage: bool = False,
    is_warmup: bool = False,
) -> RequestRecord:
    """A request of `tokens` one-token chunks, 10 ms apart."""
    return RequestRecord(
        request_id=f"s-t{turn}",
        session_id="s",
        turn=turn,
        scheduled_ns=0,
        sent_ns=0,
        end_ns=(10 * tokens + 10) * MS,
        chunk_ns=[10 * (i + 1) * MS for i in range(tokens)],
        chunk_tokens=[1] * tokens,
        num_prompt_tokens=prompt,
        server_prompt_tokens=server_prompt,
        server_completion_tokens=server_completion,
        cached_tokens=cached,
        finish_reason=None if error else finish,
        error=error,
        is_warmup=is_warmup,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        usage_reported=usage,
    )


def test_shared_prefix_tokens_by_hand():
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 7], [8, 8], [1, 2, 3, 4, 6, 6]]
    assert shared_prefix_tokens(prompts) == 4  # [1, 2, 3, 4] of the first and the last
    assert shared_prefix_tokens([[1, 2], [3, 4]]) == 0
    assert shared_prefix_tokens([[1, 2, 3]]) == 0  # nothing to share with
    assert shared_prefix_tokens([[5, 6], [5, 6]]) == 2  # the same prompt twice: all of it


class WordTokenizer:
    """One token per word of every message, roles included, tools as one token each."""

    def __init__(self) -> None:
        self.vocabulary: dict[str, int] = {}

    def encode_chat(self, messages, tools=None):
        words = [w for m in messages for w in (m["role"], *(m["content"] or "").split())]
        words += ["<tool>"] * len(tools or ())
        return [self.vocabulary.setdefault(w, len(self.vocabulary)) for w in words]


def session(session_id: str, system: str, first: str) -> Session:
    return Session(session_id, system, (Turn(first, 4, 0.0),), None)


def test_first_turn_shared_tokens_renders_the_first_turns_as_the_driver_does():
    sessions = [
        session("s0", "you are kind", "what is the sea"),
        session("s1", "you are kind", "what is a river"),
        session("s2", "you are kind", "hello"),
    ]
    # system, you, are, kind, user, what, is: 7 tokens shared by s0 and s1.
    assert first_turn_shared_tokens(sessions, WordTokenizer()) == 7


def test_ignore_eos_not_honoured():
    honoured = req(tokens=4, max_tokens=4, finish="length")
    short = req(tokens=2, max_tokens=4, finish="stop")
    assert ignore_eos_line([honoured, honoured]) is None
    assert ignore_eos_line([honoured, short, short, req(tokens=2, ignore_eos=False)]) == (
        "2 of 3 requests ended before max_tokens although ignore_eos was sent: the server does "
        "not honour ignore_eos; output lengths follow the model"
    )
    # The server's own count decides when it gave one; failures and the warm-up do not count.
    counted_by_the_server = req(tokens=2, max_tokens=4, finish="stop", server_completion=4)
    assert ignore_eos_line([counted_by_the_server]) is None
    assert ignore_eos_line([req(tokens=2, finish="stop", error="HTTP 500")]) is None
    assert ignore_eos_line([req(tokens=2, finish="stop", is_warmup=True)]) is None
    assert ignore_eos_line([req(tokens=2, finish="stop", max_tokens=0)]) is None  # unknown max


def test_no_usage_means_not_checked_and_no_hit_rate_with_the_reason():
    line = usage_line([req(), req()], "openai")
    assert line.startswith("the server reports no usage: prompt token counts are the client")
    assert "not checked" in line and "no prefix-cache hit rate" in line
    # Cached tokens without usage (a server's own timings): only the counts went unchecked.
    counts_only = usage_line([req(cached=10)], "openai")
    assert "not checked" in counts_only and "hit rate" not in counts_only
    no_cache = usage_line([req(usage=True, server_prompt=100)], "openai")
    assert no_cache.startswith("the server reports no cached tokens")
    assert usage_line([req(usage=True, server_prompt=100)], "transformers") is None  # no cache
    assert usage_line([req(usage=True, server_prompt=100, cached=0)], "openai") is None
    assert usage_line([req(server_prompt=100, cached=0)], "openai") is None  # a count is usage
    assert usage_line([req(error="HTTP 500")], "openai") is None  # nothing completed


def test_a_warm_prefix_cache_is_named_beyond_what_the_run_shares():
    shared = 120  # system prompt and template: what the warm-up may have cached legitimately
    cold = [req(0, prompt=300, cached=112), req(0, prompt=300, cached=112)]
    assert warm_cache_line(cold, shared) is None
    # Block rounding or a BOS token may push a first turn a little past the shared prefix.
    assert warm_cache_line([req(0, cached=shared + WARM_CACHE_SLACK_TOKENS)], shared) is None
    warm = [req(0, prompt=300, cached=288), req(0, prompt=300, cached=112)]
    later = req(1, prompt=600, cached=590)  # a later turn hits on its own history: expected
    assert warm_cache_line([*warm, later], shared) == (
        "the server's prefix cache was warm before this run (first requests hit 67%: 1 of 2 "
        "first turns had more cached than the 120 tokens this run's prompts share): restart "
        "the server or vary `seed` for cold-cache numbers"
    )  # (288 + 112) / (300 + 300)
    assert warm_cache_line([later], shared) is None
    assert warm_cache_line(warm, None) is None  # a run that did not measure its shared prefix
    server_counted = [req(0, prompt=290, server_prompt=300, cached=288)]
    assert "hit 96%" in warm_cache_line(server_counted, shared)  # 288 / the server's 300


def test_a_busy_machine():
    quiet = MachineLoad(2, 0.1, 0.2, 0.0, 0.05, False)
    busy = MachineLoad(2, 1.5, 2.0, 0.9, 1.0, True)
    assert busy_line(quiet) is None
    assert busy_line(busy) == (
        "the machine was busy: other processes used 0.90 cores just before the run and 1.00 "
        "during it (of 2); the numbers are pessimistic"
    )


def test_run_warnings_lists_every_line_in_order():
    records = [req(tokens=2, finish="stop", cached=250)] * 9 + [req(error="HTTP 500")]
    summary = summarize(records)
    busy = MachineLoad(2, 1.5, 2.0, 0.9, 1.0, True)
    lines = run_warnings(
        records, summary, busy, backend="openai", max_failed_fraction=0.05, shared_tokens=100
    )
    assert [line.split(" ")[:3] for line in lines] == [
        ["1", "of", "10"],  # failures
        ["the", "machine", "was"],
        ["9", "of", "9"],  # ignore_eos
        ["the", "server", "reports"],  # no usage
        ["the", "server's", "prefix"],  # warm cache
    ]
    assert run_warnings(
        [req()], summarize([req()]), MachineLoad(2, 0, 0, 0, 0, False), backend="engine",
        max_failed_fraction=0.05, shared_tokens=None,
    ) == ["the server reports no usage: prompt token counts are the client tokenizer's, not "
          "checked against the server's (token_count_mismatches: not checked), and there is no "
          "prefix-cache hit rate (the server reports no cached tokens)"]  # fmt: skip


@pytest.mark.parametrize("mismatches", [0, 2])
def test_token_count_mismatches_are_a_warning(mismatches):
    records = [req(usage=True, server_prompt=100, cached=0)] * 3
    records += [req(usage=True, server_prompt=101, cached=0)] * mismatches
    lines = run_warnings(
        records,
        summarize(records),
        MachineLoad(2, 0, 0, 0, 0, False),
        backend="openai",
        max_failed_fraction=0.05,
        shared_tokens=None,
    )
    expected = [
        "2 requests: the server counted a different number of prompt tokens than the client "
        "tokenizer"
    ]
    assert lines == (expected if mismatches else [])


def roofline(weights: str | None, *, is_estimated: bool = True) -> Roofline:
    return Roofline(is_estimated, "m", "bfloat16", 2.0, 2.0, None, None, weights=weights)


def test_assumed_weight_bytes_are_a_warning():
    """A server that says nothing of its weights: the run says which dtype its roofline assumed
    (an engine's or a told server's weights are known)."""
    line = (
        "the server does not say how it stores its weights: the estimated roofline assumes "
        "bfloat16 (2 bytes/param); set backend.weights if it is another"
    )
    assert assumed_weights_line(roofline(None)) == line
    assert assumed_weights_line(roofline("float32")) is None  # the server said, or the spec
    assert assumed_weights_line(roofline("int4:32, lm_head int8", is_estimated=False)) is None
    assert assumed_weights_line(None) is None
    lines = run_warnings(
        [req(usage=True, server_prompt=100, cached=0)],
        summarize([req(usage=True, server_prompt=100, cached=0)]),
        MachineLoad(2, 0, 0, 0, 0, False),
        backend="openai",
        max_failed_fraction=0.05,
        shared_tokens=None,
        roofline=roofline(None),
    )
    assert lines == [line]


def test_a_closed_loop_above_its_sessions_is_a_warning():
    """chat.yaml has 8 sessions: a search to concurrency 32 named 32 the edge, having never
    had more than 8 in flight."""
    spec = {"load": {"kind": "concurrency", "concurrency": 4}, "workload": {"sessions": 8}}
    assert concurrency_line(spec, None) is None
    assert concurrency_line(spec, 8.0) is None
    assert concurrency_line(spec, 32.0) == (
        "concurrency 32 asked, but the workload has 8 sessions: at most 8 were in flight; set "
        "workload.sessions to 32 or more to reach it"
    )
    spec["load"]["concurrency"] = 12  # no sweep: the load's own
    assert concurrency_line(spec, None).startswith("concurrency 12 asked, but")
    open_loop = {"load": {"kind": "poisson", "rate_per_s": 30}, "workload": {"sessions": 8}}
    assert concurrency_line(open_loop, 30.0) is None
    lines = run_warnings(
        [req()], summarize([req()]), MachineLoad(2, 0, 0, 0, 0, False), backend="engine",
        max_failed_fraction=0.05, shared_tokens=None, spec=spec,
    )  # fmt: skip
    assert lines[-1].startswith("concurrency 12 asked")  # the last line of the run's warnings
