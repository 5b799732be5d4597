"""Server-Sent Events, read from network reads: the fields of every complete line, in order.

An SSE stream is lines of `field: value` (one leading space of the value is dropped, so TGI's
`data:{...}` and vLLM's `data: {...}` read the same), events end at a blank line, and lines that
start with `:` are comments (keep-alives: sse-starlette's `: ping - <time>`, axum's `:`). Lines
end in `\\n` or `\\r\\n`; a line split across reads waits for its end. A lone `\\r` as a line end
(legal SSE, sent by no LLM server) is not supported.
"""

from __future__ import annotations

END_OF_EVENT = (b"", b"")  # what a blank line reads as


class SSEReader:
    """Bytes in, `(field, value)` pairs out: `(b"data", b'{"choices": ...}')`, `(b"event",
    b"error")`, `END_OF_EVENT` for a blank line. Comments are left out."""

    def __init__(self) -> None:
        self._tail = b""  # an incomplete line, waiting for the rest of it

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The fields of the lines that `data` completes (with what an earlier read left)."""
        lines = (self._tail + data).split(b"\n") if self._tail else data.split(b"\n")
        self._tail = lines.pop()
        return [field for field in map(_field, lines) if field is not None]

    def flush(self) -> list[tuple[bytes, bytes]]:
        """At the end of the body: the field of a last line that had no line end (a server
        that ends with `data: [DONE]` and no newline)."""
        tail, self._tail = self._tail, b""
        field = _field(tail) if tail.strip() else None
        return [] if field is None else [field]


def _field(line: bytes) -> tuple[bytes, bytes] | None:
    if line.endswith(b"\r"):
        line = line[:-1]
    if not line:
        return END_OF_EVENT
    if line.startswith(b":"):
        return None  # a comment
    name, _, value = line.partition(b":")
    if value.startswith(b" "):
        value = value[1:]
    return name, value
