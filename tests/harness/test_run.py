"""`llmbench run` end to end on a tiny model: the run folder, the summary, the roofline, an
engine crash in the middle of a run (in-process, through the harness entry point)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.engine.helpers import crash_after

TINY = ["--set", "model=synthetic:tiny", "--set", "dtype=float32", "--set", "warmup_requests=1"]
SMALL = {
    "chat": [
        "--set",
        "workload.sessions=3",
        "--set",
        "workload.think_time_s=0.01",
        "--set",
        "load.rate_per_s=20",
    ],
    "rag": [
        "--set",
        "workload.sessions=4",
        "--set",
        "workload.num_documents=6",
        "--set",
        "workload.document_tokens=40",
    ],
    "agentic": [
        "--set",
        "workload.sessions=3",
        "--set",
        "workload.tool_latency_s=0.01",
        "--set",
        "workload.system_prompt_tokens=60",
        "--set",
        "workload.tool_schema_tokens=40",
    ],
}


def replies(folder: Path) -> dict[str, tuple[str, int]]:
    """Each request's reply text and token count, from a run folder."""
    lines = (folder / "requests.jsonl").read_text().splitlines()
    return {
        r["request_id"]: (r["output_text"], sum(r["chunk_tokens"])) for r in map(json.loads, lines)
    }


