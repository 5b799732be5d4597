"""Tests for llmbench.serve.protocol: requests checked field by field (no server, no
engine), and OpenAI's reply and chunk shapes."""

from __future__ import annotations

import dataclasses

import pytest

from llmbench.engine.tokenizer import Tokenizer
from llmbench.serve.protocol import (
    ApiError,
    Limits,
    Reply,
    check_fits,
    decode_json_object,
    parse_generation,
    parse_messages,
    parse_tools,
)
from llmbench.serve.tool_calls import ToolCall

LIMITS = Limits(
    model_name="m", vocab_size=300, max_model_len=100, kv_cache_tokens=64, block_size=16
)
ROOMY = dataclasses.replace(LIMITS, max_model_len=4096, kv_cache_tokens=4096)  # tools: ~500
TOKENIZER = Tokenizer.byte_level()  # ids are bytes: "hi" is [104, 105]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def refusal(body: dict, is_chat: bool = True) -> ApiError:
    with pytest.raises(ApiError) as excinfo:
        parse_generation(body, is_chat, TOKENIZER, LIMITS)
    return excinfo.value


def chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], **fields}


def test_a_plain_chat_request():
    generation = parse_generation(chat(max_tokens=3, temperature=0), True, TOKENIZER, LIMITS)
    assert generation.prompt_ids == TOKENIZER.encode_chat([{"role": "user", "content": "hi"}])
    assert generation.sampling == {"max_tokens": 3, "stop": (), "temperature": 0}
    assert not generation.is_stream and not generation.parses_tool_calls


def test_tools_reach_the_prompt_unless_tool_choice_is_none():
    messages = [{"role": "user", "content": "hi"}]
    with_tools = parse_generation(chat(tools=[TOOL], max_tokens=1), True, TOKENIZER, ROOMY)
    assert with_tools.parses_tool_calls and with_tools.max_tool_calls is None
    assert with_tools.prompt_ids == TOKENIZER.encode_chat(messages, tools=[TOOL])
    body = chat(tools=[TOOL], tool_choice="none", max_tokens=1)
    without = parse_generation(body, True, TOKENIZER, ROOMY)
    assert not without.parses_tool_calls
    assert without.prompt_ids == TOKENIZER.encode_chat(messages)
    body = chat(tools=[TOOL], parallel_tool_calls=False, max_tokens=1)
    assert parse_generation(body, True, TOKENIZER, ROOMY).max_tool_calls == 1


@pytest.mark.parametrize(
    ("tool_choice", "message"),
    [
        ("required", "tool_choice 'required' is not supported by llmbench serve (only 'auto' and"),
        ({"type": "function", "function": {"name": "f"}}, "tool_choice a named function is not"),
        ("sometimes", "tool_choice must be 'auto' or 'none'"),
    ],
)
def test_tool_choice_other_than_auto_or_none_is_refused(tool_choice, message):
    error = refusal(chat(tools=[TOOL], tool_choice=tool_choice))
    assert error.status == 400 and error.param == "tool_choice"
    assert str(error).startswith(message)


@pytest.mark.parametrize(
    "tools",
    [TOOL, [{"function": {"name": "f"}}], [{"type": "function", "function": {"name": ""}}],
     [{"type": "function", "function": {"name": "f", "parameters": []}}]],
)  # fmt: skip
def test_malformed_tools_are_refused(tools):
    assert refusal(chat(tools=tools)).param == "tools"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"properties": "city"}, "tools[0].function.parameters.properties must be an object"),
        ({"properties": [{"city": {}}]}, "tools[0].function.parameters.properties must be"),
        ({"properties": {"city": "string"}}, "parameters.properties.city must be a JSON schema"),
        ({"properties": {}, "required": "city"}, "parameters.required must be a list of"),
        ({"required": [1]}, "tools[0].function.parameters.required must be a list of"),
    ],
)
def test_a_tool_schema_the_template_cannot_read_is_refused_by_field(parameters, message):
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    error = refusal(chat(tools=[tool]))
    assert (error.status, error.param) == (400, "tools") and message in str(error)


def test_a_well_formed_tool_schema_is_accepted():
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    assert parse_tools([tool], "auto") == [tool]


