"""Comparing two runs: hand-computed deltas and intervals, verdicts at the threshold's edge,
busy machines and devices, and the bootstrap tested statistically on seeded synthetic runs."""

from __future__ import annotations

import numpy as np
import pytest

from llmbench.compare.gates import Gate, default_gates, metric_info
from llmbench.compare.verdict import (
    MetricDelta,
    RunSamples,
    bootstrap_per_request,
    bootstrap_repetition_means,
    compare,
    judge,
    measure,
)
from llmbench.harness import metrics

CPU = "cpu: 2 cores"


def constant(tpot_ms: float, mbu: float, *, device: str = CPU, is_busy: bool = False):
    """A run whose every sample is the same: its intervals are points."""
    return RunSamples(
        per_request={"tpot_ms": [[tpot_ms] * 50] * 3},
        per_repetition={"decode_mbu": [mbu] * 3},
        device=device,
        is_busy=is_busy,
    )


def synthetic_run(rng, slowdown=1.0, *, sigma=0.2, rep_sd=0.03, mbu_cv=0.08, device=CPU):
    """3 repetitions × 50 requests: lognormal per-request TPOT (median 20 ms × slowdown, log-sd
    `sigma`) with a run-to-run shift of log-sd `rep_sd` per repetition, and per-repetition
    decode MBU / prefill MFU / tok/s per GB/s around 0.6 / 0.3 / 1.5 divided by the slowdown,
    with a coefficient of variation `mbu_cv` (a noisy 2-core machine)."""
    tpot = [
        rng.lognormal(np.log(20.0 * slowdown) + rng.normal(0.0, rep_sd), sigma, size=50)
        for _ in range(3)
    ]
    normalised = {
        name: list(mean / slowdown * (1 + rng.normal(0.0, mbu_cv, size=3)))
        for name, mean in (
            ("decode_mbu", 0.6),
            ("prefill_mfu", 0.3),
            ("output_tok_per_s_per_gb_s", 1.5),
        )
    }
    return RunSamples({"tpot_ms": tpot}, normalised, device)


def numbers(delta_low, delta_high, *, delta=None, new_low=None, new_high=None, new=1.0):
    mid = (delta_low + delta_high) / 2 if delta is None else delta
    return MetricDelta(
        metric="m",
        baseline=1.0,
        new=new,
        delta=mid,
        delta_low=delta_low,
        delta_high=delta_high,
        new_low=new if new_low is None else new_low,
        new_high=new if new_high is None else new_high,
        num_baseline_repetitions=3,
        num_new_repetitions=3,
    )


# -- numbers -----------------------------------------------------------------------------------


def test_constant_runs_give_exact_delta_and_point_intervals():
    infos = [metric_info("tpot_ms.p50"), metric_info("tpot_ms.p99"), metric_info("decode_mbu")]
    out = measure(constant(10.0, 0.5), constant(12.0, 0.4), infos, num_resamples=200)
    tpot = out["tpot_ms.p50"]
    assert (tpot.baseline, tpot.new) == (10.0, 12.0)
    assert tpot.delta == pytest.approx(0.2)
    assert (tpot.delta_low, tpot.delta_high) == pytest.approx((0.2, 0.2))
    assert (tpot.new_low, tpot.new_high) == (12.0, 12.0)
    assert (tpot.num_baseline_repetitions, tpot.num_new_repetitions) == (3, 3)
    mbu = out["decode_mbu"]
    assert mbu.delta == pytest.approx(-0.2)  # 0.4 / 0.5 − 1
    assert (mbu.delta_low, mbu.delta_high) == pytest.approx((-0.2, -0.2))


