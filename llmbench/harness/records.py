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


@dataclass(frozen=True)
class StreamEvent:
    """A piece of a streamed reply: `num_tokens` output tokens that arrived at `t_ns`.

    The final event of a stream may carry no tokens, only usage and finish reason.
    """

    t_ns: int
    num_tokens: int
    text: str = ""
    finish_reason: str | None = None
    usage_prompt_tokens: int | None = None  # as the server counts them
    usage_completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the server's prefix cache


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

    @property
    def num_output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ok(self) -> bool:
        return self.error is None