def test_the_messages_an_agent_loop_sends_back():
    messages = parse_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "f"},
        ]
    )
    assert messages == [
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "f"},
    ]


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"role": "user", "content": None}, "null only in an assistant message with tool_calls"),
        ({"role": "assistant", "content": None}, "null only in an assistant message"),
        ({"role": "user", "content": "x", "tool_calls": [CALL]}, "only assistant messages"),
        ({"role": "tool", "content": "x"}, "needs the 'tool_call_id'"),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}, "tool_calls[0]"),
        (
            {"role": "assistant", "content": None,
             "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}]},
            "arguments is not JSON",
        ),
        ({"role": "user", "content": [{"type": "image_url"}]}, "only text parts"),
        ({"role": "hacker", "content": "x"},
         "messages[0].role 'hacker' is not one of system, developer, user, assistant, tool"),
        ({"role": "function", "content": "x", "name": "f"}, "messages[0].role 'function' is not"),
        ({"role": "tool", "tool_call_id": "call_1", "content": "x"},
         "messages[0].tool_call_id 'call_1' answers no tool call of an earlier assistant message"),
    ],
)  # fmt: skip
def test_malformed_messages_are_refused_with_the_reason(message, words):
    with pytest.raises(ApiError) as excinfo:
        parse_messages([message])
    assert excinfo.value.param == "messages" and words in str(excinfo.value)


def test_a_tool_message_answers_a_call_of_an_earlier_assistant_message():
    user = {"role": "user", "content": "hi"}
    assistant = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    assert len(parse_messages([user, assistant, answer, answer])) == 4  # twice: still a call
    with pytest.raises(ApiError, match=r"messages\[1\].tool_call_id 'call_1' answers no"):
        parse_messages([user, answer, assistant])  # the answer before the call
    other = {**answer, "tool_call_id": "call_9"}
    with pytest.raises(ApiError, match=r"messages\[2\].tool_call_id 'call_9' answers no"):
        parse_messages([user, assistant, other])


@pytest.mark.parametrize(
    ("name", "value", "interval"),
    [
        ("temperature", 1e308, "[0, 2]"),
        ("temperature", 2.5, "[0, 2]"),
        ("temperature", -0.1, "[0, 2]"),
        ("temperature", "hot", "[0, 2]"),
        ("temperature", False, "[0, 2]"),
        ("top_p", 0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("min_p", -1, "[0, 1]"),
        ("min_p", float("inf"), "[0, 1]"),
    ],
)
def test_sampling_numbers_outside_openais_ranges_are_refused_by_name(name, value, interval):
    error = refusal(chat(**{name: value}))
    assert error.param == name
    assert str(error) == f"'{name}' must be a number in {interval}, got {value!r}"


def test_sampling_numbers_at_the_ends_of_their_ranges_are_accepted():
    body = chat(temperature=2, top_p=1, min_p=0, max_tokens=1)
    assert parse_generation(body, True, TOKENIZER, LIMITS).sampling["temperature"] == 2
    body = chat(temperature=0.0, top_p=1e-9, min_p=1, max_tokens=1)
    assert parse_generation(body, True, TOKENIZER, LIMITS).sampling["min_p"] == 1


@pytest.mark.parametrize(("top_k", "sampled"), [(-1, 0), (0, 0), (5, 5), (299, 299), (300, 0),
                                                (10**30, 0)])  # fmt: skip
def test_top_k_off_is_minus_one_zero_or_the_whole_vocabulary(top_k, sampled):
    body = chat(top_k=top_k, max_tokens=1)  # LIMITS: a vocabulary of 300
    assert parse_generation(body, True, TOKENIZER, LIMITS).sampling["top_k"] == sampled


def test_a_json_object_body_is_decoded():
    assert decode_json_object(b'{"prompt": "caf\\u00e9 \xc3\xa9", "n": 1}') == {
        "prompt": "café é",
        "n": 1,
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"prompt": "\\ud800"}',
         "the request body is not valid Unicode: a lone UTF-16 surrogate (\\ud800) in a string"),
        (b'{"prompt": "a\\udfffb"}', "a lone UTF-16 surrogate (\\udfff)"),
        (b'{"p": ["\xed\xa0\x80"]}', "a lone UTF-16 surrogate (\\ud800)"),
        (b"[" * 100_000 + b"]" * 100_000, "the request body is not valid JSON: it nests too"),
        (b'{"temperature": NaN}', "the request body is not valid JSON: NaN is not a JSON value"),
        (b'{"top_p": -Infinity}', "not valid JSON: -Infinity is not a JSON value"),
        (b"\xff", "the request body is not valid JSON: 'utf-8' codec can't decode"),
        (b"[1]", "the request body must be a JSON object"),
    ],
)  # fmt: skip
def test_a_body_no_tokenizer_can_take_is_a_400(raw, message):
    with pytest.raises(ApiError) as excinfo:
        decode_json_object(raw)
    assert excinfo.value.status == 400 and message in str(excinfo.value)


