"""Tests for llmbench.engine.chat_template: tools through a template that renders them (checked
against transformers), and the Hermes text fallback for templates that do not (hand-written)."""

from __future__ import annotations

import json

import pytest
import tokenizers
from tokenizers import models

from llmbench.engine.chat_template import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ChatTemplate,
    tool_turns_as_text,
)
from llmbench.engine.tokenizer import Tokenizer
from tests.engine.helpers import WEATHER_TOOL

# Plain ChatML, as SmolLM2 ships it: no `tools`, no `tool_calls`.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A Hermes-style template that renders tools itself (the shape of Qwen2.5's, shortened).
HERMES = """{%- if tools %}
<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are helpful.' }}
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0]['role'] == 'system' %}
<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{%- if message.content %}
{{ message.content }}
{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- set tool_call = tool_call.function %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
# The three-turn conversation an agent sends back: the call (content null), the tool's answer.
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
]


def with_dict_arguments(messages: list[dict]) -> list[dict]:
    """The conversation as transformers expects it: tool-call arguments as an object."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def test_what_a_template_reads_decides_the_fallback() -> None:
    chatml, hermes = ChatTemplate(CHATML), ChatTemplate(HERMES)
    assert not chatml.renders_tools and not chatml.renders_tool_calls
    assert hermes.renders_tools and hermes.renders_tool_calls


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_template_with_tools_renders_as_transformers_does(add_generation_prompt) -> None:
    from transformers import PreTrainedTokenizerFast

    reference = PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(models.WordLevel({"x": 0}, unk_token="x"))
    )
    reference.chat_template = HERMES
    for messages in (CONVERSATION[:2], CONVERSATION):
        expected = reference.apply_chat_template(
            with_dict_arguments(messages),
            tools=[WEATHER_TOOL],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        # Ours takes the API's shape, arguments as a JSON string, and parses them as vLLM does.
        text = ChatTemplate(HERMES).render(messages, add_generation_prompt, tools=[WEATHER_TOOL])
        assert text == expected
    assert '"arguments": {"city": "Paris"}' in text  # the full conversation, rendered last


def test_a_template_without_tools_gets_them_in_the_system_message() -> None:
    text = ChatTemplate(CHATML).render(CONVERSATION[:2], tools=[WEATHER_TOOL])
    tool_line = json.dumps(WEATHER_TOOL)
    expected = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
        "You may call one or more of the functions below to answer the user. Their signatures "
        "are JSON objects inside <tools></tools> tags:\n"
        f"<tools>\n{tool_line}\n</tools>\n\n"
        "To call a function, reply with a JSON object holding its name and arguments inside "
        "<tool_call></tool_call> tags, one call per pair of tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <arguments-as-a-JSON-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected


def test_without_a_system_message_the_tools_get_one_of_their_own() -> None:
    text = ChatTemplate(CHATML).render([{"role": "user", "content": "hi"}], tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\n# Tools\n\n")
    assert text.endswith("<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_no_tools_renders_exactly_as_before() -> None:
    plain = ChatTemplate(CHATML).render(CONVERSATION[:2])
    assert ChatTemplate(CHATML).render(CONVERSATION[:2], tools=[]) == plain
    assert plain == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_turns_become_text_for_a_template_without_them() -> None:
    text = ChatTemplate(CHATML).render(CONVERSATION, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n"
        f'{TOOL_CALL_OPEN}\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n'
        f"{TOOL_CALL_CLOSE}<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"sky": "sunny"}\n</tool_response><|im_end|>\n'
    )


def test_a_run_of_tool_messages_is_one_user_message_and_content_comes_first() -> None:
    first = {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    second = {**CALL, "id": "call_2", "function": {"name": "get_time", "arguments": {}}}
    messages = [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [first, second]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
        {"role": "user", "content": "Thanks"},
    ]
    assert tool_turns_as_text(messages) == [
        {"role": "user", "content": "Weather and time?"},
        {
            "role": "assistant",
            "content": "Checking.\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call>\n"
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        },
        {
            "role": "user",
            "content": "<tool_response>\nsunny\n</tool_response>\n"
            "<tool_response>\nnoon\n</tool_response>",
        },
        {"role": "user", "content": "Thanks"},
    ]


def test_arguments_that_are_not_a_json_object_reach_the_template_as_given() -> None:
    call = {**CALL, "function": {"name": "f", "arguments": "not json"}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    text = ChatTemplate(CHATML).render(messages, add_generation_prompt=False)
    assert '{"name": "f", "arguments": "not json"}' in text


def test_tokenizer_chat_methods_pass_tools_through() -> None:
    tok = Tokenizer.byte_level()  # ChatML, no tools
    messages = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages, tools=[WEATHER_TOOL])
    assert text == ChatTemplate(CHATML).render(messages, tools=[WEATHER_TOOL])
    assert tok.encode_chat(messages, tools=[WEATHER_TOOL]) == tok.encode(text)
    assert len(tok.encode_chat(messages, tools=[WEATHER_TOOL])) > len(tok.encode_chat(messages))
