"""The async driver: sends each session's turns when the load pattern says, records everything.

It only ever waits: for a session's scheduled start (open loop) or a free slot (closed loop),
for the model's reply, and for the think time or tool latency before the next turn. Latency is
measured from the *scheduled* send time and the driver's own lag (sent − scheduled) is kept, so a
saturated client never passes for a slow server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmbench.harness.records import Backend, GenerationRequest, RequestRecord
from llmbench.harness.workloads import Session


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


@dataclass(frozen=True)
class DriveOptions:
    use_chat: bool = True
    temperature: float = 0.0
    ignore_eos: bool = True


@dataclass
class DriveResult:
    records: list[RequestRecord] = field(default_factory=list)
    sessions: list[SessionStats] = field(default_factory=list)


class Driver:
    def __init__(
        self,
        backend: Backend,
        count_prompt_tokens: Callable[[list[dict[str, str]]], int],
        render_prompt: Callable[[list[dict[str, str]]], str] | None,
        options: DriveOptions,
        on_record: Callable[[RequestRecord], None] = lambda r: None,
    ):
        self.backend = backend
        self.count_prompt_tokens = count_prompt_tokens
        self.render_prompt = render_prompt
        self.options = options
        self.on_record = on_record
        self.result = DriveResult()  # filled as requests end: a partial run stays reportable

    async def run_closed_loop(self, sessions: list[Session], concurrency: int) -> DriveResult:
        """At most `concurrency` sessions in flight; the next starts when one ends."""
        slots = asyncio.Semaphore(concurrency)

        async def one(session: Session) -> None:
            async with slots:
                await self._session(session, time.perf_counter_ns())

        await asyncio.gather(*(one(s) for s in sessions))
        return self.result

    async def run_open_loop(self, sessions: list[Session], offsets_s: list[float]) -> DriveResult:
        """Session i starts at start + offsets_s[i], however busy the system is."""
        start_ns = time.perf_counter_ns()
        await asyncio.gather(
            *(
                self._session(s, start_ns + int(offset * 1e9))
                for s, offset in zip(sessions, offsets_s, strict=True)
            )
        )
        return self.result

    async def _session(self, session: Session, scheduled_ns: int, is_warmup: bool = False) -> None:
        stats = SessionStats(session.session_id, start_ns=scheduled_ns)
        history: list[dict[str, str]] = [{"role": "system", "content": session.system_prompt}]
        for turn_index, turn in enumerate(session.turns):
            if turn_index:
                scheduled_ns = time.perf_counter_ns() + int(turn.delay_s * 1e9)
                stats.tool_wait_ns += int(turn.delay_s * 1e9)
            history.append({"role": "user", "content": turn.content})
            record = await self._request(
                session, turn_index, history, turn.max_tokens, scheduled_ns, is_warmup
            )
            stats.num_requests += 1
            stats.model_wait_ns += record.end_ns - record.sent_ns
            stats.prompt_tokens += record.num_prompt_tokens
            stats.cached_tokens += record.cached_tokens or 0
            if not record.ok:
                stats.num_failed += 1
                break  # a session cannot go on without the reply
            history.append({"role": "assistant", "content": record.output_text})
        stats.end_ns = time.perf_counter_ns()
        if not is_warmup:
            self.result.sessions.append(stats)

    async def _request(
        self,
        session: Session,
        turn: int,
        messages: list[dict[str, str]],
        max_tokens: int,
        scheduled_ns: int,
        is_warmup: bool,
    ) -> RequestRecord:
        delay_s = (scheduled_ns - time.perf_counter_ns()) / 1e9
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        request = GenerationRequest(
            request_id=f"{session.session_id}-t{turn}",
            messages=tuple(dict(m) for m in messages),
            max_tokens=max_tokens,
            temperature=self.options.temperature,
            ignore_eos=self.options.ignore_eos,
            use_chat=self.options.use_chat,
            prompt_text=None if self.options.use_chat else self.render_prompt(messages),
        )
        record = RequestRecord(
            request_id=request.request_id,
            session_id=session.session_id,
            turn=turn,
            scheduled_ns=scheduled_ns,
            sent_ns=0,
            is_warmup=is_warmup,
            num_prompt_tokens=self.count_prompt_tokens(messages),
        )
        text_parts: list[str] = []
        record.sent_ns = time.perf_counter_ns()
        try:
            async for event in self.backend.generate(request):
                if event.num_tokens:
                    record.chunk_ns.append(event.t_ns)
                    record.chunk_tokens.append(event.num_tokens)
                text_parts.append(event.text)
                if event.finish_reason is not None:
                    record.finish_reason = event.finish_reason
                if event.usage_prompt_tokens is not None:
                    record.server_prompt_tokens = event.usage_prompt_tokens
                    record.server_completion_tokens = event.usage_completion_tokens
                if event.cached_tokens is not None:
                    record.cached_tokens = event.cached_tokens
        except asyncio.CancelledError:
            record.error = "cancelled (run interrupted)"
            raise
        except Exception as e:  # noqa: BLE001 — any backend failure is this request's result
            record.error = f"{type(e).__name__}: {e}"[:300]
        finally:
            record.end_ns = time.perf_counter_ns()
            record.output_text = "".join(text_parts)
            # Counted after the fact: tokenizing a long prompt must not delay the send.
            record.num_prompt_tokens = self.count_prompt_tokens(messages)
            self.result.records.append(record)
            self.on_record(record)
        return record

    async def warm_up(self, sessions: list[Session]) -> None:
        """Run these sessions' first turns one by one; their records are marked warm-up."""
        for session in sessions:
            first_only = Session(session.session_id, session.system_prompt, session.turns[:1])
            await self._session(first_only, time.perf_counter_ns(), is_warmup=True)
