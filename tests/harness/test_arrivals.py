"""Arrival schedules: hand-computed constant offsets, seeded statistics, trace parsing, errors."""

from __future__ import annotations

import math
import statistics
from itertools import pairwise

import pytest

from llmbench.errors import UserError
from llmbench.harness.arrivals import (
    constant_offsets,
    gamma_offsets,
    poisson_offsets,
    sweep_points,
    trace_offsets,
)

N = 20_000


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in pairwise(offsets)]


def test_constant_offsets_by_hand():
    assert constant_offsets(4.0, 5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert constant_offsets(0.5, 3) == [0.0, 2.0, 4.0]
    assert constant_offsets(10.0, 0) == []
    assert constant_offsets(10.0, 1) == [0.0]


@pytest.mark.parametrize(
    "make",
    [lambda seed: poisson_offsets(5.0, 100, seed), lambda seed: gamma_offsets(5.0, 0.5, 100, seed)],
)
def test_seeded_schedules_are_reproducible_and_seed_dependent(make):
    assert make(7) == make(7)
    assert make(7) != make(8)
    offsets = make(7)
    assert len(offsets) == 100 and offsets[0] == 0.0
    assert all(b >= a for a, b in pairwise(offsets))


def test_schedules_do_not_touch_global_random_state():
    import random

    random.seed(123)
    before = random.random()
    random.seed(123)
    poisson_offsets(5.0, 100, seed=1)
    gamma_offsets(5.0, 2.0, 100, seed=1)
    assert random.random() == before


def test_poisson_mean_rate_and_cv():
    g = gaps(poisson_offsets(8.0, N, seed=0))
    assert len(g) == N - 1
    assert 1 / statistics.fmean(g) == pytest.approx(8.0, rel=0.03)
    assert statistics.pstdev(g) / statistics.fmean(g) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_gamma_mean_rate_and_cv(burstiness):
    g = gaps(gamma_offsets(8.0, burstiness, N, seed=1))
    assert 1 / statistics.fmean(g) == pytest.approx(8.0, rel=0.05)
    cv = statistics.pstdev(g) / statistics.fmean(g)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.07)


def test_gamma_with_burstiness_one_is_poisson():
    # Python draws Gamma(1, θ) as −log(1 − U) · θ and Exp(λ) as −log(1 − U) / λ: same draws.
    assert gamma_offsets(3.0, 1.0, 50, seed=5) == pytest.approx(poisson_offsets(3.0, 50, seed=5))


def test_last_offset_of_long_schedule_matches_rate():
    # 20k requests at 100/s should take about (N − 1) / 100 = 199.99 s.
    assert poisson_offsets(100.0, N, seed=3)[-1] == pytest.approx((N - 1) / 100, rel=0.03)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: constant_offsets(0, 10), "rate_per_s"),
        (lambda: constant_offsets(-1.0, 10), "rate_per_s"),
        (lambda: poisson_offsets(float("inf"), 10, 0), "rate_per_s"),
        (lambda: poisson_offsets(float("nan"), 10, 0), "rate_per_s"),
        (lambda: gamma_offsets(0.0, 1.0, 10, 0), "rate_per_s"),
        (lambda: gamma_offsets(1.0, 0.0, 10, 0), "burstiness"),
        (lambda: gamma_offsets(1.0, -2.0, 10, 0), "burstiness"),
        (lambda: constant_offsets(1.0, -1), "num_requests"),
        (lambda: poisson_offsets(1.0, -5, 0), "num_requests"),
        (lambda: gamma_offsets(1.0, 1.0, 2.5, 0), "num_requests"),
    ],
)
def test_invalid_parameters_name_the_parameter_in_one_line(call, name):
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{name} must be")
    assert "\n" not in message


def test_zero_requests_is_an_empty_schedule():
    assert poisson_offsets(1.0, 0, 0) == []
    assert gamma_offsets(1.0, 0.5, 0, 0) == []


# --- traces -----------------------------------------------------------------------------------


def test_trace_offsets_relative_to_first(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 100.5, "input_length": 10}\n'
        "\n"
        '{"timestamp": 101, "output_length": 3}\n'
        '{"timestamp": 101.0}\n'
        '{"timestamp": 103.25, "hash_ids": [1, 2]}\n'
    )
    assert trace_offsets(path) == [0.0, 0.5, 0.5, 2.75]
    assert trace_offsets(str(path)) == [0.0, 0.5, 0.5, 2.75]


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ('{"timestamp": 1.0}\n{"timestamp": 2.0\n', 2, "not valid JSON"),
        ('{"timestamp": 1.0}\n{"time": 2.0}\n', 2, "'timestamp' field"),
        ("[1.0]\n", 1, "'timestamp' field"),
        ('{"timestamp": "1.0"}\n', 1, "must be a number"),
        ('{"timestamp": true}\n', 1, "must be a number"),
        ('{"timestamp": NaN}\n', 1, "must be a number"),
        ('{"timestamp": 1.0}\n\n{"timestamp": 3.0}\n{"timestamp": 2.0}\n', 4, "sort the trace"),
    ],
)
def test_bad_trace_lines_name_file_and_line(tmp_path, text, line, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        trace_offsets(path)
    message = str(info.value)
    assert f"{path}, line {line}:" in message
    assert fragment in message
    assert "\n" not in message


def test_missing_empty_and_binary_trace_files(tmp_path):
    with pytest.raises(UserError, match="cannot read trace file .*nope.jsonl"):
        trace_offsets(tmp_path / "nope.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="empty.jsonl has no requests"):
        trace_offsets(empty)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="cannot read trace file .*binary.jsonl"):
        trace_offsets(binary)


# --- sweeps -----------------------------------------------------------------------------------


def test_sweep_points_sorted():
    assert sweep_points([8, 1, 2.5, 4]) == [1.0, 2.5, 4.0, 8.0]
    assert sweep_points([3.0]) == [3.0]


@pytest.mark.parametrize(
    "values, fragment",
    [
        ([], "non-empty"),
        (None, "non-empty"),
        ([1.0, 0.0], "got 0.0"),
        ([1.0, -2], "got -2"),
        ([1.0, "fast"], "got 'fast'"),
        ([float("inf")], "got inf"),
    ],
)
def test_bad_sweeps(values, fragment):
    with pytest.raises(UserError) as info:
        sweep_points(values)
    assert str(info.value).startswith("sweep values must")
    assert fragment in str(info.value)
