"""The paired verdict of `llmbench ab` on seeded data with a known shift: the change, its expanded
paired bootstrap interval, and the verdicts `compare` gives."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from llmbench.compare.gates import Gate, metric_info
from llmbench.compare.paired import (
    compare_paired,
    expanded_tails,
    measure_paired,
    round_value,
    t_quantile,
)
from llmbench.compare.verdict import RunSamples, measure

TPOT = metric_info("tpot_ms.p50")
RATE = metric_info("output_tok_per_s")


def side(tpots: list[float], rates: list[float], device: str = "cpu: x", busy: bool = False):
    """One side of one round: its requests' TPOTs (one repetition) and its repetition rates."""
    return RunSamples({"tpot_ms": [tpots]}, {"output_tok_per_s": rates}, device, busy)


def drifting_rounds(shift: float, num_rounds: int = 8, seed: int = 1):
    """Rounds whose level drifts ±20% from round to round (the machine), shared by both sides
    of a round; NEW is `shift` slower per token than BASE, with 1% of noise of its own."""
    rng = np.random.default_rng(seed)
    rounds = []
    for _ in range(num_rounds):
        level = 30.0 * rng.uniform(0.8, 1.2)
        noise = rng.normal(1.0, 0.01)
        base_tpot, new_tpot = level, level * (1 + shift) * noise
        rounds.append((side([base_tpot], [1000 / base_tpot]), side([new_tpot], [1000 / new_tpot])))
    return rounds


