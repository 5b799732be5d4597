"""`llmbench run` and `report` in a subprocess: signals, kills, crashes and bad paths keep what
was measured, with real exit codes and one-line errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmbench.reports import rundata, tables
from tests.cli.helpers import assert_user_error
from tests.harness.test_run import SMALL, TINY, llmbench

# A long run: 40 agentic sessions one at a time, 0.2 s of tool time between turns.
LONG = [
    "--set",
    "workload.sessions=40",
    "--set",
    "load.concurrency=1",
    "--set",
    "workload.tool_latency_s=0.2",
]
NO_HANG_S = 120


def start_run(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmbench",
            "run",
            "agentic",
            *TINY,
            *LONG,
            *args,
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_lines(proc: subprocess.Popen, out: Path, is_enough, what: str) -> None:
    """Until `is_enough(lines)` holds for the whole lines of requests.jsonl (the run going on)."""
    deadline = time.monotonic() + NO_HANG_S
    path = out / "requests.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        lines = path.read_text().split("\n")[:-1] if path.is_file() else []
        if is_enough(lines):
            return
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {what} in {NO_HANG_S} s")


def wait_for_records(proc: subprocess.Popen, out: Path, count: int) -> None:
    """Until requests.jsonl holds `count` lines (the warm-up's included)."""
    wait_for_lines(proc, out, lambda lines: len(lines) >= count, f"{count} records")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_mid_run_keeps_the_results(tmp_path, signum):
    """SIGTERM (`timeout`, `docker stop`, CI), SIGHUP (a closed terminal) and Ctrl-C: the run
    saves what it measured, writes its reports and exits 128 + the signal."""
    out = tmp_path / "run"
    proc = start_run(out)
    wait_for_records(proc, out, 3)  # the warm-up and two measured requests
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=NO_HANG_S)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, stderr
    assert {143: "SIGTERM", 129: "SIGHUP", 130: "SIGINT"}[proc.returncode] == name
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"interrupted by {name}"
    assert stdout.strip().splitlines()[-1] == str(out)
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True and results["stop_reason"] == name
    assert results["summary"]["num_completed"] >= 2
    assert results["summary"]["num_completed"] < 40 * 2  # it did stop early
    for report in ("report.html", "report.md"):
        assert "partial results" in (out / report).read_text()
    assert not (out / "run-start.json").exists()


@pytest.mark.parametrize("where", ["under a regular file", "in /proc"])
def test_an_unwritable_out_fails_before_any_work(tmp_path, where):
    """One line naming the path, exit 2, before any work: the model (a path that does not
    exist) is never opened, or the error would be about it."""
    regular = tmp_path / "file"
    regular.write_text("x")
    out = regular / "run" if where == "under a regular file" else Path("/proc/llmbench-run")
    result = llmbench("run", "chat", "--set", f"model={tmp_path}/no-model", "--out", str(out))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {out}: cannot write there ("), (
        result.stderr
    )
    assert lines[0].endswith("pass a folder you can write to")


def test_kill_9_leaves_the_records_and_report_rebuilds_the_summary(tmp_path):
    out = tmp_path / "run"
    proc = start_run(out)
    wait_for_records(proc, out, 4)
    proc.kill()  # SIGKILL: nothing of llmbench runs after this
    proc.communicate(timeout=NO_HANG_S)
    assert not (out / "results.json").exists() and (out / "run-start.json").is_file()
    text = (out / "requests.jsonl").read_text()
    lines = text.splitlines()
    if not text.endswith("\n"):
        lines.pop()  # cut by the kill
    records = [json.loads(line) for line in lines]
    assert len(records) >= 4
    assert (out / "steps.jsonl").read_text().splitlines()  # the engine's steps too

    result = llmbench("report", str(out))
    assert result.returncode == 0, result.stderr
    completed = sum(1 for r in records if not r["is_warmup"] and r["error"] is None)
    assert result.stderr.strip() == (
        f"{out}: no results.json (the run was killed, or could not write it): rebuilt it from "
        f"requests.jsonl and steps.jsonl ({completed} requests completed)"
    )
    results = json.loads((out / "results.json").read_text())
    assert results["is_rebuilt"] is True and results["interrupted"] is True
    assert results["stop_reason"].startswith("killed")
    assert results["summary"]["num_completed"] == completed
    assert results["summary"]["sessions"]["num_sessions"] >= 1
    assert results["roofline"]["phases"]["decode"]["num_steps"] > 0
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert llmbench("report", str(out)).stderr == ""  # once rebuilt, read as it is


