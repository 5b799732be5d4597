"""The async driver: sends each session's turns when the load pattern says, records everything.

Every request is prepared first (the prompt rendered and tokenized with the model's tokenizer,
tools included) and only then scheduled, so tokenizing a long prompt never sits between the
scheduled time and the send:

- open loop, first turn: every session's first request is prepared before the clock starts,
  then sent at its absolute time, start + offset;
- later turns, and closed-loop first turns: scheduled = (now, once prepared) + think time or
  tool latency (0 for a first turn).

Then it only waits: for the scheduled time, a free slot (closed loop) or the model's reply.
Latency is measured from the *scheduled* send time and the driver's own lag (sent − scheduled,
`queue_ms`) is kept, so a saturated client never passes for a slow server. Preparing runs on the
event loop (≈ 1 ms per 1,000 prompt tokens on one core; in a worker thread the loop still
stalled for most of it, as rendering and encoding hold the GIL), so while one session's next
turn is tokenized no other request goes out: that delay is the driver's own and shows as those
requests' `queue_ms`.

Cancelling a drive (Ctrl-C, SIGTERM) keeps every record that ended; a request in flight at that
moment is kept too, with `error` set to `CANCELLED` and `end_ns` the moment it was cancelled (it
was sent and may have produced tokens: its queue time and TTFT are real). A request that was not
yet sent leaves no record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from llmbench.errors import BackendFailure
from llmbench.harness.records import Backend, GenerationRequest, Message, RequestRecord, Tool
from llmbench.harness.workloads import Session, Turn

CANCELLED = "cancelled: the run was interrupted"


class ChatTokenizer(Protocol):
    """The model's tokenizer, as the driver needs it (`llmbench.engine.tokenizer.Tokenizer`)."""

    def encode_chat(self, messages: list[Message], tools: list[Tool] | None = None) -> list[int]:
        """Ids of the rendered chat prompt."""
        ...

    def apply_chat_template(self, messages: list[Message], tools: list[Tool] | None = None) -> str:
        """The rendered chat prompt."""
        ...


@dataclass
class SessionStats:
    """Job-level numbers of one session (an agentic task, a conversation)."""

    session_id: str
    start_ns: int = 0
    end_ns: int = 0
    model_wait_ns: int = 0  # Σ (end − sent) of its requests
    tool_wait_ns: int = 0  # Σ tool latency / think time it spent between turns
    num_requests: int = 0
    num_failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    repetition: int = 1  # which measured repetition of the workload it belongs to


@dataclass(frozen=True)
class DriveOptions:
    use_chat: bool = True
    temperature: float = 0.0
    ignore_eos: bool = True


@dataclass
class DriveResult:
    records: list[RequestRecord] = field(default_factory=list)
    sessions: list[SessionStats] = field(default_factory=list)


def turn_messages(turn: Turn, reply: str | None) -> list[Message]:
    """What turn k adds to the history: the model's previous reply (none before the first
    turn), then the new user message, or the tool's result.

    With a workload tool call (`tools_as: api`) the reply is an assistant message with the
    reply text as content (None when it was empty) and that call in `tool_calls`, and the result
    is a `tool` message answering the call's id; otherwise both are plain text messages.
    """
    messages: list[Message] = []
    call = turn.tool_call
    if reply is not None:
        if call is None:
            messages.append({"role": "assistant", "content": reply})
        else:
            messages.append(
                {"role": "assistant", "content": reply or None, "tool_calls": [call.as_api()]}
            )
    if call is None:
        messages.append({"role": "user", "content": turn.content})
    else:
        messages.append({"role": "tool", "tool_call_id": call.call_id, "content": turn.content})
    return messages


