"""The listening socket of `llmbench serve`: at most `--max-connections` open connections.

aiohttp has no cap of its own, so the server listens with its own protocol factory: each
accepted connection is counted while it is open and handed to aiohttp's request handler; a
connection beyond the cap is answered at once with a 503 (OpenAI's error body,
`Connection: close`) and closed, before a byte of it is read. The server goes on answering
the connections it has, /health included.

A request's head must arrive within `--header-timeout` of its connection opening (or of the
previous reply on a kept-alive connection): that is aiohttp's keep-alive timeout, which closes
a connection still waiting for a complete request head. A body's own deadline is
`generate.Body.timeout_s`.

A head aiohttp cannot parse (a header line past 8 KiB, a bad request line) is answered 400 by
aiohttp and logged by `HTTP_LOG` as one line naming the client and what was wrong: the
client's mistake, not a traceback on the server's stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

from llmbench.errors import UserError
from llmbench.serve.protocol import ApiError


class _MalformedRequestsInOneLine(logging.Filter):
    """aiohttp's "Error handling request from <client>" with the traceback of the parse error
    it answered 400 (an `HttpProcessingError`) becomes one line; any other error keeps its
    traceback (a server bug is ours to read)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            reason = " ".join(str(error.message).split())[:200].replace("%", "%%")
            record.msg = f"serve: answered {error.code} to a malformed request from %s: {reason}"
            record.exc_info = None
            record.exc_text = None
        return True


# The logger aiohttp's request handler reports errors to (AppRunner's `logger`).
HTTP_LOG = logging.getLogger("llmbench.serve.http")
HTTP_LOG.addFilter(_MalformedRequestsInOneLine())

# Descriptors the process holds besides its connections: the listening socket, the standard
# streams, the --record file, the model's files while they load, torch's and the event loop's
# own (≈ 30 measured on a CPU server), with room to spare.
OTHER_FILES = 128


class ConnectionCap:
    """The listening socket's protocol factory: `handler_factory()` (aiohttp's
    `runner.server`) while fewer than `max_connections` connections are open, else a refusal."""

    def __init__(
        self, handler_factory: Callable[[], asyncio.Protocol], max_connections: int
    ) -> None:
        self._handler_factory = handler_factory
        self.max_connections = max_connections
        self.num_open = 0
        self.num_refused = 0

    def __call__(self) -> asyncio.Protocol:
        if self.num_open >= self.max_connections:
            self.num_refused += 1
            if self.num_refused == 1:
                print(
                    f"llmbench serve: {self.num_open} connections are open "
                    f"(--max-connections {self.max_connections}): refusing more with a 503",
                    file=sys.stderr,
                    flush=True,
                )
            return _Refusal(self.max_connections)
        self.num_open += 1
        return _Counted(self._handler_factory(), self)


def check_open_files(max_connections: int) -> None:
    """Make room for `max_connections` sockets under the open-files limit (raising the soft
    limit up to the hard one if need be), or say in one line that there is none: past the
    limit, accept() fails and the event loop stops accepting for a second at a time."""
    needed = max_connections + OTHER_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return
    raise UserError(
        f"serve: --max-connections {max_connections} needs {needed} open files and this "
        f"process may open {hard} (ulimit -Hn); lower --max-connections to at most "
        f"{hard - OTHER_FILES}"
    )


class _Counted(asyncio.Protocol):
    """aiohttp's handler for one connection, counted while the connection is open."""

    def __init__(self, handler: asyncio.Protocol, cap: ConnectionCap) -> None:
        self._handler = handler
        self._cap = cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cap.num_open -= 1
        self._handler.connection_lost(exc)


class _Refusal(asyncio.Protocol):
    """A connection over the cap: a 503 with OpenAI's error body, then closed."""

    def __init__(self, max_connections: int) -> None:
        error = ApiError(
            503,
            f"the server has its {max_connections} connections open (--max-connections); "
            "retry when one closes",
            error_type="server_error",
        )
        body = json.dumps(error.body()).encode()
        self._reply = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n" % len(body)
        ) + body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self._reply)
        transport.close()  # after the reply is flushed; nothing the client sent is read
