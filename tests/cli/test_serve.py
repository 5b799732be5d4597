"""`llmbench serve` as users start it: its flags reach the server, and a bad flag is one line and
exit 2 before anything listens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