def test_point_estimates_are_the_summary_statistics_of_the_pooled_requests():
    rng = np.random.default_rng(0)
    reps = [rng.lognormal(3.0, 0.4, size=n) for n in (40, 50, 60)]
    side = RunSamples({"ttft_ms": reps}, {"output_tok_per_s": [10.0, 11.0, 15.0]}, CPU)
    names = ["ttft_ms.p50", "ttft_ms.p90", "ttft_ms.p99", "ttft_ms.mean", "output_tok_per_s"]
    out = measure(side, side, [metric_info(n) for n in names], num_resamples=100)
    pooled = np.concatenate(reps)
    for q in (50, 90, 99):
        assert out[f"ttft_ms.p{q}"].baseline == pytest.approx(metrics.percentile(pooled, q))
    assert out["ttft_ms.mean"].new == pytest.approx(pooled.mean())
    assert out["output_tok_per_s"].baseline == pytest.approx(12.0)  # mean over repetitions
    assert out["output_tok_per_s"].delta == 0.0


def test_two_stage_resampling_draws_repetitions_then_requests():
    # Repetition 0 is [1, 1, 1], repetition 1 is [5]. A resample draws a repetition for each of
    # the two slots (3 positions, then 1), then requests inside it: pooled means can only be
    # (0,0) → 1, (0,1) → (3 + 5) / 4 = 2, (1,0) → (15 + 1) / 4 = 4, (1,1) → 5, each ≈ 1/4.
    rng = np.random.default_rng(1)
    reps = [np.array([1.0, 1.0, 1.0]), np.array([5.0])]
    means = bootstrap_per_request(reps, ["mean"], 4000, rng)[0]
    assert set(np.round(means, 9)) == {1.0, 2.0, 4.0, 5.0}
    for value in (1.0, 2.0, 4.0, 5.0):
        assert np.mean(means == value) == pytest.approx(0.25, abs=0.03)


def test_requests_are_resampled_inside_a_repetition():
    # one repetition [1, 2]: the mean of two draws is 1, 1.5 or 2 with odds 1/4, 1/2, 1/4
    means = bootstrap_per_request([np.array([1.0, 2.0])], ["mean"], 4000, np.random.default_rng(2))
    assert set(means[0]) == {1.0, 1.5, 2.0}
    assert np.mean(means[0] == 1.5) == pytest.approx(0.5, abs=0.03)


def test_repetition_means_resample_the_repetitions():
    # three values: 10 distinct multisets; all-equal draws give the extremes with odds 1/27
    means = bootstrap_repetition_means(np.array([1.0, 2.0, 6.0]), 5000, np.random.default_rng(3))
    assert means.min() == 1.0 and means.max() == 6.0
    assert np.mean(means == 6.0) == pytest.approx(1 / 27, abs=0.01)
    assert means.mean() == pytest.approx(3.0, abs=0.05)


def test_seeded_and_independent_of_the_other_gates():
    rng = np.random.default_rng(4)
    base, new = synthetic_run(rng), synthetic_run(rng, 1.1)
    p50 = metric_info("tpot_ms.p50")
    alone = measure(base, new, [p50], seed=7)["tpot_ms.p50"]
    again = measure(base, new, [p50], seed=7)["tpot_ms.p50"]
    with_others = measure(
        base, new, [metric_info("decode_mbu"), metric_info("tpot_ms.p99"), p50], seed=7
    )["tpot_ms.p50"]
    other_seed = measure(base, new, [p50], seed=8)["tpot_ms.p50"]
    assert alone == again == with_others
    assert other_seed.delta == alone.delta and other_seed.delta_low != alone.delta_low


def test_ten_thousand_requests_by_a_thousand_resamples():
    # More values than one chunk holds: chunks must join into one interval that covers the truth.
    rng = np.random.default_rng(5)
    side = RunSamples({"tpot_ms": [rng.lognormal(np.log(10.0), 0.3, 10_000)]}, {}, CPU)
    slower = RunSamples({"tpot_ms": [rng.lognormal(np.log(12.0), 0.3, 10_000)]}, {}, CPU)
    out = measure(side, slower, [metric_info("tpot_ms.p50"), metric_info("tpot_ms.p99")])
    for name in ("tpot_ms.p50", "tpot_ms.p99"):
        assert out[name].delta_low < 0.2 < out[name].delta_high
        assert out[name].delta_high - out[name].delta_low < 0.1


