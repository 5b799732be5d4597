"""A real peer: `llmbench run chat` against llama-cpp-python's OpenAI server, with no workaround.

Left out of the default run (marked `peer`): it needs llama-cpp-python with its server extra
and takes about a minute. Run it with

    LLMBENCH_LLAMA_CPP_PYTHON=/path/to/venv/bin/python python -m pytest -m peer tests

(the variable names the interpreter that has `llama_cpp`; without it, the one running pytest
must have it). The server gets the flags that make its numbers fair: one thread for decode and
one for prompts, and `--interrupt_requests False`, without which a new request cuts the reply in
progress (those replies are failed requests in llmbench's records). Server and client are
pinned to different cores when there are two. The server sends no timings: its stderr goes to a
file that the run reads (`backend.server_log`) for llama.cpp's own counters, and the summary
and report show them beside the client's. Before the run the server gets one prompt longer
than its batch (512 tokens), so that no prompt of the run is the longest it has seen (its
prompt clock misses those).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from itertools import combinations

import pytest

pytestmark = pytest.mark.peer

SERVER_FLAGS = ["--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", "4096"]
SERVER_FLAGS += ["--interrupt_requests", "False"]
START_TIMEOUT_S = 120
LONG_PROMPT = "word " * 600  # above llama-cpp-python's n_batch of 512 tokens
WORKLOAD = [  # the shipped chat workload, shortened: 3 sessions of 2 turns, 24 tokens a reply
    "--set",
    "workload.sessions=3",
    "--set",
    "workload.turns=2",
    "--set",
    "workload.output_tokens=24",
    "--set",
    "workload.think_time_s=0",
    "--set",
    "backend.kind=openai",
    "--set",
    "backend.weights=q4_1",
]


def llama_cpp_python() -> str:
    """The interpreter that runs the server: $LLMBENCH_LLAMA_CPP_PYTHON, else this one."""
    python = os.environ.get("LLMBENCH_LLAMA_CPP_PYTHON") or sys.executable
    check = subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True)
    if check.returncode != 0:
        pytest.fail(
            f"{python} cannot import llama_cpp.server: install llama-cpp-python[server] there, "
            "or set LLMBENCH_LLAMA_CPP_PYTHON to an interpreter that has it"
        )
    return python


def pinned(cpu: int) -> list[str]:
    """`taskset -c cpu` when taskset exists and the machine has another core for the other side."""
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(cpu)]
    return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def llama_server(tmp_path, smollm2_gguf_path):
    """llama-cpp-python's server on the SmolLM2 GGUF, on 127.0.0.1, its output in a file, and
    once sent a long prompt; its /v1 URL and that file. Stopped at teardown."""
    port = free_port()
    command = [*pinned(0), llama_cpp_python(), "-m", "llama_cpp.server"]
    command += ["--model", str(smollm2_gguf_path), *SERVER_FLAGS]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "server.log"
    with log.open("w") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"the server exited ({server.returncode}): {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer in {START_TIMEOUT_S} s: {log.read_text()}")
            time.sleep(0.5)
        warm = {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 1}
        request = urllib.request.Request(
            f"{url}/chat/completions",
            data=json.dumps(warm).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=START_TIMEOUT_S) as response:
            assert response.status == 200
        yield url, log
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.parametrize("concurrency", [1, 2])
def test_llmbench_runs_chat_against_llama_cpp_python(tmp_path, llama_server, concurrency):
    url, log = llama_server
    out = tmp_path / "run"
    client_cpus = ["--client-cpus", "1"] if pinned(1) else []
    result = subprocess.run(
        [sys.executable, "-m", "llmbench", "run", "chat", *WORKLOAD]
        + ["--set", f"backend.url={url}", "--set", f"backend.server_log={log}"]
        + ["--set", f"load={{kind: concurrency, concurrency: {concurrency}}}"]
        + [*client_cpus, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "results.json").read_text())["summary"]
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["is_warmup"]]
    assert len(measured) == 6 and (summary["num_completed"], summary["num_failed"]) == (6, 0)
    for r in records:
        assert r["error"] is None, r["error"]
        assert 0 < sum(r["chunk_tokens"]) <= r["max_tokens"] == 24
        assert r["finish_reason"] in ("length", "stop")
        assert r["chunk_ns"] == sorted(r["chunk_ns"]) and r["first_content_ns"] == r["chunk_ns"][0]
        assert r["sent_ns"] < r["chunk_ns"][0] <= r["end_ns"]
    if concurrency == 2:  # two requests were in flight at once at least once
        spans = [(r["sent_ns"], r["end_ns"]) for r in measured]
        assert any(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in combinations(spans, 2))
    # The server's own counters, from its log, beside the client's: on every request.
    for r in records:
        timings = r["server_timings"]
        assert timings["source"] == "llama.cpp log", timings
        assert timings["prompt_ms"] > 0 and timings["decode_ms_per_token"] > 0
        assert timings["prompt_tokens"] == r["num_prompt_tokens"]
        assert r["cached_tokens"] == timings["cached_tokens"] >= 0
    assert not [w for w in summary["warnings"] if "server_log" in w], summary["warnings"]
    for key in ("server_prompt_ms", "ttft_overhead_ms", "server_decode_ms_per_token"):
        assert summary[key]["count"] == 6, (key, summary[key])
    assert summary["prefix_cache_hit_rate"] > 0  # the shared system prompt, from the log
    assert "server vs client (ms)" in result.stdout
    assert "## Server vs client" in (out / "report.md").read_text()
