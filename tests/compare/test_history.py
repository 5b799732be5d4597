"""Change points over a history of runs (E-Divisive means): the energy statistic against hand
values and the brute-force formula, the divisive search on seeded synthetic series with known
shifts, the seeded permutation test, and histories read from run folders written by the
project's own writers."""

from __future__ import annotations

import dataclasses
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from llmbench.compare.gates import metric_info, parse_gates
from llmbench.compare.history import (
    analyse,
    best_split,
    change_points,
    history_gates,
    load_history,
    run_value,
    split_statistics,
)
from llmbench.compare.runs import load_run
from llmbench.errors import UserError
from llmbench.harness.results import read_results, write_results
from tests.harness.synthetic_runs import write_run

SEEDS = range(1, 6)


def _energy(x: np.ndarray, y: np.ndarray) -> float:
    """Q of one split, straight from the Formula (pairs counted once, C(m,2) below them)."""
    m, k = len(x), len(y)
    between = sum(abs(a - b) for a in x for b in y)
    within_x = sum(abs(a - b) for a, b in combinations(x, 2))
    within_y = sum(abs(a - b) for a, b in combinations(y, 2))
    e = 2 * between / (m * k) - within_x / (m * (m - 1) / 2) - within_y / (k * (k - 1) / 2)
    return m * k / (m + k) * e


def test_the_energy_statistic_by_hand():
    # X = 0,0,0 and Y = 1,1,1: between 9 pairs of 1 → 2·9/9 = 2; within 0; Q = 9/6 · 2 = 3.
    assert split_statistics(np.array([0.0, 0, 0, 1, 1, 1])) == pytest.approx([3.0])
    # Y = 1,1,3: between 3·(1+1+3) = 15 → 10/3; within Y (0+2+2)/3 = 4/3; Ê = 2, Q = 3.
    assert split_statistics(np.array([0.0, 0, 0, 1, 1, 3])) == pytest.approx([3.0])
    assert split_statistics(np.zeros(8)) == pytest.approx([0.0, 0.0, 0.0])


def test_the_prefix_sums_match_the_formula_at_every_split():
    values = np.random.default_rng(7).normal(size=17)
    expected = [_energy(values[:t], values[t:]) for t in range(3, 15)]
    assert split_statistics(values, min_size=3) == pytest.approx(expected)
    assert split_statistics(values, min_size=5) == pytest.approx(expected[2:-2])


def _series(seed: int, levels: list[tuple[int, float]], noise: float = 0.03) -> np.ndarray:
    """Runs at each (count, level), times 1 + noise·N(0, 1)."""
    base = np.concatenate([np.full(n, level) for n, level in levels])
    return base * (1 + noise * np.random.default_rng(seed).standard_normal(base.size))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_clean_twenty_percent_shift_is_found_where_it_began(seed):
    series = _series(seed, [(12, 1.0), (13, 1.2)])
    assert [s.index for s in change_points(series)] == [12]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_flat_noisy_series_has_no_change_point(seed):
    assert change_points(_series(seed, [(25, 1.0)])) == []


# Each segment left after a cut is tested again at 5%, so over 10 seeded series noise is cut
# too now and then: seed 2 (at 27, p 0.02), 6 (15, p 0.04), 8 (7, p 0.03), 10 (3 and 27), and
# seed 3 draws a 3.3-sigma run 9 (1.10) that moves the first cut to 9. The others are exact.
@pytest.mark.parametrize("seed", (1, 4, 5, 7, 9))
def test_two_shifts_are_both_found(seed):
    series = _series(seed, [(10, 1.0), (10, 1.2), (10, 0.9)])
    assert [s.index for s in change_points(series)] == [10, 20]


def test_false_alarms_on_flat_series_are_as_rare_as_the_significance_says():
    alarms = [bool(change_points(_series(seed, [(10, 1.0)]), seed=seed)) for seed in range(100)]
    assert sum(alarms) == 5  # alpha 0.05


