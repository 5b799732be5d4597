"""BASE and NEW read from real run folders (written by the project's own writers): samples that
match the summary, repetitions, normalised rates, pairing, and every unusable input in one
line."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from llmbench.compare.gates import default_gates
from llmbench.compare.runs import (
    device_label,
    differences,
    load_run,
    load_side,
    pair_runs,
    spec_differences,
)
from llmbench.compare.verdict import compare
from llmbench.errors import UserError
from llmbench.harness.metrics import LATENCY_FAMILIES
from llmbench.harness.results import READABLE_VERSIONS, Device, read_results, write_results
from tests.harness.synthetic_runs import READ_BYTES_PER_S, write_run, write_sweep


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("compare-runs") / "base", seed=1)


def _rewrite(folder: Path, **changes) -> None:
    """Replace fields of a folder's results.json (`provenance=...`, `summary=...`)."""
    result = read_results(folder)
    write_results(folder, dataclasses.replace(result, **changes))


def _pooled(groups) -> np.ndarray:
    return np.concatenate([np.asarray(g) for g in groups])


# -- samples -------------------------------------------------------------------------------------


def test_latency_samples_are_the_summarys_own_per_repetition_and_pooled(base):
    run = load_run(base / "results.json")
    summary = run.result.summary
    assert set(run.samples.per_request) == set(LATENCY_FAMILIES)
    for family in LATENCY_FAMILIES:
        groups = run.samples.per_request[family]
        assert len(groups) == 3, family
        pooled = _pooled(groups)
        assert len(pooled) == summary[family]["count"], family
        for q in ("p50", "p90", "p99"):
            assert np.percentile(pooled, float(q[1:])) == pytest.approx(summary[family][q])
        for group, repetition in zip(groups, summary["repetitions"], strict=True):
            assert np.mean(group) == pytest.approx(repetition[family]["mean"]), family
    # 40 requests a repetition, 16 tokens each: 15 token gaps per request.
    assert [len(g) for g in run.samples.per_request["tpot_ms"]] == [40, 40, 40]
    assert [len(g) for g in run.samples.per_request["itl_ms"]] == [600, 600, 600]


def test_warmup_requests_are_neither_samples_nor_records(base):
    run = load_run(base / "results.json")
    assert max(_pooled(run.samples.per_request["ttft_ms"])) < 1000  # the warm-up's is 5 s
    assert len(run.requests) == 120 and not any(r.is_warmup for r in run.requests)
    assert len(run.steps) == 16 + 120 * 16  # the warm-up's steps are roofline points too


def test_per_repetition_values_come_from_summary_repetitions(base):
    run = load_run(base / "results.json")
    repetitions = run.result.summary["repetitions"]
    values = run.samples.per_repetition
    assert values["decode_mbu"] == [r["decode_mbu"] for r in repetitions]
    assert values["prefill_mfu"] == [r["prefill_mfu"] for r in repetitions]
    assert values["prefix_cache_hit_rate"] == [0.0, 0.0, 0.0]
    # tok/s per GB/s of the measured read bandwidth (19 GB/s).
    assert values["output_tok_per_s_per_gb_s"] == pytest.approx(
        [r["output_tok_per_s"] / 19.0 for r in repetitions]
    )
    assert READ_BYTES_PER_S == 19e9
    assert run.num_repetitions == 3 and run.has_records
    assert run.samples.device == "cpu: Test CPU (2 threads)" and run.samples.is_busy is False


