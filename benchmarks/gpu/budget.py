"""Time boxes: how long a step (or a part of the engine step) may run, so that one slow step
never takes the time of the steps after it and the whole sitting ends in time."""

from __future__ import annotations

# A step offered less than this is skipped (said so in the summary), not started.
MIN_STEP_S = 3.0


def step_timeout_s(box_s: float, left_s: float, later_reserve_s: float) -> float:
    """Seconds a step may run: its own box, and never what the steps after it are owed.

    Formula: min(box_s, left_s − later_reserve_s), with left_s the time to the sitting's end
    and later_reserve_s the Σ reserve_s of the steps after this one. A result below
    `MIN_STEP_S` means: skip the step.
    """
    return min(box_s, left_s - later_reserve_s)