def llmbench(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmbench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


@pytest.mark.parametrize("workload", ["chat", "rag", "agentic"])
def test_run_shipped_workload_writes_a_complete_folder(tmp_path, workload):
    out = tmp_path / "run"
    result = llmbench("run", workload, *TINY, *SMALL[workload], "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(out)  # the folder is the last line
    assert "ttft_ms" in result.stdout and "prefix-cache hit rate" in result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["schema_version"] == 9
    assert results["interrupted"] is False and results["stop_reason"] is None
    assert not (out / "run-start.json").exists()  # results.json holds all it had
    summary = results["summary"]
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in requests if not r["is_warmup"]]
    assert summary["num_completed"] == len(measured) and summary["num_failed"] == 0
    assert sum(r["is_warmup"] for r in requests) == 1
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p95", "p99", "max"}
    assert summary["output_tok_per_s"] > 0 and summary["request_per_s"] > 0
    prov = results["provenance"]
    assert prov["model"] == "synthetic:tiny" and prov["seed"] == 0
    assert {"spec_hash", "workload_hash", "git_sha", "versions", "device", "machine_load"} <= set(
        prov
    )
    steps = (out / "steps.jsonl").read_text().splitlines()
    assert steps and "num_prefill_tokens" in json.loads(steps[0])
    # The roofline: every phase's achieved share of the measured roofs, which say where they
    # came from (measured now, or the cache and its date).
    assert prov["hardware"]["read_bytes_per_s"] > 0
    sources = results["roofline"]["roofs"]["sources"]
    assert sources["read_bytes_per_s"] == prov["hardware"]["sources"]["read"]
    assert sources["flops_per_s"] == prov["hardware"]["sources"]["float32"]
    assert sources["flops_per_s"] == "measured now" or sources["flops_per_s"].startswith("cache ")
    # Each phase's share of its roof; none only where the run went above a roof probed on a
    # busy machine, and then the summary's warning names the phase.
    for key, phase in (("decode_mbu", "decode bandwidth"), ("prefill_mfu", "prefill FLOP/s")):
        if summary[key] is None:
            assert any(w.startswith(phase) for w in summary["warnings"]), summary["warnings"]
        else:
            assert 0 < summary[key] <= 1
    assert results["roofline"]["phases"]["decode"]["num_steps"] > 0
    # Telemetry on the run's clock: samples between the first send and the last reply.
    rows = (out / "telemetry.csv").read_text().splitlines()
    assert rows[0] == "t_ns,process_cpu_percent,system_cpu_percent,rss_bytes"
    sample_ns = [int(row.split(",")[0]) for row in rows[1:]]
    first = min(r["sent_ns"] for r in requests)
    assert any(first <= t <= max(r["end_ns"] for r in requests) for t in sample_ns)
    assert "no NVML" in results["telemetry"]["notes"][0]  # no GPU here: a note, not an error
    # Output lengths follow the spec (ignore_eos), and every request's tokens were timed.
    for r in measured:
        assert sum(r["chunk_tokens"]) == len(r["chunk_ns"]) > 0
    if workload != "rag":  # multi-turn: the system prompt and history are shared in-session
        assert summary["prefix_cache_hit_rate"] > 0.3


def test_same_seed_same_requests(tmp_path):
    hashes = []
    for i in range(2):
        out = tmp_path / f"r{i}"
        run = llmbench("run", "rag", *TINY, *SMALL["rag"], "--out", str(out), "--no-report")
        assert run.returncode == 0
        hashes.append(json.loads((out / "results.json").read_text())["provenance"]["workload_hash"])
    assert hashes[0] == hashes[1]


def test_bad_workload_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("load:\n  kind: poisson\n  rate_per_s: -2\n")
    result = llmbench("run", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {bad}:3: load.rate_per_s: must be > 0, got -2.0"
    assert llmbench("run", "nosuch").stderr.startswith("error: workload 'nosuch': no such file")


@pytest.fixture
def served_tiny():
    """`llmbench serve` on a free loopback port, stopped afterwards."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmbench",
            "serve",
            "--model",
            "synthetic:tiny",
            "--port",
            "0",
            "--device",
            "cpu",
            "--dtype",
            "float32",  # as the in-process run it is held against
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = None
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "listening on " in line:
            url = line.strip().split("listening on ")[1]
    assert url, "the server did not start"
    yield url
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)


def test_openai_backend_against_llmbench_serve_matches_the_engine(tmp_path, served_tiny):
    """The same workload through HTTP and in-process: the same greedy replies, turn by turn."""
    common = [*TINY, *SMALL["chat"], "--set", "workload.output_tokens=12"]
    http, local = tmp_path / "http", tmp_path / "local"
    result = llmbench(
        "run",
        "chat",
        *common,
        "--set",
        "backend.kind=openai",
        "--set",
        f"backend.url={served_tiny}",
        "--set",
        "backend.hardware=measured",
        "--out",
        str(http),
    )
    assert result.returncode == 0, result.stderr
    assert llmbench("run", "chat", *common, "--out", str(local), "--no-report").returncode == 0

    assert replies(http) == replies(local)
    results = json.loads((http / "results.json").read_text())
    summary = results["summary"]
    assert summary["num_failed"] == 0 and summary["token_count_mismatches"] == 0
    assert summary["prefix_cache_hit_rate"] > 0  # cached_tokens came back through the usage
    # The server's roofline, estimated from the token times and labelled so.
    assert summary["roofline_is_estimated"] is True
    # Its decode MBU; none only where the estimate went above a roof probed on a busy machine
    # (CI's two workers), and then the summary's warning names the phase.
    if summary["decode_mbu"] is None:
        assert any(w.startswith("decode bandwidth") for w in summary["warnings"]), summary
    else:
        assert 0 < summary["decode_mbu"] <= 1
    assert results["roofline"]["roofs"]["label"].startswith("measured")
    assert results["roofline"]["weight_bytes_per_param"] == 4.0  # float32, as the server says
    points = [json.loads(line) for line in (http / "steps.jsonl").read_text().splitlines()]
    assert points and all(p["is_estimated"] and p["phase"] == "decode" for p in points)
    assert "ESTIMATED from the client" in (http / "report.html").read_text()


def test_unreachable_server_is_one_line(tmp_path):
    result = llmbench(
        "run",
        "chat",
        *TINY,
        "--set",
        "backend.kind=openai",
        "--set",
        "backend.url=http://127.0.0.1:9/v1",
        "--out",
        str(tmp_path / "x"),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: backend openai: cannot reach")


def test_transformers_backend_gives_the_engines_greedy_replies(tmp_path):
    """The baseline backend runs HF generate on the same prompt ids: same greedy tokens."""
    from llmbench.engine.tokenizer import Tokenizer
    from tests.engine.helpers import write_tiny_checkpoint

    folder = write_tiny_checkpoint(tmp_path / "tiny")
    byte_level = Tokenizer.byte_level()  # 259 ids: fits the tiny model's 300, spells any text
    byte_level.hf_tokenizer.save(str(folder / "tokenizer.json"))
    config = {"chat_template": byte_level.chat_template, "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    common = [
        "--set",
        f"model={folder}",
        "--set",
        "dtype=float32",
        "--set",
        "device=cpu",
        *SMALL["rag"],
        "--set",
        "workload.output_tokens=6",
        "--set",
        "load.concurrency=2",
    ]
    hf, local = tmp_path / "hf", tmp_path / "local"
    common += ["--no-report"]  # the replies are the point
    result = llmbench("run", "rag", *common, "--set", "backend.kind=transformers", "--out", str(hf))
    assert result.returncode == 0, result.stderr
    assert llmbench("run", "rag", *common, "--out", str(local)).returncode == 0

    assert replies(hf) == replies(local)
    assert all(n == 6 for _, n in replies(hf).values())


def test_sweep_writes_one_result_per_point(tmp_path):
    out = tmp_path / "sweep"
    result = llmbench(
        "run", "rag", *TINY, *SMALL["rag"], "--set", "load.sweep=[2, 1]", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "figures",  # the sweep curves as PNGs
        "point-1",
        "point-2",
        "report.html",
        "report.md",
    ]
    throughputs = {}
    for name, value in (("point-1", 1), ("point-2", 2)):
        results = json.loads((out / name / "results.json").read_text())
        assert results["sweep_point"] == value
        assert results["summary"]["num_completed"] == 4
        assert (out / name / "report.html").is_file()
        throughputs[value] = results["summary"]["output_tok_per_s"]
    # The sweep's own report: a row per point, and latency-vs-throughput curves.
    md = (out / "report.md").read_text()
    assert f"| 1 | {throughputs[1]:,.1f} |" in md and f"| 2 | {throughputs[2]:,.1f} |" in md
    html = (out / "report.html").read_text()
    assert '<figure id="sweep-ttft_ms">' in html and '<a href="point-1/report.html">' in html


@pytest.mark.parametrize("mode", ["error500", "drop", "garbage"])
def test_a_failing_server_is_counted_and_the_run_completes(tmp_path, mode):
    """Every 3rd request fails (HTTP 500, dropped connection, garbage SSE): the run goes on,
    the failures are recorded per request with a reason, and the summary counts them."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.harness.streaming_server",
            "--port",
            "0",
            "--record",
            str(tmp_path / "record.jsonl"),
            "--mode",
            mode,
            "--ttft-ms",
            "5",
            "--tpot-ms",
            "1",
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(server.stdout.readline())
        out = tmp_path / "run"
        result = llmbench(
            "run",
            "rag",
            *TINY,
            *SMALL["rag"],
            "--set",
            "workload.sessions=8",
            "--set",
            "backend.kind=openai",
            "--set",
            f"backend.url=http://127.0.0.1:{port}/v1",
            "--no-report",
            "--out",
            str(out),
        )
    finally:
        server.kill()
        server.wait()
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "results.json").read_text())["summary"]
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["error"]]
    # 9 requests (1 warm-up + 8): the 3rd, 6th and 9th fail.
    assert len(records) == 9 and len(failed) == 3
    assert summary["num_failed"] == sum(1 for r in failed if not r["is_warmup"])
    assert summary["num_completed"] == 8 - summary["num_failed"]
    reason = {"error500": "HTTP 500", "drop": "dropped", "garbage": "malformed stream"}[mode]
    assert all(reason in r["error"] for r in failed)


