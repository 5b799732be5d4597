"""OpenAI's API shapes for `llmbench serve`: requests parsed and checked, replies and chunks built.

Everything a client can get wrong is refused here with OpenAI's error body (`ApiError`) naming
the parameter; nothing here touches the engine or the network. The tokenizer is passed in.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmbench.errors import UserError
from llmbench.serve.tool_calls import ToolCall

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# torch.Generator.manual_seed accepts [-2**63, 2**64); outside it raises, so refuse it here.
_SEED_RANGE = range(-(2**63), 2**64)
# OpenAI options this server does not implement, each with the values it accepts besides null:
# a request asking for anything else is refused rather than silently answered without it.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "functions": (),  # the API's older form of tools
    "function_call": (),
}
_TEXT_PART_TYPES = ("text", "input_text")
_ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's chat roles
# name -> (lowest, highest, is the lowest itself refused): OpenAI's documented ranges (top_p
# and min_p as the sampler takes them). Inside them the sampler never sees an inf or a NaN.
_NUMBER_RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, False),
    "top_p": (0.0, 1.0, True),
    "min_p": (0.0, 1.0, False),
}


class Tokenizer(Protocol):
    """What parsing needs of `llmbench.engine.tokenizer.Tokenizer`."""

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]: ...

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]: ...


@dataclass(frozen=True)
class Limits:
    """What the served model accepts."""

    model_name: str  # the name clients must send as `model`
    vocab_size: int  # logits width: token ids and logit_bias keys must be below it
    max_model_len: int  # prompt + max_tokens, at most
    kv_cache_tokens: int  # the whole KV cache: one request can never hold more
    block_size: int


class ApiError(Exception):
    """A refused request: OpenAI's error body with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        error_type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.error_type = error_type
        self.code = code

    def body(self) -> dict[str, Any]:
        error = {"message": str(self), "type": self.error_type, "param": self.param}
        return {"error": {**error, "code": self.code}}


