"""Sharding: which sessions and streams a shard gets, when it may not shard, its option, and how
records of several processes are put on one clock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from llmbench.errors import UserError
from llmbench.harness import shards
from llmbench.harness.shards import ClockAnchor, Shard
from llmbench.harness.spec import ConcurrencyLoad, RateLoad
from llmbench.harness.spec_load import load_spec


def test_pick_is_round_robin_and_the_shards_add_up_to_the_whole():
    items = list(range(7))
    picked = [shards.pick(items, Shard(i, 3)) for i in range(3)]
    assert picked == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(x for p in picked for x in p) == items
    assert shards.pick(items, None) == items


@pytest.mark.parametrize(
    ("concurrency", "count", "expected"),
    [(5, 2, [3, 2]), (4, 3, [2, 1, 1]), (6, 3, [2, 2, 2]), (3, 3, [1, 1, 1])],
)
def test_a_closed_loop_shares_its_streams(concurrency, count, expected):
    got = [shards.concurrency_of(concurrency, Shard(i, count)) for i in range(count)]
    assert got == expected and sum(got) == concurrency
    assert shards.concurrency_of(concurrency, None) == concurrency


def test_what_cannot_be_sharded():
    rate = RateLoad(rate_per_s=5.0)
    assert shards.problem("openai", rate, 8, 1) is None
    assert shards.problem("engine", rate, 8, 1) is None  # one process is no sharding
    assert shards.problem("openai", rate, 8, 2) is None
    assert "backend kind 'openai'" in shards.problem("engine", rate, 8, 2)
    assert "the transformers backend" in shards.problem("transformers", rate, 8, 2)
    assert shards.problem("openai", rate, 3, 4) == (
        "3 sessions for 4 processes: each needs at least one session"
    )
    assert shards.problem("openai", ConcurrencyLoad(concurrency=4), 8, 4) is None
    assert shards.problem("openai", ConcurrencyLoad(concurrency=2), 8, 4) == (
        "concurrency 2 for 4 processes: each needs at least one stream"
    )
    swept = ConcurrencyLoad(concurrency=8, sweep=(8.0, 1.0))
    assert "concurrency 1 for 2 processes" in shards.problem("openai", swept, 8, 2)


def test_load_workers_is_checked_with_the_spec(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("load:\n  kind: poisson\n  rate_per_s: 5\n  workers: 2\n")
    with pytest.raises(UserError) as e:
        load_spec(path)
    assert str(e.value) == (
        f"{path}:4: load.workers: 2 processes need backend kind 'openai' (the engine backend "
        "runs inside this process)"
    )
    with pytest.raises(UserError, match="load.workers: must be >= 1, got 0"):
        load_spec(path, ["load.workers=0"])
    spec = load_spec(path, ["backend.kind=openai", "backend.url=http://127.0.0.1:1/v1"])
    assert spec.load.workers == 2


def test_workers_leave_the_spec_hash_alone(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("backend:\n  kind: openai\n  url: http://127.0.0.1:1/v1\n")
    one = load_spec(path)
    two = load_spec(path, ["load.workers=2"])
    assert one != two and one.hash() == two.hash()
    assert one.hash() != load_spec(path, ["load.concurrency=2"]).hash()


@pytest.mark.parametrize("text", ["2/2", "a/b", "1", "-1/2", "0/0", "1/"])
def test_a_bad_shard_option_is_one_line(text):
    with pytest.raises(UserError) as e:
        shards.parse_shard(text)
    assert str(e.value) == f"--shard {text}: expected i/N with 0 <= i < N, e.g. --shard 0/2"


def test_parse_shard():
    assert shards.parse_shard("1/3") == (1, 3)
    assert shards.parse_shard("0/1") == (0, 1)


def test_the_shard_options_are_checked_against_the_spec(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("backend:\n  kind: openai\n  url: http://127.0.0.1:1/v1\n")
    spec = load_spec(path)
    assert shards.from_options(None, None, spec) is None
    shard = shards.from_options("1/2", None, spec)
    assert (shard.index, shard.count, shard.start_at) == (1, 2, None)
    with pytest.raises(UserError, match=r"^--start-at: only with --shard i/N$"):
        shards.from_options(None, 1.0, spec)
    with pytest.raises(UserError, match=r"^--shard 0/2: not with load.workers 2; "):
        shards.from_options("0/2", None, load_spec(path, ["load.workers=2"]))
    with pytest.raises(UserError, match=r"^--shard 0/5: concurrency 4 for 5 processes: "):
        shards.from_options("0/5", None, spec)
    engine = load_spec(tmp_path / "w.yaml", ["backend.kind=engine"])
    with pytest.raises(UserError, match=r"^--shard 0/2: 2 processes need backend kind 'openai'"):
        shards.from_options("0/2", None, engine)
    resetting = load_spec(path, ["backend.reset_prefix_cache=true"])
    with pytest.raises(UserError, match=r"^--shard 0/2: not with backend.reset_prefix_cache "):
        shards.from_options("0/2", None, resetting)


def test_start_at_starts_the_first_repetition_at_the_wall_clock_time(capsys):
    # 50 ms after the wall clock was read, on perf_counter: between 50 ms after a read before it
    # and 50 ms after a read once start_at answered, however long anything took in between
    # (1 µs: the float of a Unix time in seconds).
    before = time.perf_counter_ns()
    start_at = shards._first_at(time.time() + 0.05)
    first = asyncio.run(start_at())
    after = time.perf_counter_ns()
    assert before + 50_000_000 - 1_000 <= first <= after + 50_000_000 + 1_000
    before = time.perf_counter_ns()
    later = asyncio.run(start_at())  # the next repetition: at once
    assert before <= later <= time.perf_counter_ns()
    late = shards._first_at(time.time() - 2.0)
    before = time.perf_counter_ns()
    assert before <= asyncio.run(late()) <= time.perf_counter_ns()
    assert "--start-at: 2.0 s past already; starting now" in capsys.readouterr().err


def anchor(perf_ns: int, monotonic_ns: int, unix_ns: int, boot: str | None = "b", host="h"):
    return ClockAnchor(perf_ns, monotonic_ns, unix_ns, host, boot)


def test_on_one_boot_records_move_by_the_perf_minus_monotonic_offsets():
    # Source: perf = monotonic + 5 s; target: perf = monotonic + 2 s. A source time t is
    # monotonic t − 5 s, which the target reads as t − 5 s + 2 s.
    source = anchor(10_000_000_000, 5_000_000_000, 1)
    target = anchor(7_000_000_000, 5_000_000_000, 1_000_000_000_000)
    assert shards.shift_ns(source, target) == -3_000_000_000
    assert shards.alignment([source], target) == shards.ALIGNED_BY_MONOTONIC


def test_across_hosts_records_move_by_the_wall_clock():
    # Source host: perf 10 s at unix 1000 s; target host: perf 50 s at unix 1001 s. A source
    # time t is unix t − 10 s + 1000 s, which the target reads as that − 1001 s + 50 s.
    source = anchor(10_000_000_000, 3, 1_000_000_000_000, boot="b1", host="a")
    target = anchor(50_000_000_000, 4, 1_001_000_000_000, boot="b2", host="b")
    assert shards.shift_ns(source, target) == 39_000_000_000
    assert shards.alignment([source], target) == shards.ALIGNED_BY_WALL_CLOCK
    unknown = anchor(10_000_000_000, 3, 1_000_000_000_000, boot=None, host="b")
    assert shards.shift_ns(unknown, target) == 39_000_000_000  # no boot id: not trusted
    assert not shards.is_same_boot(unknown, unknown)


def test_this_processes_clocks():
    a = shards.clock_anchor()
    assert a.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert abs(a.unix_ns - time.time_ns()) < 50_000_000
    assert abs(a.perf_ns - time.perf_counter_ns()) < 50_000_000
    # A start given on CLOCK_MONOTONIC lands on this process's perf_counter at the same instant.
    monotonic_now, perf_now = time.monotonic_ns(), time.perf_counter_ns()
    assert abs(shards.perf_ns_of_monotonic(monotonic_now) - perf_now) < 1_000_000
    assert shards.shift_ns(a, shards.clock_anchor()) == pytest.approx(0, abs=1_000_000)


def test_where_perf_counter_is_another_clock_its_offset_is_read(monkeypatch):
    monkeypatch.setattr(shards, "_IS_PERF_MONOTONIC", False)
    # Here both are one clock after all: the offset read back to back is within a read's time.
    assert abs(shards._perf_minus_monotonic_ns()) < 1_000_000
    monotonic_now, perf_now = time.monotonic_ns(), time.perf_counter_ns()
    assert abs(shards.perf_ns_of_monotonic(monotonic_now) - perf_now) < 1_000_000
