"""`llmbench compare` end to end, as CI runs it: synthetic run folders from a known distribution
(3 repetitions, seeded lognormal latencies, written by the project's own writers), then two real
tiny engine runs. Exit 0 pass, 1 regression (explained under the table, or on stderr with
--format markdown / json), 2 unusable input (one line)."""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cli.helpers import streaming_server
from tests.harness.synthetic_runs import write_run, write_sweep
from tests.harness.test_run import SMALL, TINY, llmbench
from tests.reports.browser import open_in_chromium

REPO_ROOT = Path(__file__).resolve().parents[2]

TPOT_GATE = "tpot_ms.p50: {max_increase: 5%}\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare-cli")
    return {
        "base": write_run(root / "base", seed=1),
        "same": write_run(root / "same", seed=2),
        "slower": write_run(root / "slower", seed=3, slowdown=1.2),
        "other-workload": write_run(root / "other-workload", seed=4, sessions=5),
        "busy-slower": write_run(root / "busy-slower", seed=5, slowdown=1.2, is_busy=True),
        "gpu-slower": write_run(root / "gpu-slower", seed=6, slowdown=1.2, device_name="Big GPU"),
    }


@pytest.fixture(scope="module")
def tpot_gates(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gates") / "gates.yaml"
    path.write_text(TPOT_GATE)
    return path


def compare(*args, env: dict[str, str] | None = None):
    clean = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    return llmbench("compare", *map(str, args), env={**clean, **(env or {})})


def one_error_line(result) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_twenty_percent_slower_exits_1_naming_the_metric(runs):
    result = compare(runs["base"], runs["slower"])
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("llmbench compare: REGRESSION")
    notes = result.stdout.split("\n\n")[-1].splitlines()
    assert any(
        line.startswith("decode_mbu max_decrease 10%: decode_mbu fell ")
        and line.endswith("past the 10% allowed")
        for line in notes
    ), result.stdout
    assert any(line.startswith("output_tok_per_s_per_gb_s max_decrease 10%: ") for line in notes)
    # Markdown and JSON go to files: the people reading the log get the failing gates on stderr.
    for fmt in ("markdown", "json"):
        failing = compare(runs["base"], runs["slower"], "--format", fmt).stderr.splitlines()
        assert any(
            line.startswith("regression: decode_mbu max_decrease 10%: decode_mbu fell ")
            and line.endswith("past the 10% allowed")
            for line in failing
        ), failing


def test_the_table_explains_each_verdict_once(runs):
    """The terminal shows stdout and stderr together: the reasons under the table are all."""
    result = compare(runs["base"], runs["slower"])
    assert result.returncode == 1
    assert result.stderr == ""
    seen = result.stdout + result.stderr
    for line in result.stdout.split("\n\n")[-1].splitlines():
        reason = line.split(": ", 1)[1]
        assert seen.count(reason) == 1, reason


def test_single_repetitions_have_no_interval(tmp_path):
    """One repetition per side: a rate or roofline fraction has one value per side, so there is
    no interval to show, not a zero-width one (`-15.5% … -15.5%`) that reads as certainty."""
    base = write_run(tmp_path / "base", seed=1, num_repetitions=1)
    new = write_run(tmp_path / "new", seed=2, num_repetitions=1, slowdown=1.2)
    junit = tmp_path / "compare.xml"
    result = compare(base, new, "--junit", junit)
    assert result.returncode == 1, result.stderr
    # The rates and roofline fractions (one value per repetition); latency gates resample the
    # requests, so they keep an interval.
    rows = [line for line in result.stdout.splitlines() if "max_decrease" in line]
    mbu_row = next(line for line in rows if line.startswith("decode_mbu max_decrease 10% "))
    assert "  1 repetition: no interval  regression" in mbu_row
    assert rows and all(" … " not in row and "95% CI -" not in row for row in rows)
    assert re.search(
        r"\ndecode_mbu max_decrease 10%: decode_mbu fell \d+\.\d% \(1 repetition: no interval\), "
        r"past the 10% allowed\n",
        result.stdout,
    ), result.stdout
    assert result.stderr.splitlines() == [
        f"note: {side} has 1 repetition: its rates and roofline fractions have no interval, so "
        "their gates judge the change alone (`llmbench run --repeat 3`)"
        for side in ("BASE", "NEW")
    ]
    markdown = compare(base, new, "--format", "markdown").stdout
    assert "| `decode_mbu max_decrease 10%` |" in markdown
    assert "| 1 repetition: no interval | **regression** |" in markdown
    [case] = [
        c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name").startswith("decode")
    ]
    assert "(1 repetition: no interval)" in case.find("failure").get("message")
    assert "(1 repetition: no interval)" in case.find("system-out").text
    gates = json.loads(compare(base, new, "--format", "json").stdout)["gates"]
    gates = [g for g in gates if g["metric"] in ("decode_mbu", "prefill_mfu", "output_tok_per_s")]
    assert len(gates) == 3
    assert all(g["delta_ci"] == [None, None] and g["delta"] < 0 for g in gates)
    assert all(g["num_baseline_repetitions"] == 1 for g in gates)
    page = tmp_path / "diff.html"
    assert compare(base, new, "--html", page).returncode == 1
    assert "<td>1 repetition: no interval</td>" in page.read_text()


def test_a_latency_gate_names_its_numbers(runs, tpot_gates):
    result = compare(runs["base"], runs["slower"], "--gates", tpot_gates)
    assert result.returncode == 1
    line = result.stdout.splitlines()[-1]
    assert line.startswith("tpot_ms.p50 max_increase 5%: tpot_ms.p50 rose ")
    assert "95% CI +" in line and line.endswith("past the 5% allowed")


def test_the_same_distribution_with_another_seed_exits_0(runs, tpot_gates):
    for gates in ((), ("--gates", tpot_gates)):
        result = compare(runs["base"], runs["same"], *gates)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        assert result.stdout.startswith("llmbench compare: no regression")


def test_mismatched_workloads_exit_2_with_the_reason(runs):
    line = one_error_line(compare(runs["base"], runs["other-workload"]))
    assert line.startswith("error: BASE and NEW are not the same benchmark: workload_hash ")
    assert "(spec workload.sessions: 8 vs 5)" in line
    assert line.endswith("pass --force to compare them anyway")
    assert compare(runs["base"], runs["other-workload"], "--force").returncode in (0, 1)


def test_a_corrupt_results_file_exits_2_without_a_traceback(runs, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(runs["same"], folder)
    (folder / "results.json").write_text('{"schema_version": 3, "summary": {')
    line = one_error_line(compare(runs["base"], folder))
    assert line.startswith(f"error: {folder / 'results.json'}: not valid JSON")
    (folder / "results.json").write_bytes(b"\xff\xfe garbage")
    line = one_error_line(compare(runs["base"], folder))
    assert line.startswith(f"error: {folder / 'results.json'}: cannot read it")


def test_an_unknown_schema_version_exits_2(runs, tmp_path):
    folder = tmp_path / "future"
    shutil.copytree(runs["same"], folder)
    data = json.loads((folder / "results.json").read_text())
    (folder / "results.json").write_text(json.dumps({**data, "schema_version": 99}))
    line = one_error_line(compare(runs["base"], folder / "results.json"))
    assert "results schema_version 99; this llmbench reads" in line
    assert line.endswith("upgrade llmbench to read it")


def test_missing_inputs_and_bad_gates_exit_2(runs, tmp_path):
    line = one_error_line(compare(runs["base"], tmp_path / "nope"))
    assert line == (
        f"error: {tmp_path / 'nope'}: no such file or folder; pass a run folder, a sweep folder "
        "or a results.json"
    )
    gates = tmp_path / "gates.yaml"
    gates.write_text("tpot_ms.p50: {max_increase: 5%}\ndecode_mbu: {max_increase: 5%}\n")
    line = one_error_line(compare(runs["base"], runs["same"], "--gates", gates))
    assert line == (
        f"error: {gates}:2: decode_mbu.max_increase: decode_mbu is better when higher; gate it "
        "with max_decrease"
    )
    # An output file that cannot be written is refused before the comparison is printed.
    result = compare(runs["base"], runs["same"], "--junit", tmp_path / "no" / "j")
    assert one_error_line(result) == (
        f"error: --junit {tmp_path / 'no' / 'j'}: the folder {tmp_path / 'no'} does not exist"
    )
    assert result.stdout == ""
    line = one_error_line(compare(runs["base"], runs["same"], "--html", tmp_path))
    assert line == f"error: --html {tmp_path}: is a folder; give a file name"


def test_markdown_and_junit_outputs_parse(runs, tmp_path, tpot_gates):
    junit = tmp_path / "compare.xml"
    options = ("--gates", tpot_gates, "--format", "markdown", "--junit", junit)
    result = compare(runs["base"], runs["slower"], *options)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("### llmbench compare: REGRESSION")
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| gate | BASE | NEW | change | 95% CI | verdict |"
    assert table[1] == "|---|---|---|---|---|---|"
    [row] = table[2:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "`tpot_ms.p50 max_increase 5%`" and cells[5] == "**regression**"
    suites = ET.parse(junit).getroot()
    [suite] = suites.findall("testsuite")
    assert suite.get("tests") == "1" and suite.get("failures") == "1"
    [case] = suite.findall("testcase")
    assert case.get("name") == "tpot_ms.p50 max_increase 5%"
    assert case.find("failure").get("type") == "regression"


def test_json_verdicts(runs):
    result = compare(runs["base"], runs["slower"], "--format", "json")
    data = json.loads(result.stdout)
    assert data["has_regression"] is True
    verdicts = {g["metric"]: g["verdict"] for g in data["gates"]}
    assert verdicts["decode_mbu"] == "regression"
    assert all(g["num_baseline_repetitions"] == 3 for g in data["gates"])


def test_the_seed_makes_the_intervals_reproducible(runs):
    first = compare(runs["base"], runs["same"], "--format", "json", "--seed", "7")
    again = compare(runs["base"], runs["same"], "--format", "json", "--seed", "7")
    other = compare(runs["base"], runs["same"], "--format", "json", "--seed", "8")
    assert first.stdout == again.stdout and json.loads(first.stdout)["seed"] == 7
    assert (
        json.loads(other.stdout)["gates"][0]["delta_ci"]
        != (json.loads(first.stdout)["gates"][0]["delta_ci"])
    )


def test_results_files_alone_have_no_latency_data(runs, tmp_path, tpot_gates):
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    shutil.copy(runs["base"] / "results.json", base)
    shutil.copy(runs["slower"] / "results.json", new)
    result = compare(base, new, "--gates", tpot_gates)
    assert result.returncode == 2  # no silent pass: a gate without data is no verdict
    notes = [
        f"note: {side} has no requests.jsonl beside {path}: its latency gates have no data"
        for side, path in (("BASE", base), ("NEW", new))
    ]
    [error] = result.stderr.splitlines()[2:]
    assert result.stderr.splitlines()[:2] == notes
    assert error.startswith("error: tpot_ms.p50 max_increase 5%: no data: ")
    assert error.endswith("leave the gate out of --gates, or pass --allow-missing")
    assert "tpot_ms.p50 was not measured by NEW" in result.stdout
    assert result.stdout.startswith("llmbench compare: NO VERDICT (1 no data)")
    allowed = compare(base, new, "--gates", tpot_gates, "--allow-missing")
    assert allowed.returncode == 0 and allowed.stderr.splitlines() == notes
    assert compare(base, new).returncode == 1  # per-repetition metrics need no records


def test_markdown_is_appended_to_the_github_step_summary(runs, tmp_path):
    summary = tmp_path / "step-summary.md"
    summary.write_text("# earlier step\n")
    env = {"GITHUB_STEP_SUMMARY": str(summary)}
    assert compare(runs["base"], runs["same"], env=env).returncode == 0
    assert compare(runs["base"], runs["slower"], env=env).returncode == 1
    text = summary.read_text()
    assert text.startswith("# earlier step\n### llmbench compare: no regression")
    assert text.count("### llmbench compare: ") == 2
    assert "\n### llmbench compare: REGRESSION" in text


def test_a_busy_machine_makes_a_regression_inconclusive_unless_allowed(runs):
    result = compare(runs["base"], runs["busy-slower"])
    assert result.returncode == 0
    assert "NEW: cpu: Test CPU (2 threads) (machine busy)" in result.stdout
    assert result.stderr.splitlines()[0] == (
        "note: NEW ran on a busy machine (other processes used 1.0 of 2 cores): a regression "
        "there is called inconclusive unless --allow-busy"
    )
    assert any(
        line.startswith("decode_mbu max_decrease 10%: decode_mbu fell ")
        and line.endswith("; measured on a busy machine, so not called a regression unless allowed")
        for line in result.stdout.splitlines()
    )
    assert compare(runs["base"], runs["busy-slower"], "--allow-busy").returncode == 1


def test_raw_gates_are_refused_between_devices_unless_forced(runs, tpot_gates):
    result = compare(runs["base"], runs["gpu-slower"], "--gates", tpot_gates, "--format", "json")
    assert result.returncode == 2  # a refused gate is no verdict, not a pass
    (error,) = result.stderr.splitlines()  # said once, as the error it is
    assert error.startswith("error: tpot_ms.p50 max_increase 5%: refused: tpot_ms.p50 is a raw")
    assert error.endswith(
        "pass --force-devices to compare raw numbers across devices, or gate a "
        "hardware-normalised metric"
    )
    assert json.loads(result.stdout)["is_unusable"] is True
    allowed = ("--gates", tpot_gates, "--allow-missing")
    assert compare(runs["base"], runs["gpu-slower"], *allowed).returncode == 0
    # Hardware-normalised gates travel between devices.
    assert compare(runs["base"], runs["gpu-slower"]).returncode == 1
    forced = compare(runs["base"], runs["gpu-slower"], "--gates", tpot_gates, "--force-devices")
    assert forced.returncode == 1


def test_sweeps_are_compared_point_by_point(tmp_path):
    base = write_sweep(tmp_path / "base", seed=10, points=(1, 2))
    new = tmp_path / "new"
    write_run(new / "point-1", seed=30, sweep_point=1.0)
    write_run(new / "point-2", seed=31, sweep_point=2.0, slowdown=1.3)
    junit = tmp_path / "sweep.xml"
    result = compare(base, new, "--junit", junit)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("llmbench compare: sweep of 2 points, REGRESSION at point-2\n")
    assert "\n== point-1 ==\nllmbench compare: no regression" in result.stdout
    assert result.stderr == ""
    result = compare(base, new, "--format", "markdown")
    failing = [line for line in result.stderr.splitlines() if line.startswith("regression")]
    assert failing and all(line.startswith("regression: point-2: ") for line in failing)
    suites = ET.parse(junit).getroot()
    assert [s.get("name") for s in suites.findall("testsuite")] == [
        "llmbench compare point-1",
        "llmbench compare point-2",
    ]
    # 6 default gates a point: 3 hardware-normalised, 3 raw (both sweeps ran on one device)
    assert suites.get("tests") == "12" and suites.get("failures") == str(len(failing))
    data = json.loads(compare(base, new, "--format", "json").stdout)
    assert [p["point"] for p in data["points"]] == ["point-1", "point-2"]
    assert [p["has_regression"] for p in data["points"]] == [False, True]
    markdown = compare(base, new, "--format", "markdown").stdout
    assert markdown.startswith("## llmbench compare: sweep of 2 points, REGRESSION at point-2")
    assert "\n### point-1: no regression" in markdown and "\n### point-2: REGRESSION" in markdown
    other = write_sweep(tmp_path / "other", seed=40, points=(1, 4))
    line = one_error_line(compare(base, other))
    assert "the sweeps' points differ: only BASE has point-2; only NEW has point-4" in line


def test_two_sweeps_with_slos_name_each_sides_highest_load_that_met_them(tmp_path):
    """The gates judge point by point; a note says what each whole sweep takes within its SLOs
    (`capacity.capacity_line`)."""
    from tests.reports.test_sweep_capacity import write_sweep as write_slo_sweep

    write_slo_sweep(tmp_path / "base", {1: 1.0, 2: 0.95, 4: 0.5})
    write_slo_sweep(tmp_path / "new", {1: 0.97, 2: 0.6, 4: 0.2})
    result = compare(tmp_path / "base", tmp_path / "new")
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    limits = "(ttft_ms ≤ 200, tpot_ms ≤ 50) for 90% of its requests"
    assert notes[-2:] == [
        f"note: BASE: highest load that met the SLOs {limits}: concurrency 2, 3.80 good req/s "
        "(95.0% met)",
        f"note: NEW: highest load that met the SLOs {limits}: concurrency 1, 1.94 good req/s "
        "(97.0% met)",
    ]


def test_the_html_diff_is_written(runs, tmp_path):
    page = tmp_path / "diff.html"
    assert compare(runs["base"], runs["slower"], "--html", page).returncode == 1
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "llmbench compare: REGRESSION" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_two_real_tiny_engine_runs_compare_end_to_end(tmp_path):
    """Two runs of the same spec on the tiny model: every default gate gets numbers from both
    sides; a run against itself changes by exactly 0 and passes."""
    folders = []
    for name in ("a", "b"):
        out = tmp_path / name
        run = llmbench("run", "chat", *TINY, *SMALL["chat"], "--out", str(out))
        assert run.returncode == 0, run.stderr
        folders.append(out)
    page, junit = tmp_path / "diff.html", tmp_path / "junit.xml"
    result = compare(*folders, "--format", "json", "--html", page, "--junit", junit)
    # Two runs on a shared 2-core machine may truly differ by more than the gates allow.
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    assert [g["metric"] for g in data["gates"]] == [  # engine runs on one device
        "decode_mbu",
        "output_tok_per_s_per_gb_s",
        "prefill_mfu",
        "tpot_ms.p50",
        "itl_ms.p90",
        "output_tok_per_s",
    ]
    for gate in data["gates"]:
        assert gate["baseline"] > 0 and gate["new"] > 0, gate
        assert gate["verdict"] in ("regression", "inconclusive", "within noise", "improvement")
    assert result.returncode == (1 if data["has_regression"] else 0)
    cases = ET.parse(junit).getroot().iter("testcase")
    assert [case.get("name") for case in cases] == [g["gate"] for g in data["gates"]]
    opened = open_in_chromium(page, "figure > svg", tmp_path / "diff.png")
    assert opened.console_errors == [] and opened.requests == []
    assert len(opened.element_sizes) == 3  # roofline, TTFT and TPOT CDFs
    itself = compare(folders[0], folders[0], "--format", "json")
    assert itself.returncode == 0, itself.stderr
    assert {g["delta"] for g in json.loads(itself.stdout)["gates"]} == {0.0}


def test_two_servers_at_two_addresses_compare_on_their_latency(tmp_path):
    """BASE and NEW against servers at different addresses are one benchmark (the address is
    the system under test, not the benchmark), and two instances of one server are one device:
    the default server gates catch a 20% slower TPOT with no flag, pass identical servers, and
    missing input is exit 2. A TPOT is the last chunk's lateness spread over the request's
    gaps: 64 tokens (not 16) keep a busy neighbour's few milliseconds from hiding the 20%."""
    tpots = (10.0, 10.0, 12.0)
    servers = [streaming_server(t, tmp_path / f"server-{i}.jsonl") for i, t in enumerate(tpots)]
    try:
        folders = []
        for name, (_, url) in zip(("base", "same", "slower"), servers, strict=True):
            folder = tmp_path / name
            run = llmbench(
                "run",
                "chat",
                *TINY,
                *("--set", "workload.sessions=6", "--set", "workload.turns=2"),
                *("--set", "workload.think_time_s=0", "--set", "workload.output_tokens=64"),
                *("--set", "load.kind=concurrency", "--set", "load.concurrency=3"),
                *("--set", "backend.kind=openai", "--set", f"backend.url={url}"),
                "--no-report",
                "--out",
                str(folder),
            )
            assert run.returncode == 0, run.stderr
            folders.append(folder)
    finally:
        for process, _ in servers:
            process.stdin.close()
            process.wait(timeout=10)
    base, same, slower = folders
    device = json.loads((base / "results.json").read_text())["provenance"]["device"]
    assert device["name"] == "server (version not said): streaming-test-model"
    assert compare(base, same).returncode == 0
    # --allow-busy: the servers run on this machine, which a neighbour may keep busy.
    result = compare(base, slower, "--format", "json", "--allow-busy")
    assert result.returncode == 1, result.stderr
    verdicts = {g["metric"]: g["verdict"] for g in json.loads(result.stdout)["gates"]}
    assert verdicts["tpot_ms.p50"] == "regression"
    assert verdicts["failed_fraction"] == "pass"
    assert "regression: tpot_ms.p50 max_increase 10%: tpot_ms.p50 rose" in result.stderr
    assert compare(base, tmp_path / "no-such-run").returncode == 2


# -- compare --history DIR -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    """10 runs of one spec; run-06 on are 1.3× slower (a regression that is still there)."""
    root = tmp_path_factory.mktemp("compare-history") / "history"
    for i in range(10):
        write_run(root / f"run-{i:02d}", seed=100 + i, slowdown=1.3 if i >= 6 else 1.0)
    return root


def test_history_names_the_run_where_the_slowdown_began(history, tmp_path):
    result = compare("--history", history)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(f"llmbench compare --history {history}: REGRESSION (")
    assert "10 runs, oldest first by name (a run has no start time): run-00 … run-09" in (
        result.stdout
    )
    assert "tpot_ms.p50 (max_increase 10%): 10 runs, 1 change point; last: REGRESSION" in (
        result.stdout
    )
    assert re.search(
        r"\n  run-06: 19\.\d+ ms → 2[56]\.\d+ ms \(\+3\d\.\d%\) regression", result.stdout
    )
    data = json.loads(compare("--history", history, "--format", "json").stdout)
    assert data["has_regression"] and data["runs"] == [f"run-{i:02d}" for i in range(10)]
    for metric in data["metrics"]:  # every default gate: the shift, at run-06, the bad way
        (point,) = metric["change_points"]
        assert (point["run"], point["index"], point["is_regression"]) == ("run-06", 6, True)
        assert point["change"] == pytest.approx(
            (point["after"] - point["before"]) / point["before"]
        )
        assert point["after"] == pytest.approx(sum(metric["values"][6:]) / 4)
    page = tmp_path / "history.html"
    assert compare("--history", history, "--html", page).returncode == 1
    opened = open_in_chromium(page, "figure > svg", tmp_path / "history.png")
    assert opened.console_errors == [] and opened.requests == []
    assert len(opened.element_sizes) == len(data["metrics"])


def test_history_passes_when_the_shift_is_within_the_gate_or_gone(history, tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("tpot_ms.p50: {max_increase: 50%}\n")
    result = compare("--history", history, "--gates", gates, "--format", "json")
    assert result.returncode == 0, result.stderr
    (metric,) = json.loads(result.stdout)["metrics"]
    assert [p["run"] for p in metric["change_points"]] == ["run-06"]
    flat = tmp_path / "flat"
    for i in range(8):
        write_run(flat / f"run-{i}", seed=300 + i)
    assert compare("--history", flat).returncode == 0


def test_history_input_mistakes_are_one_line(history, runs, tmp_path):
    assert "--history DIR takes no BASE or NEW" in one_error_line(
        compare(runs["base"], "--history", history)
    )
    assert "give BASE and NEW (two run folders), or --history DIR" in one_error_line(compare())
    assert "no such folder" in one_error_line(compare("--history", tmp_path / "nowhere"))
    mixed = tmp_path / "mixed"
    shutil.copytree(runs["base"], mixed / "a")
    assert "a history needs at least 2" in one_error_line(compare("--history", mixed))
    shutil.copytree(runs["other-workload"], mixed / "b")
    line = one_error_line(compare("--history", mixed))
    assert "runs a and b are not the same benchmark: " in line and "--force" in line
    assert compare("--history", mixed, "--force").returncode == 0
    assert "--junit is for BASE NEW" in one_error_line(
        compare("--history", history, "--junit", tmp_path / "x.xml")
    )


def test_two_run_options_are_refused_with_history(tmp_path):
    for option in ("--allow-busy", "--force-devices", "--allow-missing"):
        result = compare("--history", tmp_path, option)
        assert result.returncode == 2
        assert result.stderr.strip() == f"error: {option} is for BASE NEW, not --history; drop it"
