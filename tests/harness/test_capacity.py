"""`load.search`'s choice of the next load (`capacity.next_load`), against loads whose outcome a
test decides: a machine that meets the SLOs up to a known load."""

from __future__ import annotations

from llmbench.harness import capacity
from llmbench.harness.spec import LoadSearch


def searched(search: LoadSearch, edge: float, whole: bool) -> list[float]:
    """The loads the search runs, in order, on a machine that meets the SLOs up to `edge`."""
    met: dict[float, bool] = {}
    order = []
    while (load := capacity.next_load(search, met, whole)) is not None:
        order.append(load)
        met[load] = load <= edge
    return order


def test_a_concurrency_search_halves_the_gap_on_a_log_scale_down_to_neighbours():
    # 1 met, 64 missed; then sqrt(1·64) = 8 met, sqrt(8·64) = 22.6 → 23 missed, sqrt(8·23) =
    # 13.6 → 14 met, sqrt(14·23) = 17.9 → 18 missed, sqrt(14·18) = 15.9 → 16 met, ...
    order = searched(LoadSearch(low=1, high=64, points=12), edge=16.5, whole=True)
    assert order == [1, 64, 8, 23, 14, 18, 16, 17]  # 16 met, 17 missed: neighbours, done


def test_a_search_stops_at_its_points():
    order = searched(LoadSearch(low=1, high=64, points=4), edge=16.5, whole=True)
    assert order == [1, 64, 8, 23]


def test_a_rate_search_keeps_three_digits_and_stops_within_five_percent():
    order = searched(LoadSearch(low=0.5, high=8, points=20), edge=3.0, whole=False)
    # sqrt(0.5·8) = 2 met, sqrt(2·8) = 4 missed, sqrt(2·4) = 2.83 met, sqrt(2.83·4) = 3.36
    # missed, sqrt(2.83·3.36) = 3.08 missed, sqrt(2.83·3.08) = 2.95 met, then 2.95 → 3.08 is
    # within 5%: done
    assert order == [0.5, 8, 2.0, 4.0, 2.83, 3.36, 3.08, 2.95]


def test_a_low_load_that_misses_or_a_high_one_that_meets_ends_the_search():
    assert searched(LoadSearch(low=2, high=32), edge=1, whole=True) == [2]
    assert searched(LoadSearch(low=2, high=32), edge=100, whole=True) == [2, 32]


def test_a_noisy_outcome_searches_between_the_best_hit_and_the_lowest_miss_above_it():
    # 8 missed (noise) yet 12 met: the search goes on between 12 and the lowest miss above it
    met = {1.0: True, 32.0: False, 6.0: True, 14.0: False, 8.0: False, 12.0: True}
    assert capacity.next_load(LoadSearch(low=1, high=32, points=10), met, whole=True) == 13


def test_a_point_meets_the_slos_when_90_percent_of_its_requests_do():
    assert capacity.meets_slos({"goodput_fraction": 0.9})
    assert not capacity.meets_slos({"goodput_fraction": 0.89})
    assert not capacity.meets_slos({"goodput_fraction": None})  # no measured request