def test_a_file_from_before_repetitions_is_one_repetition(tmp_path):
    folder = write_run(tmp_path / "old", seed=2, num_repetitions=None)
    lines = (folder / "requests.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    for row in rows:
        del row["repetition"]  # as the records of an older llmbench
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(folder / "results.json")
    summary = run.result.summary
    assert run.num_repetitions == 1
    assert run.samples.per_repetition["decode_mbu"] == [summary["decode_mbu"]]
    assert run.samples.per_repetition["output_tok_per_s"] == [summary["output_tok_per_s"]]
    assert [len(g) for g in run.samples.per_request["tpot_ms"]] == [40]


def test_a_repetition_cut_short_is_left_out_when_whole_ones_exist(tmp_path):
    folder = write_run(tmp_path / "cut", seed=8)
    summary = read_results(folder).summary
    repetitions = [dict(r) for r in summary["repetitions"]]
    repetitions[2]["is_partial"] = True
    _rewrite(folder, summary={**summary, "repetitions": repetitions}, interrupted=True)
    run = load_run(folder / "results.json")
    assert run.num_repetitions == 2
    assert run.samples.per_repetition["decode_mbu"] == [r["decode_mbu"] for r in repetitions[:2]]
    assert [len(g) for g in run.samples.per_request["ttft_ms"]] == [40, 40]
    for r in repetitions:  # with no whole repetition, the partial ones are all there is
        r["is_partial"] = True
    _rewrite(folder, summary={**summary, "repetitions": repetitions})
    assert len(load_run(folder / "results.json").samples.per_request["ttft_ms"]) == 3


def test_without_measured_roofs_there_is_no_normalised_rate(tmp_path):
    folder = write_run(tmp_path / "run", seed=3)
    provenance = read_results(folder).provenance
    _rewrite(folder, provenance=dataclasses.replace(provenance, hardware=None))
    values = load_run(folder / "results.json").samples.per_repetition
    assert "output_tok_per_s_per_gb_s" not in values
    assert len(values["output_tok_per_s"]) == 3


def test_a_busy_run_and_its_device():
    assert device_label(Device("cpu", "AMD EPYC", 2, "torch reference ops")) == (
        "cpu: AMD EPYC (2 threads)"
    )
    assert device_label(Device("cuda", "NVIDIA H100", 16)) == "cuda: NVIDIA H100 (16 threads)"
    assert device_label(Device("remote", url="http://gpu:8000/v1")) == "remote: http://gpu:8000/v1"


def test_busy_flag_comes_from_the_machine_load(tmp_path):
    folder = write_run(tmp_path / "busy", seed=4, is_busy=True)
    assert load_run(folder / "results.json").samples.is_busy is True


def test_a_results_file_reads_the_records_beside_it_only_under_its_own_name(base, tmp_path):
    assert load_run(base / "results.json").has_records
    alone = tmp_path / "baseline.json"
    shutil.copy(base / "results.json", alone)
    run = load_run(alone)
    assert not run.has_records and run.requests == () and run.steps == ()
    assert all(groups == [] for groups in run.samples.per_request.values())
    assert (
        run.samples.per_repetition["decode_mbu"]
        == load_run(base / "results.json").samples.per_repetition["decode_mbu"]
    )
    assert list(load_side(alone)) == [None] and list(load_side(base)) == [None]


# -- unusable input, one line each ---------------------------------------------------------------


def _one_line_error(path: Path) -> str:
    with pytest.raises(UserError) as error:
        load_side(path)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_missing_and_empty_paths(tmp_path):
    assert _one_line_error(tmp_path / "nope") == (
        f"{tmp_path / 'nope'}: no such file or folder; pass a run folder, a sweep folder or a "
        "results.json"
    )
    assert "no results.json and no sweep points" in _one_line_error(tmp_path)


def test_a_killed_run_points_at_llmbench_report(base, tmp_path):
    folder = tmp_path / "killed"
    shutil.copytree(base, folder)
    (folder / "results.json").rename(folder / "run-start.json")
    assert _one_line_error(folder) == (
        f"{folder}: no results.json: the run did not finish (killed, or still going); "
        f"`llmbench report {folder}` rebuilds it from its records"
    )


def test_corrupt_results_and_unknown_schema_version(base, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(base, folder)
    (folder / "results.json").write_text('{"schema_version": 2, "name": ')
    assert "results.json: not valid JSON" in _one_line_error(folder)
    data = json.loads((base / "results.json").read_text())
    (folder / "results.json").write_text(json.dumps({**data, "schema_version": 99}))
    readable = ", ".join(map(str, READABLE_VERSIONS))
    assert _one_line_error(folder) == (
        f"{folder / 'results.json'}: results schema_version 99; this llmbench reads "
        f"{readable}: upgrade llmbench to read it"
    )


def test_corrupt_records_are_named(base, tmp_path):
    folder = tmp_path / "records"
    shutil.copytree(base, folder)
    lines = (folder / "requests.jsonl").read_text().splitlines(keepends=True)
    (folder / "requests.jsonl").write_text("".join([lines[0], "{oops\n", *lines[1:]]))
    assert _one_line_error(folder) == (
        f"{folder / 'requests.jsonl'}:2: not valid JSON (Expecting property name enclosed in "
        "double quotes)"
    )
    row = json.loads(lines[1])
    del row["sent_ns"]
    (folder / "requests.jsonl").write_text("".join([lines[0], json.dumps(row) + "\n"]))
    message = _one_line_error(folder)
    assert message.startswith(f"{folder / 'requests.jsonl'}: not records as llmbench writes them")
    row = json.loads(lines[1])
    row["chunk_ns"] = ["soon"] * len(row["chunk_ns"])
    (folder / "requests.jsonl").write_text("".join([lines[0], json.dumps(row) + "\n"]))
    assert "not records as llmbench writes them (TypeError" in _one_line_error(folder)
    shutil.copy(base / "requests.jsonl", folder / "requests.jsonl")
    (folder / "steps.jsonl").write_text('{"phase": "decode"}\n')
    assert _one_line_error(folder) == (
        f"{folder / 'steps.jsonl'}: line 1: not a roofline point (no t_start_ns, t_end_ns, "
        "flops, bytes)"
    )


def test_malformed_repetition_summaries_are_named(base, tmp_path):
    folder = tmp_path / "reps"
    shutil.copytree(base, folder)
    summary = dict(read_results(folder).summary)
    _rewrite(folder, summary={**summary, "repetitions": "three"})
    assert _one_line_error(folder) == (
        f"{folder / 'results.json'}: summary.repetitions: expected a list of objects"
    )
    repetitions = [dict(r) for r in summary["repetitions"]]
    repetitions[1]["decode_mbu"] = "fast"
    _rewrite(folder, summary={**summary, "repetitions": repetitions})
    assert _one_line_error(folder) == (
        f"{folder / 'results.json'}: summary.repetitions[repetition 2].decode_mbu: expected a "
        "number or null, got 'fast'"
    )


# -- pairing -------------------------------------------------------------------------------------


def test_spec_differences_name_key_paths_and_skip_labels():
    a = {"name": "base", "seed": 0, "load": {"concurrency": 4, "sweep": [1, 2]}, "slo": {}}
    b = {"name": "new", "seed": 0, "load": {"concurrency": 8, "sweep": [1, 3]}, "slo": {"x": 1}}
    assert spec_differences(a, b) == [
        "load.concurrency: 4 vs 8",
        "load.sweep: [1, 2] vs [1, 3]",
        "slo.x: (absent) vs 1",  # slo {} is the default: no difference of its own
    ]
    # A key an older llmbench did not write is no difference at its default, one otherwise.
    older, newer = {"seed": 0}, {"seed": 0, "routing": {"policy": "round_robin", "down_s": 5.0}}
    assert spec_differences(older, newer) == []
    newer["routing"]["policy"] = "prefix_affinity"
    assert spec_differences(older, newer) == ["routing.policy: (absent) vs 'prefix_affinity'"]
    labels = ({"name": "a", "output_dir": "x", "repeat": 1}, {"name": "b", "output_dir": "y"})
    assert spec_differences(*labels) == []
    # How failures are judged is a label too (and out of the spec hash).
    assert spec_differences({"max_failed_fraction": 0.05}, {"max_failed_fraction": 0.5}) == []
    # The system under test is not the benchmark: its address, headers and keys may differ.
    servers = (
        {"backend": {"url": "http://127.0.0.1:8000/v1", "headers": {"Authorization": "a"}}},
        {"backend": {"url": "http://127.0.0.1:8001/v1", "headers": {"Authorization": "b"}}},
    )
    assert spec_differences(*servers) == []
    models = ({"backend": {"served_model": "a"}}, {"backend": {"served_model": "b"}})
    assert spec_differences(*models) == ["backend.served_model: 'a' vs 'b'"]


def test_server_timings_and_warnings_in_a_summary_leave_the_gates_as_they_were(base, tmp_path):
    """A run whose summary has the server-vs-client keys (distributions or null) and warnings
    compares on the default gates as before: they are not per-repetition metrics."""
    from llmbench.harness.metrics import distribution

    folder = write_run(tmp_path / "timed", seed=5)
    result = read_results(folder)
    server = {
        "server_prompt_ms": distribution([10.0, 12.0]),
        "ttft_overhead_ms": distribution([1.0, 2.0]),
        "server_decode_ms_per_token": None,
        "tpot_overhead_ms": None,
        "warnings": ["the server reports no usage: x"],
    }
    _rewrite(
        folder,
        summary={
            **result.summary,
            **server,
            "repetitions": [{**r, **server} for r in result.summary["repetitions"]],
        },
    )
    base_run = load_run(base / "results.json")
    before = compare(base_run.samples, base_run.samples, default_gates())
    [pair] = pair_runs(base, folder)
    comparison = compare(pair.baseline.samples, pair.new.samples, default_gates())
    assert [r.gate for r in comparison.results] == [r.gate for r in before.results]
    assert set(pair.new.samples.per_repetition) == set(pair.baseline.samples.per_repetition)


def test_the_same_benchmark_pairs_and_another_is_refused_naming_why(base, tmp_path):
    same = write_run(tmp_path / "same", seed=5)
    [pair] = pair_runs(base, same / "results.json")
    assert pair.point is None and pair.baseline.path == base / "results.json"
    other = write_run(tmp_path / "other", seed=5, sessions=5)
    with pytest.raises(UserError) as error:
        pair_runs(base, other)
    a, b = read_results(base).provenance, read_results(other).provenance
    assert str(error.value) == (
        f"BASE and NEW are not the same benchmark: workload_hash {a.workload_hash} vs "
        f"{b.workload_hash}; spec_hash {a.spec_hash} vs {b.spec_hash} (spec "
        "workload.sessions: 8 vs 5); pass --force to compare them anyway"
    )
    assert len(pair_runs(base, other, force=True)) == 1


def test_model_and_dtype_are_named_and_labels_may_differ(base, tmp_path):
    folder = write_run(tmp_path / "model", seed=6)
    result = read_results(folder)
    _rewrite(
        folder,
        spec={**result.spec, "model": "synthetic:smollm2-135m", "name": "renamed"},
        provenance=dataclasses.replace(
            result.provenance, model="synthetic:smollm2-135m", spec_hash="f" * 16
        ),
    )
    found = differences(read_results(base), read_results(folder))
    assert found == ["model synthetic:tiny vs synthetic:smollm2-135m"]
    _rewrite(
        folder,
        spec={**result.spec, "name": "renamed", "output_dir": "elsewhere"},
        provenance=dataclasses.replace(result.provenance, spec_hash="f" * 16),
    )
    assert differences(read_results(base), read_results(folder)) == []


def test_sweeps_pair_point_by_point(tmp_path):
    a = write_sweep(tmp_path / "a", seed=10, points=(1, 2, 4))
    b = write_sweep(tmp_path / "b", seed=20, points=(1, 2, 4))
    pairs = pair_runs(a, b)
    assert [p.point for p in pairs] == ["point-1", "point-2", "point-4"]
    assert [p.baseline.result.sweep_point for p in pairs] == [1.0, 2.0, 4.0]
    assert pairs[2].new.path == b / "point-4" / "results.json"


def test_sweep_points_must_match_unless_forced(tmp_path):
    a = write_sweep(tmp_path / "a", seed=10, points=(1, 2))
    b = write_sweep(tmp_path / "b", seed=20, points=(2, 4))
    with pytest.raises(UserError) as error:
        pair_runs(a, b)
    assert str(error.value) == (
        "the sweeps' points differ: only BASE has point-1; only NEW has point-4; compare "
        "sweeps of the same points, or pass --force to compare the points they share"
    )
    assert [p.point for p in pair_runs(a, b, force=True)] == ["point-2"]
    run = write_run(tmp_path / "run", seed=30)
    with pytest.raises(UserError, match=r"is a sweep of 2 points but NEW .* is a single run"):
        pair_runs(a, run)


def test_a_sweep_point_missing_its_results_is_named(tmp_path):
    a = write_sweep(tmp_path / "a", seed=10, points=(1, 2))
    (a / "point-2" / "results.json").unlink()
    assert _one_line_error(a) == f"{a / 'point-2'}: no results.json in this sweep point"


# -- through the comparison ----------------------------------------------------------------------


def test_twenty_percent_slower_folders_regress_on_the_default_gates(base, tmp_path):
    slower = write_run(tmp_path / "slower", seed=7, slowdown=1.2)
    [pair] = pair_runs(base, slower)
    comparison = compare(pair.baseline.samples, pair.new.samples, default_gates())
    regressed = {r.gate.metric for r in comparison.regressions}
    assert {"decode_mbu", "output_tok_per_s_per_gb_s"} <= regressed
    mbu = next(r for r in comparison.results if r.gate.metric == "decode_mbu").numbers
    assert mbu.delta == pytest.approx(1 / 1.2 - 1, abs=0.05)  # MBU falls as TPOT rises


def test_identical_code_folders_pass_the_default_gates(tmp_path):
    """Ten seeded pairs of folders from one distribution: the default gates fail none."""
    failing = 0
    for k in range(10):
        a = write_run(tmp_path / f"a{k}", seed=100 + k, num_requests=20)
        b = write_run(tmp_path / f"b{k}", seed=200 + k, num_requests=20)
        [pair] = pair_runs(a, b)
        failing += compare(pair.baseline.samples, pair.new.samples, default_gates()).has_regression
    assert failing == 0