@dataclass(frozen=True)
class Generation:
    """A parsed /v1/completions or /v1/chat/completions request."""

    prompt_ids: list[int]
    sampling: dict[str, Any]  # SamplingParams' fields, checked by SamplingParams itself
    max_tokens_param: str  # "max_tokens" or "max_completion_tokens": which one the client set
    is_stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk carries the usage
    parses_tool_calls: bool  # tools were given and tool_choice is not "none"
    max_tool_calls: int | None  # 1 when parallel_tool_calls is false


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything else (not JSON, NaN or Infinity, nested past
    Python's parser, a lone UTF-16 surrogate such as "\\ud800" that no tokenizer can encode)
    is a 400. Takes time in proportion to the body: run it off the event loop."""
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
        # Only valid Unicode encodes: a lone surrogate escape decodes to a str that does not.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise ApiError(400, "the request body is not valid JSON: it nests too deeply") from None
    except UnicodeEncodeError as e:
        raise ApiError(
            400,
            "the request body is not valid Unicode: a lone UTF-16 surrogate "
            f"(\\u{ord(e.object[e.start]):04x}) in a string",
        ) from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def check_model(body: dict[str, Any], limits: Limits) -> None:
    model = body.get("model")
    if model is not None and model != limits.model_name:
        raise model_not_found(model, limits.model_name)


def model_not_found(model: object, served: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist; this server serves `{served}`",
        "model",
        code="model_not_found",
    )


def parse_generation(
    body: dict[str, Any], is_chat: bool, tokenizer: Tokenizer, limits: Limits
) -> Generation:
    """Check every field of a generation request and tokenize its prompt."""
    check_model(body, limits)
    for name, accepted in _UNSUPPORTED.items():
        if body.get(name) is not None and body[name] not in accepted:
            only = f"only {accepted[0]!r} or null" if accepted else "leave it out"
            raise ApiError(400, f"'{name}' is not supported by llmbench serve ({only})", name)
    _check_response_format(body.get("response_format"))
    parses_tool_calls, max_tool_calls = False, None
    if is_chat:
        tools = parse_tools(body.get("tools"), body.get("tool_choice"))
        messages = parse_messages(body.get("messages"))
        prompt_ids = tokenizer.encode_chat(messages, tools=tools)
        if not prompt_ids:
            raise ApiError(400, "the chat prompt has no tokens", "messages")
        parses_tool_calls = tools is not None
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise ApiError(
                400, "'parallel_tool_calls' must be true or false", "parallel_tool_calls"
            )
        max_tool_calls = 1 if parallel is False else None
    else:
        prompt_ids = prompt_token_ids(body.get("prompt"), tokenizer, limits.vocab_size)
    prompt_param = "messages" if is_chat else "prompt"

    # max_completion_tokens is OpenAI's newer name for max_tokens; it wins when both are set.
    is_new_name = body.get("max_completion_tokens") is not None
    max_tokens_param = "max_completion_tokens" if is_new_name else "max_tokens"
    max_tokens = body.get(max_tokens_param)
    if max_tokens is None:
        max_tokens = _default_max_tokens(len(prompt_ids), is_chat, limits)
    if is_int(max_tokens):
        check_fits(len(prompt_ids), max_tokens, limits, prompt_param)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ApiError(400, "'stop' must be a string or a list of strings", "stop")
    seed = body.get("seed")
    if is_int(seed) and seed not in _SEED_RANGE:
        raise ApiError(400, f"'seed' must be in [-2**63, 2**64), got {seed}", "seed")
    for name, (lowest, highest, is_open) in _NUMBER_RANGES.items():
        _check_range(body.get(name), name, lowest, highest, is_open)
    top_k = body.get("top_k")
    if top_k == -1 or (is_int(top_k) and top_k >= limits.vocab_size):
        top_k = 0  # off: vLLM spells it -1, and a top_k past the vocabulary keeps every token
    sampling: dict[str, Any] = {
        "max_tokens": max_tokens,
        "stop": () if stop is None else stop,
        "top_k": top_k,
        "logit_bias": _logit_bias(body.get("logit_bias"), limits.vocab_size),
    }
    for name in ("temperature", "top_p", "min_p", "seed", "ignore_eos"):
        sampling[name] = body.get(name)

    is_stream = body.get("stream", False)
    if not isinstance(is_stream, bool):
        raise ApiError(400, f"'stream' must be true or false, got {is_stream!r}", "stream")
    options = body.get("stream_options") or {}
    include_usage = options.get("include_usage", False) if isinstance(options, dict) else None
    if not isinstance(include_usage, bool):
        raise ApiError(
            400,
            "'stream_options' must be an object like {\"include_usage\": true}",
            "stream_options",
        )
    return Generation(
        prompt_ids=prompt_ids,
        sampling={k: v for k, v in sampling.items() if v is not None},
        max_tokens_param=max_tokens_param,
        is_stream=is_stream,
        include_usage=include_usage,
        parses_tool_calls=parses_tool_calls,
        max_tool_calls=max_tool_calls,
    )


def sampling_error(error: UserError, generation: Generation) -> ApiError:
    """`SamplingParams`' "sampling: <field> must be ..." as a 400 naming the parameter."""
    field = str(error).removeprefix("sampling: ").split(" ", 1)[0]
    param = field if field in generation.sampling else None
    if param == "max_tokens":
        param = generation.max_tokens_param
    return ApiError(400, str(error), param)


def check_fits(num_prompt_tokens: int, max_tokens: int, limits: Limits, param: str) -> None:
    """Refuse a request the context window or the whole KV cache cannot hold."""
    total = num_prompt_tokens + max_tokens
    if total > limits.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {limits.max_model_len} tokens. However, "
            f"you requested {total} tokens ({num_prompt_tokens} in the {param}, {max_tokens} "
            "in the completion). Please reduce the length of the prompt or of max_tokens.",
            param,
            code="context_length_exceeded",
        )
    num_blocks = -(-total // limits.block_size)
    kv_blocks = limits.kv_cache_tokens // limits.block_size
    if num_blocks > kv_blocks:
        raise ApiError(
            400,
            f"the request needs {num_blocks} KV blocks ({total} tokens) and the server's whole "
            f"KV cache has {kv_blocks}; shorten the prompt or lower max_tokens",
            param,
        )


def _default_max_tokens(num_prompt_tokens: int, is_chat: bool, limits: Limits) -> int:
    if not is_chat:
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    # Chat (as in vLLM): whatever room the context and the whole KV cache leave.
    capacity = min(limits.max_model_len, limits.kv_cache_tokens)
    return max(1, capacity - num_prompt_tokens)  # too long: check_fits says so


def _check_range(value: object, name: str, lowest: float, highest: float, is_open: bool) -> None:
    if value is None:
        return
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or not (lowest < value if is_open else lowest <= value) or value > highest:
        interval = f"{'(' if is_open else '['}{lowest:g}, {highest:g}]"
        raise ApiError(400, f"'{name}' must be a number in {interval}, got {value!r}", name)


def _check_response_format(value: object) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return
    raise ApiError(
        400,
        f"response_format {kind or value!r} is not supported by llmbench serve (only "
        '{"type": "text"}): the engine does not constrain its output to JSON',
        "response_format",
    )


def _logit_bias(value: object, vocab_size: int) -> dict[int, Any] | None:
    """OpenAI's {"token id as a string": bias} as {id: bias}; the bias range is the sampler's."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias")
    bias = {}
    for key, amount in value.items():
        token_id = int(key) if isinstance(key, str) and key.isdecimal() else None
        if token_id is None or token_id >= vocab_size:
            raise ApiError(
                400,
                f"'logit_bias' key {key!r} is not a token id in the vocabulary [0, {vocab_size})",
                "logit_bias",
            )
        bias[token_id] = amount
    return bias


# -- prompts ----------------------------------------------------------------------------------


def prompt_token_ids(prompt: object, tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """A completion's `prompt`: a string, or token ids (also OpenAI's batch form of one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(is_int(t) for t in prompt):
        ids = list(prompt)
        check_token_ids(ids, vocab_size, "prompt")
    else:
        raise ApiError(
            400,
            "'prompt' must be a string or a list of token ids (one prompt per request)",
            "prompt",
        )
    if not ids:
        raise ApiError(400, "'prompt' is empty", "prompt")
    return ids


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    outside = [t for t in ids if not 0 <= t < vocab_size]
    if outside:
        raise ApiError(
            400,
            f"'{param}' token id {outside[0]} is outside the vocabulary [0, {vocab_size})",
            param,
        )


def parse_messages(value: object) -> list[dict[str, Any]]:
    """Chat messages for the chat template: text parts joined into one string; an assistant's
    `tool_calls` (content may then be null) and a tool message's `tool_call_id` kept."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list of messages", "messages")
    messages = []
    call_ids: set[str] = set()  # the ids of the calls made so far: what a tool message answers
    for i, message in enumerate(value):
        out = _message(i, message)
        call_ids.update(call["id"] for call in out.get("tool_calls") or ())
        if out["role"] == "tool" and out["tool_call_id"] not in call_ids:
            raise ApiError(
                400,
                f"messages[{i}].tool_call_id {out['tool_call_id']!r} answers no tool call of an "
                "earlier assistant message",
                "messages",
            )
        messages.append(out)
    return messages


def _message(i: int, message: object) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(400, f"{where} must be an object with a string 'role'", "messages")
    role = message["role"]
    if role not in _ROLES:
        raise ApiError(400, f"{where}.role {role!r} is not one of {', '.join(_ROLES)}", "messages")
    out: dict[str, Any] = {"role": role}
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise ApiError(400, f"{where}: only assistant messages carry tool_calls", "messages")
        out["tool_calls"] = _tool_calls(where, tool_calls)
    content = message.get("content")
    if content is None and out.get("tool_calls"):
        out["content"] = None  # what every agent loop sends back after a call
    else:
        out["content"] = _text_content(where, content)
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ApiError(
                400, f"{where}: a tool message needs the 'tool_call_id' it answers", "messages"
            )
        out["tool_call_id"] = call_id
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def _text_content(where: str, content: object) -> str:
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        if not all(
            isinstance(p, dict)
            and p.get("type", "text") in _TEXT_PART_TYPES
            and isinstance(p.get("text"), str)
            for p in content
        ):
            raise ApiError(400, f"{where}.content: only text parts are supported", "messages")
        return "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise ApiError(
            400,
            f"{where}.content must be a string or a list of text parts (null only in an "
            "assistant message with tool_calls)",
            "messages",
        )
    return content


def _tool_calls(where: str, value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ApiError(400, f"{where}.tool_calls must be a list", "messages")
    calls = []
    for j, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or call.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            raise ApiError(
                400,
                f'{where}.tool_calls[{j}] must be {{"id", "type": "function", '
                '"function": {"name": string, "arguments": JSON string}}',
                "messages",
            )
        try:
            json.loads(function["arguments"])
        except ValueError as e:
            raise ApiError(
                400, f"{where}.tool_calls[{j}].function.arguments is not JSON: {e}", "messages"
            ) from e
        calls.append(
            {
                "id": call.get("id") if isinstance(call.get("id"), str) else f"call_{j}",
                "type": "function",
                "function": {"name": function["name"], "arguments": function["arguments"]},
            }
        )
    return calls


def parse_tools(tools: object, tool_choice: object) -> list[dict[str, Any]] | None:
    """The function definitions to render, or None (no tools, or `tool_choice: "none"`)."""
    if isinstance(tool_choice, dict) or tool_choice == "required":
        shown = "a named function" if isinstance(tool_choice, dict) else "'required'"
        raise ApiError(
            400,
            f"tool_choice {shown} is not supported by llmbench serve (only 'auto' and 'none'): "
            "the engine does not force its output into a tool call",
            "tool_choice",
        )
    if tool_choice not in (None, "auto", "none"):
        raise ApiError(400, "tool_choice must be 'auto' or 'none'", "tool_choice")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function definitions", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(function, dict)
            or tool.get("type") != "function"
            or not isinstance(function.get("name"), str)
            or not function["name"]
            or not isinstance(function.get("parameters", {}), dict)
        ):
            raise ApiError(
                400,
                f'tools[{i}] must be {{"type": "function", "function": {{"name": '
                'string, "description": string, "parameters": JSON schema}}',
                "tools",
            )
        _check_parameters(f"tools[{i}].function.parameters", function.get("parameters", {}))
    if not tools or tool_choice == "none":
        return None
    return tools


def _check_parameters(where: str, parameters: dict[str, Any]) -> None:
    """The parts of a function's JSON schema the chat template and the model read."""
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise ApiError(
            400, f"{where}.properties must be an object (parameter name -> JSON schema)", "tools"
        )
    for name, schema in properties.items():
        if not isinstance(schema, dict):
            raise ApiError(400, f"{where}.properties.{name} must be a JSON schema object", "tools")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ApiError(400, f"{where}.required must be a list of parameter names", "tools")


# -- replies ----------------------------------------------------------------------------------


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> dict:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


class Reply:
    """OpenAI's response and chunk bodies for one request (chat or text completion)."""

    def __init__(self, is_chat: bool, model_name: str, include_usage: bool) -> None:
        self.is_chat = is_chat
        self.id = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex}"  # also the engine's
        self.model_name = model_name
        self.include_usage = include_usage
        self.created = int(time.time())
        self._num_calls = 0  # tool calls streamed so far: each delta carries its index

    def _envelope(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model_name,
        }

    def role_chunk(self) -> dict[str, Any]:
        """A chat stream's first chunk: the role, no content yet."""
        return self._chunk({"role": "assistant", "content": ""}, None)

    def chunks(
        self, events: Sequence[str | ToolCall], finish_reason: str | None
    ) -> list[dict[str, Any]]:
        """The chunks of one engine output: a content delta (texts joined), a delta per tool
        call, the finish reason on the last (an empty delta if nothing else is left)."""
        deltas: list[dict[str, Any]] = []
        text = "".join(event for event in events if isinstance(event, str))
        if text:
            deltas.append({"content": text} if self.is_chat else {"text": text})
        for call in (event for event in events if isinstance(event, ToolCall)):
            deltas.append({"tool_calls": [{"index": self._num_calls, **call.as_api()}]})
            self._num_calls += 1
        if finish_reason is None:
            return [self._chunk(delta, None) for delta in deltas]
        if not deltas:
            deltas.append({} if self.is_chat else {"text": ""})
        last = self._chunk(deltas[-1], finish_reason)
        return [self._chunk(delta, None) for delta in deltas[:-1]] + [last]

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        if self.is_chat:
            choice = {"index": 0, "delta": delta}
            body = self._envelope("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": delta.get("text", "")}
            body = self._envelope("text_completion")
        choice.update(logprobs=None, finish_reason=finish_reason)
        body["choices"] = [choice]
        if self.include_usage:  # OpenAI: every chunk has "usage", null but in the last
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.is_chat else "text_completion")
        return {**body, "choices": [], "usage": usage}

    def body(
        self,
        text: str,
        tool_calls: Sequence[ToolCall],
        finish_reason: str | None,
        usage: dict[str, Any],
    ) -> dict[str, Any]:
        if self.is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["content"] = text or None
                message["tool_calls"] = [call.as_api() for call in tool_calls]
            choice: dict[str, Any] = {"index": 0, "message": message}
            body = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": text}
            body = self._envelope("text_completion")
        choice.update(logprobs=None, finish_reason=finish_reason)
        return {**body, "choices": [choice], "usage": usage}