# The fault comes from outside: this wrapper makes the model's forward pass raise after 80 calls
# (the warm-up takes 32), then runs the real CLI. No file of the project is changed.
CRASHING = """
import sys
from llmbench.engine import model
forward, calls = model.LlamaModel.forward, [0]
def crashing(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] > 80:
        raise RuntimeError("injected forward failure")
    return forward(self, *args, **kwargs)
model.LlamaModel.forward = crashing
from llmbench.cli.main import main
sys.argv = ["llmbench", *sys.argv[1:]]
main()
"""


def test_an_engine_crash_is_one_line_exit_1_and_the_results_are_kept(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", CRASHING, "run", "agentic", *TINY, *SMALL["agentic"]]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=NO_HANG_S,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    error = "the engine stopped: RuntimeError: injected forward failure"
    assert result.stderr.strip().splitlines()[-1] == f"error: {error}"
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True and results["stop_reason"] == error
    assert results["summary"]["num_failed"] >= 1
    assert "partial results" in (out / "report.md").read_text()


def test_report_refuses_an_unknown_schema_version_in_one_line(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema_version": 99, "name": "from the future"}))
    for command in ("report", "export"):
        result = llmbench(command, str(tmp_path))
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == (
            f"error: {path}: results schema_version 99; this llmbench reads 1, 2, 3, 4, 5, 6, 7, "
            "8, 9: upgrade llmbench to read it"
        )


# Three repetitions of 2 agentic sessions one at a time, 0.2 s of tool time between turns: a
# repetition takes a few seconds, so a signal sent once repetition 2 has a record lands in it.
REPEATED = [
    "--set",
    "workload.sessions=2",
    "--set",
    "load.concurrency=1",
    "--set",
    "workload.tool_latency_s=0.2",
    "--repeat",
    "3",
]


def start_repeated_run(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "llmbench", "run", "agentic", *TINY, *REPEATED, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_repetition(proc: subprocess.Popen, out: Path, number: int) -> None:
    """Until requests.jsonl holds a whole line of repetition `number`."""
    wait_for_lines(
        proc,
        out,
        lambda lines: any(json.loads(line)["repetition"] == number for line in lines),
        f"record of repetition {number}",
    )


def test_a_signal_in_repetition_2_keeps_1_whole_and_2_partial(tmp_path):
    out = tmp_path / "run"
    proc = start_repeated_run(out)
    wait_for_repetition(proc, out, 2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=NO_HANG_S)
    assert proc.returncode == 143, stderr
    results = json.loads((out / "results.json").read_text())
    summary = results["summary"]
    assert [(r["repetition"], r["is_partial"]) for r in summary["repetitions"]] == [
        (1, False),
        (2, True),
    ]
    assert summary["repetitions"][1]["num_completed"] >= 1
    assert summary["num_completed"] == sum(r["num_completed"] for r in summary["repetitions"])
    # The spread is over the whole repetition only: one, so no stdev.
    assert summary["spread"]["tpot_ms.p50"]["stdev"] is None
    assert summary["spread"]["tpot_ms.p50"]["mean"] == summary["repetitions"][0]["tpot_ms"]["p50"]
    assert "repetitions: 1 whole, repetition 2 of 3 cut short (its numbers are partial)" in stdout
    assert "| 2 (partial) |" in (out / "report.md").read_text()
    sessions = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert {s["repetition"] for s in sessions} <= {1, 2}
    assert sum(s["repetition"] == 1 for s in sessions) == 2


def test_kill_9_in_repetition_2_and_report_rebuilds_the_repetitions(tmp_path):
    out = tmp_path / "run"
    proc = start_repeated_run(out)
    wait_for_repetition(proc, out, 2)
    proc.kill()
    proc.communicate(timeout=NO_HANG_S)
    assert not (out / "results.json").exists()
    result = llmbench("report", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "results.json").read_text())["summary"]
    # Repetition 1 ended (its sessions were logged when it did); 2 was cut by the kill.
    assert [(r["repetition"], r["is_partial"]) for r in summary["repetitions"]] == [
        (1, False),
        (2, True),
    ]
    assert summary["repetitions"][0]["sessions"]["num_sessions"] == 2
    assert summary["repetitions"][1]["num_completed"] >= 1
    assert "## Repetitions" in (out / "report.md").read_text()


def test_repeat_below_1_is_one_line(tmp_path):
    result = llmbench("run", "chat", "--repeat", "0", "--out", str(tmp_path / "x"))
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --repeat 0: must be >= 1"


def openai_at(url: str) -> list[str]:
    return ["--set", "backend.kind=openai", "--set", f"backend.url={url}"]


def test_a_run_whose_requests_all_fail_exits_1_with_the_reason_and_keeps_the_results(tmp_path):
    """Every request is refused (nothing listens on the port; the served model is named, so
    the backend starts without asking the server): one line naming the most common error,
    exit 1, and results and reports written all the same."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the run starts
    out = tmp_path / "run"
    url = f"http://127.0.0.1:{port}/v1"
    result = llmbench(
        "run", "chat", *TINY, *SMALL["chat"], *openai_at(url),
        "--set", "backend.served_model=m", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: all 3 measured requests failed; most common error (3 of 3): ")
    assert f"cannot connect to {url}" in last
    assert result.stdout.strip().splitlines()[-1] == str(out)  # the folder, as for any run
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["num_failed"] == 3 and summary["failed_fraction"] == 1.0
    assert summary["warnings"][0] == last.removeprefix("error: ")
    assert f"WARNING: {summary['warnings'][0]}" in result.stdout
    html = (out / "report.html").read_text()
    assert '<div class="banner" role="alert"><strong>Failed requests:</strong> all 3' in html


def test_failures_above_max_failed_fraction_are_loud_and_exit_1_only_with_strict(tmp_path):
    """Every 3rd request gets HTTP 500: 3 of 8 measured requests fail (37.5%, above 5%)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.streaming_server", "--port", "0", "--record",
         str(tmp_path / "record.jsonl"), "--mode", "error500", "--ttft-ms", "5", "--tpot-ms", "1"],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    runs = {}
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        for strict in ([], ["--strict"]):
            out = tmp_path / f"run{len(strict)}"
            runs[bool(strict)] = out, llmbench(
                "run", "rag", *TINY, *SMALL["rag"], "--set", "workload.sessions=8",
                *openai_at(url), *strict, "--out", str(out),
            )  # fmt: skip
    finally:
        server.kill()
        server.wait()
    # The server names the request in its error, so each text is its own (the first one wins).
    loud = (
        "3 of 8 measured requests failed (37.5%, above max_failed_fraction 5.0%); most common "
        "error (1 of 3): BackendError: HTTP 500: injected failure for request"
    )
    for strict, (out, result) in runs.items():
        assert result.returncode == (1 if strict else 0), result.stderr
        assert f"WARNING: {loud}" in result.stdout
        assert (out / "results.json").is_file()
        assert "Failed requests:</strong> 3 of 8" in (out / "report.html").read_text()
    assert runs[True][1].stderr.strip().splitlines()[-1].startswith(f"error: {loud}")


def test_the_same_seeded_run_twice_on_one_server_warns_of_its_warm_prefix_cache(tmp_path):
    """`llmbench serve` keeps its prefix cache between runs: the first run's first turns hit
    only the system prompt the warm-up cached (no warning); the same run again finds its whole
    first prompts cached and says so."""
    from llmbench.serve import ServeConfig
    from tests.serve.helpers import serving, tiny_engine

    workload = [
        "--set", "workload.turns=1", "--set", "workload.system_prompt_tokens=32",
        "--set", "workload.user_tokens=48", "--set", "workload.output_tokens=4",
    ]  # fmt: skip
    warm = "the server's prefix cache was warm before this run (first requests hit "
    with serving(tiny_engine(), ServeConfig(served_model_name="tiny")) as url:
        runs = [
            llmbench(
                "run",
                "chat",
                *TINY,
                *SMALL["chat"],
                *workload,
                *openai_at(f"{url}/v1"),
                "--no-report",
                "--out",
                str(tmp_path / f"run{k}"),
            )  # fmt: skip
            for k in (1, 2)
        ]
    for result in runs:
        assert result.returncode == 0, result.stderr
    first, second = (json.loads((tmp_path / f"run{k}/results.json").read_text()) for k in (1, 2))
    shared = first["provenance"]["shared_prefix_tokens"]
    assert 32 <= shared < 32 + 48  # the system prompt and the template, not a user message
    assert not any(w.startswith(warm) for w in first["summary"]["warnings"])
    assert f"WARNING: {warm}" not in runs[0].stdout
    (line,) = [w for w in second["summary"]["warnings"] if w.startswith(warm)]
    assert f"3 of 3 first turns had more cached than the {shared} tokens" in line
    assert f"WARNING: {line}" in runs[1].stdout


VARIANTS_SPEC = """name: tiny-variants
model: synthetic:tiny
dtype: float32
warmup_requests: 1
workload:
  kind: rag
  sessions: 3
  system_prompt_tokens: 8
  num_documents: 4
  docs_per_query: 2
  document_tokens: 24
  user_tokens: 8
  output_tokens: 12
load: {kind: concurrency, concurrency: 2}
variants:
  - name: int8
    set: {engine.quantize: int8}
  - name: ngram
    set: {engine.speculative.method: ngram}
  - name: broken
    set: {model: "synthetic:nosuch"}
"""


@pytest.fixture(scope="module")
def variants_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One `llmbench run` of three variants: int8 weights, n-gram speculation, and one whose
    model does not load."""
    folder = tmp_path_factory.mktemp("variants")
    spec = folder / "spec.yaml"
    spec.write_text(VARIANTS_SPEC)
    out = folder / "out"
    return out, llmbench("run", str(spec), "--out", str(out))


def test_variants_each_get_a_whole_run_folder_and_a_failure_keeps_the_others(variants_run):
    out, result = variants_run
    # The failed variant makes the run exit 1, with its one-line error last, no traceback.
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: variant broken: synthetic:nosuch: unknown preset")
    assert result.stdout.splitlines()[-1] == str(out)
    index = json.loads((out / "variants.json").read_text())
    assert [(v["name"], v["status"], v["folder"]) for v in index["variants"]] == [
        ("int8", "done", "variants/int8"),
        ("ngram", "done", "variants/ngram"),
        ("broken", "failed", "variants/broken"),
    ]
    assert index["variants"][0]["set"] == {"engine.quantize": "int8"}
    for name in ("int8", "ngram"):
        files = {p.name for p in (out / "variants" / name).iterdir()}
        assert {"results.json", "requests.jsonl", "steps.jsonl", "report.html"} <= files
    int8, ngram = (
        json.loads((out / "variants" / name / "results.json").read_text())
        for name in ("int8", "ngram")
    )
    # Each variant's results carry its own configuration, as its engine loaded it.
    quantize = [run["spec"]["engine"]["quantize"] for run in (int8, ngram)]
    assert quantize == ["int8", None]
    assert (int8["provenance"]["quantize"], ngram["provenance"]["quantize"]) == ("int8", None)
    # float32 weights: 4 bytes each; int8: 1 byte each plus a float scale per output channel.
    assert ngram["roofline"]["weight_bytes_per_param"] == 4.0
    assert 1.0 < int8["roofline"]["weight_bytes_per_param"] < 1.1
    assert int8["summary"]["speculative"] is None
    assert ngram["summary"]["speculative"]["num_proposed_tokens"] > 0
    assert not (out / "variants" / "broken").exists()  # it wrote nothing: no empty folder


def test_variants_top_report_has_a_row_per_variant(variants_run):
    out, result = variants_run
    html = (out / "report.html").read_text()
    for name in ("int8", "ngram"):
        assert f'<td><a href="variants/{name}/report.html">{name}</a></td>' in html
    assert "<td>broken</td><td>failed</td>" in html
    assert "<h2>Speculative decoding</h2>" in html
    # The terminal table: one row per variant, before the folder.
    table = result.stdout.splitlines()[-5:-1]
    assert table[0].split()[:3] == ["variant", "output", "tok/s"]
    assert [line.split()[0] for line in table[1:]] == ["int8", "ngram", "broken"]
    # `llmbench report` on the folder renders the top page again (and each variant's).
    (out / "report.html").unlink()
    again = llmbench("report", str(out))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [str(out / "report.html"), str(out / "report.md")]
    assert (out / "report.html").read_text().count("<h2>") == html.count("<h2>")


def test_vary_and_listed_variants_together_is_a_user_error(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(VARIANTS_SPEC)
    result = llmbench("run", str(spec), "--vary", "seed=1,2", "--out", str(tmp_path / "out"))
    assert_user_error(result, "--vary:", "lists variants already; use one or the other")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["chat", "--set", "load.rate_per_s=-1"],
            "error: --set load.rate_per_s=-1: load.rate_per_s: must be > 0, got -1.0",
        ),
        (
            ["chat", "--set", "workload.sesions=3"],
            "error: --set workload.sesions=3: workload.sesions: unknown key; known keys here: "
            "kind, output_tokens, sessions, system_prompt_tokens,",
        ),
        (
            ["chat", "--set", "load.sweep=1,2"],
            "error: --set load.sweep=1,2: load.sweep: must be a list, got str; write "
            "load.sweep=[1,2]",
        ),
        (
            ["chta"],
            "error: workload 'chta': no such file; did you mean chat? (give a YAML path or one of "
            "agentic, chat, rag)",
        ),
    ],
)
def test_a_mistyped_run_is_one_line_that_says_what_to_type(tmp_path, args, line):
    """A mistake in a --set names the --set as typed (not the shipped YAML, with no line), and
    a mistyped workload name gets the closest shipped one."""
    result = llmbench("run", *args, "--out", str(tmp_path / "out"))
    assert_user_error(result)
    assert result.stderr.startswith(line), result.stderr
    assert not (tmp_path / "out").exists()


def test_a_set_kind_and_a_sweep_say_what_was_dropped_and_end_with_a_table_and_the_folder(
    tmp_path,
):
    """chat.yaml's load is poisson: `--set load.kind=concurrency` drops its rate with a note; a
    sweep prints each point's summary on stderr, then a row per point, then the sweep folder
    as the last line (before: the last point's folder, and no table), after the highest load
    that met the SLOs."""
    out = tmp_path / "sweep"
    small = ["workload.sessions=2", "workload.turns=2", "workload.think_time_s=0.01"]
    sets = [*small, "workload.output_tokens=8", "load.kind=concurrency", "load.sweep=[1,2]"]
    options = [part for s in sets for part in ("--set", s)]
    result = llmbench("run", "chat", *TINY, *options, "--out", str(out), "--no-report")
    assert result.returncode == 0, result.stderr
    note = "note: --set load.kind=concurrency drops load.rate_per_s (a field of poisson loads)"
    assert note in result.stderr.splitlines()
    lines = result.stdout.splitlines()
    assert lines[-1] == str(out)
    # chat.yaml has SLOs: the highest load that met them, and goodput columns
    assert lines[-2] == tables.sweep_capacity(rundata.sweep_points(out))
    header, *rows = lines[-5:-2]
    assert header.split() == [
        "concurrency", "completed", "failed", "output", "tok/s", "TTFT", "p50", "TTFT", "p99",
        "TPOT", "p50", "TPOT", "p99", "decode", "MBU", "goodput", "req/s", "SLOs", "met",
    ]  # fmt: skip
    for point, row in zip((1, 2), rows, strict=True):
        results = json.loads((out / f"point-{point}" / "results.json").read_text())
        assert results["spec"]["load"]["kind"] == "concurrency"
        s = results["summary"]
        assert row.split()[:4] == [
            str(point),
            str(s["num_completed"]),
            str(s["num_failed"]),
            f"{s['output_tok_per_s']:,.1f}",
        ]
    # Each point's own summary is on stderr; stdout holds the folders and the table.
    assert result.stderr.count(" requests completed, ") == 2
    assert lines[:2] == [str(out / "point-1"), str(out / "point-2")]


@pytest.mark.parametrize(
    "args",
    [
        ["--set", "load.sweep=[1,2]"],  # a sweep: its points and root
        ["--vary", "workload.output_tokens=4,8"],
    ],
    ids=["sweep", "variants"],
)
def test_no_report_writes_the_numbers_and_no_pages_and_report_draws_them_later(tmp_path, args):
    """`--no-report`: every run folder has its results.json and no report.html or report.md;
    the table and the folder are still printed last; `llmbench report` draws the pages after
    (of the sweep: the variants folder's pages are drawn by the same `write_reports`)."""
    out = tmp_path / "out"
    small = ["workload.sessions=2", "workload.turns=1", "load.kind=concurrency"]
    options = [*(part for s in small for part in ("--set", s)), *args]
    result = llmbench("run", "chat", *TINY, *options, "--out", str(out), "--no-report")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == str(out)
    runs = sorted(path.parent for path in out.rglob("results.json"))
    assert len(runs) == 2, runs  # two points, or two variants
    assert not [*out.rglob("report.html"), *out.rglob("report.md"), *out.rglob("*.svg")]
    if args[0] == "--set":  # the sweep: drawn after, its root and its points (a few s a page)
        drawn = llmbench("report", str(out))
        assert drawn.returncode == 0, drawn.stderr
        assert (out / "report.html").is_file()
        assert all((run / "report.html").is_file() for run in runs)


@pytest.mark.parametrize(
    ("slo_ms", "points", "verdicts", "capacity"),
    [
        # SLOs every request meets: 1 met, 3 met, the edge lies past the range
        ("1000000", [1, 3], ["met", "met"], "concurrency 3, "),
        # a TTFT no request meets: 1 missed, nothing lower to try
        ("0.001", [1], ["missed"], "no point met the SLOs (ttft_ms ≤ 0.001, tpot_ms ≤ "),
    ],
)
def test_a_load_search_runs_its_ends_first_and_stops_where_they_answer(
    tmp_path, slo_ms, points, verdicts, capacity
):
    """`load.search` between concurrency 1 and 3: the points it ran, what each did against the
    SLOs (stderr), and the sweep's line naming the highest load that met them (stdout). The
    middle of the range is `capacity.next_load`'s (tests/harness/test_capacity.py)."""
    out = tmp_path / "search"
    small = ["workload.sessions=3", "workload.turns=2", "workload.think_time_s=0.01"]
    search = ["load.kind=concurrency", "load.search.low=1", "load.search.high=3"]
    sets = [*small, "workload.output_tokens=4", *search, f"slo.ttft_ms={slo_ms}"]
    result = llmbench(
        "run", "chat", *TINY, *[p for s in sets for p in ("--set", s)], "--no-report",
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("point-*")) == [f"point-{p}" for p in points]
    said = [line for line in result.stderr.splitlines() if line.startswith("search: ")]
    assert [line.split()[2] for line in said] == verdicts
    assert [line.split()[1] for line in said] == [f"point-{p}" for p in points]
    lines = result.stdout.splitlines()
    assert lines[-1] == str(out)
    assert capacity in lines[-2]
    assert lines[-2] == tables.sweep_capacity(rundata.sweep_points(out))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--vary", "engine.quantize=none,int8"],
            "load.search: not with variants: each variant is one run; drop load.search",
        ),
        (["--shard", "0/2"], "--shard 0/2: not with load.search (each load it runs follows"),
    ],
)
def test_a_load_search_is_one_configuration_in_one_process(tmp_path, options, message):
    search = ["--set", "load.search.low=1", "--set", "load.search.high=4"]
    result = llmbench("run", "chat", *TINY, *search, *options, "--out", str(tmp_path / "x"))
    assert_user_error(result, message)


