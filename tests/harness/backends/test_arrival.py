"""Arrival stamps: a read is stamped when its bytes came in, not when its task got to them.

The server is a bare socket the test writes to by hand, so the order of events is fixed: bytes
sent, the event loop has fed them to the response (its `total_bytes` grew), the loop is then
held (as other streams' parsing holds it), and only then is the read made.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import aiohttp

from llmbench.harness.backends import arrival

HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
HELD_S = 0.05  # the loop held between the bytes' arrival and the read


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def fed(response: aiohttp.ClientResponse, num_bytes: int) -> None:
    """Until the event loop has fed `num_bytes` of body to `response` in all."""
    while response.content.total_bytes < num_bytes:
        await asyncio.sleep(0.001)


@contextlib.asynccontextmanager
async def hand_driven(stamping: bool = True):
    """A client session (one stamping connection, or aiohttp's own pool) and a server the test
    writes by hand: yields `ask()`, which starts a GET and returns the server's end of the
    connection, the request read off it, and the pending response."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
        connector = arrival.stamping_connector(1) if stamping else None
        async with aiohttp.ClientSession(connector=connector) as session:
            ends: list[socket.socket] = []

            async def ask() -> tuple[socket.socket, asyncio.Future]:
                request = asyncio.ensure_future(session.get(url))
                if not ends:  # the first request opens the connection; the next reuse it
                    ends.append((await loop.sock_accept(listener))[0])
                await loop.sock_recv(ends[0], 4096)
                return ends[0], request

            try:
                yield ask
            finally:
                for end in ends:
                    end.close()


async def exchange() -> dict[str, int]:
    """One request to a hand-driven server: the headers, 30 ms later a first chunk read after
    the loop was held, then two chunks read together, then the last chunk with the body's
    end."""
    async with hand_driven() as ask:
        server, request = await ask()
        server.sendall(HEADERS)
        async with await request as response:
            stamps = arrival.start(response)
            assert isinstance(stamps, arrival.StampingHandler)
            await asyncio.sleep(0.03)
            times = {"first_sent": time.perf_counter_ns()}
            server.sendall(chunk(b"data: 1\n\n"))
            await fed(response, 9)
            times["held"] = time.perf_counter_ns()
            time.sleep(HELD_S)
            assert await response.content.readany() == b"data: 1\n\n"
            times["first"] = arrival.take(stamps)
            times["first_read"] = time.perf_counter_ns()
            times["second_sent"] = time.perf_counter_ns()
            server.sendall(chunk(b"data: 2\n\n"))
            await fed(response, 18)
            server.sendall(chunk(b"data: 3\n\n"))
            await fed(response, 27)
            time.sleep(HELD_S)
            assert await response.content.readany() == b"data: 2\n\ndata: 3\n\n"
            times["second"] = arrival.take(stamps)
            times["unstamped"] = arrival.take(stamps)  # nothing came in since
            times["last_sent"] = time.perf_counter_ns()
            server.sendall(chunk(b"data: 4\n\n") + b"0\r\n\r\n")  # and the body's end
            await fed(response, 36)
            assert response.connection is None  # aiohttp let the connection go
            time.sleep(HELD_S)
            assert await response.content.readany() == b"data: 4\n\n"
            times["last"] = arrival.take(stamps)
            times["end"] = time.perf_counter_ns()
    return times


def test_a_read_is_stamped_when_its_bytes_came_in_not_when_the_loop_got_to_it():
    times = asyncio.run(exchange())
    # The first chunk: after it was sent, before the loop was held; not the headers' arrival
    # 30 ms before it (cleared when the response began).
    assert times["first_sent"] <= times["first"] <= times["held"]
    assert times["first_read"] - times["first"] >= HELD_S * 1e9
    # Two chunks read together carry the arrival of the earlier one.
    assert times["second_sent"] <= times["second"] < times["end"] - HELD_S * 1e9
    # A take with nothing new stamped since the last is the time of the call.
    assert times["second"] < times["unstamped"] <= times["last_sent"]
    # The last read, made after the body's end let the connection go, keeps its stamp.
    assert times["last_sent"] <= times["last"] < times["end"] - HELD_S * 1e9


def test_a_connection_that_does_not_stamp_gives_the_time_of_the_read():
    async def take_from_plain_session() -> tuple[int, int, int]:
        async with hand_driven(stamping=False) as ask:
            server, request = await ask()
            server.sendall(HEADERS + chunk(b"data: 1\n\n"))
            async with await request as response:
                stamps = arrival.start(response)
                assert stamps is None
                await fed(response, 9)
                time.sleep(HELD_S)
                before = time.perf_counter_ns()
                await response.content.readany()
                return before, arrival.take(stamps), time.perf_counter_ns()

    before, stamp, after = asyncio.run(take_from_plain_session())
    assert before <= stamp <= after


async def pooled_exchange() -> tuple[int, int, int]:
    """Two requests over one pooled connection: the first reply's end arrives after its last
    read (a stamp nobody takes); the second's headers and body arrive in one write."""
    async with hand_driven() as ask:
        server, request = await ask()
        server.sendall(HEADERS + chunk(b"data: 1\n\n"))
        async with await request as response:
            stamps = arrival.start(response)
            await response.content.readany()
            arrival.take(stamps)
            server.sendall(b"0\r\n\r\n")  # the reply's end: stamped, never taken
            await response.content.read()
        await asyncio.sleep(0.03)
        same, request = await ask()  # the same connection: no new accept
        assert same is server
        sent = time.perf_counter_ns()
        server.sendall(HEADERS + chunk(b"data: 2\n\n"))
        async with await request as response:
            received = time.perf_counter_ns()
            stamps = arrival.start(response)
            assert await response.content.readany() == b"data: 2\n\n"
            return sent, arrival.take(stamps), received


def test_a_reply_on_a_pooled_connection_is_not_stamped_with_the_last_ones_end():
    sent, stamp, received = asyncio.run(pooled_exchange())
    assert sent <= stamp <= received


def test_a_reply_read_whole_is_stamped_when_its_last_bytes_came_in():
    """A server that does not stream (a JSON reply) is one read of the whole body: its time is
    its last bytes' arrival, not its first's, nor the read's."""

    async def read_whole() -> tuple[int, int, int]:
        body = b'{"choices": []}'
        async with hand_driven() as ask:
            server, request = await ask()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            server.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
            async with await request as response:
                stamps = arrival.start(response)
                await asyncio.sleep(0.03)
                sent = time.perf_counter_ns()
                server.sendall(body[5:])
                await fed(response, len(body))
                time.sleep(HELD_S)
                assert await response.content.read() == body
                return sent, arrival.last(stamps), time.perf_counter_ns()

    sent, stamp, read = asyncio.run(read_whole())
    assert sent <= stamp < read - HELD_S * 1e9