def test_a_surrogate_pair_is_one_character_not_a_lone_surrogate():
    assert decode_json_object(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format", "'json_object' is not"),
        ({"response_format": {"type": "json_schema"}}, "response_format", 'only {"type": "text"}'),
        ({"logit_bias": {"x": 1}}, "logit_bias", "'x' is not a token id"),
        ({"logit_bias": {"300": 1}}, "logit_bias", "[0, 300)"),
        ({"logit_bias": [1]}, "logit_bias", "must be an object"),
        ({"functions": [{"name": "f"}]}, "functions", "leave it out"),
        ({"n": 2}, "n", "only 1 or null"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "true or false"),
        ({"model": "other"}, "model", "does not exist"),
    ],
)  # fmt: skip
def test_unsupported_or_bad_options_are_refused_by_name(body, param, words):
    error = refusal(chat(**body))
    assert error.param == param and words in str(error)


def test_text_response_format_and_logit_bias_are_accepted():
    body = chat(response_format={"type": "text"}, logit_bias={"104": -100, "7": 5.5})
    generation = parse_generation(body, True, TOKENIZER, LIMITS)
    assert generation.sampling["logit_bias"] == {104: -100, 7: 5.5}


def test_context_and_kv_cache_limits():
    # max_model_len 100: 90 + 10 fits, 90 + 11 does not.
    big_cache = dataclasses.replace(LIMITS, kv_cache_tokens=1000)
    check_fits(90, 10, big_cache, "prompt")
    with pytest.raises(ApiError) as excinfo:
        check_fits(90, 11, big_cache, "prompt")
    error = excinfo.value
    assert error.code == "context_length_exceeded" and error.param == "prompt"
    assert "maximum context length is 100 tokens" in str(error) and "101 tokens" in str(error)
    # 64 cached tokens = 4 blocks of 16: 65 tokens need 5.
    check_fits(60, 4, LIMITS, "messages")
    with pytest.raises(ApiError, match="needs 5 KV blocks .* has 4"):
        check_fits(60, 5, LIMITS, "messages")


def test_chat_default_max_tokens_fills_what_the_context_and_cache_leave():
    generation = parse_generation(chat(), True, TOKENIZER, LIMITS)
    prompt = len(generation.prompt_ids)
    assert generation.sampling["max_tokens"] == 64 - prompt  # the cache (64) < the context (100)
    completion = parse_generation({"prompt": "hi"}, False, TOKENIZER, LIMITS)
    assert completion.sampling["max_tokens"] == 16 and completion.prompt_ids == [104, 105]


def test_stream_chunks_carry_content_tool_call_deltas_and_the_finish_reason_last():
    reply = Reply(is_chat=True, model_name="m", include_usage=False)
    call = ToolCall(id="call_x", name="f", arguments='{"a": 1}')
    assert reply.role_chunk()["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = reply.chunks(["Check", "ing."], None)
    assert [c["choices"][0]["delta"] for c in chunks] == [{"content": "Checking."}]
    chunks = reply.chunks([call, call], "tool_calls")
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"tool_calls": [{"index": 0, **call.as_api()}]},
        {"tool_calls": [{"index": 1, **call.as_api()}]},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "tool_calls"]
    [last] = reply.chunks([], "stop")
    assert last["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == reply.id for c in chunks)


def test_a_reply_with_tool_calls_has_null_content():
    reply = Reply(is_chat=True, model_name="m", include_usage=False)
    call = ToolCall(id="call_x", name="f", arguments="{}")
    body = reply.body("", [call], "tool_calls", {})
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call.as_api()],
    }
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    plain = reply.body("hello", [], "stop", {})["choices"][0]["message"]
    assert plain == {"role": "assistant", "content": "hello"}


def test_parse_tools_returns_none_for_no_tools():
    assert parse_tools(None, None) is None
    assert parse_tools([], "auto") is None
    assert parse_tools([TOOL], "auto") == [TOOL]
