"""The hand-offs between driver, backends and metrics: one contract per boundary.

All times are `time.perf_counter_ns()` integers of the process that runs the driver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

# A chat message as the OpenAI API shapes it: {"role": ..., "content": ...}; an assistant message
# that calls tools has "tool_calls" (and content None when it said nothing), a tool result is
# {"role": "tool", "tool_call_id": ..., "content": ...}.
Message = dict[str, Any]
# An OpenAI function definition:
# {"type": "function", "function": {"name": ..., "description": ..., "parameters": JSON schema}}.
Tool = dict[str, Any]


@dataclass(frozen=True)
class GenerationRequest:
    """One model call, as the driver asks a backend for it."""

    request_id: str
    messages: tuple[Message, ...]  # the conversation so far, system message first
    max_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    use_chat: bool = True  # False: send the rendered prompt text to /v1/completions
    prompt_text: str | None = None  # the rendered prompt, for completion-style backends
    # The rendered prompt's ids under the model's tokenizer, tools included; taken by the driver
    # before the request is scheduled, so a backend that needs ids need not tokenize after the
    # send. None when the caller did not tokenize.
    prompt_ids: tuple[int, ...] | None = None
    tools: tuple[Tool, ...] | None = None  # sent as the request's `tools`; None: no tools
    session_id: str = ""  # the session it belongs to (routing keeps sessions together)


@dataclass(frozen=True)
class ServerTimings:
    """What a server reported about its own work on one request, beside the client's clock.

    Every number is the server's, None when it did not report it. llama.cpp's server sends a
    `timings` object (all of these); OpenAI-style `usage` gives only the counts.
    """

    source: str  # the shapes it came from, e.g. "llama.cpp timings + openai usage"
    prompt_ms: float | None = None  # its prompt pass (prefill), cached tokens not recomputed
    decode_ms: float | None = None  # its generation after the prompt pass
    decode_ms_per_token: float | None = None  # as it reported it (llama.cpp: decode_ms / n)
    prompt_tokens: int | None = None  # the whole prompt as it counted it, cached ones included
    decode_tokens: int | None = None  # output tokens it generated
    cached_tokens: int | None = None  # prompt tokens it served from its prefix cache


@dataclass(slots=True)  # not frozen: one is made per chunk, and frozen costs ~1.3 µs more each
class StreamEvent:
    """A piece of a streamed reply: `num_tokens` output tokens that arrived at `t_ns`.

    A piece may carry text but no new token (text the tokenizer merges into the token before):
    its text still belongs to the reply. The final event of a stream carries no tokens, only
    finish reason, usage and the server's timings.
    """

    t_ns: int
    num_tokens: int
    text: str = ""  # reply text (content)
    finish_reason: str | None = None
    usage_prompt_tokens: int | None = None  # as the server counts them
    usage_completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the server's prefix cache
    # Output the model generated that is not reply text: reasoning deltas (`reasoning_content`),
    # and the name and argument pieces of streamed tool calls.
    reasoning_text: str = ""
    tool_call_text: str = ""
    server_timings: ServerTimings | None = None  # final event: the server's own numbers
    usage_reported: bool = False  # final event: the server sent a `usage` object
    # Final event, speculative decoding (None: the backend does not speculate, or say): draft
    # tokens verified for the request, and how many of them the target accepted.
    num_draft_tokens: int | None = None
    num_accepted_draft_tokens: int | None = None
    # First event of a routed request (`RoutedBackend`): the endpoint it was sent to.
    endpoint: int | None = None
    # Final event: the reply's reasoning tokens (the server's usage detail, else the client's
    # count of reasoning text; None: not known).
    reasoning_tokens: int | None = None


class Backend(Protocol):
    """Something that streams a reply for a request: the built-in engine, an HTTP server..."""

    name: str

    async def start(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]: ...

    async def close(self) -> None: ...


@dataclass
class RequestRecord:
    """Everything measured about one request; metrics are computed from these alone."""

    request_id: str
    session_id: str
    turn: int
    scheduled_ns: int  # when the load pattern said to send it
    sent_ns: int  # when the driver actually sent it
    end_ns: int = 0  # when the stream ended (or failed)
    chunk_ns: list[int] = field(default_factory=list)  # arrival of every chunk with tokens
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each of those chunks
    num_prompt_tokens: int = 0  # counted by the client's tokenizer
    server_prompt_tokens: int | None = None  # from the server's usage, when it gives one
    server_completion_tokens: int | None = None
    cached_tokens: int | None = None
    output_text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # why the request failed; None when it completed
    is_warmup: bool = False
    repetition: int = 1  # which measured repetition of the workload (`--repeat`) it belongs to
    server_timings: ServerTimings | None = None  # what the server said about its own work
    max_tokens: int = 0  # what the request asked for
    ignore_eos: bool = False  # whether it asked the server to ignore EOS
    first_reasoning_ns: int | None = None  # arrival of the first reasoning output, if any
    first_content_ns: int | None = None  # arrival of the first reply text or tool-call piece
    usage_reported: bool = False  # the server sent a `usage` object (its counts were checked)
    # Speculative decoding (None: not reported): draft tokens verified, and accepted.
    num_draft_tokens: int | None = None
    num_accepted_draft_tokens: int | None = None
    endpoint: int | None = None  # which of `backend.urls` served it (None: one endpoint)
    reasoning_tokens: int | None = None  # of the output tokens, reasoning (None: not known)

    @property
    def num_output_tokens(self) -> int:
        """Output tokens of the reply: the server's `usage.completion_tokens` when it sent one,
        else the client's count, Σ chunk_tokens.

        The server wins because it counted the ids it generated; the client re-tokenizes the
        text, which can merge or split tokens where the model did not, and never sees tokens
        without text (an EOS, a special token). `chunk_tokens` stays the client's split of the
        reply over its chunks, which timing (ITL) needs and the server does not give.
        """
        if self.server_completion_tokens is not None:
            return self.server_completion_tokens
        return sum(self.chunk_tokens)

    @property
    def ok(self) -> bool:
        return self.error is None
