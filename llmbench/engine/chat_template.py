"""Chat messages (and tools) -> prompt text through a model's jinja chat template, as
transformers renders them; tools and tool turns as text for templates that do not know them.

Messages and tools come in OpenAI's shapes. As in transformers, a template receives `messages`,
`tools` (the list of `{"type": "function", "function": {...}}` definitions, or None),
`add_generation_prompt`, `bos_token` and `eos_token`; as in vLLM, the `arguments` of an
assistant message's `tool_calls` (a JSON string in the API) reach the template parsed into an
object.

A template that never reads `tools` (SmolLM2's, plain ChatML) gets them in the Hermes format,
the one most open models are trained on, written into the system message:

    # Tools
    ...
    <tools>
    {"type": "function", "function": {"name": "get_weather", ...}}
    </tools>
    ...
    <tool_call>
    {"name": <function-name>, "arguments": <arguments-as-a-JSON-object>}
    </tool_call>

and, when it never reads `tool_calls`, the tool turns as text in the same format: an assistant
message's calls become `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after
its content, and each run of `tool` messages becomes one user message of
`<tool_response>...</tool_response>` blocks. A server parses replies in this format (the
`serve` package's `tool_calls` module).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmbench.errors import UserError

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
# The system-message block that lists the tools, for templates that do not render them.
TOOLS_SYSTEM_BLOCK = """# Tools

You may call one or more of the functions below to answer the user. Their signatures are \
JSON objects inside <tools></tools> tags:
<tools>
{tool_lines}
</tools>

To call a function, reply with a JSON object holding its name and arguments inside \
<tool_call></tool_call> tags, one call per pair of tags:
<tool_call>
{{"name": <function-name>, "arguments": <arguments-as-a-JSON-object>}}
</tool_call>"""


class ChatTemplate:
    """A compiled chat template; `render` gives the prompt text of a conversation."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._template = _compile_chat_template(source)
        # What the template reads decides which tool turns it is given as text (see above).
        variables = meta.find_undeclared_variables(self._template.environment.parse(source))
        self.renders_tools = "tools" in variables
        self.renders_tool_calls = re.search(r"\btool_calls\b", source) is not None

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: list[dict[str, Any]] | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> str:
        """The prompt text of `messages`; `tools` are the request's function definitions."""
        messages = [_with_parsed_arguments(message) for message in messages]
        if not self.renders_tool_calls:
            messages = tool_turns_as_text(messages)
        if tools and not self.renders_tools:
            messages = with_tools_in_system_message(messages, tools)
            tools = None
        special = {"bos_token": bos_token, "eos_token": eos_token}
        try:
            return self._template.render(
                messages=messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                # A missing token is left undefined (renders "") rather than "None".
                **{name: token for name, token in special.items() if token is not None},
            )
        except (jinja2.TemplateError, TypeError) as e:  # TypeError: None + str, and the like
            raise UserError(
                f"chat template failed: {_first_line(e)}: check the roles and order of the "
                "messages against what the model's template accepts"
            ) from e


def with_tools_in_system_message(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`messages` with the tools block after the first system message's text (or as a new
    system message in front)."""
    tool_lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    block = TOOLS_SYSTEM_BLOCK.format(tool_lines=tool_lines)
    if messages and messages[0].get("role") == "system":
        system = messages[0].get("content") or ""
        content = f"{system}\n\n{block}" if system else block
        return [{**messages[0], "content": content}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def tool_turns_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls as `<tool_call>` blocks in the content; each run of `tool`
    messages as one user message of `<tool_response>` blocks."""
    out: list[dict[str, Any]] = []
    is_after_tool = False  # the last message out holds tool responses
    for message in messages:
        role = message.get("role")
        if role == "tool":
            content = message.get("content") or ""
            response = f"{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"
            if is_after_tool:
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + response}
            else:
                out.append({"role": "user", "content": response})
            is_after_tool = True
            continue
        is_after_tool = False
        if role == "assistant" and message.get("tool_calls"):
            calls = [_call_as_text(call) for call in message["tool_calls"]]
            text = "\n".join(part for part in [message.get("content") or "", *calls] if part)
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            message["content"] = text
        elif message.get("content") is None:
            message = {**message, "content": ""}
        out.append(message)
    return out


def _call_as_text(call: dict[str, Any]) -> str:
    function = call.get("function", call)  # transformers also accepts the bare function
    body = {"name": function.get("name"), "arguments": function.get("arguments", {})}
    return f"{TOOL_CALL_OPEN}\n{json.dumps(body, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"


def _with_parsed_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """The message with each tool call's `arguments` JSON string parsed, as templates expect
    an object (a string that is not a JSON object is left as it is)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    parsed = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                value = json.loads(arguments)
            except ValueError:
                value = None
            if isinstance(value, dict):
                call = {**call, "function": {**function, "arguments": value}}
        parsed.append(call)
    return {**message, "tool_calls": parsed}


def _compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers renders them in.

    Templates come from model repos and are untrusted code, hence the sandbox. trim_blocks and
    lstrip_blocks change the output whitespace, so they must match transformers for the same
    prompt text; so must the `tojson` override (no HTML escaping, non-ASCII kept).
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(
            f"invalid chat template: line {e.lineno}: {e.message}: fix the template in the "
            "model's tokenizer files"
        ) from e


def _raise_exception(message: str) -> None:
    """`raise_exception("...")`, called by templates to reject a conversation."""
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    """Llama-3 templates print today's date."""
    return datetime.now().strftime(fmt)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
