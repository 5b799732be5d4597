"""Load for memory measurements of `llmbench serve`: a real server in a subprocess, rounds of
concurrent streams with some of them cancelled mid-stream, the server's RSS after each round.

The RSS test runs a few rounds; the long measurement behind the figures in
`llmbench.serve.app` is this module as a script (a few minutes on 2 cores):

    python -m tests.serve.load --requests 22000 --concurrency 100

`--probe` starts the server with a SIGUSR1 handler that prints, to the server's stderr, glibc's
heap statistics (`mallinfo2`), what `malloc_trim(0)` gives back, and (with `--tracemalloc`)
Python's traced total: the tools that tell a growing Python heap from native memory, allocator
fragmentation or pages touched once. `--env KEY=VALUE` passes allocator knobs to the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil

# Started with `python -c` to add the --probe handler; otherwise it is `llmbench serve`.
_PROBED_SERVER = """
import ctypes, gc, os, signal, sys, tracemalloc
if os.environ.get("LOAD_TRACEMALLOC"):
    tracemalloc.start(1)
libc = ctypes.CDLL("libc.so.6")

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = MallInfo2

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

def probe(signum, frame):
    info = libc.mallinfo2()
    before = rss_mb()
    libc.malloc_trim(0)
    print("PROBE " + " ".join([
        f"rss_mb={before:.2f}", f"rss_after_trim_mb={rss_mb():.2f}",
        f"heap_mb={info.arena / 2**20:.2f}", f"heap_used_mb={info.uordblks / 2**20:.2f}",
        f"heap_free_mb={info.fordblks / 2**20:.2f}", f"mmap_mb={info.hblkhd / 2**20:.2f}",
        f"python_mb={tracemalloc.get_traced_memory()[0] / 2**20:.2f}",
        f"objects={len(gc.get_objects())}",
    ]), file=sys.stderr, flush=True)

signal.signal(signal.SIGUSR1, probe)
if os.environ.get("LOAD_NO_BPE_CACHE"):  # attribution: the tokenizer's word cache off
    from llmbench.engine import tokenizer
    byte_level = tokenizer.Tokenizer.byte_level.__func__
    def without_cache(cls):
        made = byte_level(cls)
        made.hf_tokenizer.model._resize_cache(0)
        return made
    tokenizer.Tokenizer.byte_level = classmethod(without_cache)
sys.argv = ["llmbench", *sys.argv[1:]]
from llmbench.cli.main import main
main()
"""


class ServerProcess:
    """`llmbench serve --port 0` in a subprocess; `url` once it listens."""

    def __init__(self, args: list[str], probe: bool = False, env: dict | None = None) -> None:
        command = [sys.executable, "-c", _PROBED_SERVER] if probe else [
            sys.executable, "-m", "llmbench"]  # fmt: skip
        self.process = subprocess.Popen(
            [*command, "serve", "--port", "0", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                raise RuntimeError("llmbench serve exited:\n" + "".join(self.lines))
            self.lines.append(line)
            match = re.search(r"listening on (http://\S+)/v1", line)
            if match:
                self.url = match[1]
                return
        raise RuntimeError("llmbench serve did not start in 120 s")

    def rss_mb(self) -> float:
        return psutil.Process(self.process.pid).memory_info().rss / 2**20

    def probe(self) -> dict[str, float]:
        """Send SIGUSR1 and read the PROBE line (only with probe=True)."""
        import signal

        self.process.send_signal(signal.SIGUSR1)
        while True:
            line = self.process.stderr.readline()
            if line.startswith("PROBE "):
                return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()


async def one_round(
    session: aiohttp.ClientSession,
    url: str,
    num_streams: int,
    max_tokens: int,
    cancel_every: int = 2,
    seed: int = 0,
) -> int:
    """`num_streams` concurrent chat streams; every `cancel_every`-th is dropped after its
    first content chunk. Returns how many ran to [DONE]."""

    async def stream(i: int) -> bool:
        body = {
            "messages": [{"role": "user", "content": f"request {seed}-{i}: tell me something"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            num_chunks = 0
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    return True
                num_chunks += line.startswith(b"data: ")
                if i % cancel_every == 0 and num_chunks >= 2:
                    response.close()  # hang up mid-stream: the server must abort it
                    return False
        return False

    results = await asyncio.gather(*(stream(i) for i in range(num_streams)))
    return sum(results)


async def rounds(url: str, num_rounds: int, num_streams: int, max_tokens: int, on_round) -> None:
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=num_streams)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for r in range(num_rounds):
            await one_round(session, url, num_streams, max_tokens, seed=r)
            on_round(r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="synthetic:tiny")
    parser.add_argument("--kv-cache-memory", default=str(4 * 2**20))
    parser.add_argument("--dtype", default="float32", help="the server's --dtype (docs: float32)")
    parser.add_argument("--requests", type=int, default=22_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--every", type=int, default=1_000, help="report every N requests")
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--tracemalloc", action="store_true", help="--probe: trace Python too")
    parser.add_argument("--threads", default=None, help="the server's --threads")
    parser.add_argument(
        "--no-bpe-cache", action="store_true", help="--probe: turn the tokenizer's word cache off"
    )
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE for the server (allocator knobs)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON lines of the figures")
    parser.add_argument(
        "--fit-from", type=int, default=12_000, help="fit RSS growth over requests from here on"
    )
    args = parser.parse_args()

    env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.env))
    if args.tracemalloc:
        env["LOAD_TRACEMALLOC"] = "1"
    if args.no_bpe_cache:
        env["LOAD_NO_BPE_CACHE"] = "1"
    server_args = ["--model", args.model, "--kv-cache-memory", args.kv_cache_memory]
    server_args += ["--dtype", args.dtype]
    if args.threads:
        server_args += ["--threads", args.threads]
    server = ServerProcess(server_args, probe=args.probe, env=env)
    rows = []
    started = time.monotonic()
    report_every = max(1, args.every // args.concurrency)

    def on_round(r: int) -> None:
        if (r + 1) % report_every:
            return
        row = {"requests": (r + 1) * args.concurrency, "rss_mb": round(server.rss_mb(), 2)}
        if args.probe:
            row.update(server.probe())
        row["elapsed_s"] = round(time.monotonic() - started, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")

    try:
        first = {"requests": 0, "rss_mb": round(server.rss_mb(), 2)}
        if args.probe:
            first.update(server.probe())
        print(json.dumps(first), flush=True)
        num_rounds = args.requests // args.concurrency
        asyncio.run(rounds(server.url, num_rounds, args.concurrency, args.max_tokens, on_round))
    finally:
        server.stop()
    late = [(row["requests"], row["rss_mb"]) for row in rows if row["requests"] >= args.fit_from]
    if len(late) >= 2:
        print(json.dumps({"fit_from": args.fit_from, **growth_per_1000(late)}))


def growth_per_1000(points: list[tuple[int, float]]) -> dict[str, float]:
    """Least-squares slope of RSS over requests, in MB per 1,000 requests, and the end-to-end
    difference over the same span."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in points)
    variance = sum((x - mean_x) ** 2 for x, _ in points)
    span = points[-1][0] - points[0][0]
    return {
        "slope_mb_per_1000": round(covariance / variance * 1000, 4),
        "end_to_end_mb_per_1000": round((points[-1][1] - points[0][1]) / span * 1000, 4),
    }


if __name__ == "__main__":
    main()