def test_missing_values_and_empty_repetitions_are_dropped():
    side = RunSamples(
        {"tpot_ms": [[10.0, float("nan")], [], [10.0]]},
        {"decode_mbu": [0.5, None, float("inf")]},
        CPU,
    )
    out = measure(side, side, [metric_info("tpot_ms.p50"), metric_info("decode_mbu")])
    assert out["tpot_ms.p50"].num_baseline_repetitions == 2
    assert out["decode_mbu"].baseline == 0.5 and out["decode_mbu"].num_new_repetitions == 1


def test_one_repetition_of_a_per_repetition_metric_has_no_interval():
    # 0.5 → 0.4 is −20%; one value on a side has no spread to resample, so no bounds at all
    # (a zero-width interval would read as certainty). Per-request samples keep theirs.
    one = RunSamples({"tpot_ms": [[10.0, 12.0, 14.0]]}, {"decode_mbu": [0.5]}, CPU)
    three = RunSamples({}, {"decode_mbu": [0.4, 0.41, 0.39]}, CPU)
    infos = [metric_info("decode_mbu"), metric_info("tpot_ms.p50")]
    for base, new, delta in ((one, three, -0.2), (three, one, 0.25), (one, one, 0.0)):
        mbu = measure(base, new, infos)["decode_mbu"]
        assert mbu.delta == pytest.approx(delta)  # 0.4 / 0.5 − 1, 0.5 / 0.4 − 1, 0
        assert (mbu.delta_low, mbu.delta_high) == (None, None)
        assert not mbu.has_delta_interval
    alone = measure(three, one, infos)["decode_mbu"]
    assert (alone.new_low, alone.new_high) == (None, None) and not alone.has_new_interval
    has_base_spread = measure(one, three, infos)["decode_mbu"]
    assert has_base_spread.new_low < has_base_spread.new_high  # NEW alone has 3 repetitions
    tpot = measure(one, one, infos)["tpot_ms.p50"]
    assert tpot.delta_low < 0 < tpot.delta_high  # its requests are resampled


def test_a_gate_without_an_interval_judges_the_change_and_says_so():
    one, slower = (RunSamples({}, {"decode_mbu": [mbu]}, CPU) for mbu in (0.5, 0.4))
    relative, floor = compare(
        one, slower, [Gate("decode_mbu", "max_decrease", 0.1), Gate("decode_mbu", "min", 0.45)]
    ).results
    assert relative.verdict == "regression"
    assert relative.reason == (
        "decode_mbu fell 20.0% (1 repetition: no interval), past the 10% allowed"
    )
    assert floor.verdict == "regression"
    assert floor.reason == (
        "decode_mbu = 0.4 (1 repetition: no interval): wholly below the floor 0.45"
    )
    within = compare(one, slower, [Gate("decode_mbu", "max_decrease", 0.25)]).results[0]
    assert within.verdict == "within noise"
    assert within.reason == (
        "decode_mbu changed -20.0% (1 repetition: no interval): not wholly past ±25%"
    )


def test_confidence_must_be_a_probability():
    with pytest.raises(ValueError, match="confidence"):
        measure(constant(1, 1), constant(1, 1), [metric_info("decode_mbu")], confidence=95)


# -- verdicts ----------------------------------------------------------------------------------

INCREASE = Gate("tpot_ms.p50", "max_increase", 0.05)
DECREASE = Gate("decode_mbu", "max_decrease", 0.05)