def test_the_spec_s_headers_and_request_id_header_reach_the_server(tmp_path):
    """`backend.headers` go on every request; `backend.request_id_header` adds a fresh UUID4
    under that name (none by default: some servers refuse an id that is not a UUID)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.streaming_server", "--port", "0"]
        + ["--record", str(tmp_path / "record.jsonl"), "--ttft-ms", "1", "--tpot-ms", "1"],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(server.stdout.readline())
        result = llmbench(
            "run",
            "chat",
            *TINY,
            *SMALL["chat"],
            "--set",
            "backend.kind=openai",
            "--set",
            f"backend.url=http://127.0.0.1:{port}/v1",
            "--set",
            "backend.request_id_header=X-Request-Id",
            "--set",
            "backend.headers={X-Team: perf}",
            "--no-report",
            "--out",
            str(tmp_path / "run"),
        )
    finally:
        server.kill()
        server.wait()
    assert result.returncode == 0, result.stderr
    served = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert served and all(r["headers"].get("X-Team") == "perf" for r in served)
    ids = [r["request_id"] for r in served]
    assert all(uuid.UUID(i).version == 4 for i in ids) and len(set(ids)) == len(ids)


def test_prepare_folder_makes_it_or_names_it_in_one_line(tmp_path):
    from llmbench.errors import UserError
    from llmbench.harness.run_folder import prepare_folder

    prepare_folder(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir() and not any((tmp_path / "a" / "b").iterdir())
    regular = tmp_path / "file"
    regular.write_text("x")
    for bad in (regular / "run", Path("/proc/llmbench-run")):
        with pytest.raises(UserError) as error:
            prepare_folder(bad)
        assert str(error.value).startswith(f"--out {bad}: cannot write there (")
        assert str(error.value).endswith("); pass a folder you can write to")


def test_a_run_refused_before_writing_leaves_no_folder_it_made(tmp_path, monkeypatch):
    """An engine that cannot be opened fails the run before it writes anything: the folder the
    run made goes again (a folder of runs holds runs only); one the user made stays, empty."""
    from llmbench.errors import UserError
    from llmbench.harness import run_point
    from llmbench.harness.run import execute

    def refused(spec):
        raise UserError("engine: refused")

    monkeypatch.setattr(run_point, "_open_backend", refused)
    made, given = tmp_path / "runs" / "made", tmp_path / "given"
    given.mkdir()
    for out in (made, given):
        with pytest.raises(UserError, match="engine: refused"):
            execute(agentic_spec(), out, print)
    assert not made.exists() and (tmp_path / "runs").is_dir()
    assert given.is_dir() and not any(given.iterdir())


def test_a_folder_left_holding_anything_stays(tmp_path):
    from llmbench.harness.run_folder import removed_if_left_empty

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), removed_if_left_empty(out):
        out.mkdir()
        (out / "requests.jsonl").write_text("{}\n")
        raise KeyboardInterrupt
    assert (out / "requests.jsonl").read_text() == "{}\n"
    with removed_if_left_empty(tmp_path / "ok"):  # the work succeeded: nothing is removed
        (tmp_path / "ok").mkdir()
    assert (tmp_path / "ok").is_dir()


NO_HANG_S = 120  # a run that does not end by then hangs


@pytest.mark.parametrize("where", ["forward", "sampler"])
def test_an_engine_crash_ends_the_run_with_its_error_and_keeps_the_results(
    tmp_path, monkeypatch, where
):
    """The model's forward pass (or the sampler) raises after 80 calls, in the middle of the
    measured requests (the warm-up takes 32 steps, the first turns about 33 more): `execute`
    saves what was measured, then raises the engine's error."""
    import threading

    from llmbench.engine import model, runner
    from llmbench.errors import BackendFailure
    from llmbench.harness.run import execute
    from llmbench.harness.spec_load import load_spec
    from llmbench.workloads import __file__ as workloads_init

    if where == "forward":
        error = RuntimeError("injected forward failure")
        forward = model.LlamaModel.forward
        monkeypatch.setattr(model.LlamaModel, "forward", crash_after(80, forward, error))
    else:
        error = ValueError("injected sampler failure")
        monkeypatch.setattr(runner, "sample", crash_after(80, runner.sample, error))
    overrides = [o for o in [*TINY, *SMALL["agentic"]] if o != "--set"]
    spec = load_spec(Path(workloads_init).parent / "agentic.yaml", overrides)
    out, reported, raised = tmp_path / "run", [], []

    def run() -> None:
        try:
            execute(spec, out, reported.append)
        except BaseException as e:  # noqa: BLE001 — handed to the test's thread
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(NO_HANG_S)
    assert not thread.is_alive(), "the run hangs after the engine crashed"
    (failure,) = raised
    name = f"{type(error).__name__}: {error}"
    assert isinstance(failure, BackendFailure)
    assert str(failure) == f"the engine stopped: {name}"
    assert reported == [out]  # the reports of the partial run
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True
    assert results["stop_reason"] == f"the engine stopped: {name}"
    summary = results["summary"]
    assert summary["num_completed"] >= 1 and summary["num_failed"] >= 1
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    failed = [r for r in requests if r["error"]]
    assert failed and all(name in r["error"] for r in failed)
    assert len(requests) < 1 + 11  # the run stopped: not every turn of the workload was sent
    steps = (out / "steps.jsonl").read_text().splitlines()
    # A step is recorded once its forward pass and sampling are done; a chunked prefill step
    # with no token to sample does not call the sampler.
    assert len(steps) == 80 if where == "forward" else len(steps) >= 80


