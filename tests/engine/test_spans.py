"""The engine's profiler spans: nothing while no profiler records, a named event while one
does (what `llmbench profile` names the engine's host work by)."""

from __future__ import annotations

import contextlib

import torch
from torch.profiler import ProfilerActivity, profile

from llmbench.engine import spans


def test_a_span_is_nothing_without_a_profiler():
    assert isinstance(spans.span(spans.SCHEDULE), contextlib.nullcontext)


def test_a_span_is_a_profiler_event_while_one_records():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with spans.span(spans.OUTPUTS):
            torch.ones(3).sum()
    (event,) = [e for e in prof.events() if e.name == spans.OUTPUTS]
    assert [c.name for c in event.cpu_children] == ["aten::ones", "aten::sum"]