def test_the_permutation_test_is_seeded_and_counts_as_extreme_shuffles():
    series = _series(1, [(12, 1.0), (13, 1.2)])
    # No shuffle of 25 values puts the 13 high ones back in a block: p = (1 + 0) / (1 + 199).
    assert [s.p_value for s in change_points(series)] == [1 / 200]
    # A weak shift: shuffles as extreme exist, and the same seed counts the same ones.
    weak = _series(3, [(5, 1.0), (5, 1.02)])
    runs = [best_split(weak, rng=np.random.default_rng(9)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert 1 / 200 < runs[0].p_value < 1
    other = best_split(weak, rng=np.random.default_rng(10))
    assert other.index == runs[0].index and other.p_value != runs[0].p_value
    # A constant series: every shuffle ties (Q = 0), p = 1, no split.
    assert best_split(np.ones(10), rng=np.random.default_rng(0)).p_value == 1.0
    assert change_points(np.ones(10)) == []


def test_four_runs_against_four_is_about_the_least_that_can_split():
    """4 + 4 runs: only 2 of the C(8, 4) = 70 ways to place the high runs are as extreme (all
    first or all last), so the best p is about 2/70 ≈ 0.029, and 199 shuffles may draw more of
    them (this stream draws 12: p 0.065). 3 + 3 never splits: 2/20 = 0.1 > 0.05."""
    series = _series(0, [(4, 1.0), (4, 1.3)])
    split = best_split(series, rng=np.random.default_rng([0, 0, 8]))
    assert split.index == 4 and split.p_value == pytest.approx(13 / 200)
    assert change_points(_series(0, [(3, 1.0), (3, 2.0)])) == []
    assert [s.index for s in change_points(_series(0, [(6, 1.0), (4, 1.3)]))] == [6]


def test_segments_shorter_than_twice_the_minimum_are_not_split():
    series = _series(1, [(2, 1.0), (3, 2.0)])
    assert best_split(series, rng=np.random.default_rng(0)) is None
    assert change_points(series) == []
    assert [s.index for s in change_points(series, min_size=2)] == []  # 5 values: p ≥ 0.1


# -- histories of run folders ----------------------------------------------------------------


@pytest.fixture(scope="module")
def history_folder(tmp_path_factory) -> Path:
    """10 runs; run-06 on are 1.3× slower."""
    root = tmp_path_factory.mktemp("history")
    for i in range(10):
        write_run(root / f"run-{i:02d}", seed=100 + i, slowdown=1.3 if i >= 6 else 1.0)
    return root


def _set_start(folder: Path, created_unix_s: float) -> None:
    result = read_results(folder)
    provenance = dataclasses.replace(result.provenance, created_unix_s=created_unix_s)
    write_results(folder, dataclasses.replace(result, provenance=provenance))


def test_a_run_gives_one_value_per_metric_as_its_summary_says(history_folder):
    run = load_run(history_folder / "run-00" / "results.json")
    summary = run.result.summary
    assert run_value(run, metric_info("tpot_ms.p50")) == pytest.approx(summary["tpot_ms"]["p50"])
    assert run_value(run, metric_info("ttft_ms.mean")) == pytest.approx(summary["ttft_ms"]["mean"])
    mbu = [r["decode_mbu"] for r in summary["repetitions"]]
    assert run_value(run, metric_info("decode_mbu")) == pytest.approx(np.mean(mbu))
    assert run_value(run, metric_info("moe_decode_experts_touched")) is None


def test_the_shift_is_named_at_the_first_slower_run(history_folder):
    history = load_history(history_folder)
    assert [r.name for r in history.runs] == [f"run-{i:02d}" for i in range(10)]
    assert not history.is_by_start_time  # the synthetic runs have no start time (0)
    gates, notes = history_gates(history)
    assert notes == []
    assert [g.name for g in gates][:3] == [
        "decode_mbu max_decrease 10%",
        "output_tok_per_s_per_gb_s max_decrease 10%",
        "prefill_mfu max_decrease 15%",
    ]
    (tpot,) = analyse(history, parse_gates("tpot_ms.p50: {max_increase: 10%}\n", "g"))
    (point,) = tpot.change_points
    assert point.run == "run-06" and point.index == 6
    assert point.before == pytest.approx(np.mean(tpot.values[:6]))
    assert point.after == pytest.approx(np.mean(tpot.values[6:]))
    assert 0.25 < point.change < 0.35  # 1.3× slower, as written
    assert point.is_regression and point.failed_gates == ("tpot_ms.p50 max_increase 10%",)
    assert tpot.is_failing


def test_a_shift_within_its_gate_or_the_good_way_does_not_fail(history_folder, tmp_path):
    (tpot,) = analyse(
        load_history(history_folder), parse_gates("tpot_ms.p50: {max_increase: 50%}", "g")
    )
    assert tpot.change_points[-1].is_regression and not tpot.is_failing
    for i in range(10):  # faster from run 6 on: an improvement
        write_run(tmp_path / f"r{i}", seed=200 + i, slowdown=1 / 1.3 if i >= 6 else 1.0)
    (rate,) = analyse(
        load_history(tmp_path), parse_gates("output_tok_per_s: {max_decrease: 5%}", "g")
    )
    (point,) = rate.change_points
    assert point.run == "r6" and not point.is_regression and not rate.is_failing
    # An absolute floor: broken only when the shift crosses it.
    (mbu,) = analyse(load_history(history_folder), parse_gates("decode_mbu: {min: 0.5}", "g"))
    assert mbu.is_failing and mbu.change_points[-1].failed_gates == ("decode_mbu min 0.5",)


def test_runs_are_ordered_by_start_time_else_by_name(tmp_path):
    for name, start in (("c", 100.0), ("a", 300.0), ("b", 200.0)):
        _set_start(write_run(tmp_path / name, seed=1), start)
    history = load_history(tmp_path)
    assert history.is_by_start_time and [r.name for r in history.runs] == ["c", "b", "a"]
    _set_start(tmp_path / "b", 0.0)  # one run without a start time: all by name
    history = load_history(tmp_path)
    assert not history.is_by_start_time and [r.name for r in history.runs] == ["a", "b", "c"]


def test_unusable_histories_are_one_line(tmp_path):
    with pytest.raises(UserError, match="no such folder"):
        load_history(tmp_path / "nowhere")
    write_run(tmp_path / "only", seed=1)
    with pytest.raises(UserError, match="1 run folder; a history needs at least 2"):
        load_history(tmp_path)
    write_run(tmp_path / "other", seed=2, sessions=5)
    with pytest.raises(UserError, match="runs only and other are not the same benchmark: "):
        load_history(tmp_path)
    assert len(load_history(tmp_path, force=True).runs) == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty: no results.json"):
        load_history(tmp_path)