def test_the_summary_table_of_a_run_stopped_before_any_request():
    """A signal during the warm-up: no request measured, and the table still prints."""
    import dataclasses

    from llmbench.harness.metrics import summarize
    from llmbench.harness.summary_lines import format_summary
    from tests.harness.test_results import a_result

    result = dataclasses.replace(
        a_result(), summary=summarize([]), roofline=None, stop_reason="SIGTERM"
    )
    table = format_summary(result)
    assert "0 requests completed, 0 failed in 0.0 s" in table
    assert "throughput: - output tok/s, - input tok/s, - req/s; goodput - req/s" in table
    assert table.endswith("interrupted (SIGTERM): partial results")


def test_the_summary_table_of_a_server_says_what_it_does_not_know():
    """An openai run against a server of unknown weights and hardware (before: "openai
    smollm2-135m bfloat16 on ?" and GB/s that silently assumed 2-byte weights), with the
    server's timings beside the client's and the run's warnings after the table."""
    import dataclasses

    from llmbench.harness.metrics import summarize
    from llmbench.harness.records import RequestRecord, ServerTimings
    from llmbench.harness.results import Device, Phase
    from llmbench.harness.summary_lines import format_summary
    from tests.harness.test_results import a_result

    record = RequestRecord(
        "r", "s", 0, scheduled_ns=0, sent_ns=0, end_ns=50_000_000,
        chunk_ns=[20_000_000, 30_000_000, 40_000_000], chunk_tokens=[1, 1, 1],
        server_timings=ServerTimings("llama.cpp", prompt_ms=15.0, decode_ms_per_token=8.0),
    )  # fmt: skip
    base = a_result()
    result = dataclasses.replace(
        base,
        interrupted=False,
        stop_reason=None,
        spec={"backend": {"kind": "openai", "hardware": None}},
        provenance=dataclasses.replace(
            base.provenance, backend="openai", device=Device("remote", url="http://h:8/v1")
        ),
        summary={**summarize([record]), "warnings": ["the server reports no usage: x"]},
        roofline=dataclasses.replace(
            base.roofline,
            is_estimated=True,
            dtype="bfloat16",
            roofs=None,
            phases={"decode": Phase(10, 1.0, 16.55e9, 1e9, None, None, 0.06)},
            weights=None,
        ),
    )
    lines = format_summary(result).splitlines()
    assert lines[0].startswith(
        "chat: openai synthetic:tiny weights ? at http://h:8/v1 on server hardware unknown - 1 "
    )
    assert "TTFT from send                20.0      20.0      20.0" in lines
    assert "  overhead                     5.0       5.0       5.0" in lines  # 20 − 15 ms
    assert "  overhead                     2.0       2.0       2.0" in lines  # 10 − 8 ms
    assert (
        "roofline (estimated from the client; bytes assume bfloat16 weights: set "
        "backend.weights): decode at 16.55 GB/s achieved (set backend.hardware for MBU/MFU)"
    ) in lines
    assert lines[-1] == "WARNING: the server reports no usage: x"


