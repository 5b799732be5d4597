"""The driver: sends at the scheduled times, keeps to the concurrency, records its own lag,
tokenizes before it schedules, builds real multi-turn and tool-calling histories, and keeps what
ended when it is cancelled. The backend is a test double of the `Backend` protocol that answers
from the event loop; the tokenizer is the real byte-level one unless a test needs another. Time
is virtual (`VirtualClock`): every schedule and lag below is exact, whatever the machine does."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise

import pytest

from llmbench.engine.tokenizer import Tokenizer
from llmbench.harness.driver import CANCELLED, DriveOptions, Driver, turn_messages
from llmbench.harness.metrics import queue_ms
from llmbench.harness.records import (
    GenerationRequest,
    RequestRecord,
    ServerTimings,
    StreamEvent,
)
from llmbench.harness.workloads import Session, ToolCall, Turn
from tests.harness.virtual_time import LOOP_ROUNDING_NS, VirtualClock

MS = 1_000_000


class FakeBackend:
    """Answers each request with `num_tokens` one-token chunks `gap_s` apart, then a final
    event. Requests whose id is in `hang` never answer; in `fail`, raise; in `block_s`, block
    the whole event loop that long first (a client that cannot keep up)."""

    name = "fake"

    def __init__(self, clock, num_tokens=2, gap_s=0.0, reply="ok ", hang=(), fail=(), block_s=None):
        self.clock = clock
        self.num_tokens = num_tokens
        self.gap_s = gap_s
        self.reply = reply
        self.hang, self.fail = set(hang), set(fail)
        self.block_s = block_s or {}
        self.received: list[tuple[int, GenerationRequest]] = []  # (t_ns, request)
        self.in_flight = 0
        self.max_in_flight = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def generate(self, request: GenerationRequest):
        self.received.append((self.clock(), request))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if request.request_id in self.block_s:
                self.clock.work(self.block_s[request.request_id])
            if request.request_id in self.hang:
                await asyncio.Event().wait()
            if request.request_id in self.fail:
                raise ConnectionError("server went away")
            for _ in range(self.num_tokens):
                await asyncio.sleep(self.gap_s)
                yield StreamEvent(self.clock(), 1, self.reply)
            yield StreamEvent(self.clock(), 0, finish_reason="length")
        finally:
            self.in_flight -= 1


class SlowTokenizer:
    """The byte-level tokenizer, `work_s` slower per call (a long prompt on a slow CPU);
    remembers when each call ended."""

    def __init__(self, clock: VirtualClock, work_s: float):
        self.inner = Tokenizer.byte_level()
        self.clock = clock
        self.work_s = work_s
        self.ended_ns: list[int] = []

    def encode_chat(self, messages, tools=None):
        self.clock.work(self.work_s)
        ids = self.inner.encode_chat(messages, tools=tools)
        self.ended_ns.append(self.clock())
        return ids

    def apply_chat_template(self, messages, tools=None):
        return self.inner.apply_chat_template(messages, tools=tools)


class JsonTokenizer:
    """One id per byte of the JSON of (messages, tools): a tokenizer that sees the tools, and
    takes messages with null content and tool calls. Remembers the tools of each call."""

    def __init__(self):
        self.tools_seen: list[list | None] = []

    def apply_chat_template(self, messages, tools=None):
        return json.dumps([messages, tools])

    def encode_chat(self, messages, tools=None):
        self.tools_seen.append(tools)
        return list(self.apply_chat_template(messages, tools=tools).encode())


def session(sid: str, *turns: Turn, tools=None) -> Session:
    return Session(sid, "You are terse.", turns, tools)


def turn(content="hi", max_tokens=2, delay_s=0.0, **kw) -> Turn:
    return Turn(content, max_tokens, delay_s, **kw)


def setup(
    tokenizer=None,
    options: DriveOptions | None = None,
    on_record=None,
    tokenize_s: float | None = None,
    **backend_options,
) -> tuple[VirtualClock, FakeBackend, Driver]:
    """A clock, a fake backend on it, and a driver of that backend on the same clock; with
    `tokenize_s`, the tokenizer is a `SlowTokenizer` on that clock."""
    clock = VirtualClock()
    backend = FakeBackend(clock, **backend_options)
    if tokenize_s is not None:
        tokenizer = SlowTokenizer(clock, tokenize_s)
    driver = Driver(
        backend,
        tokenizer or Tokenizer.byte_level(),
        options or DriveOptions(),
        on_record=on_record or (lambda r: None),
        clock=clock,
    )
    return clock, backend, driver


def is_on_time(lag_ns: int) -> bool:
    """Sent when scheduled: the loop's wake-up is exact up to its float rounding."""
    return 0 <= lag_ns < LOOP_ROUNDING_NS


