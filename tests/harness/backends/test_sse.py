"""The SSE reader: fields of complete lines, whatever the network reads cut."""

from __future__ import annotations

import pytest

from llmbench.harness.backends.sse import END_OF_EVENT, SSEReader

STREAM = (
    b": ping - 2025-01-01 00:00:00.000000+00:00\n\n"  # sse-starlette keep-alive
    b":\n\n"  # axum (TGI) keep-alive
    b'data:{"a":1}\n\n'  # TGI: no space after the colon
    b'data: {"a": 2}\n\n'  # vLLM, llama.cpp
    b"event: error\ndata: {}\n\n"
    b'error: {"code":500}\n\n'  # llama.cpp before 2025
    b"id: 7\nretry: 100\ndata: [DONE]\n\n"
)
FIELDS = [
    END_OF_EVENT,
    END_OF_EVENT,
    (b"data", b'{"a":1}'),
    END_OF_EVENT,
    (b"data", b'{"a": 2}'),
    END_OF_EVENT,
    (b"event", b"error"),
    (b"data", b"{}"),
    END_OF_EVENT,
    (b"error", b'{"code":500}'),
    END_OF_EVENT,
    (b"id", b"7"),
    (b"retry", b"100"),
    (b"data", b"[DONE]"),
    END_OF_EVENT,
]


def read(stream: bytes, size: int) -> list[tuple[bytes, bytes]]:
    reader = SSEReader()
    fields = []
    for start in range(0, len(stream), size):
        fields += reader.feed(stream[start : start + size])
    return fields + reader.flush()


@pytest.mark.parametrize("size", [1, 3, 17, 10_000])
def test_fields_in_order_and_comments_left_out_whatever_the_reads(size):
    assert read(STREAM, size) == FIELDS


@pytest.mark.parametrize("size", [1, 5, 10_000])
def test_crlf_line_ends_read_the_same(size):
    assert read(STREAM.replace(b"\n", b"\r\n"), size) == FIELDS


def test_a_multi_byte_character_split_between_reads_is_joined_before_decoding():
    line = 'data: {"content":"日本"}\n'.encode()
    assert read(line, 1) == [(b"data", '{"content":"日本"}'.encode())]


def test_a_last_line_without_its_end_is_read_at_flush_and_only_once():
    reader = SSEReader()
    assert reader.feed(b"data: [DONE]") == []
    assert reader.flush() == [(b"data", b"[DONE]")]
    assert reader.flush() == []