@pytest.mark.parametrize(
    ("gate", "low", "high", "verdict"),
    [
        (INCREASE, 0.05, 0.09, "within noise"),  # ends exactly at the threshold: not past it
        (INCREASE, 0.0501, 0.09, "regression"),
        (INCREASE, 0.01, 0.09, "within noise"),  # straddles
        (INCREASE, -0.09, -0.05, "within noise"),
        (INCREASE, -0.09, -0.0501, "improvement"),
        (INCREASE, -0.2, 0.2, "within noise"),
        (DECREASE, -0.09, -0.05, "within noise"),
        (DECREASE, -0.09, -0.0501, "regression"),
        (DECREASE, -0.09, 0.0, "within noise"),
        (DECREASE, 0.0501, 0.09, "improvement"),
    ],
)
def test_relative_verdict_needs_the_whole_interval_past_the_threshold(gate, low, high, verdict):
    assert judge(gate, numbers(low, high)).verdict == verdict


def test_delta_exactly_at_the_threshold_end_to_end():
    # every sample constant: the interval is the point 5% exactly, which is not past 5%
    at = compare(constant(100.0, 0.5), constant(105.0, 0.5), [INCREASE])
    assert at.results[0].numbers.delta == 0.05
    assert at.results[0].verdict == "within noise" and not at.has_regression
    past = compare(constant(100.0, 0.5), constant(105.01, 0.5), [INCREASE])
    assert past.results[0].verdict == "regression" and past.has_regression


@pytest.mark.parametrize(
    ("rule", "limit", "low", "high", "verdict"),
    [
        ("min", 0.5, 0.40, 0.49, "regression"),  # wholly below the floor
        ("min", 0.5, 0.45, 0.55, "within noise"),
        ("min", 0.5, 0.50, 0.55, "pass"),  # exactly on the floor meets it
        ("max", 50.0, 51.0, 60.0, "regression"),
        ("max", 50.0, 45.0, 55.0, "within noise"),
        ("max", 50.0, 40.0, 50.0, "pass"),
    ],
)
def test_absolute_gates_judge_the_new_values_interval(rule, limit, low, high, verdict):
    gate = Gate("decode_mbu" if rule == "min" else "ttft_ms.p99", rule, limit)
    result = judge(gate, numbers(0.0, 0.0, new=(low + high) / 2, new_low=low, new_high=high))
    assert result.verdict == verdict


def test_absolute_floor_end_to_end_names_the_numbers():
    result = compare(constant(10.0, 0.6), constant(10.0, 0.42), [Gate("decode_mbu", "min", 0.5)])
    (gate,) = result.results
    assert gate.verdict == "regression"
    assert gate.reason == "decode_mbu = 0.42 (95% CI 0.42 to 0.42): wholly below the floor 0.5"


def test_regression_on_a_busy_machine_is_inconclusive_unless_allowed():
    base, slow = constant(10.0, 0.5), constant(12.0, 0.5, is_busy=True)
    result = compare(base, slow, [INCREASE]).results[0]
    assert result.verdict == "inconclusive" and not result.is_failing
    assert "busy machine" in result.reason
    assert compare(base, slow, [INCREASE], allow_busy=True).results[0].verdict == "regression"
    busy_base = constant(10.0, 0.5, is_busy=True)
    assert compare(busy_base, constant(12.0, 0.5), [INCREASE]).results[0].verdict == "inconclusive"
    # only a regression is softened: an improvement stays one
    assert compare(busy_base, constant(8.0, 0.5), [INCREASE]).results[0].verdict == "improvement"


def test_raw_metrics_are_refused_between_devices_unless_forced():
    base, new = constant(10.0, 0.5, device="cpu: epyc"), constant(30.0, 0.2, device="cuda: H100")
    gates = [INCREASE, Gate("decode_mbu", "max_decrease", 0.1), Gate("tpot_ms.p50", "max", 50)]
    refused, mbu, ceiling = compare(base, new, gates).results
    assert refused.verdict == "refused"
    assert refused.reason.startswith(
        "tpot_ms.p50 is a raw time: not compared between devices (cpu: epyc vs cuda: H100) "
        "unless forced"
    )
    assert mbu.verdict == "regression"  # hardware-normalised: compared anyway
    assert ceiling.verdict == "pass"  # an absolute ceiling judges NEW alone
    forced = compare(base, new, gates, force_devices=True).results[0]
    assert forced.verdict == "regression"