def by_id(records: list[RequestRecord]) -> dict[str, RequestRecord]:
    return {r.request_id: r for r in records}


# --- scheduling -------------------------------------------------------------------------------


def test_open_loop_sends_at_the_scheduled_times():
    clock, backend, driver = setup()
    sessions = [session(f"s{i}", turn()) for i in range(4)]
    start_ns = clock()
    clock.run(driver.run_open_loop(sessions, [0.0, 0.1, 0.25, 0.3]))

    records = sorted(driver.result.records, key=lambda r: r.scheduled_ns)
    assert [r.session_id for r in records] == ["s0", "s1", "s2", "s3"]
    assert [r.scheduled_ns - start_ns for r in records] == [0, 100 * MS, 250 * MS, 300 * MS]
    assert all(is_on_time(r.sent_ns - r.scheduled_ns) for r in records)
    # The backend saw them at those times too (not all at once, not early).
    received = sorted(t for t, _ in backend.received)
    assert [t - r.sent_ns for t, r in zip(received, records, strict=True)] == [0, 0, 0, 0]


def test_later_turns_are_scheduled_after_the_reply_plus_the_delay():
    clock, backend, driver = setup(num_tokens=1, gap_s=0.01)
    sessions = [session("s0", turn(), turn(delay_s=0.15), turn(delay_s=0.05))]
    clock.run(driver.run_closed_loop(sessions, 1))

    t0, t1, t2 = driver.result.records
    assert t0.end_ns - t0.sent_ns >= 10 * MS  # the reply took time; the delay counts after it
    assert t1.scheduled_ns - t0.end_ns == 150 * MS
    assert t2.scheduled_ns - t1.end_ns == 50 * MS
    assert all(is_on_time(r.sent_ns - r.scheduled_ns) for r in (t0, t1, t2))
    (stats,) = driver.result.sessions
    assert stats.tool_wait_ns == 200 * MS and stats.num_requests == 3
    assert stats.start_ns == t0.scheduled_ns


def test_closed_loop_never_exceeds_the_concurrency():
    clock, backend, driver = setup(num_tokens=3, gap_s=0.005)
    sessions = [session(f"s{i}", turn(), turn()) for i in range(9)]
    clock.run(driver.run_closed_loop(sessions, 3))

    assert backend.max_in_flight == 3  # reached, never passed
    assert len(driver.result.records) == 18 and all(r.ok for r in driver.result.records)
    assert len(driver.result.sessions) == 9
    # Session by session: turn 1 is only sent after turn 0 ended.
    records = by_id(driver.result.records)
    for i in range(9):
        assert records[f"s{i}-t1"].sent_ns >= records[f"s{i}-t0"].end_ns


def test_a_common_start_is_the_open_loops_offset_0_once_the_firsts_are_prepared():
    """`start_at` (a start shared with other processes) is asked for after every first request
    is prepared, and the schedule counts from what it returns."""
    clock, backend, driver = setup(tokenize_s=0.03)
    asked_ns = []

    async def start_at() -> int:
        asked_ns.append(clock())
        return asked_ns[0] + 80 * MS

    sessions = [session(f"s{i}", turn()) for i in range(2)]
    clock.run(driver.run_open_loop(sessions, [0.0, 0.05], start_at))
    assert asked_ns == [driver.tokenizer.ended_ns[1]]  # after both firsts were tokenized
    records = sorted(driver.result.records, key=lambda r: r.scheduled_ns)
    assert [r.scheduled_ns for r in records] == [asked_ns[0] + 80 * MS, asked_ns[0] + 130 * MS]
    assert all(is_on_time(r.sent_ns - r.scheduled_ns) for r in records)


def test_a_common_start_holds_the_closed_loop_until_then():
    clock, backend, driver = setup()
    start_ns = []

    async def start_at() -> int:
        start_ns.append(clock() + 80 * MS)
        return start_ns[0]

    clock.run(driver.run_closed_loop([session(f"s{i}", turn()) for i in range(2)], 2, start_at))
    assert all(is_on_time(r.scheduled_ns - start_ns[0]) for r in driver.result.records)


# --- lag ----------------------------------------------------------------------------------------


