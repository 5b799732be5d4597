"""The stream parser, byte by byte: events, token counts, the final event and the verdict."""

from __future__ import annotations

import json

import pytest

from llmbench.harness.backends.openai_stream import StreamError, StreamParser
from llmbench.harness.records import ServerTimings, StreamEvent
from tests.harness.backends.tiny_bpe import tiny_bpe_count


def count_words(text: str) -> int:
    return len(text.split())


def sse(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def delta(usage: dict | None = None, **fields) -> bytes:
    chunk: dict = {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}
    if usage is not None:
        chunk["usage"] = usage
    return sse(chunk)


FINISH = sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = sse(
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
)
DONE = b"data: [DONE]\n\n"


def parse(
    stream: bytes, use_chat=True, count_tokens=None, read_size=None, max_tokens=None
) -> tuple[list[StreamEvent], str | None]:
    """Feed `stream` in reads of `read_size` bytes (all at once if None), stamped 0, 1, 2...;
    the events, the final one last, and the verdict."""
    parser = StreamParser(use_chat, count_tokens, max_tokens)
    size = read_size or len(stream) or 1
    events = []
    for t_ns, start in enumerate(range(0, len(stream), size)):
        events += parser.feed(stream[start : start + size], t_ns)
    return events + parser.finish(t_ns=10**9), parser.failure()


def pieces(events: list[StreamEvent]) -> list[tuple[int, str]]:
    return [(e.num_tokens, e.text) for e in events]


CHAT = (
    delta(role="assistant", content="")  # role-only first delta: no token
    + b": keep-alive comment\n\n"
    + delta(content="Hello")
    + b"event: message\nid: 3\n"
    + delta(content=" big world")
    + FINISH
    + USAGE
    + DONE
)


def test_role_only_delta_comments_and_other_fields_carry_no_tokens():
    events, failure = parse(CHAT, count_tokens=count_words)
    assert failure is None
    assert pieces(events) == [(1, "Hello"), (2, " big world"), (0, "")]
    final = events[-1]
    assert final.finish_reason == "stop"
    assert (final.usage_prompt_tokens, final.usage_completion_tokens) == (7, 5)
    assert final.cached_tokens == 4 and final.usage_reported
    assert final.server_timings == ServerTimings(
        source="openai usage", prompt_tokens=7, decode_tokens=5, cached_tokens=4
    )


@pytest.mark.parametrize("read_size", [1, 2, 7, 64])
def test_lines_split_across_reads_give_the_same_events(read_size):
    expected, _ = parse(CHAT, count_tokens=count_words)
    events, _ = parse(CHAT, count_tokens=count_words, read_size=read_size)
    assert pieces(events) == pieces(expected)


def test_an_event_is_stamped_with_the_read_that_completed_its_line():
    parser = StreamParser(use_chat=True)
    line = delta(content="a")
    assert parser.feed(line[:10], t_ns=100) == []
    assert [e.t_ns for e in parser.feed(line[10:], t_ns=200)] == [200]


def test_crlf_line_endings():
    events, failure = parse(CHAT.replace(b"\n", b"\r\n"))
    assert failure is None and [e.text for e in events] == ["Hello", " big world", ""]


def test_multi_token_chunks_count_with_the_tokenizer_and_as_one_without():
    stream = delta(content="w0 ") + delta(content="w1 w2 w3 ") + delta(content="w4 ") + FINISH
    assert [e.num_tokens for e in parse(stream, count_tokens=count_words)[0]] == [1, 3, 1, 0]
    assert [e.num_tokens for e in parse(stream)[0]] == [1, 1, 1, 0]


def test_a_chunk_that_adds_no_whole_token_counts_none_and_keeps_its_text():
    """ "wo" + "rd" is one token: the second chunk carries 0 (it used to be rounded up to 1,
    over-counting the reply), and its text is still the reply's."""
    stream = delta(content="wo") + delta(content="rd") + delta(content=" word") + FINISH
    events, failure = parse(stream, count_tokens=tiny_bpe_count())
    assert failure is None
    assert pieces(events) == [(1, "wo"), (0, "rd"), (1, " word"), (0, "")]


def test_the_count_over_a_split_character_and_merged_tokens_is_the_whole_texts():
    """The tokenizer merges across chunks ("wo|rd"), a server holds half a character back (an
    empty delta, then "日" whole: 2 tokens) or splits a non-BMP character into UTF-16 halves
    (JSON escapes "\\ud83d" then "\\ude00"): the chunks' tokens add up to the count of the
    whole text, and the text is the whole text."""
    count = tiny_bpe_count()
    chunks = ["wo", "rd", "", " 日", "\ud83d", "\ude00", " word", "wo", "rd"]
    stream = b"".join(delta(content=c) for c in chunks) + FINISH + DONE
    events, failure = parse(stream, count_tokens=count)
    text = "word 日😀 wordword"
    assert failure is None
    assert "".join(e.text for e in events) == text
    # "word", " 日" (Ġ + 2), "😀" (4 bytes), " wordword" (Ġword + word): 1 + 3 + 4 + 2.
    assert sum(e.num_tokens for e in events) == count(text) == 10
    # No event for the empty delta nor for the lone first half of "😀".
    assert [e.num_tokens for e in events[:-1]] == [1, 0, 3, 4, 1, 1, 0]


def test_the_count_is_capped_at_max_tokens():
    stream = delta(content="w0 w1 ") + delta(content="w2 w3 w4 ") + delta(content="w5") + FINISH
    events, _ = parse(stream, count_tokens=count_words, max_tokens=4)
    assert [e.num_tokens for e in events] == [2, 2, 0, 0]


def test_usage_on_every_chunk_gives_the_servers_own_counts_never_summed():
    """vLLM's `continuous_usage_stats`: the running completion_tokens on every chunk. A chunk
    the server skipped (a token with no text yet) shows in the next one's count."""
    stream = (
        delta(role="assistant", content="", usage={"prompt_tokens": 9, "completion_tokens": 0})
        + delta(content="a b", usage={"prompt_tokens": 9, "completion_tokens": 1})
        + delta(content="c", usage={"prompt_tokens": 9, "completion_tokens": 4})
        + sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})
        + FINISH
    )
    events, failure = parse(stream, count_tokens=count_words)
    assert failure is None
    assert pieces(events) == [(1, "a b"), (3, "c"), (0, "")]
    final = events[-1]
    assert final.usage_completion_tokens == 4
    assert final.server_timings.source == "vllm continuous_usage_stats"


