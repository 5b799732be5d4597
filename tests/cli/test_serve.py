"""`llmbench serve` as users start it: its flags reach the server, and a bad flag is one line and
exit 2 before anything listens."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.serve.load import ServerProcess

TINY = ["--model", "synthetic:tiny", "--kv-cache-memory", str(4 * 2**20)]


def llmbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmbench", *args], capture_output=True, text=True, timeout=120
    )


def get(url: str, key: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--max-model-len", "5000"],
            "error: serve: --max-model-len 5000 is outside [1, 4096], the model's context "
            "window; lower it",
        ),
        (["--record", "/proc/no-such-place"], "error: serve --record: cannot write "),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(args, message):
    out = llmbench("serve", *TINY, "--port", "0", *args)
    assert out.returncode == 2, out.stderr
    [*_, last] = out.stderr.strip().splitlines()
    assert last.startswith(message) and "Traceback" not in out.stderr


def test_flags_reach_the_server_and_the_key_comes_from_the_environment(tmp_path):
    env = dict(os.environ, LLMBENCH_API_KEY="sk-from-env")
    args = [*TINY, "--served-model-name", "tiny-chat", "--max-model-len", "128"]
    args += ["--record", str(tmp_path / "rec"), "--vllm-metrics"]
    server = ServerProcess(args, env=env)
    try:
        assert "serving it as 'tiny-chat'; API key required" in "".join(server.lines)
        assert get(server.url + "/v1/models")[0] == 401
        status, listing = get(server.url + "/v1/models", key="sk-from-env")
        assert status == 200
        assert [(m["id"], m["max_model_len"]) for m in listing["data"]] == [("tiny-chat", 128)]
        # bfloat16 by default, as the shipped workloads run; said where a client reads it
        assert "bfloat16 on cpu" in "".join(server.lines)
        assert [(m["dtype"], m["quantization"]) for m in listing["data"]] == [("bfloat16", None)]
        with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
            assert b'vllm:num_requests_running{model_name="tiny-chat"}' in response.read()
        assert (tmp_path / "rec" / "steps.jsonl").is_file()
    finally:
        server.stop()


def test_serve_speculates_and_streams_what_the_engine_decodes_plainly():
    from llmbench.engine.engine import EngineConfig, LLMEngine
    from llmbench.engine.sampling import SamplingParams

    prompt = "abcabcabcabc"
    engine = LLMEngine(EngineConfig(model="synthetic:tiny", device="cpu", kv_cache_memory=2**22))
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    expected = engine.tokenizer.decode(engine.generate([prompt], params)[0])
    server = ServerProcess([*TINY, "--speculative", "ngram:3"])
    try:
        assert "speculative ngram (n 4 down to 2), k=3" in "".join(server.lines)
        body = {"model": "synthetic:tiny", "prompt": prompt, "max_tokens": 16}
        body |= {"temperature": 0, "ignore_eos": True}
        request = urllib.request.Request(
            server.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.loads(response.read())
        assert reply["choices"][0]["text"] == expected
        assert reply["usage"]["completion_tokens"] == 16
    finally:
        server.stop()


def test_sigterm_ends_a_server_whose_record_disk_is_full(tmp_path):
    # Every write to steps.jsonl fails with ENOSPC, as on a full disk: it is /dev/full.
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / "steps.jsonl").symlink_to("/dev/full")
    server = ServerProcess([*TINY, "--record", str(folder)])
    try:
        body = {"model": "synthetic:tiny", "prompt": "abc", "max_tokens": 4, "ignore_eos": True}
        assert post(server.url + "/v1/completions", body)[0] == 200
        # The writer counts off the engine thread, a batch at a time (it may fail the first
        # steps before it has taken the last ones): wait until all of them are counted.
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
                metrics = response.read().decode()
            [line] = [s for s in metrics.splitlines() if s.startswith("llmbench_record_d")]
            dropped = float(line.split()[1])
            if dropped >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert dropped >= 4  # the request's prefill and decode steps
        assert post(server.url + "/v1/completions", body)[0] == 200  # serving goes on
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        returncode = server.process.wait(timeout=60)
        took_s = time.monotonic() - started
    finally:
        server.stop()
    stderr = "".join(server.lines) + server.process.stderr.read()
    assert returncode == 0 and "Traceback" not in stderr
    assert took_s < 10  # ≈ 0.1 s when idle; 10 s: a busy machine, far below a hang
    assert stderr.count("--record cannot write") == 1
    assert "--record dropped" in stderr and "No space left on device" in stderr


def test_the_connection_flags_reach_the_server():
    args = [*TINY, "--header-timeout", "0.5", "--body-timeout", "0.5", "--max-connections", "2"]
    server = ServerProcess(args)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"
        stalled_body = socket.create_connection(("127.0.0.1", port), timeout=30)
        stalled_body.sendall(head)
        stalled_head = socket.create_connection(("127.0.0.1", port), timeout=30)
        stalled_head.sendall(b"GET /health HT")
        over_the_cap = socket.create_connection(("127.0.0.1", port), timeout=30)
        replies = [read_all(s) for s in (over_the_cap, stalled_head, stalled_body)]
    finally:
        server.stop()
    assert replies[0].startswith(b"HTTP/1.1 503 ")  # --max-connections 2
    assert replies[1] == b""  # --header-timeout: closed unanswered
    assert replies[2].startswith(b"HTTP/1.1 408 ")  # --body-timeout
    assert b"--body-timeout" in replies[2]


def test_a_malformed_request_is_one_line_on_stderr_not_a_traceback():
    """A header line past aiohttp's 8 KiB, a header without its colon: each answered 400, and
    on the server's stderr one line naming the client and what was wrong (it was aiohttp's
    "Error handling request" with a traceback of its parser)."""
    server = ServerProcess(TINY)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        replies = []
        for head in (b"X-Big: " + b"a%s" * 5000, b"Host x"):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /health HTTP/1.1\r\n" + head + b"\r\n\r\n")
            replies.append(read_all(sock))
        assert get(server.url + "/v1/models")[0] == 200  # serving goes on
    finally:
        server.stop()
    stderr = "".join(server.lines) + server.process.stderr.read()
    assert all(reply.startswith(b"HTTP/1.0 400 ") for reply in replies)
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if "malformed request" in line]
    assert len(lines) == 2
    assert lines[0].startswith(
        "serve: answered 400 to a malformed request from 127.0.0.1: Got more than 8190 bytes "
        "when reading: b'a%sa%s"
    )
    assert lines[1] == (
        "serve: answered 400 to a malformed request from 127.0.0.1: Invalid header token: "
        "b'Host x' ^"
    )


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (30 s at most)."""
    received = b""
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_the_cli_loads_the_server_only_to_serve():
    """`llmbench` names `serve`'s defaults from `serve.limits`, which imports no aiohttp: every
    other command (and `--help`) starts without the server's ~0.4 s of imports."""
    script = (
        "import sys; import llmbench.cli.main; from llmbench.serve import limits; "
        "print(any(m == 'aiohttp' or m.startswith('aiohttp.') for m in sys.modules)); "
        "from llmbench.serve import ServeConfig; "
        "print(ServeConfig.__dataclass_fields__['max_connections'].default)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "1000"]  # the server's names still load on demand