def test_missing_data_is_named_and_never_a_regression():
    base = constant(10.0, 0.5)
    no_tpot = RunSamples({}, {"decode_mbu": [0.5]}, CPU)
    assert compare(base, no_tpot, [INCREASE]).results[0].reason == (
        "tpot_ms.p50 was not measured by NEW"
    )
    assert compare(no_tpot, base, [INCREASE]).results[0].verdict == "no data"
    zero = RunSamples({}, {"prefix_cache_hit_rate": [0.0, 0.0]}, CPU)
    some = RunSamples({}, {"prefix_cache_hit_rate": [0.5, 0.6]}, CPU)
    hit_rate = Gate("prefix_cache_hit_rate", "max_decrease", 0.1)
    result = compare(zero, some, [hit_rate]).results[0]
    assert (result.verdict, result.numbers.new) == ("no data", 0.55)
    assert "0 in BASE" in result.reason


# -- the bootstrap, statistically --------------------------------------------------------------

LATENCY_GATES = [
    Gate("tpot_ms.p50", "max_increase", 0.05),
    Gate("tpot_ms.mean", "max_increase", 0.05),
]


def test_twenty_percent_slower_is_a_regression_naming_the_metric():
    rng = np.random.default_rng(2024)
    base, slow = synthetic_run(rng), synthetic_run(rng, 1.2)
    comparison = compare(base, slow, LATENCY_GATES, seed=1)
    assert comparison.has_regression
    p50 = comparison.results[0]
    assert p50.verdict == "regression"
    assert p50.numbers.delta == pytest.approx(0.2, abs=0.08)
    assert p50.reason.startswith("tpot_ms.p50 rose ")
    assert p50.reason.endswith("past the 5% allowed")


def test_same_distribution_with_another_seed_is_no_regression():
    base = synthetic_run(np.random.default_rng(2024))
    again = synthetic_run(np.random.default_rng(2025))
    comparison = compare(base, again, LATENCY_GATES + list(default_gates()), seed=1)
    assert not comparison.has_regression
    assert {r.verdict for r in comparison.results} <= {"within noise", "improvement"}


def test_twenty_percent_slower_is_caught_in_nearly_every_pair():
    rng = np.random.default_rng(11)
    caught = [
        compare(synthetic_run(rng), synthetic_run(rng, 1.2), LATENCY_GATES[:1], seed=i)
        .results[0]
        .verdict
        == "regression"
        for i in range(40)
    ]
    assert np.mean(caught) >= 0.8


def test_default_gates_catch_a_thirty_percent_slower_decode():
    # decode MBU and tok/s per GB/s at 0.7× with 8% run-to-run spread, 3 repetitions a side
    rng = np.random.default_rng(12)
    gates = [g for g in default_gates() if g.metric != "prefill_mfu"]
    assert {g.metric for g in gates} == {"decode_mbu", "output_tok_per_s_per_gb_s"}
    caught = np.zeros(len(gates))
    for i in range(50):
        comparison = compare(synthetic_run(rng), synthetic_run(rng, 1 / 0.7), gates, seed=i)
        caught += [r.verdict == "regression" for r in comparison.results]
    assert caught.min() / 50 >= 0.9


def test_false_regression_rate_over_200_identical_pairs():
    rng = np.random.default_rng(13)
    # default gates, the latency gates, and a 0% gate: pure significance at 95% two-sided,
    # which should call a regression in about 2.5% of identical pairs
    zero = Gate("tpot_ms.p50", "max_increase", 0.0)
    gates = list(default_gates()) + LATENCY_GATES + [zero]
    failed = np.zeros(len(gates))
    for i in range(200):
        comparison = compare(
            synthetic_run(rng), synthetic_run(rng), gates, seed=i, num_resamples=500
        )
        failed += [r.verdict == "regression" for r in comparison.results]
    rates = failed / 200
    assert rates.max() <= 0.05, dict(zip([g.name for g in gates], rates, strict=True))