def test_speculative_decoding_gives_the_same_replies_and_reports_its_numbers(tmp_path):
    """rag with a draft model (the target's first layer) against the same run without: the
    same greedy replies, and the run says how many drafts were accepted and what they cost."""
    outs = {}
    for name, sets in (
        ("off", []),
        (
            "draft",
            [
                "--set",
                "engine.speculative.method=draft",
                "--set",
                "engine.speculative.draft_model=self:layers=1",
                "--set",
                "engine.speculative.num_tokens=3",
            ],
        ),
    ):
        outs[name] = tmp_path / name
        sets = [*sets, "--no-report"]  # the replies and the numbers are the point
        result = llmbench("run", "rag", *TINY, *SMALL["rag"], *sets, "--out", str(outs[name]))
        assert result.returncode == 0, result.stderr
        assert ("draft tokens accepted" in result.stdout) == (name == "draft")
    assert replies(outs["draft"]) == replies(outs["off"])
    off = json.loads((outs["off"] / "results.json").read_text())["summary"]
    results = json.loads((outs["draft"] / "results.json").read_text())
    s = results["summary"]["speculative"]
    assert off["speculative"] is None
    assert s["num_proposed_tokens"] > 0 and 0 <= s["acceptance_rate"] <= 1
    assert s["draft_s"] > 0 and s["verify_s"] > 0 and s["draft_bytes"] > 0
    assert results["spec"]["engine"]["speculative"]["draft_model"] == "self:layers=1"
    requests = [json.loads(line) for line in (outs["draft"] / "requests.jsonl").open()]
    measured = [r for r in requests if not r["is_warmup"]]
    assert sum(r["num_draft_tokens"] for r in measured) == s["num_proposed_tokens"]
    assert sum(r["num_accepted_draft_tokens"] for r in measured) == s["num_accepted_tokens"]
    steps = [json.loads(line) for line in (outs["draft"] / "steps.jsonl").open()]
    assert any(p.get("draft_passes") and p["draft_bytes"] > 0 for p in steps)