def test_an_out_that_holds_a_run_is_refused_and_force_replaces_it(tmp_path):
    """`--out base1` twice replaced 21 records with 12 without a word; now the second run is
    one line, exit 2, before any work, and `--force` replaces the run (only its files)."""
    out = tmp_path / "base1"
    out.mkdir()
    old_records = "".join(f'{{"old": {i}}}\n' for i in range(21))
    (out / "requests.jsonl").write_text(old_records)
    (out / "notes.txt").write_text("mine\n")
    run = ["run", "rag", *TINY, *SMALL["rag"], "--no-report", "--out", str(out)]
    refused = llmbench(*run)
    assert_user_error(refused)
    assert refused.stderr.strip() == (
        f"error: --out {out}: holds a run already (requests.jsonl); pass --force to replace "
        "it, or another folder"
    )
    assert (out / "requests.jsonl").read_text() == old_records  # untouched
    replaced = llmbench(*run, "--force")
    assert replaced.returncode == 0, replaced.stderr
    assert len((out / "requests.jsonl").read_text().splitlines()) == 1 + 4  # the new run's
    assert (out / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("old", "args", "held"),
    [
        ("point-1/results.json", ["--set", "load.sweep=[1,2]"], "point-1/"),
        ("variants.json", ["--vary", "seed=1,2"], "variants.json"),
    ],
)
def test_a_sweep_or_variants_root_that_holds_a_run_is_refused(tmp_path, old, args, held):
    out = tmp_path / "root"
    (out / old).parent.mkdir(parents=True, exist_ok=True)
    (out / old).write_text("{}\n")
    result = llmbench("run", "rag", *TINY, *SMALL["rag"], *args, "--out", str(out))
    assert_user_error(result, f"--out {out}: holds a run already ({held}); pass --force")


