"""A run sharded across client processes, against a real loopback server of known timing
(`streaming_server`: first token 20 ms after the request, then a chunk every 5 ms per token):
`load.workers: 2` sends the single process's schedule and its merged summary is the summary of
its records; `--shard 0/2` + `--shard 1/2` + `llmbench merge` send the same requests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmbench.harness import metrics, record_log
from llmbench.harness.results import read_results
from llmbench.harness.run import execute
from llmbench.harness.spec_load import load_spec

REPO_ROOT = Path(__file__).resolve().parents[2]
TTFT_MS, TPOT_MS = 20.0, 5.0
CHAT = REPO_ROOT / "llmbench" / "workloads" / "chat.yaml"
SETS = [
    "model=synthetic:tiny",
    "warmup_requests=2",
    "workload.sessions=6",
    "workload.turns=2",
    "workload.think_time_s=0",
    "workload.user_tokens=16",
    "workload.system_prompt_tokens=16",
    "workload.output_tokens=6",
    "load.kind=constant",
    "load.rate_per_s=25",
    "backend.kind=openai",
]


@pytest.fixture(scope="module")
def server():
    """The known-timing server on a free loopback port: (base URL, pid)."""
    record = Path(os.environ.get("TMPDIR", "/tmp")) / f"llmbench-workers-{os.getpid()}.jsonl"
    command = [sys.executable, "-m", "tests.harness.streaming_server", "--port", "0"]
    command += ["--record", str(record), "--ttft-ms", str(TTFT_MS), "--tpot-ms", str(TPOT_MS)]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    port = process.stdout.readline().strip()
    assert port.isdigit(), f"the streaming server did not start (exit {process.poll()})"
    yield f"http://127.0.0.1:{port}/v1", process.pid
    process.stdin.close()
    process.wait(timeout=10)
    record.unlink(missing_ok=True)


def spec_of(url: str, *sets: str):
    return load_spec(CHAT, [*SETS, f"backend.url={url}", *sets])


@pytest.fixture(scope="module")
def workers_run(server, tmp_path_factory):
    url, _ = server
    folder = tmp_path_factory.mktemp("workers") / "run"
    execute(spec_of(url, "load.workers=2"), folder, lambda _: None)
    return folder


def requests_of(folder: Path) -> dict[str, tuple[int, bool]]:
    """request id → (output tokens, is warm-up), from the folder's requests.jsonl."""
    return {
        r.request_id: (r.num_output_tokens, r.is_warmup) for r in record_log.read_requests(folder)
    }


def first_turn_offsets_ns(folder: Path) -> dict[str, int]:
    """Each session's first scheduled send after the first session's."""
    firsts = {
        r.session_id: r.scheduled_ns
        for r in record_log.read_requests(folder)
        if r.turn == 0 and not r.is_warmup
    }
    return {s: t - firsts["s0"] for s, t in firsts.items()}


def test_workers_send_the_single_process_schedule_and_merge_to_its_summary(
    server, workers_run, tmp_path
):
    url, server_pid = server
    single = tmp_path / "single"
    execute(spec_of(url), single, lambda _: None)
    assert requests_of(workers_run) == requests_of(single)
    assert len(requests_of(single)) == 2 + 6 * 2  # the warm-up's, then two turns each
    # One schedule on one clock: 40 ms apart, to the nanosecond, in both runs.
    assert first_turn_offsets_ns(workers_run) == first_turn_offsets_ns(single)
    assert first_turn_offsets_ns(single) == {f"s{i}": i * 40_000_000 for i in range(6)}
    result = read_results(workers_run)
    merged = record_log.read_requests(workers_run)
    alone = metrics.summarize(merged, {})
    assert {k: result.summary[k] for k in alone} == alone
    for folder in (single, workers_run):  # the server's known timing, seen from the client
        ttft = read_results(folder).summary["ttft_from_send_ms"]
        assert TTFT_MS <= ttft["p50"] < TTFT_MS + 40
    client = result.client
    assert (client.shard, client.num_shards) == (None, 2)
    assert [p.shard for p in client.processes] == [0, 1]
    assert len({p.pid for p in client.processes} | {os.getpid()}) == 3
    assert client.server_pids == (server_pid,)
    assert client.clock_alignment.startswith("CLOCK_MONOTONIC")
    assert all(0 < p.busy_fraction < 1.5 and p.wall_s > 0.2 for p in client.processes)
    one = read_results(single).client
    assert one.shard is None and one.num_shards == 1 and len(one.processes) == 1
    for i in (0, 1):
        shard = read_results(workers_run / "shards" / f"shard-{i}")
        assert (shard.client.shard, shard.client.num_shards) == (i, 2)
        assert (workers_run / "shards" / f"shard-{i}" / "worker.log").is_file()


def llmbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmbench", *args], capture_output=True, text=True, timeout=120
    )


def test_shards_run_apart_then_merged_send_what_the_workers_sent(server, workers_run, tmp_path):
    url, _ = server
    cpu = min(os.sched_getaffinity(0))
    sets = _options([*SETS, f"backend.url={url}"])
    shards = [tmp_path / "shard-0", tmp_path / "shard-1"]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "llmbench", "run", "chat", *sets, "--shard", f"{i}/2"]
            + ["--out", str(folder), *(["--client-cpus", str(cpu)] if i == 0 else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, folder in enumerate(shards)
    ]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    pinned = read_results(shards[0]).client.processes[0]
    assert pinned.cpu_affinity == (cpu,)
    merged = tmp_path / "merged"
    result = llmbench("merge", *map(str, shards), "--out", str(merged))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(merged)
    assert requests_of(merged) == requests_of(workers_run)
    assert (merged / "report.html").is_file()
    summary = read_results(merged).summary
    alone = metrics.summarize(record_log.read_requests(merged), {})
    assert {k: summary[k] for k in alone} == alone
    refused = llmbench("merge", str(shards[0]), str(workers_run), "--out", str(tmp_path / "x"))
    assert refused.returncode == 2
    assert refused.stderr == (
        f"error: {workers_run}: not a shard (it was not run with --shard i/N or load.workers)\n"
    )
    assert not (tmp_path / "x").exists()  # the refused merge leaves no empty folder behind


def test_a_worker_that_cannot_reach_the_server_ends_the_run_in_one_line(tmp_path):
    sets = [*SETS, "backend.url=http://127.0.0.1:9/v1", "load.workers=2"]
    result = llmbench("run", "chat", "--out", str(tmp_path / "run"), *_options(sets))
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: worker ") and "of 2: backend openai: cannot reach" in last


def _options(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]