@pytest.mark.parametrize(
    "df, expected",  # Student's t table, two-sided 95%
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (9, 2.262), (29, 2.045)],
)
def test_t_quantile_matches_the_table(df, expected):
    assert t_quantile(0.95, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_at_90_percent():
    assert t_quantile(0.90, 4) == pytest.approx(2.132, abs=5e-4)
    assert t_quantile(0.90, 10) == pytest.approx(1.812, abs=5e-4)


def test_expanded_tails_widen_to_the_paired_t_interval():
    """n = 5: √(5/4) · t(0.95, 4) = 1.1180 · 2.7764 = 3.1041; Φ(−3.1041) = 0.000954."""
    low, high = expanded_tails(0.95, 5)
    assert low == pytest.approx(
        100 * statistics.NormalDist().cdf(-math.sqrt(5 / 4) * 2.776445), rel=1e-5
    )
    assert low == pytest.approx(0.0954, abs=1e-3)
    assert high == pytest.approx(100 - low)
    # Many rounds: the plain 2.5% / 97.5% percentiles again.
    assert expanded_tails(0.95, 2000)[0] == pytest.approx(2.5, abs=0.01)


def test_round_value_pools_the_repetitions_of_a_round():
    samples = RunSamples(
        {"tpot_ms": [[1.0, 2.0], [3.0, 4.0, 100.0]]}, {"output_tok_per_s": [10.0, None, 20.0]}, "d"
    )
    assert round_value(samples, TPOT) == 3.0  # the median of 1, 2, 3, 4, 100
    assert round_value(samples, metric_info("tpot_ms.mean")) == 22.0
    assert round_value(samples, RATE) == 15.0  # the mean of 10 and 20; None is no value
    assert round_value(samples, metric_info("decode_mbu")) is None


def test_a_known_shift_is_found_through_round_to_round_drift():
    rounds = drifting_rounds(0.15)
    numbers = measure_paired(rounds, TPOT, seed=0)
    base = np.mean([round_value(b, TPOT) for b, _ in rounds])
    new = np.mean([round_value(n, TPOT) for _, n in rounds])
    assert numbers.baseline == pytest.approx(base) and numbers.new == pytest.approx(new)
    assert numbers.delta == pytest.approx(new / base - 1)
    assert numbers.num_baseline_repetitions == numbers.num_new_repetitions == 8
    # The drift is ±20% between rounds, yet the paired interval is a few percent wide ...
    assert 0.12 < numbers.delta_low < 0.15 < numbers.delta_high < 0.18
    # ... where the same rounds unpaired (two independent sides) straddle most of ±20%.
    unpaired = measure(
        RunSamples({"tpot_ms": [list(round_value(b, TPOT) for b, _ in rounds)]}, {}, "d"),
        RunSamples({"tpot_ms": [list(round_value(n, TPOT) for _, n in rounds)]}, {}, "d"),
        [metric_info("tpot_ms.mean")],
    )["tpot_ms.mean"]
    assert unpaired.delta_high - unpaired.delta_low > 4 * (numbers.delta_high - numbers.delta_low)


def test_the_interval_is_seeded_and_the_seed_matters():
    rounds = drifting_rounds(0.05, num_rounds=5)
    a = measure_paired(rounds, TPOT, seed=3)
    assert a == measure_paired(rounds, TPOT, seed=3)
    assert a.delta_low != measure_paired(rounds, TPOT, seed=4).delta_low


def test_verdicts_on_paired_rounds():
    gates = [
        Gate("tpot_ms.p50", "max_increase", 0.05),
        Gate("output_tok_per_s", "max_decrease", 0.05),
    ]
    slower = compare_paired(drifting_rounds(0.15), gates)
    assert [r.verdict for r in slower.results] == ["regression", "regression"]
    assert slower.num_rounds == 8 and slower.command == "llmbench ab"
    assert "tpot_ms.p50 rose 15" in slower.results[0].reason
    same = compare_paired(drifting_rounds(0.0), gates)
    assert [r.verdict for r in same.results] == ["within noise", "within noise"]
    assert not same.has_regression and not same.is_unusable
    faster = compare_paired(drifting_rounds(-0.2), gates)
    assert [r.verdict for r in faster.results] == ["improvement", "improvement"]


def test_rounds_a_side_did_not_measure_are_left_out():
    rounds = drifting_rounds(0.15, num_rounds=4)
    empty = RunSamples({"tpot_ms": [[]]}, {"output_tok_per_s": []}, "cpu: x")
    rounds.append((rounds[0][0], empty))
    numbers = measure_paired(rounds, TPOT)
    assert numbers.num_baseline_repetitions == 5 and numbers.num_new_repetitions == 4
    four = measure_paired(rounds[:4], TPOT)
    assert numbers.delta == four.delta and numbers.delta_low == four.delta_low


def test_one_pair_has_no_interval_and_none_has_no_data():
    rounds = drifting_rounds(0.15, num_rounds=1)
    one = measure_paired(rounds, TPOT)
    assert one.delta is not None and one.delta_low is None and not one.has_delta_interval
    empty = RunSamples({}, {}, "cpu: x")
    result = compare_paired(
        [(rounds[0][0], empty)] * 3, [Gate("tpot_ms.p50", "max_increase", 0.05)]
    )
    assert result.results[0].verdict == "no data" and result.is_unusable


def test_raw_gates_are_refused_between_devices_and_busy_rounds_are_inconclusive():
    gate = [Gate("tpot_ms.p50", "max_increase", 0.05)]
    rounds = drifting_rounds(0.3, num_rounds=4)
    other = [(b, RunSamples(n.per_request, n.per_repetition, "cuda: big")) for b, n in rounds]
    refused = compare_paired(other, gate)
    assert refused.results[0].verdict == "refused" and refused.new_device == "cuda: big"
    assert compare_paired(other, gate, force_devices=True).results[0].verdict == "regression"
    busy = [(b, RunSamples(n.per_request, n.per_repetition, n.device, True)) for b, n in rounds]
    assert compare_paired(busy, gate).results[0].verdict == "inconclusive"
    assert compare_paired(busy, gate, allow_busy=True).results[0].verdict == "regression"


def test_absolute_gates_judge_the_mean_of_new():
    rounds = [(side([30.0], [10.0]), side([30.0], [10.0])) for _ in range(4)]
    rounds = [
        (b, RunSamples(n.per_request, {"failed_fraction": [f]}, n.device))
        for (b, n), f in zip(rounds, (0.0, 0.0, 0.02, 0.0), strict=True)
    ]
    result = compare_paired(rounds, [Gate("failed_fraction", "max", 0.01)]).results[0]
    assert result.numbers.new == pytest.approx(0.005)
    assert result.verdict == "within noise"  # the interval of the mean reaches 0.02
    clean = [
        (b, RunSamples(n.per_request, {"failed_fraction": [0.0]}, n.device)) for b, n in rounds
    ]
    assert (
        compare_paired(clean, [Gate("failed_fraction", "max", 0.01)]).results[0].verdict == "pass"
    )