def test_a_quantised_kv_cache_is_recorded_with_its_real_bytes_and_its_quality(tmp_path):
    out = tmp_path / "run"
    kv = ["--set", "engine.kv_cache_dtype={k: int8, v: int4}"]
    budget = ["--set", "engine.kv_cache_memory=1000000"]
    quality = ["--set", "quality={tokens: 64, context: 32, generate: 4}"]
    result = llmbench(
        "run", "chat", *TINY, *SMALL["chat"], *kv, *budget, *quality, "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["spec"]["engine"]["kv_cache_dtype"] == {"k": "int8", "v": "int4"}
    # synthetic:tiny: 2 layers, 2 KV heads, head_dim 16: per layer and head an int8 key takes
    # 16 + 2 (its float16 scale) bytes, an int4 value 8 + 2; 1,000,000 bytes hold
    # floor(1e6 / (112 · 16)) = 558 blocks of 16 tokens.
    assert results["provenance"]["kv_cache"] == {
        "k_dtype": "int8",
        "v_dtype": "int4",
        "kv_bytes_per_token": 2 * 2 * (18 + 10),
        "kv_cache_tokens": 558 * 16,
        "kv_cache_bytes": 558 * 16 * 112,
    }
    # The cost model moves those bytes: (18 + 10) / 2 / 16 bytes per K/V element.
    assert results["roofline"]["kv_bytes_per_elem"] == 0.875
    # The quality block: the run's configuration against the unquantised model, in the
    # summary and on the report beside the speed.
    rows = results["summary"]["quality"]["rows"]
    assert [r["kv_cache_dtype"] for r in rows] == [
        {"k": "float32", "v": "float32"},
        {"k": "int8", "v": "int4"},
    ]
    assert rows[0]["mean_kl"] == 0.0 and rows[1]["num_tokens_scored"] == 2 * 2 * 31
    assert "quality: 2/2 weights as loaded, kv k=int8,v=int4" in result.stderr
    page = (out / "report.html").read_text()
    assert "perplexity (weights as loaded, kv k=int8,v=int4)" in page
    assert "vs unquantised: KL / top-1 / greedy" in page
    assert "keys int8, values int4: 112 B/token, 8,928 tokens" in page


def agentic_spec(*sets: str):
    """The shipped agentic workload, tiny: 3 sessions of 4 turns one at a time, 0.2 s of tool
    time between turns (a run of a few seconds), plus `sets` (`key=value`)."""
    from llmbench.harness.spec_load import load_spec
    from llmbench.workloads import __file__ as workloads_init

    overrides = [o for o in [*TINY, *SMALL["agentic"]] if o != "--set"]
    overrides += ["load.concurrency=1", "workload.tool_latency_s=0.2", *sets]
    return load_spec(Path(workloads_init).parent / "agentic.yaml", overrides)


@pytest.mark.parametrize("is_results_written", [True, False])
def test_a_full_disk_stops_the_run_and_keeps_what_it_measured(
    tmp_path, monkeypatch, is_results_written
):
    """The disk fills up after 3 lines of requests.jsonl (the warm-up and 2 measured requests):
    the run stops at once (before: it ran to its end, then an OSError traceback and no
    results.json), requests.jsonl holds those 3 whole lines, and the `WriteFailed` names the
    file, the space left and what was kept. When results.json still fits it counts every
    request (they are in memory); when it does not, run-start.json stays and `llmbench report`
    rebuilds it from the records on disk once there is room."""
    import pathlib

    from llmbench.harness import record_log, run_summary
    from llmbench.harness.run import execute
    from llmbench.harness.run_folder import WriteFailed
    from tests.harness.test_record_log import DiskFull, no_space_left

    disk = DiskFull(3, "requests.jsonl")
    monkeypatch.setattr(record_log, "_write", disk)
    no_space_left(monkeypatch)
    if not is_results_written:  # results.json too (after the disk filled up)
        write_text = pathlib.Path.write_text

        def full_write_text(path, *args, **kwargs):
            if disk.is_full:
                raise OSError(28, "No space left on device")
            return write_text(path, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "write_text", full_write_text)
    out, reported = tmp_path / "run", []
    with pytest.raises(WriteFailed) as failed:
        execute(agentic_spec(), out, reported.append)
    line = str(failed.value)
    requests = out / "requests.jsonl"
    assert line.startswith(
        f"{requests}: cannot write (No space left on device; 0 B free there); the run stopped; "
        "on disk 3 of "
    )
    assert [r.is_warmup for r in record_log.read_requests(out)] == [True, False, False]
    assert requests.read_text().count("\n") == 3  # whole lines: the cut one was cut off
    num_steps = len((out / "steps.jsonl").read_text().splitlines())
    counts = re.search(r"on disk 3 of (\d+) request records, (\d+) of (\d+) step records", line)
    assert counts and int(counts[2]) == num_steps
    num_records = int(counts[1])
    assert 4 <= num_records < 1 + 3 * 4  # the 4th request ended, the run then stopped
    assert reported == []  # no reports on a full disk: `llmbench report` later
    if is_results_written:
        assert line.endswith(
            f"; results.json written; free some space, then llmbench report {out} writes the "
            "reports"
        )
        results = json.loads((out / "results.json").read_text())
        summary = results["summary"]
        assert summary["num_completed"] + summary["num_failed"] == num_records - 1  # no warm-up
        assert results["interrupted"] is True
        assert results["stop_reason"] == (f"writing {requests} failed: No space left on device")
        assert not (out / "run-start.json").exists()
    else:
        assert line.endswith(
            "; results.json not written (the summary above counts every record); free some "
            f"space, then llmbench report {out} rebuilds it from the records on disk"
        )
        assert not (out / "results.json").exists() and (out / "run-start.json").is_file()
        assert not list(out.glob("*.tmp"))  # nothing half-written left to take space
        monkeypatch.undo()  # space freed
        rebuilt = run_summary.rebuild(out)
        assert rebuilt.summary["num_completed"] + rebuilt.summary["num_failed"] == 2


def test_a_folder_that_holds_a_run_is_refused_before_any_work(tmp_path, monkeypatch):
    """`--out base1` twice: the second run is refused (before: its records replaced the
    first's, 21 became 12); `force` removes that run's files, and only those."""
    from llmbench.errors import UserError
    from llmbench.harness import run_point
    from llmbench.harness.run import execute
    from llmbench.harness.run_folder import claim_folder

    def no_work(spec):
        raise AssertionError("the backend was opened")

    monkeypatch.setattr(run_point, "_open_backend", no_work)
    out = tmp_path / "base1"
    (out / "point-2").mkdir(parents=True)
    for name in ("requests.jsonl", "results.json", "notes.txt"):
        (out / name).write_text("x\n")
    with pytest.raises(UserError) as refused:
        execute(agentic_spec(), out, print)
    assert str(refused.value) == (
        f"--out {out}: holds a run already (results.json, requests.jsonl, point-2/); pass "
        "--force to replace it, or another folder"
    )
    assert (out / "requests.jsonl").read_text() == "x\n"  # untouched
    claim_folder(out, force=True)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # the user's own file stays
    claim_folder(out)  # a folder without a run is used as it is
    claim_folder(tmp_path / "new" / "folder")  # as is one that does not exist yet


def test_run_folder_names_every_file_a_run_writes():
    """`RUN_FILES` (what `--force` removes, what marks a folder as a run's) spells the names
    the writers use."""
    from llmbench.harness import record_log, run_folder, run_summary, variant_index
    from llmbench.harness.expert_stats_file import EXPERTS_FILE
    from llmbench.harness.results import RESULTS_FILE

    names = {RESULTS_FILE, run_summary.START_FILE, EXPERTS_FILE, variant_index.INDEX_FILE}
    names |= {record_log.REQUESTS_FILE, record_log.STEPS_FILE, record_log.SESSIONS_FILE}
    assert names <= set(run_folder.RUN_FILES)


def test_the_default_folder_of_a_run_never_takes_another_runs(tmp_path, monkeypatch):
    """Two runs without --out in the same second: the second gets `-2`, not the first's."""
    from llmbench.harness import run_folder

    monkeypatch.setattr(run_folder.time, "strftime", lambda form: "20250101-120000")
    first = run_folder.default_folder(str(tmp_path), "chat")
    assert first == tmp_path / "chat-20250101-120000"
    first.mkdir()
    assert run_folder.default_folder(str(tmp_path), "chat") == first  # empty: still free
    (first / "requests.jsonl").write_text("")
    assert run_folder.default_folder(str(tmp_path), "chat") == tmp_path / "chat-20250101-120000-2"


def test_a_run_says_what_it_does_before_each_slow_step(tmp_path, monkeypatch, capsys):
    """Before the model loads and before the workload is built (10,000,000 sessions took
    minutes with no line at all), a line on stderr says what is happening: checked by what
    stderr holds when each slow step is called."""
    from types import SimpleNamespace

    from llmbench.harness import run_point, run_roofs
    from llmbench.harness.run import execute

    seen = {}

    class Stop(Exception):
        pass

    def open_backend(spec):
        seen["loading"] = capsys.readouterr().err
        tokenizer = SimpleNamespace(encode=lambda text: [0], decode=lambda ids: "")
        return SimpleNamespace(), tokenizer, None

    def build_sessions(*args, **kwargs):
        seen["building"] = capsys.readouterr().err
        raise Stop

    monkeypatch.setattr(run_point, "_open_backend", open_backend)
    monkeypatch.setattr(run_roofs, "measured_roofs", lambda spec, backend: None)
    monkeypatch.setattr(run_roofs, "roofline_setup", lambda *args: (None, None))
    monkeypatch.setattr(run_point, "build_sessions", build_sessions)
    with pytest.raises(Stop):
        execute(agentic_spec("repeat=2"), tmp_path / "run", print)
    assert seen["loading"] == "loading synthetic:tiny (engine, float32, device auto)\n"
    assert seen["building"] == (
        "preparing the workload: 2 repetitions of 3 agentic sessions, and 1 warm-up\n"
    )


def test_a_trace_is_read_up_to_the_sessions_the_run_sends(tmp_path):
    """A run of n sessions reads the first n lines of its trace (at most
    `MAX_TRACE_REQUESTS`): what follows is never read, so a long trace costs nothing."""
    from llmbench.errors import UserError
    from llmbench.harness import arrivals

    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 10}\n\n{"timestamp": 10.5}\n{"timestamp": 12}\nnot json\n')
    assert arrivals.trace_offsets(trace, max_requests=2) == [0.0, 0.5]
    assert arrivals.trace_offsets(trace, max_requests=3) == [0.0, 0.5, 2.0]
    with pytest.raises(UserError, match=r"line 5: not valid JSON"):
        arrivals.trace_offsets(trace)