class Driver:
    def __init__(
        self,
        backend: Backend,
        tokenizer: ChatTokenizer,
        options: DriveOptions,
        on_record: Callable[[RequestRecord], None] = lambda r: None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ):
        """`clock` is the run's clock in ns (the event loop's clock, counted in ns), injected by
        tests of the timing logic."""
        self.backend = backend
        self.clock = clock
        self.tokenizer = tokenizer
        self.options = options
        self.on_record = on_record
        self.result = DriveResult()  # filled as requests end: a partial run stays reportable

    async def run_closed_loop(
        self,
        sessions: list[Session],
        concurrency: int,
        start_at: Callable[[], Awaitable[int]] | None = None,
    ) -> DriveResult:
        """At most `concurrency` sessions in flight; the next starts when one ends. With
        `start_at`, the first ones start at the time it returns (on `clock`: a common start)."""
        slots = asyncio.Semaphore(concurrency)
        if start_at is not None:
            await asyncio.sleep(max(0, await start_at() - self.clock()) / 1e9)

        async def one(session: Session) -> None:
            async with slots:
                first = self._prepare(session, 0, self._first_messages(session))
                await self._session(session, first, self.clock())

        await asyncio.gather(*(one(s) for s in sessions))
        return self.result

    async def run_open_loop(
        self,
        sessions: list[Session],
        offsets_s: list[float],
        start_at: Callable[[], Awaitable[int]] | None = None,
    ) -> DriveResult:
        """Session i starts at start + offsets_s[i], however busy the system is; every first
        request is prepared before `start` is taken: now, or the time (on `clock`) that
        `start_at` returns (a start common to several processes)."""
        firsts = [self._prepare(s, 0, self._first_messages(s)) for s in sessions]
        start_ns = self.clock() if start_at is None else await start_at()
        await asyncio.gather(
            *(
                self._session(s, first, start_ns + round(offset * 1e9))
                for s, first, offset in zip(sessions, firsts, offsets_s, strict=True)
            )
        )
        return self.result

    async def warm_up(self, sessions: list[Session]) -> None:
        """Run these sessions' first turns one by one; their records are marked warm-up."""
        for session in sessions:
            first_only = Session(
                session.session_id, session.system_prompt, session.turns[:1], session.tools
            )
            first = self._prepare(first_only, 0, self._first_messages(first_only))
            await self._session(first_only, first, self.clock(), is_warmup=True)

    @staticmethod
    def _first_messages(session: Session) -> list[Message]:
        system: Message = {"role": "system", "content": session.system_prompt}
        return [system, *turn_messages(session.turns[0], None)]

    def _prepare(self, session: Session, turn: int, messages: list[Message]) -> GenerationRequest:
        """The request for `messages`, rendered and tokenized: all the work before a send."""
        use_chat = self.options.use_chat
        tools = list(session.tools) if session.tools else None
        ids = self.tokenizer.encode_chat(messages, tools=tools)
        text = None if use_chat else self.tokenizer.apply_chat_template(messages, tools=tools)
        return GenerationRequest(
            request_id=f"{session.session_id}-t{turn}",
            messages=tuple(messages),
            max_tokens=session.turns[turn].max_tokens,
            temperature=self.options.temperature,
            ignore_eos=self.options.ignore_eos,
            use_chat=use_chat,
            prompt_text=text,
            prompt_ids=tuple(ids),
            tools=session.tools,
            session_id=session.session_id,
        )

    async def _session(
        self,
        session: Session,
        first: GenerationRequest,
        first_scheduled_ns: int,
        is_warmup: bool = False,
    ) -> None:
        """Send `first` at `first_scheduled_ns`, then each later turn with the real replies."""
        stats = SessionStats(session.session_id, start_ns=first_scheduled_ns)
        history = list(first.messages)
        request, scheduled_ns = first, first_scheduled_ns
        reply: str | None = None  # the model's last reply
        for turn_index, turn in enumerate(session.turns):
            if turn_index:
                history += turn_messages(turn, reply)
                request = self._prepare(session, turn_index, history)
                scheduled_ns = self.clock() + round(turn.delay_s * 1e9)
                stats.tool_wait_ns += round(turn.delay_s * 1e9)
            record = await self._send(session, turn_index, request, scheduled_ns, is_warmup)
            stats.num_requests += 1
            stats.model_wait_ns += record.end_ns - record.sent_ns
            stats.prompt_tokens += record.num_prompt_tokens
            stats.cached_tokens += record.cached_tokens or 0
            if not record.ok:
                stats.num_failed += 1
                break  # a session cannot go on without the reply
            reply = record.output_text
        stats.end_ns = self.clock()
        if not is_warmup:
            self.result.sessions.append(stats)

    async def _send(
        self,
        session: Session,
        turn: int,
        request: GenerationRequest,
        scheduled_ns: int,
        is_warmup: bool,
    ) -> RequestRecord:
        """Wait for `scheduled_ns`, send the prepared request, record its stream."""
        delay_s = (scheduled_ns - self.clock()) / 1e9
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        record = RequestRecord(
            request_id=request.request_id,
            session_id=session.session_id,
            turn=turn,
            scheduled_ns=scheduled_ns,
            sent_ns=0,
            is_warmup=is_warmup,
            num_prompt_tokens=len(request.prompt_ids),
            max_tokens=request.max_tokens,
            ignore_eos=request.ignore_eos,
        )
        text_parts: list[str] = []
        record.sent_ns = self.clock()
        try:
            async for event in self.backend.generate(request):
                if event.num_tokens:
                    record.chunk_ns.append(event.t_ns)
                    record.chunk_tokens.append(event.num_tokens)
                text_parts.append(event.text)
                if event.reasoning_text and record.first_reasoning_ns is None:
                    record.first_reasoning_ns = event.t_ns
                if (event.text or event.tool_call_text) and record.first_content_ns is None:
                    record.first_content_ns = event.t_ns
                if event.finish_reason is not None:
                    record.finish_reason = event.finish_reason
                if event.usage_prompt_tokens is not None:
                    record.server_prompt_tokens = event.usage_prompt_tokens
                if event.usage_completion_tokens is not None:
                    record.server_completion_tokens = event.usage_completion_tokens
                if event.usage_reported or event.usage_prompt_tokens is not None:
                    record.usage_reported = True
                if event.server_timings is not None:
                    record.server_timings = event.server_timings
                if event.cached_tokens is not None:
                    record.cached_tokens = event.cached_tokens
                if event.endpoint is not None:
                    record.endpoint = event.endpoint
                if event.reasoning_tokens is not None:
                    record.reasoning_tokens = event.reasoning_tokens
                if event.num_draft_tokens is not None:
                    record.num_draft_tokens = event.num_draft_tokens
                    record.num_accepted_draft_tokens = event.num_accepted_draft_tokens
        except asyncio.CancelledError:
            record.error = CANCELLED
            raise
        except Exception as e:  # noqa: BLE001 — any backend failure is this request's result
            record.error = f"{type(e).__name__}: {e}"[:300]
            if isinstance(e, BackendFailure):
                raise  # the backend itself died: the drive stops, nothing else can be served
        finally:
            record.end_ns = self.clock()
            record.output_text = "".join(text_parts)
            self.result.records.append(record)
            self.on_record(record)
        return record