def test_usage_on_the_last_output_chunk_only_is_not_taken_as_running_counts():
    stream = delta(content="a b ") + delta(
        content="c", usage={"prompt_tokens": 9, "completion_tokens": 3}
    )
    events, _ = parse(stream + FINISH, count_tokens=count_words)
    assert [e.num_tokens for e in events] == [2, 1, 0]
    assert events[-1].server_timings.source == "openai usage"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_deltas_are_tokens_but_not_reply_text(field):
    stream = (
        delta(role="assistant")
        + delta(**{field: "think hard "})
        + delta(content="answer")
        + FINISH
        + DONE
    )
    events, _ = parse(stream, count_tokens=count_words)
    assert [(e.num_tokens, e.text, e.reasoning_text) for e in events] == [
        (2, "", "think hard "),
        (1, "answer", ""),
        (0, "", ""),
    ]
    assert [e.num_tokens for e in parse(stream)[0]] == [1, 1, 0]


def test_reasoning_tokens_are_the_servers_count_else_the_clients():
    """usage.completion_tokens_details.reasoning_tokens when the server says it (billed apart);
    else the client's count of the reasoning text; None with neither."""
    stream = delta(reasoning_content="think hard ") + delta(content="answer") + FINISH
    detail = {"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 6}}
    with_usage = stream + sse({"choices": [], "usage": detail}) + DONE
    assert parse(with_usage, count_tokens=count_words)[0][-1].reasoning_tokens == 6
    assert parse(with_usage)[0][-1].reasoning_tokens == 6  # no tokenizer needed
    assert parse(stream + DONE, count_tokens=count_words)[0][-1].reasoning_tokens == 2
    plain = delta(content="answer only") + FINISH + DONE
    assert parse(plain, count_tokens=count_words)[0][-1].reasoning_tokens == 0
    assert parse(plain)[0][-1].reasoning_tokens is None


def test_streamed_tool_call_pieces_are_tokens_but_not_reply_text():
    """A tool call streamed as deltas (name first, then argument pieces), as vLLM sends it."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "search"}}
    stream = (
        delta(role="assistant")
        + delta(tool_calls=[call])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": '{"q": '}}])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": '"a b"}'}}])
        + sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        + DONE
    )
    events, failure = parse(stream, count_tokens=count_words)
    # Words: "search" 1; 'search{"q":' still 1; then '"a' and 'b"}' are 2 more.
    assert failure is None
    assert [(e.num_tokens, e.text) for e in events] == [(1, ""), (0, ""), (2, ""), (0, "")]
    assert "".join(e.tool_call_text for e in events) == 'search{"q": "a b"}'


def test_completions_read_choice_text():
    stream = sse({"choices": [{"index": 0, "text": "w0 w1 ", "finish_reason": "length"}]})
    events, failure = parse(stream + DONE, use_chat=False, count_tokens=count_words)
    assert failure is None and pieces(events) == [(2, "w0 w1 "), (0, "")]


def test_a_reply_sent_whole_instead_of_streamed_is_one_event_with_its_timings():
    """llama.cpp's non-streamed response: `message`, `usage` and `timings` at the top level."""
    body = {
        "choices": [{"index": 0, "finish_reason": "length", "message": {"content": "w0 w1 w2"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        "timings": {"prompt_n": 5, "prompt_ms": 9.0, "predicted_n": 3, "predicted_ms": 60.0},
    }
    parser = StreamParser(use_chat=True, count_tokens=count_words)
    events = parser.feed_response(json.dumps(body).encode(), 7) + parser.finish(8)
    assert parser.failure() is None
    assert [(e.t_ns, e.num_tokens, e.text) for e in events] == [(7, 3, "w0 w1 w2"), (8, 0, "")]
    assert events[-1].server_timings.prompt_ms == 9.0


# -- the verdict ------------------------------------------------------------------------------


def test_a_stream_with_no_token_is_a_failure_even_when_it_ends_well():
    """llama-cpp-python, interrupting a reply for a new request: a role chunk and [DONE]."""
    events, failure = parse(delta(role="assistant") + DONE)
    assert failure == "empty stream: the server sent no token (finish_reason: None)"
    assert [e.num_tokens for e in events] == [0]
    _, failure = parse(delta(role="assistant", content="") + FINISH + DONE)
    assert failure == "empty stream: the server sent no token (finish_reason: stop)"


def test_no_finish_reason_is_a_cut_stream_with_or_without_done():
    _, failure = parse(delta(content="a b") + DONE, count_tokens=count_words)
    assert failure == "stream cut: [DONE] after 2 tokens with no finish_reason"
    _, failure = parse(delta(content="a b"), count_tokens=count_words)
    assert failure == "stream cut: the stream ended after 2 tokens with no finish_reason or [DONE]"


def test_a_finish_reason_without_done_is_complete_and_a_last_line_needs_no_newline():
    assert parse(delta(content="x") + FINISH)[1] is None
    events, failure = parse(delta(content="x") + FINISH + b"data: [DONE]")
    assert failure is None and [e.num_tokens for e in events] == [1, 0]


@pytest.mark.parametrize(
    "error",
    [
        sse({"error": {"message": "KV cache full", "type": "server_error", "code": 503}}),
        sse({"object": "error", "message": "KV cache full", "type": "BadRequestError"}),
        sse({"error": {"message": "KV cache full", "http_status_code": 422}}),
        b'event: error\ndata: {"message": "KV cache full"}\n\n',
        b"event: error\ndata: KV cache full\n\n",
        b'error: {"code": 500, "message": "KV cache full", "type": "server_error"}\n\n',
    ],
    ids=["error-object", "object-error", "tgi", "event-error", "event-error-text", "error-line"],
)
def test_an_error_mid_stream_fails_the_request_and_keeps_the_tokens_before_it(error):
    stream = (
        delta(content="a b")
        + error
        + delta(content="c")  # nothing after the error is output
        + sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        + DONE
    )
    events, failure = parse(stream, count_tokens=count_words)
    assert failure == "server error in stream after 2 tokens: KV cache full"
    assert pieces(events) == [(2, "a b"), (0, "")]
    assert events[-1].usage_completion_tokens == 2  # usage after the error is still read


def test_malformed_json_and_layouts_raise():
    with pytest.raises(StreamError, match="malformed stream: .*\\{not json"):
        parse(delta(content="x") + b"data: {not json\n\n")
    with pytest.raises(StreamError, match="malformed stream"):
        parse(b"data: [1, 2]\n\n")
    with pytest.raises(StreamError, match="malformed stream: unexpected chunk layout"):
        parse(b'data: {"choices": "oops"}\n\n')


def test_data_of_other_event_types_is_not_a_chunk():
    events, failure = parse(b"event: ping\ndata: hello\n\n" + delta(content="x") + FINISH)
    assert failure is None and pieces(events) == [(1, "x"), (0, "")]
