"""The app around generation: every endpoint and flag of `llmbench serve`, the API key, the
metrics as Prometheus reads them, and engine crashes (a failing forward pass, a failing sampler)
that must end open streams at once and turn the server unhealthy, never hang it."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import types
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

import llmbench
from llmbench.engine import runner
from llmbench.errors import UserError
from llmbench.serve import ServeConfig, build_app, recorder, run_server
from tests.engine.helpers import crash_after
from tests.serve.helpers import serving, tiny_engine

NAME = "my-served-name"
KEY = "sk-local-secret"
TIMEOUT = aiohttp.ClientTimeout(total=60)
NO_HANG_S = 20.0  # far above any step of the tiny model: a hang fails here, not in CI's limit
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": 4}
# The same through the openai client, which sends vLLM's extra fields in `extra_body`.
CLIENT_GREEDY = {"temperature": 0, "max_tokens": 4, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()  # synthetic:tiny: byte-level vocabulary, 4,096-token window


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("record") / "steps-here"


@pytest.fixture(scope="module")
def url(engine, record_dir):
    config = ServeConfig(
        served_model_name=NAME,
        api_key=KEY,
        max_model_len=64,
        record_dir=record_dir,
        vllm_metrics=True,
    )
    with serving(engine, config) as url:
        yield url


async def call(
    method: str, url: str, body: Any = None, key: str | None = KEY
) -> tuple[int, Any, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.request(method, url, json=body, headers=headers) as response:
            text = await response.text()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text
            return response.status, payload, dict(response.headers)


def request(method: str, url: str, body: Any = None, key: str | None = KEY):
    status, payload, _ = asyncio.run(call(method, url, body, key))
    return status, payload


# -- simple endpoints -------------------------------------------------------------------------


def test_health_and_version_need_no_key(url):
    assert request("GET", url + "/health", key=None) == (200, "ok")
    assert request("GET", url + "/version", key=None) == (200, {"version": llmbench.__version__})


def test_models_list_and_one_model_by_id(url):
    status, listing = request("GET", url + "/v1/models")
    assert status == 200 and listing["object"] == "list"
    [card] = listing["data"]
    assert card["id"] == NAME and card["object"] == "model" and card["owned_by"] == "llmbench"
    assert card["max_model_len"] == 64  # --max-model-len, below the model's 4,096
    # llmbench's own: what a client needs to cost the bytes a step reads
    assert (card["dtype"], card["quantization"]) == ("float32", None)
    assert request("GET", url + f"/v1/models/{NAME}") == (200, card)
    status, error = request("GET", url + "/v1/models/synthetic:tiny")
    assert status == 404 and error["error"]["code"] == "model_not_found"


def test_tokenize_a_prompt_and_a_chat_and_detokenize(url, engine):
    status, reply = request("POST", url + "/tokenize", {"prompt": "hi!"})
    assert status == 200 and reply == {"count": 3, "max_model_len": 64, "tokens": [104, 105, 33]}
    messages = [{"role": "user", "content": "hi"}]
    status, reply = request("POST", url + "/tokenize", {"model": NAME, "messages": messages})
    assert status == 200 and reply["tokens"] == engine.tokenizer.encode_chat(messages)
    assert reply["count"] == len(reply["tokens"])
    body = {"messages": messages, "add_generation_prompt": False}
    status, reply = request("POST", url + "/tokenize", body)
    assert reply["tokens"] == engine.tokenizer.encode_chat(messages, add_generation_prompt=False)
    assert request("POST", url + "/detokenize", {"tokens": [104, 105, 33]}) == (
        200,
        {"prompt": "hi!"},
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": []}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": "hi"}, "messages"),
        ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
        ("/detokenize", {"tokens": "hi"}, "tokens"),
        ("/detokenize", {"tokens": [1, 400]}, "tokens"),  # the tokenizer has 259 ids
    ],
)
def test_tokenize_and_detokenize_refuse_bad_bodies(url, path, body, param):
    status, reply = request("POST", url + path, body)
    assert status in (400, 404) and reply["error"]["param"] == param


def test_unknown_route_and_method_are_json_errors(url):
    status, reply = request("GET", url + "/v1/nothing")
    assert status == 404 and reply["error"]["message"] == "Invalid URL (GET /v1/nothing)"
    status, reply = request("GET", url + "/v1/completions")
    assert status == 405 and reply["error"]["message"]


def test_reset_prefix_cache_empties_the_cache_between_requests(url):
    body = {"model": NAME, "prompt": "x" * 40, **GREEDY}  # 40 byte tokens: 2 blocks of 16

    def cached() -> int:
        status, reply = request("POST", url + "/v1/completions", body)
        assert status == 200, reply
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached()
    assert cached() == 32  # the first request's 2 full blocks
    assert request("POST", url + "/reset_prefix_cache") == (200, {"reset": True})
    assert cached() == 0


# -- flags ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/models", "/v1/chat/completions", "/tokenize", "/reset_prefix_cache"]
)
def test_api_key_missing_or_wrong_is_401(url, path):
    method = "GET" if path == "/v1/models" else "POST"
    body = None if method == "GET" else {"prompt": "hi", "messages": [{"role": "user"}]}
    status, reply, headers = asyncio.run(call(method, url + path, body, key=None))
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert reply["error"]["type"] == "invalid_request_error"
    assert "didn't provide an API key" in reply["error"]["message"]
    status, reply, _ = asyncio.run(call(method, url + path, body, key="sk-wrong"))
    assert status == 401 and reply["error"]["code"] == "invalid_api_key"


def test_the_openai_client_with_the_right_and_a_wrong_key(url):
    good = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [model.id for model in good.models.list()] == [NAME]
    assert good.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        good.models.retrieve("another-model")
    bad = openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_clients_must_use_the_served_model_name(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    reply = client.completions.create(model=NAME, prompt="hi", **CLIENT_GREEDY)
    assert reply.model == NAME and reply.usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError, match="serves `my-served-name`"):
        client.completions.create(model="synthetic:tiny", prompt="hi", **CLIENT_GREEDY)


def test_max_model_len_caps_prompt_plus_max_tokens(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    client.completions.create(model=NAME, prompt="x" * 60, max_tokens=4, temperature=0)  # 64
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.completions.create(model=NAME, prompt="x" * 60, max_tokens=5, temperature=0)
    assert excinfo.value.code == "context_length_exceeded"
    assert "maximum context length is 64 tokens" in str(excinfo.value)
    # A chat with no max_tokens gets what the window leaves.
    messages = [{"role": "user", "content": "hi"}]
    _, tokens = request("POST", url + "/tokenize", {"messages": messages})
    reply = client.chat.completions.create(
        model=NAME, messages=messages, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage.total_tokens == 64 and reply.usage.prompt_tokens == tokens["count"]


def test_max_model_len_beyond_the_model_is_refused_before_serving(engine):
    config = ServeConfig(served_model_name=NAME, max_model_len=5000)
    with pytest.raises(UserError, match=r"--max-model-len 5000 is outside \[1, 4096\]"):
        build_app(engine, config)


def test_record_streams_engine_steps_while_serving(url, record_dir):
    path = record_dir / "steps.jsonl"
    before = len(path.read_text().splitlines()) if path.exists() else 0
    status, reply = request("POST", url + "/v1/completions", {"prompt": "abc", **GREEDY})
    assert status == 200
    for _ in range(200):  # written off the engine thread: wait for the writer, not the server
        lines = path.read_text().splitlines()
        if len(lines) >= before + 4:
            break
        threading.Event().wait(0.01)
    steps = [json.loads(line) for line in lines[before:]]
    assert len(steps) >= 4  # one prefill step, three decode steps (at least)
    assert {"t_start_ns", "t_end_ns", "num_prefill_tokens", "context_lens"} <= set(steps[0])
    assert sum(step["num_prefill_tokens"] for step in steps) >= 3


def test_a_record_disk_that_fails_is_said_once_counted_in_metrics_and_serving_goes_on(
    tmp_path, capsys
):
    # A steps.jsonl whose every write fails with ENOSPC, as on a full disk: /dev/full.
    folder = tmp_path / "full-disk"
    folder.mkdir()
    (folder / "steps.jsonl").symlink_to("/dev/full")
    with serving(tiny_engine(), ServeConfig(NAME, record_dir=folder)) as url:
        for _ in range(3):
            status, _ = request("POST", url + "/v1/completions", {"prompt": "abc", **GREEDY})
            assert status == 200  # serving goes on
        for _ in range(400):  # the writer counts off the engine thread: wait for it
            metrics = scrape(url)
            dropped = metrics["llmbench_record_dropped_steps"].samples[0].value
            if dropped >= 12:
                break
            threading.Event().wait(0.01)
        assert dropped >= 12  # 3 requests x (1 prefill + 3 decode steps), at least
        assert metrics["llmbench_record_written_steps"].samples[0].value == 0
        said = [line for line in capsys.readouterr().err.splitlines() if "--record" in line]
        assert said == [
            f"llmbench serve: --record cannot write {folder / 'steps.jsonl'}: No space left on "
            "device; steps are no longer recorded (counted in "
            "llmbench_record_dropped_steps_total), serving goes on"
        ]
    said = capsys.readouterr().err  # at shutdown, the count
    assert f"--record dropped {int(dropped)} steps (writing failed: No space left on" in said


def test_a_server_whose_record_disk_hangs_with_a_full_queue_stops_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "MAX_PENDING_STEPS", 3)
    # One step a batch: a writer woken late would otherwise take every step queued by then (a
    # 2-core AMD EPYC's took 3, so 6 were dropped, not 8).
    monkeypatch.setattr(recorder, "MAX_BATCH_STEPS", 1)
    release = threading.Event()

    def hung_disk(record):  # the writer takes the first step and never gets past it
        release.wait()
        return {}

    monkeypatch.setattr(recorder, "dataclasses", types.SimpleNamespace(asdict=hung_disk))
    try:
        with serving(tiny_engine(), ServeConfig(NAME, record_dir=tmp_path)) as url:
            for _ in range(3):  # 12 steps or more: 1 taken, 3 queued, the rest dropped
                assert request("POST", url + "/v1/completions", {"prompt": "a", **GREEDY})[0] == 200
            # the count may trail the responses on a slow machine: wait for it, as above
            deadline = time.monotonic() + 10
            while True:
                dropped = scrape(url)["llmbench_record_dropped_steps"].samples[0].value
                if dropped >= 8 or time.monotonic() > deadline:
                    break
                threading.Event().wait(0.01)
            assert dropped >= 8
            stopping = time.monotonic()
        took_s = time.monotonic() - stopping  # `serving` fails if the server takes 30 s
        assert took_s < 10  # CLOSE_TIMEOUT_S is 1 s; 10 s: a busy machine
    finally:
        release.set()


def test_an_unexpected_error_is_a_500_with_openais_error_body(capsys):
    engine = tiny_engine()  # its own: the module's engine may be serving
    real = engine.tokenizer.hf_tokenizer

    class BrokenOnce:  # a tokenizer that fails the first time it encodes
        is_broken = True

        def encode_batch(self, texts, **kwargs):
            self._break_once()
            return real.encode_batch(texts, **kwargs)

        def encode(self, text, **kwargs):
            self._break_once()
            return real.encode(text, **kwargs)

        def _break_once(self):
            if BrokenOnce.is_broken:
                BrokenOnce.is_broken = False
                raise RuntimeError("injected tokenizer bug")

        def __getattr__(self, name):
            return getattr(real, name)

    engine.tokenizer.hf_tokenizer = BrokenOnce()
    with serving(engine, ServeConfig(NAME)) as url:
        status, reply = request("POST", url + "/tokenize", {"prompt": "hi"})
        assert status == 500
        assert reply == {
            "error": {
                "message": "internal server error: RuntimeError: injected tokenizer bug",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }
        assert request("POST", url + "/tokenize", {"prompt": "hi"})[0] == 200  # it goes on
    assert "llmbench serve: POST /tokenize failed: RuntimeError: injected tokenizer bug" in (
        capsys.readouterr().err
    )


# -- metrics ----------------------------------------------------------------------------------


def scrape(url: str) -> dict[str, Any]:
    status, text = request("GET", url + "/metrics", key=None)  # open, as Prometheus scrapes it
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(text)}


def buckets(family) -> dict[str, float]:
    return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}


def count(family) -> float:
    return next(s.value for s in family.samples if s.name.endswith("_count"))


def test_metrics_histograms_move_after_requests(url):
    before = scrape(url)
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    for _ in range(3):
        client.completions.create(model=NAME, prompt="abcde", **CLIENT_GREEDY)
    after = scrape(url)
    for name in (
        "llmbench_time_to_first_token_seconds",
        "llmbench_e2e_request_latency_seconds",
        "llmbench_request_queue_time_seconds",
        "llmbench_time_per_output_token_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert after[name].type == "histogram"
        assert count(after[name]) - count(before[name]) == 3, name
        assert buckets(after[name])["+Inf"] - buckets(before[name])["+Inf"] == 3, name
        assert buckets(after[name]) != buckets(before[name]), name
    for name in ("llmbench_inter_token_latency_seconds", "vllm:inter_token_latency_seconds"):
        assert count(after[name]) - count(before[name]) == 9  # 3 gaps after each first token
    tokens = "llmbench_generation_tokens"
    assert after[tokens].samples[0].value - before[tokens].samples[0].value == 12
    prompt = "vllm:prompt_tokens"
    assert after[prompt].samples[0].value - before[prompt].samples[0].value == 15
    assert after[prompt].samples[0].labels == {"model_name": NAME}
    reasons = {s.labels["finish_reason"]: s.value for s in after["llmbench_requests"].samples
               if s.name.endswith("_total")}  # fmt: skip
    assert reasons["length"] >= 3
    assert after["vllm:num_requests_running"].samples[0].value == 0
    assert 0 <= after["vllm:kv_cache_usage_perc"].samples[0].value <= 1


# -- serving itself ---------------------------------------------------------------------------


def test_port_in_use_is_a_user_error(engine):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):
            run_server(engine, ServeConfig(NAME), port=port, stop=threading.Event())


async def _read_stream(session, url: str, body: dict) -> list[Any]:
    async with session.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200
        return [
            json.loads(line[6:]) if line[6:].strip() != b"[DONE]" else "[DONE]"
            async for line in response.content
            if line.startswith(b"data: ")
        ]


@pytest.mark.parametrize("where", ["forward", "sampler"])
def test_engine_crash_ends_open_streams_and_turns_the_server_unhealthy(monkeypatch, where):
    engine = tiny_engine()
    if where == "forward":
        error = RuntimeError("injected forward failure")
        monkeypatch.setattr(engine.model, "forward", crash_after(3, engine.model.forward, error))
    else:
        error = ValueError("injected sampler failure")
        monkeypatch.setattr(runner, "sample", crash_after(3, runner.sample, error))
    name = f"{type(error).__name__}: {error}"

    async def go():
        app = build_app(engine, ServeConfig(NAME))
        async with TestServer(app) as test_server, aiohttp.ClientSession() as session:
            base = str(test_server.make_url(""))
            long = {"ignore_eos": True, "max_tokens": 2_000, "temperature": 0}
            streams = [
                _read_stream(session, base + "/v1/completions", {"prompt": f"p{i}", **long})
                for i in range(3)
            ]
            chat = {"messages": [{"role": "user", "content": "x"}], **long}
            collected = session.post(base + "/v1/chat/completions", json=chat)
            results = await asyncio.wait_for(
                asyncio.gather(*streams, collected, return_exceptions=True), NO_HANG_S
            )
            *stream_events, collected_response = results
            collected_reply = (collected_response.status, await collected_response.json())
            async with session.post(base + "/v1/completions", json={"prompt": "a", **GREEDY}) as r:
                later = r.status, await r.json()
            async with session.get(base + "/health") as r:
                health = r.status, await r.json()
        return stream_events, collected_reply, later, health

    stream_events, (status, reply), later, health = asyncio.run(go())
    for events in stream_events:  # each open stream ended with one error event, no [DONE]
        assert events[-1] != "[DONE]", events[-3:]
        error_body = events[-1]["error"]
        assert error_body["type"] == "server_error" and name in error_body["message"]
    assert status == 503 and name in reply["error"]["message"]
    assert later[0] == 503 and name in later[1]["error"]["message"]
    assert health[0] == 503 and name in health[1]["error"]["message"]