def test_the_drivers_own_lag_is_recorded_as_queue_ms():
    """s0's reply blocks the event loop for 150 ms just after it is sent, while s1 is due 20 ms
    later: s1 goes out 130 ms late, and its record says so."""
    clock, backend, driver = setup(block_s={"s0-t0": 0.15})
    sessions = [session("s0", turn()), session("s1", turn())]
    clock.run(driver.run_open_loop(sessions, [0.0, 0.02]))

    records = by_id(driver.result.records)
    late = records["s1-t0"]
    assert is_on_time(late.sent_ns - late.scheduled_ns - 130 * MS)
    assert queue_ms(late) == (late.sent_ns - late.scheduled_ns) / 1e6
    # Latency counts from the schedule, so the lag shows in TTFT too.
    assert late.chunk_ns[0] - late.scheduled_ns >= 130 * MS
    assert is_on_time(records["s0-t0"].sent_ns - records["s0-t0"].scheduled_ns)


# --- tokenization before scheduling -------------------------------------------------------------


@pytest.mark.parametrize("loop", ["open", "closed"])
def test_send_timestamp_is_taken_after_tokenization(loop):
    """Every encode_chat takes 150 ms; none of it may land between scheduled and sent: open
    loop, the first turns are all tokenized before the clock starts; later turns and closed-loop
    first turns are tokenized, then scheduled."""
    clock, backend, driver = setup(tokenize_s=0.15, num_tokens=1)
    if loop == "open":
        sessions = [session("s0", turn()), session("s1", turn())]
        clock.run(driver.run_open_loop(sessions, [0.0, 0.05]))
    else:
        sessions = [session("s0", turn(), turn(delay_s=0.01)), session("s1", turn())]
        clock.run(driver.run_closed_loop(sessions, 1))

    tokenizer, records = driver.tokenizer, driver.result.records
    assert len(records) == len(tokenizer.ended_ns) == (3 if loop == "closed" else 2)
    assert all(is_on_time(r.sent_ns - r.scheduled_ns) for r in records)  # none of the 150 ms
    # Each request was tokenized before it was scheduled: call i ended before request i's time.
    scheduled = sorted(r.scheduled_ns for r in records)
    for ended_ns, scheduled_ns in zip(sorted(tokenizer.ended_ns), scheduled, strict=True):
        assert ended_ns <= scheduled_ns
    if loop == "open":  # the second start keeps its offset after the first
        assert scheduled[1] - scheduled[0] == 50 * MS
    else:  # a later turn's delay counts from when it was tokenized
        t1 = by_id(records)["s0-t1"]
        assert t1.scheduled_ns - tokenizer.ended_ns[1] == 10 * MS


def test_another_sessions_tokenization_shows_as_lag_not_as_server_time():
    """Preparing runs on the event loop: while s0's second turn is tokenized (150 ms from its
    reply at 0), s1 (due at 50 ms) cannot be sent. That is the driver's own lag: it is in s1's
    queue_ms (100 ms), and s1's TTFT from the send stays 0 (this backend answers at once)."""
    clock, backend, driver = setup(tokenize_s=0.15, num_tokens=1)
    sessions = [session("s0", turn(), turn()), session("s1", turn())]
    clock.run(driver.run_open_loop(sessions, [0.0, 0.05]))

    late = by_id(driver.result.records)["s1-t0"]
    assert is_on_time(late.sent_ns - late.scheduled_ns - 100 * MS)
    assert late.chunk_ns[0] == late.sent_ns


def test_prompt_ids_are_the_model_tokenizers_and_counted():
    tokenizer = Tokenizer.byte_level()
    clock, backend, driver = setup(tokenizer, reply="yes ")
    clock.run(driver.run_closed_loop([session("s0", turn("hello"), turn("more"))], 1))

    (_, first), (_, second) = backend.received
    assert first.prompt_ids == tuple(tokenizer.encode_chat(list(first.messages)))
    assert second.messages == (
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "yes yes "},  # the real reply, fed back
        {"role": "user", "content": "more"},
    )
    # ChatML, byte level: per message <|im_start|> role \n content <|im_end|> \n (role + content
    # + 4 ids), then <|im_start|> assistant \n (11 ids): 23 + 31 + 16 + 11.
    expected = sum(len(m["role"]) + len(m["content"]) + 4 for m in second.messages) + 11
    assert expected == 81
    assert len(second.prompt_ids) == expected
    assert [r.num_prompt_tokens for r in driver.result.records] == [
        len(first.prompt_ids),
        expected,
    ]
    assert first.prompt_text is None and first.tools is None