# The disk fills up from outside: this wrapper gives requests.jsonl room for 3 lines (the
# warm-up and 2 measured requests), then every write fails as on a full disk (ENOSPC), with
# 0 bytes free; then it runs the real CLI. No file of the project is changed.
FULL_DISK = """
import errno, shutil, sys, types
from llmbench.harness import record_log
real, state = record_log._write, {"left": 3, "full": False}
def write(f, data):
    if state["full"]:
        raise OSError(errno.ENOSPC, "No space left on device")
    if not f.name.endswith("requests.jsonl"):
        return real(f, data)
    lines = data.splitlines(keepends=True)
    fits = lines[: state["left"]]
    real(f, b"".join(fits))
    state["left"] -= len(fits)
    if len(fits) < len(lines):
        state["full"] = True
        raise OSError(errno.ENOSPC, "No space left on device")
record_log._write = write
shutil.disk_usage = lambda path: types.SimpleNamespace(total=204800, used=204800, free=0)
from llmbench.cli.main import main
sys.argv = ["llmbench", *sys.argv[1:]]
main()
"""


def test_a_full_disk_is_one_line_exit_1_and_the_run_stops(tmp_path):
    """Before: the progress said 12/12, 0 errors, then an OSError traceback, exit 1, no
    results.json. Now the first failed write stops the run: one line naming the file, the space
    left and what was kept, exit 1; the summary of every request is still printed."""
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK, "run", "agentic", *TINY, *SMALL["agentic"]]
        + ["--set", "load.concurrency=1", "--set", "workload.tool_latency_s=0.2"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=NO_HANG_S,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "12/12 requests" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == result.stderr.strip().splitlines()[-1]
    assert errors[0].startswith(
        f"error: {out / 'requests.jsonl'}: cannot write (No space left on device; 0 B free "
        "there); the run stopped; on disk 3 of "
    )
    assert "requests completed" in result.stdout  # the summary, from the records in memory
    assert len((out / "requests.jsonl").read_text().splitlines()) == 3
