"""Arrival stamps taken where the bytes come in, not where a task gets to them.

A task awaiting `StreamReader.readany()` wakes one event-loop turn after its bytes arrived, and
when many streams are ready at once it wakes behind the others' tasks, each parsing its chunk
and handing the event on: a stamp taken when the read returns is late by all of that.

So each connection's protocol stamps the first bytes that arrive while none are unread, in the
event loop's own read callback, and a read takes that stamp (`take`). The loop calls those
callbacks one after another as soon as its poll returns, so what is left is aiohttp's HTTP
parsing of the connections ahead (µs), and what no stamp in the client can take out: bytes
that wait in the kernel while the loop is busy, until its next poll.
"""

from __future__ import annotations

import functools
import time

import aiohttp
from aiohttp.client_proto import ResponseHandler


class StampingHandler(ResponseHandler):
    """aiohttp's connection protocol, stamping `perf_counter_ns()` when bytes arrive: every
    time (`last_ns`), and when no bytes that arrived before are stamped still (`arrival_ns`)."""

    def __init__(self, loop) -> None:
        super().__init__(loop)
        self.arrival_ns: int | None = None
        self.last_ns: int | None = None

    def data_received(self, data: bytes) -> None:
        if data:  # aiohttp calls it empty too, to resume reading: nothing arrived
            self.last_ns = time.perf_counter_ns()
            if self.arrival_ns is None:
                self.arrival_ns = self.last_ns
        super().data_received(data)


def stamping_connector(limit: int) -> aiohttp.TCPConnector:
    """A connection pool whose connections are `StampingHandler`s. aiohttp makes each with the
    connector's `_factory` (every release since 1.0); a test holds this one to it."""
    connector = aiohttp.TCPConnector(limit=limit)
    connector._factory = functools.partial(StampingHandler, loop=connector._loop)
    return connector


def start(response: aiohttp.ClientResponse) -> StampingHandler | None:
    """Call once `response`'s headers are in: its connection's stamps (None: it does not
    stamp), without those of what arrived before its body (an earlier reply's end on a pooled
    connection, the headers). Body bytes that came already came with the last bytes to arrive,
    or just before them: stamped by those. Kept for the whole reply: aiohttp lets the
    connection go as soon as the body's end arrives, before the last read."""
    connection = response.connection
    handler = connection.protocol if connection is not None else None
    if not isinstance(handler, StampingHandler):
        return None
    handler.arrival_ns = handler.last_ns if response.content.total_bytes else None
    return handler


def last(stamps: StampingHandler | None) -> int:
    """When the last bytes arrived (a whole reply read at once); now where the connection does
    not stamp."""
    if stamps is None or stamps.last_ns is None:
        return time.perf_counter_ns()
    stamps.arrival_ns = None
    return stamps.last_ns


def take(stamps: StampingHandler | None) -> int:
    """When the bytes of the read just returned began to arrive (`perf_counter_ns`); now where
    the connection does not stamp. Call it right after the read, with no await between."""
    if stamps is None or stamps.arrival_ns is None:
        return time.perf_counter_ns()
    t_ns, stamps.arrival_ns = stamps.arrival_ns, None
    return t_ns