def test_completions_requests_carry_the_rendered_prompt():
    tokenizer = Tokenizer.byte_level()
    clock, backend, driver = setup(tokenizer, DriveOptions(use_chat=False, temperature=0.5))
    clock.run(driver.run_closed_loop([session("s0", turn("hello", max_tokens=7))], 1))

    ((_, request),) = backend.received
    assert request.prompt_text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert request.prompt_ids == tuple(tokenizer.encode(request.prompt_text))
    assert (request.use_chat, request.temperature, request.max_tokens) == (False, 0.5, 7)


# --- tool calling -------------------------------------------------------------------------------

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "find_river_0",
            "description": "Find a river.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what"}},
                "required": ["query"],
            },
        },
    },
)
CALL_1 = ToolCall("call_1", "find_river_0", '{"query": "nile"}')
CALL_2 = ToolCall("call_2", "find_river_0", '{"query": "rhine"}')


def test_tool_messages_by_hand():
    assert turn_messages(turn("task"), None) == [{"role": "user", "content": "task"}]
    assert turn_messages(turn("next"), "sure") == [
        {"role": "assistant", "content": "sure"},
        {"role": "user", "content": "next"},
    ]
    assert turn_messages(turn("6,650 km", tool_call=CALL_1, is_tool_result=True), "") == [
        {
            "role": "assistant",
            "content": None,  # an empty reply is null content next to the tool call
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "find_river_0", "arguments": '{"query": "nile"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "6,650 km"},
    ]


def test_api_tools_go_with_every_request_and_into_the_count():
    tokenizer = JsonTokenizer()
    clock, backend, driver = setup(tokenizer, reply="let me check ", num_tokens=1)
    s = session(
        "s0",
        turn("task"),
        turn("6,650 km", tool_call=CALL_1, is_tool_result=True),
        turn("1,230 km", tool_call=CALL_2, is_tool_result=True),
        tools=TOOLS,
    )
    clock.run(driver.run_closed_loop([s], 1))

    requests = [r for _, r in backend.received]
    assert [r.tools for r in requests] == [TOOLS] * 3
    assert tokenizer.tools_seen == [list(TOOLS)] * 3
    last = requests[2]
    assert [m["role"] for m in last.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert last.messages[2] == {
        "role": "assistant",
        "content": "let me check ",
        "tool_calls": [CALL_1.as_api()],
    }
    assert last.messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "6,650 km"}
    assert last.messages[4]["tool_calls"] == [CALL_2.as_api()]
    for request, record in zip(requests, driver.result.records, strict=True):
        expected = len(json.dumps([list(request.messages), list(TOOLS)]).encode())
        assert record.num_prompt_tokens == len(request.prompt_ids) == expected


def test_the_real_tokenizer_renders_and_counts_the_tool_conversation():
    """The engine's tokenizer renders the tools and the tool turns into the prompt (ChatML has
    no tool support, so its fallback format): every count includes them."""
    tokenizer = Tokenizer.byte_level()
    # An empty reply: null content in the history.
    clock, backend, driver = setup(tokenizer, reply="", num_tokens=1)
    s = session(
        "s0",
        turn("task"),
        turn("6,650 km", tool_call=CALL_1, is_tool_result=True),
        tools=TOOLS,
    )
    clock.run(driver.run_closed_loop([s], 1))

    (_, first), (_, second) = backend.received
    assert second.messages[2]["content"] is None
    for request, record in zip((first, second), driver.result.records, strict=True):
        ids = tokenizer.encode_chat(list(request.messages), tools=list(TOOLS))
        assert request.prompt_ids == tuple(ids) and record.num_prompt_tokens == len(ids)
        prompt = tokenizer.decode(ids)
        assert json.dumps(TOOLS[0]) in prompt
        without_tools = tokenizer.encode_chat(list(request.messages)[:2])
        assert len(ids) > len(without_tools) + len(json.dumps(TOOLS[0]))
    prompt = tokenizer.decode(second.prompt_ids)
    assert '"name": "find_river_0", "arguments": {"query": "nile"}' in prompt  # the call
    assert "6,650 km" in prompt  # its result


class ScriptedBackend:
    """Yields the given events, stamped in order (1, 2, ...), then raises `error` if given."""

    name = "scripted"

    def __init__(self, events: list[StreamEvent], error: Exception | None = None):
        self.events, self.error = events, error

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def generate(self, request: GenerationRequest):
        for event in self.events:
            yield event
        if self.error is not None:
            raise self.error


def test_the_record_keeps_what_was_asked_the_first_of_each_kind_and_the_servers_report():
    timings = ServerTimings(source="llama.cpp timings", prompt_ms=3.0, cached_tokens=2)
    events = [
        StreamEvent(10, 2, reasoning_text="let me think"),
        StreamEvent(20, 0, reasoning_text=" more"),
        StreamEvent(30, 1, text="Yes"),
        StreamEvent(40, 1, text=" sir"),
        StreamEvent(
            50,
            0,
            finish_reason="stop",
            usage_completion_tokens=5,
            cached_tokens=2,
            server_timings=timings,
            usage_reported=True,
        ),
    ]
    driver = Driver(ScriptedBackend(events), Tokenizer.byte_level(), DriveOptions(ignore_eos=True))
    asyncio.run(driver.run_closed_loop([session("s0", turn(max_tokens=7))], 1))
    [record] = driver.result.records
    assert (record.max_tokens, record.ignore_eos) == (7, True)
    assert (record.chunk_ns, record.chunk_tokens) == ([10, 30, 40], [2, 1, 1])
    assert (record.first_reasoning_ns, record.first_content_ns) == (10, 30)
    assert record.output_text == "Yes sir"  # reasoning is not the reply fed to the next turn
    assert (record.server_prompt_tokens, record.server_completion_tokens) == (None, 5)
    assert record.usage_reported and record.server_timings == timings
    assert record.cached_tokens == 2 and record.num_output_tokens == 5


def test_a_failed_stream_keeps_its_tokens_and_its_final_event():
    """A backend that yields its final event, then raises (a server error mid-stream): the
    tokens and the server's report stay in the record beside the error."""
    events = [
        StreamEvent(10, 1, tool_call_text="search"),
        StreamEvent(20, 0, usage_prompt_tokens=9, usage_reported=True),
    ]
    backend = ScriptedBackend(events, ConnectionError("server error in stream: full"))
    driver = Driver(backend, Tokenizer.byte_level(), DriveOptions())
    asyncio.run(driver.run_closed_loop([session("s0", turn())], 1))
    [record] = driver.result.records
    assert record.error == "ConnectionError: server error in stream: full"
    assert record.chunk_tokens == [1] and record.first_content_ns == 10
    assert record.server_prompt_tokens == 9 and record.usage_reported


# --- failures and cancellation ------------------------------------------------------------------


def test_a_failed_request_ends_its_session():
    seen: list[RequestRecord] = []
    clock, backend, driver = setup(on_record=seen.append, fail={"s0-t1"})
    clock.run(driver.run_closed_loop([session("s0", turn(), turn(), turn())], 1))

    t0, t1 = driver.result.records
    assert t0.ok and t1.error == "ConnectionError: server went away"
    assert t1.end_ns >= t1.sent_ns > 0
    assert [r.request_id for r in seen] == ["s0-t0", "s0-t1"]
    (stats,) = driver.result.sessions
    assert (stats.num_requests, stats.num_failed) == (2, 1)


def test_cancelling_keeps_what_ended_and_marks_what_was_in_flight():
    """Concurrency 2: s0 ends, s1 hangs, s2's first turn ends and its second hangs, s3 waits
    for a slot. Cancelled then: two completed records, two in flight kept as cancelled, none for
    s3, which was never sent."""
    seen: list[RequestRecord] = []
    clock, backend, driver = setup(on_record=seen.append, hang={"s1-t0", "s2-t1"})
    sessions = [
        session("s0", turn()),
        session("s1", turn()),
        session("s2", turn(), turn()),
        session("s3", turn()),
    ]

    async def main():
        task = asyncio.create_task(driver.run_closed_loop(sessions, 2))
        while len(backend.received) < 4:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    clock.run(main())
    records = by_id(driver.result.records)
    assert set(records) == {"s0-t0", "s1-t0", "s2-t0", "s2-t1"}
    assert records["s0-t0"].ok and records["s2-t0"].ok
    for rid in ("s1-t0", "s2-t1"):
        assert records[rid].error == CANCELLED
        assert records[rid].end_ns >= records[rid].sent_ns > 0
    assert {r.request_id for r in seen} == set(records)
    assert backend.in_flight == 0  # the backend's streams were closed too
    assert [s.session_id for s in driver.result.sessions] == ["s0"]


def test_warm_up_records_are_marked_and_have_no_session_stats():
    clock, backend, driver = setup()
    clock.run(driver.warm_up([session("w0", turn(), turn()), session("w1", turn())]))

    assert [(r.request_id, r.is_warmup) for r in driver.result.records] == [
        ("w0-t0", True),
        ("w1-t0", True),
    ]
    assert driver.result.sessions == []
    for a, b in pairwise(driver.result.records):
        assert b.sent_ns >= a.end_ns  # one by one
