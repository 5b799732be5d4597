"""The measured roofs: real measurements of the right shape, sized and bounded by time, cached
per probe with where each number came from and how busy the machine was. Whatever depends on
time or load runs on a scripted clock (`FakeClock`) and scripted load readings (`FakeWatch`):
no test here fails because the machine running it is busy."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from llmbench.roofline import ceilings


class FakeClock:
    """A clock that moves only when a fake run says how long it took."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def run(self, seconds: float):
        """A run that takes `seconds` on this clock."""

        def advance():
            self.t += seconds

        return advance


def test_measured_bandwidth_has_every_probe_and_rates_from_its_runs():
    """Real runs: three kernels at all threads and at one, each rate the bytes it moves over its
    recorded time, on buffers within the 1 GB bound."""
    roofs = ceilings.measure("cpu", budget_s=5.0, dtypes=())
    threads = roofs["threads"]
    names = {"read", "copy", "triad"}
    if threads > 1:
        names |= {"read_1thread", "copy_1thread", "triad_1thread"}
    assert set(roofs["probes"]) | set(roofs["skipped"]) == names
    for name, probe in roofs["probes"].items():
        # A round's buffers take at most 576 MiB: the read's one, or the triad's three.
        num_buffers = {"read": 1, "copy": 2, "triad": 3}[name.split("_")[0]]
        assert ceilings.MIN_BUFFER_BYTES <= probe["size"]
        assert num_buffers * probe["size"] <= ceilings.MAX_PROBE_BYTES
        assert probe["unit"] == "B/s" and probe["repeats"] >= 1
        assert probe["best_per_s"] >= probe["median_per_s"] > 0 and 0 <= probe["spread"] < 1
        # Each fresh allocation's best run; the probe's best is the best of them.
        assert max(probe["allocation_best_per_s"]) == probe["best_per_s"]
    read = roofs["probes"]["read"]
    assert read["size"] == 3 * roofs["probes"]["copy"]["size"]  # the triad's three buffers' bytes
    assert roofs["read_bytes_per_s"] == read["best_per_s"] == read["size"] / read["seconds"]
    assert (read["method"], read["threads"]) == ("read-only sum", threads)
    copy = roofs["probes"]["copy"]
    assert roofs["copy_bytes_per_s"] == 2 * copy["size"] / copy["seconds"]  # read + write
    if "triad" in roofs["probes"]:
        triad = roofs["probes"]["triad"]
        assert triad["best_per_s"] == 3 * triad["size"] / triad["seconds"]  # 2 reads + 1 write


def test_measured_matmuls_have_rates_from_their_runs():
    roofs = ceilings.measure("cpu", budget_s=8.0, with_bandwidth=False)
    # torch 2.13's CPU build has an int8 x int8 -> int32 matmul, so int8 is measured too.
    assert set(roofs["matmul_flops_per_s"]) | set(roofs["skipped"]) == set(ceilings.MATMUL_DTYPES)
    assert "float32" in roofs["matmul_flops_per_s"]  # the first has time whatever the load
    for dtype, rate in roofs["matmul_flops_per_s"].items():
        probe = roofs["probes"][dtype]
        assert probe["best_per_s"] == rate == 2 * probe["size"] ** 3 / probe["seconds"]
        assert 256 <= probe["size"] <= 2048 and 0 < rate < 1e15  # .. 1 PFLOP/s
        assert probe["unit"] == "FLOP/s" and probe["repeats"] <= ceilings.MAX_REPEATS


def fake_bandwidth(monkeypatch, clock: FakeClock, seconds: float) -> list[str]:
    """Bandwidth runs that take `seconds` each on `clock` and no memory; returns the log of what
    ran ("read" each run, warm-ups included; "buffer" each buffer made)."""
    ran = []

    def kernel_run(name, buffers):
        step = clock.run(seconds)
        return lambda: (ran.append(name), step())

    monkeypatch.setattr(ceilings, "KERNEL_RUN", kernel_run)
    monkeypatch.setattr(ceilings, "NEW_BUFFER", lambda size, device: ran.append("buffer"))
    return ran


def test_a_loaded_machine_overruns_a_tiny_budget_by_one_run_at_most(monkeypatch):
    """Every run takes 2 s (a loaded machine) against a 0.3 s budget: `read` and `copy` get the
    one timed run a run needs (each after a warm-up), nothing else starts: 8 s, not the 24 runs
    of a whole round and four matmuls, which took 38.7 s against a 10.3 s limit under load."""
    clock = FakeClock()
    ran = fake_bandwidth(monkeypatch, clock, 2.0)
    monkeypatch.setattr(ceilings, "MATMULS", {})  # none may run: any would be a KeyError
    roofs = ceilings.measure("cpu", budget_s=0.3, clock=clock)
    assert clock.t == 8.0  # read: warm-up + 1 run, copy: warm-up + 1 run
    # The read's own buffer, then copy's two (made after the read's was let go).
    assert ran == ["buffer", "read", "read", "buffer", "buffer", "copy", "copy"]
    assert {name: p["repeats"] for name, p in roofs["probes"].items()} == {"read": 1, "copy": 1}
    size = roofs["probes"]["copy"]["size"]
    assert roofs["probes"]["read"]["size"] == 3 * size  # one buffer of the triad's three's bytes
    assert (
        roofs["read_bytes_per_s"] == 3 * size / 2.0 and roofs["copy_bytes_per_s"] == 2 * size / 2.0
    )
    assert roofs["matmul_flops_per_s"] == {}
    assert roofs["skipped"][-4:] == list(ceilings.MATMUL_DTYPES)
    for dtype in ceilings.MATMUL_DTYPES:
        assert (
            f"matmul {dtype}: not measured, the time budget was spent (a later run measures it)"
            in roofs["notes"]
        )
    assert "bandwidth triad: not measured, the time budget was spent" in roofs["notes"]


def test_the_dtype_a_run_computes_in_gets_one_small_matmul_past_the_budget(monkeypatch):
    """The same loaded machine: the bandwidth spends the 0.3 s, yet the run's own dtype (its
    MFU's roof) gets a warm-up and one timed run at 256x256; the others are skipped."""
    clock = FakeClock()
    fake_bandwidth(monkeypatch, clock, 2.0)
    sizes = []

    def matmul(dtype, n, device):
        sizes.append((dtype, n))
        return clock.run(2.0)

    monkeypatch.setattr(ceilings, "MATMULS", {"bfloat16": matmul})  # any other: a KeyError
    roofs = ceilings.measure("cpu", budget_s=0.3, clock=clock, needed="bfloat16")
    assert sizes == [("bfloat16", 256)] and clock.t == 8.0 + 2 * 2.0
    assert roofs["matmul_flops_per_s"] == {"bfloat16": 2 * 256**3 / 2.0}
    assert roofs["probes"]["bfloat16"]["repeats"] == 1
    assert roofs["skipped"][-3:] == [d for d in ceilings.MATMUL_DTYPES if d != "bfloat16"]


def test_the_deadline_is_checked_before_every_run_not_every_probe(monkeypatch):
    """5 s budget, 2 s runs: read warms up (2 s) and runs at 4 s and 6 s (4 < 5 when it starts),
    then stops; copy still gets its one run (8, 10 s); nothing more."""
    clock = FakeClock()
    fake_bandwidth(monkeypatch, clock, 2.0)
    roofs = ceilings.measure("cpu", budget_s=5.0, dtypes=(), clock=clock)
    assert clock.t == 10.0
    assert {name: p["repeats"] for name, p in roofs["probes"].items()} == {"read": 2, "copy": 1}


def test_timed_runs_start_only_while_time_is_left():
    clock = FakeClock()
    warmed = []

    def run():
        clock.t += 1.0
        return 1.0

    def out_of_time():
        return clock.t >= 2.5

    runs = ceilings.timed_runs(run, 5, out_of_time, warm_up=lambda: warmed.append(clock.t))
    assert (runs, warmed) == ([1.0, 1.0, 1.0], [0.0])  # started at 0, 1, 2; not at 3
    assert ceilings.timed_runs(run, 5, out_of_time) == []  # out of time: none, no warm-up
    assert ceilings.timed_runs(run, 5, out_of_time, min_runs=1) == [1.0]  # one whatever


def slow_matmul(clock: FakeClock, flops_per_s: float):
    """A dtype with no fast path: an n×n matmul that takes 2n³ / rate seconds on `clock`."""

    def make(dtype, n, device):
        return clock.run(2 * n**3 / flops_per_s)

    return make


def test_a_slow_dtype_is_measured_small_and_says_so(monkeypatch):
    # At 0.5 GFLOP/s: 256² takes 67 ms, so 512² (0.54 s) is a run under MAX_RUN_S = 0.75 s and
    # 1024² (4.3 s) is not: the probe stops at 512, 1000x below a dtype that reached 2048².
    clock = FakeClock()
    monkeypatch.setitem(ceilings.MATMULS, "float16", slow_matmul(clock, 0.5e9))
    monkeypatch.setitem(ceilings.MATMULS, "bfloat16", slow_matmul(clock, 500e9))  # 2048²: 34 ms
    roofs = ceilings.measure(
        "cpu", dtypes=("bfloat16", "float16"), with_bandwidth=False, clock=clock
    )
    assert (
        roofs["probes"]["bfloat16"]["size"] == 2048 and roofs["probes"]["bfloat16"]["note"] is None
    )
    probe = roofs["probes"]["float16"]
    assert probe["size"] == 512 and probe["repeats"] == 3  # 3 equal runs: agreed
    assert roofs["matmul_flops_per_s"]["float16"] == pytest.approx(0.5e9)
    assert roofs["notes"] == [probe["note"]]
    assert probe["note"] == (
        "matmul float16: measured at 512x512, not 2048x2048 (a run took 537 ms): 0.50 GFLOP/s, "
        "1000x below bfloat16: no fast path for it here"
    )
    assert "read_bytes_per_s" not in roofs


def test_size_by_time_grows_a_fast_probe_to_full_size():
    clock = FakeClock()
    sizes = []

    def make(n):
        sizes.append(n)
        return clock.run(1e-3)

    n, times = ceilings.size_by_time(make, lambda: None, 256, 2048, cap_s=5.0, clock=clock)
    assert (n, sizes) == (2048, [256, 512, 1024, 2048])
    assert times == pytest.approx([1e-3] * 3)  # 2 runs at 2048², a third: the best 3 agree


def fake_probe(unit: str = "B/s", best_per_s: float = 1e9, converged: bool = True) -> dict:
    return {
        "size": 1,
        "repeats": 3,
        "seconds": 1.0,
        "measured_unix_s": 0.0,
        "note": None,
        "method": "fake",
        "threads": 2,
        "unit": unit,
        "best_per_s": best_per_s,
        "median_per_s": best_per_s,
        "spread": 0.0,
        "converged": converged,
        "allocation_best_per_s": [best_per_s] if unit == "B/s" else None,
    }


def fake_measure(calls, skipped=("float16",), read_per_s=(3e9,)):
    """`measure` without measuring: every dtype at 1 GFLOP/s but `skipped` (over budget), read
    at `read_per_s[-1]` (a test appends another rate), copy at 2 GB/s; `calls` logs each call."""

    def measure(device, budget_s, dtypes, with_bandwidth, progress, needed=None):
        calls.append((list(dtypes), with_bandwidth))
        probe = fake_probe("FLOP/s")
        out = {
            "device": "cpu0",
            "device_type": "cpu",
            "threads": 2,
            "torch": "2.13.0",
            "method": "best of fake runs",
            "matmul_flops_per_s": {d: 1e9 for d in dtypes if d not in skipped},
            "probes": {d: probe for d in dtypes if d not in skipped},
            "skipped": [d for d in dtypes if d in skipped],
            "unsupported": [],
            "notes": [],
        }
        if with_bandwidth:
            out.update(copy_bytes_per_s=2e9, read_bytes_per_s=read_per_s[-1])
            out["probes"] |= {
                "copy": fake_probe(best_per_s=2e9),
                "read": fake_probe(best_per_s=read_per_s[-1]),
            }
        return out

    return measure


class FakeWatch:
    """A `LoadWatch` with scripted readings: other processes' cores in the second before and
    during the measurement (busy above 0.25, as `provenance.LoadMonitor` says)."""

    def __init__(self, before: float, during: float):
        self.before, self.during = before, during
        self.is_over = False

    def __call__(self) -> FakeWatch:  # the factory `ceilings` calls
        self.is_over = False
        return self

    def __enter__(self) -> FakeWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.is_over = True

    def load(self) -> SimpleNamespace:
        during = self.during if self.is_over else None
        return SimpleNamespace(
            cpu_count=2,
            other_processes_cores_before=self.before,
            other_processes_cores=during,
            is_busy=any(v is not None and v > 0.25 for v in (self.before, during)),
        )


QUIET, BUSY = FakeWatch(0.02, 0.05), FakeWatch(0.9, 0.75)
BUSY_NOTE = (
    "measured on a busy machine (other processes used up to 0.90 of 2 cores): float32, "
    "bfloat16, float16, int8, copy, read; cached marked busy, not as this machine's roofs, and "
    "measured again by the next run on a quiet machine"
)


def test_roofs_measured_busy_are_cached_marked_busy_and_measured_again_when_quiet(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(ceilings, "measure", fake_measure(calls, skipped=()))
    busy = ceilings.ceilings("cpu", watch_load=BUSY)
    assert busy["probe_loads"]["read"] == {
        "is_busy": True,
        "cpu_count": 2,
        "other_processes_cores_before": 0.9,
        "other_processes_cores": 0.75,
    }
    assert busy["notes"][0] == BUSY_NOTE and busy["sources"]["read"] == "measured now"
    (cache_file,) = (tmp_path / "hardware").iterdir()
    assert json.loads(cache_file.read_text())["probe_loads"]["bfloat16"]["is_busy"] is True
    # Still busy: measuring again would give busy numbers too; the busy ones are used, said so.
    still = ceilings.ceilings("cpu", watch_load=BUSY)
    assert len(calls) == 1 and still["notes"][0] == BUSY_NOTE
    ceilings.ceilings("cpu")  # a call that does not watch cannot tell it is quiet now
    assert len(calls) == 1
    assert still["sources"]["read"].startswith("cache ")
    # Quiet: everything measured busy is measured again, and cached as the machine's.
    quiet = ceilings.ceilings("cpu", watch_load=QUIET)
    assert calls[1] == (["float32", "bfloat16", "float16", "int8"], True)
    assert quiet["probe_loads"]["read"]["is_busy"] is False and quiet["notes"] == []
    ceilings.ceilings("cpu", watch_load=QUIET)
    assert len(calls) == 2  # quiet roofs in the cache: nothing measured


def test_a_busy_refresh_shows_what_it_measured_and_keeps_the_quiet_roofs(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls, read_per_s = [], [3e9]
    monkeypatch.setattr(ceilings, "measure", fake_measure(calls, (), read_per_s))
    ceilings.ceilings("cpu", watch_load=QUIET)
    read_per_s.append(1e9)  # a busy machine reads a third of it
    refreshed = ceilings.ceilings("cpu", refresh=True, watch_load=BUSY)
    assert refreshed["read_bytes_per_s"] == 1e9 and refreshed["sources"]["read"] == "measured now"
    assert refreshed["notes"][-1] == (
        "bfloat16, copy, float16, float32, int8, read: not cached, measured on a busy machine; "
        "the cache keeps the quiet measurement (`llmbench hardware` shows it)"
    )
    again = ceilings.ceilings("cpu", watch_load=QUIET)
    assert len(calls) == 2 and again["read_bytes_per_s"] == 3e9
    assert again["probe_loads"]["read"]["is_busy"] is False


def test_roofs_measured_unwatched_are_measured_again_by_a_call_that_watches(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(ceilings, "measure", fake_measure(calls, skipped=()))
    assert set(ceilings.ceilings("cpu")["probe_loads"].values()) == {None}  # load unknown
    ceilings.ceilings("cpu")
    assert len(calls) == 1  # nor can this call tell: the cache serves
    watched = ceilings.ceilings("cpu", watch_load=QUIET)
    assert calls[1] == (["float32", "bfloat16", "float16", "int8"], True)
    assert watched["probe_loads"]["int8"]["is_busy"] is False


def test_ceilings_measure_only_what_the_cache_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(ceilings, "measure", fake_measure(calls))
    first = ceilings.ceilings("cpu", first="bfloat16")
    # The run's dtype first; float16 was skipped (over budget): not cached as measured.
    assert calls == [(["bfloat16", "float32", "float16", "int8"], True)]
    assert set(first["matmul_flops_per_s"]) == {"bfloat16", "float32", "int8"}
    assert first["sources"]["read"] == "measured now"
    assert (
        first["sources"]["read_bytes_per_s"]
        == "probe read: the best fake over 2 threads, of 3 runs"
    )
    assert "skipped" not in first and "unsupported" not in first

    second = ceilings.ceilings("cpu")
    assert calls[1] == (["float16"], False)  # only the dtype it lacked, no bandwidth again
    (cache_file,) = (tmp_path / "hardware").iterdir()
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(0))  # measured_unix_s 0
    assert second["sources"]["read"] == f"cache {cache_file} (measured {date})"
    assert second["sources"]["float32"].startswith(f"cache {cache_file}")

    ceilings.ceilings("cpu", refresh=True)
    assert calls[2] == (["float32", "bfloat16", "float16", "int8"], True)


def test_a_complete_cache_measures_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    fake = fake_measure(calls)
    monkeypatch.setattr(
        ceilings,
        "measure",
        lambda device, budget_s, dtypes, with_bandwidth, progress, needed=None: {
            **fake(device, budget_s, [d for d in dtypes if d != "float16"], with_bandwidth, None),
            "unsupported": ["float16"] if "float16" in dtypes else [],
        },
    )
    roofs = ceilings.ceilings("cpu")
    assert roofs["notes"] == ["matmul float16: torch has none on this device"]
    ceilings.ceilings("cpu")
    assert len(calls) == 1  # float16 is known to be missing: not tried again


def test_a_cache_from_before_the_probes_had_spreads_is_measured_again(tmp_path, monkeypatch):
    """A cache entry of the earlier format (one copy and one read probe, best runs only, no
    `format`) lacks the medians, spreads and the other methods: it is measured again whole."""
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(ceilings, "measure", fake_measure(calls))
    first = ceilings.ceilings("cpu")  # writes this machine's cache file, then age it
    (cache_file,) = (tmp_path / "hardware").iterdir()
    assert json.loads(cache_file.read_text())["format"] == ceilings.CACHE_FORMAT
    old_probe = {"size": 1, "repeats": 5, "seconds": 1.0, "measured_unix_s": 0.0, "note": None}
    old = {
        **{k: v for k, v in first.items() if k != "sources"},
        "method": "best of up to 6x10 (bandwidth, fresh buffers) or 5 (matmul) runs",
        "probes": {name: old_probe for name in first["probes"]},
        "unsupported": [],
    }
    cache_file.write_text(json.dumps(old))
    assert ceilings._read_cache(cache_file) is None
    ceilings.ceilings("cpu")
    assert calls[1] == (["float32", "bfloat16", "float16", "int8"], True)  # all of it again
    assert json.loads(cache_file.read_text())["format"] == ceilings.CACHE_FORMAT
    assert ceilings._read_cache(cache_file) is not None
    assert "format" not in ceilings.ceilings("cpu")  # bookkeeping, not a roof
    assert len(calls) == 3  # float16 (skipped by the fake) is asked for again; nothing else


@pytest.mark.parametrize(
    "seconds, expected",
    [
        ([1.0, 1.02, 1.03], True),  # 3% apart: agreed
        ([1.03, 1.5, 1.0, 1.02], True),  # in any order; a slow run does not matter
        ([1.0, 1.02, 1.031], False),  # the third best is more than 3% slower
        ([1.0, 1.0], False),  # fewer than AGREE_RUNS runs
        ([], False),
    ],
)
def test_a_probe_has_converged_when_its_best_three_runs_agree(seconds, expected):
    assert ceilings.has_converged(seconds) is expected


def test_run_stats_are_rates_of_the_best_and_median_run_and_the_spread():
    # 8 bytes per run in 2, 1 and 4 s: best 8 B/s, median (2 s) 4 B/s, slowest 2 B/s.
    stats = ceilings.run_stats([2.0, 1.0, 4.0], work=8.0)
    assert stats == {"best_per_s": 8.0, "median_per_s": 4.0, "spread": 0.75}
    assert ceilings.run_stats([0.5, 0.5, 0.5], work=1.0)["spread"] == 0.0


def scripted(times):
    """A timed run that takes each of `times` in turn (no clock involved)."""
    queue = list(times)
    return lambda: queue.pop(0)


def test_repeat_until_agreed_stops_when_the_best_runs_agree():
    runs = ceilings.repeat_until_agreed(
        scripted([1.5, 1.01, 1.02, 9.0]), [1.0], lambda next_s: False
    )
    assert runs == [1.0, 1.5, 1.01, 1.02]  # 1.0, 1.01, 1.02 agree: no fourth run


def test_repeat_until_agreed_stops_at_max_runs_or_when_out_of_time():
    wild = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert ceilings.repeat_until_agreed(scripted(wild), [0.5], lambda s: False, 4) == [
        0.5,
        1.0,
        2.0,
        3.0,
    ]
    asked = []

    def out_of_time(next_s):
        asked.append(next_s)
        return len(asked) > 2

    assert ceilings.repeat_until_agreed(scripted(wild), [0.5], out_of_time) == [0.5, 1.0, 2.0]
    assert asked == [0.5, 0.5, 0.5]  # the next run is expected to take the best run's time


def test_rounds_continue_for_the_probes_that_have_not_agreed():
    script = {
        "steady": [[1.0, 1.01, 1.02], [1.0, 1.0, 1.0]],
        "noisy": [[1.0, 1.5, 2.0], [1.2, 1.9, 1.3], [0.8, 1.6, 1.1], [1.0, 0.81, 0.82]],
    }
    asked = []

    def time_round(pending):
        asked.append(list(pending))
        return {name: script[name].pop(0) for name in pending}

    times = ceilings.rounds_until_agreed(["steady", "noisy"], time_round, lambda: False)
    # Both run the first two rounds (two fresh allocations each), then only the noisy one,
    # until its best three (0.8, 0.81, 0.82) agree.
    assert asked == [["steady", "noisy"], ["steady", "noisy"], ["noisy"], ["noisy"]]
    assert times["steady"] == [1.0, 1.01, 1.02, 1.0, 1.0, 1.0]
    assert len(times["noisy"]) == 12 and ceilings.has_converged(times["noisy"])


def test_rounds_stop_at_max_rounds_or_when_time_is_out():
    def time_round(pending):
        return {name: [1.0, 2.0, 3.0] for name in pending}  # never agree

    times = ceilings.rounds_until_agreed(["a"], time_round, lambda: False, max_rounds=3)
    assert len(times["a"]) == 9
    times = ceilings.rounds_until_agreed(["a", "b"], time_round, lambda: True)
    assert times == {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0]}  # the first round, whole


def test_notes_name_unsettled_probes_and_a_read_roof_below_one_thread():
    roofs = {
        "probes": {
            "read": {**fake_probe(best_per_s=11.2e9), "spread": 0.14},
            "read_1thread": {**fake_probe(best_per_s=22.5e9, converged=False), "spread": 0.77},
            "bfloat16": {**fake_probe("FLOP/s", converged=False), "spread": 0.345},
        },
        "skipped": [],
        "unsupported": [],
    }
    assert ceilings._notes(roofs) == [
        "not settled (their best 3 runs were not within 3% when their time ran out): "
        "read_1thread spread 77%, bfloat16 spread 34%; a busy machine? re-measure on a quiet "
        "one with `llmbench hardware --refresh`",
        "one thread read 22.5 GB/s, more than 2 threads' 11.2 GB/s (the read roof): other "
        "processes, or the VM's host, had the cores, so the roof is low",
    ]
    # One thread within 3% of all of them is noise, not a low roof.
    roofs["probes"]["read_1thread"] = fake_probe(best_per_s=11.5e9)
    roofs["probes"].pop("bfloat16")
    assert ceilings._notes(roofs) == []


def test_exceeding_a_ceiling_is_a_line_not_a_utilisation_above_one():
    line = ceilings.exceeds_ceiling_line("decode bandwidth", 21.04e9, 19.0e9, "GB/s", 1e9)
    assert line == (
        "decode bandwidth achieved 21.0 GB/s > measured ceiling 19.0 GB/s: the ceiling is "
        "stale or wrong; re-measure with `llmbench hardware --refresh`"
    )
    assert ceilings.exceeds_ceiling_line("decode bandwidth", 19e9, 19e9, "GB/s", 1e9) is None
    assert ceilings.exceeds_ceiling_line("decode bandwidth", 9e9, 19e9, "GB/s", 1e9) is None
    assert ceilings.exceeds_ceiling_line("decode bandwidth", 9e9, None, "GB/s", 1e9) is None


@pytest.mark.parametrize(
    "llc, available, expected",
    [
        (40 << 20, 16 << 30, (160 << 20, None)),  # 4x a 40 MiB L3
        (2 << 20, 16 << 30, (128 << 20, None)),  # never below 128 MiB
        (48 << 20, 16 << 30, (192 << 20, None)),  # 4x 48 MiB: a round's three share 576 MiB
        # The VM's 300 MiB L3 (its host's) is believed as 48 MiB: 192 MiB, not 2.4 GiB.
        (300 << 20, 16 << 30, (192 << 20, None)),
        (None, None, (192 << 20, None)),  # nothing known: the most the bound allows
    ],
)
def test_buffers_are_four_times_a_believable_last_level_cache(llc, available, expected):
    assert ceilings.buffer_bytes(llc, available) == expected


def test_a_rounds_buffers_stay_under_the_probe_bound_whatever_the_cache_reports():
    for llc in (None, 1 << 20, 32 << 20, 300 << 20, 4 << 30):
        size, _ = ceilings.buffer_bytes(llc, 128 << 30)
        assert 3 * size <= ceilings.MAX_PROBE_BYTES == 576 << 20


def test_buffers_shrink_to_fit_memory_and_say_so():
    # 3 buffers of 160 MiB (4x 40 MiB) want 480 MiB; half of 900 MiB is 450 MiB: 150 MiB each.
    size, note = ceilings.buffer_bytes(40 << 20, 900 << 20)
    assert size == 150 << 20
    assert note == (
        "bandwidth buffers 150 MiB, not 160 MiB (4x the last-level cache): memory is short; "
        "part of each run may come from cache"
    )


def test_last_level_cache_is_every_instance_of_the_highest_level(tmp_path):
    """Two sockets, each an L3 of 32 MiB shared by its two CPUs, and a private L2 per CPU:
    64 MiB of last-level cache."""
    for cpu in range(4):
        shared = "0-1" if cpu < 2 else "2-3"
        for index, (level, kind, size, cpus) in enumerate(
            [
                (1, "Instruction", "32K", str(cpu)),
                (2, "Unified", "1024K", str(cpu)),
                (3, "Unified", "32768K", shared),
            ]
        ):
            folder = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
            folder.mkdir(parents=True)
            for name, value in (
                ("level", level),
                ("type", kind),
                ("size", size),
                ("shared_cpu_list", cpus),
            ):
                (folder / name).write_text(f"{value}\n")
    assert ceilings.llc_bytes(tmp_path) == 64 << 20


def test_this_machine_has_a_last_level_cache_size():
    assert ceilings.llc_bytes() is None or ceilings.llc_bytes() >= 1 << 20


def test_allocation_spread_of_given_rates():
    """Four allocations' best runs, GB/s: 12.6 (a slow moment), 29.4, 29.8, 30.2."""
    moved = ceilings.allocation_spread([29.4e9, 12.6e9, 30.2e9, 29.8e9])
    assert moved["min_per_s"] == 12.6e9 and moved["max_per_s"] == 30.2e9
    assert moved["median_per_s"] == pytest.approx(29.6e9)  # (29.4 + 29.8) / 2
    assert moved["spread"] == pytest.approx(1 - 12.6 / 30.2)  # 0.583
    assert ceilings.allocation_spread([25e9]) == {
        "min_per_s": 25e9,
        "median_per_s": 25e9,
        "max_per_s": 25e9,
        "spread": 0.0,
    }


@pytest.mark.parametrize(
    "read, alone, settled",
    [
        ([0.020, 0.0201, 0.0202], [0.040, 0.041], True),  # 2 threads twice one: a roof
        ([0.020, 0.0201, 0.0202], None, True),  # no one-thread probe (one thread, a GPU)
        ([0.020, 0.0201, 0.0202], [], True),  # the one-thread probe got no run
        ([0.046, 0.0461, 0.0462], [0.040], False),  # 2 threads slower than one: not there
        ([0.0412, 0.0413, 0.0414], [0.040], True),  # 3% slower: within the tolerance
        ([0.020, 0.030, 0.040], [0.040], False),  # not converged
    ],
)
def test_a_bandwidth_probe_slower_at_all_threads_than_at_one_is_not_settled(read, alone, settled):
    times = {"read": read} | ({} if alone is None else {"read_1thread": alone})
    assert ceilings.is_bandwidth_settled("read", times) is settled


def test_rounds_go_on_while_all_threads_read_slower_than_one(monkeypatch):
    """Round 1 and 2: the two threads share a core (46 ms, one thread 40 ms); round 3 they have
    two (20 ms): the rounds go on until then, and the roof is the two-core read."""
    per_round = iter([0.046, 0.046, 0.020, 0.020])
    rounds = []

    def time_round(pending):
        rounds.append(list(pending))
        seconds = next(per_round)
        return {name: [seconds] * 3 if name == "read" else [0.040] * 3 for name in pending}

    times = ceilings.rounds_until_agreed(
        ["read", "read_1thread"],
        time_round,
        lambda: False,
        is_settled=ceilings.is_bandwidth_settled,
    )
    assert rounds == [["read", "read_1thread"], ["read", "read_1thread"], ["read"]]
    assert min(times["read"]) == 0.020 and ceilings.is_bandwidth_settled("read", times)


def test_a_read_whose_allocations_disagree_is_noted():
    read = {**fake_probe(best_per_s=30.2e9), "allocation_best_per_s": [12.6e9, 30.2e9, 29.8e9]}
    assert ceilings.allocations_note(read) == (
        "read: the best runs of its 3 allocations ranged 12.6-30.2 GB/s (median 29.8): the "
        "machine's bandwidth moved while it was measured; the roof is the best"
    )
    roofs = {"probes": {"read": read}, "skipped": [], "unsupported": []}
    assert ceilings._notes(roofs) == [ceilings.allocations_note(read)]
    # Within 5%, one allocation, or none recorded (a cache from before): nothing to say.
    for rates in ([29.0e9, 30.2e9], [30.2e9], None):
        assert ceilings.allocations_note({**read, "allocation_best_per_s": rates}) is None
    assert ceilings.allocations_note(None) is None


def test_pages_text():
    assert ceilings.pages_text([1.0, 1.0]) == "on huge pages (100% of 2 read buffers)"
    assert ceilings.pages_text([0.5]) == "on huge pages (50% of 1 read buffer)"
    assert ceilings.pages_text([0.0, 0.0]) == "on 4 KiB pages (huge pages asked for, not given)"
    assert ceilings.pages_text([]) == "pages not known"


def test_a_cached_read_from_before_allocations_were_kept_is_used_as_it_is(tmp_path, monkeypatch):
    """A cache entry whose read probe has no `allocation_best_per_s` (measured before huge pages
    and the whole-cap read buffer, or written by hand) is used, not measured again: a cached
    roof holds still until `--refresh`; it reads into `results.Probe` with the field null."""
    from llmbench.harness.plain_data import from_plain
    from llmbench.harness.results import HardwareCeilings

    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(ceilings, "measure", fake_measure(calls, skipped=()))
    ceilings.ceilings("cpu", watch_load=QUIET)
    (cache_file,) = (tmp_path / "hardware").iterdir()
    old = json.loads(cache_file.read_text())
    for probe in old["probes"].values():
        del probe["allocation_best_per_s"]
    cache_file.write_text(json.dumps(old))
    roofs = ceilings.ceilings("cpu", watch_load=QUIET)
    assert len(calls) == 1 and roofs["sources"]["read"].startswith("cache ")
    roofs.pop("probe_loads")
    assert from_plain(HardwareCeilings, roofs).probes["read"].allocation_best_per_s is None


@pytest.mark.parametrize(
    "rates, reproduced",
    [
        ([29.4e9, 30.2e9], True),  # 29.4 >= 0.97 * 30.2 = 29.29
        ([12.6e9, 12.6e9, 27.8e9], False),  # one good round after a slow moment
        ([12.6e9, 12.6e9, 27.8e9, 29.9e9, 29.5e9], True),
        ([29.0e9, 30.2e9], False),  # 29.0 < 29.29
        ([30.2e9], False),  # one allocation: nothing to reproduce it
        ([], False),
    ],
)
def test_a_read_roof_is_reproduced_on_two_allocations(rates, reproduced):
    assert ceilings.is_reproduced(rates) is reproduced


def test_the_read_rounds_go_on_until_two_allocations_reach_its_best(monkeypatch):
    """Scripted: the read takes 20 ms on round 1's buffer, 10 ms on round 2's (its runs agree,
    and beat one thread's 40 ms, but on one buffer), 10.1 ms on round 3's: three rounds for
    `read`, two for the others, and the roof is round 2's, reproduced by round 3."""
    clock = FakeClock()
    read_calls = iter([0.020, 0.040, 0.010, 0.040, 0.0101])  # read, read_1thread per round

    def kernel_run(name, buffers):
        return clock.run(next(read_calls) if name == "read" else 0.030)

    monkeypatch.setattr(ceilings, "KERNEL_RUN", kernel_run)
    monkeypatch.setattr(ceilings, "NEW_BUFFER", lambda size, device: None)
    monkeypatch.setattr(ceilings, "MATMULS", {})
    roofs = ceilings.measure("cpu", budget_s=100.0, dtypes=(), clock=clock)
    read = roofs["probes"]["read"]
    assert read["repeats"] == 9 and read["converged"] is True
    assert read["seconds"] == pytest.approx(0.010)  # clock differences: not exactly
    assert read["allocation_best_per_s"] == pytest.approx(
        [read["size"] / 0.020, read["size"] / 0.010, read["size"] / 0.0101]
    )
    assert roofs["probes"]["copy"]["repeats"] == 6  # two rounds: settled


def test_each_cache_format_has_its_own_file(tmp_path, monkeypatch):
    """Two versions of llmbench share a cache (the sides of `llmbench ab`): this one reads a
    format-3 file as it is and writes its own format's file beside it, never over it, so the
    older version keeps reading what it wrote."""
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(ceilings, "measure", fake_measure(calls))
    first = ceilings.ceilings("cpu")
    (own,) = (tmp_path / "hardware").iterdir()
    assert own.name.endswith(f".format{ceilings.CACHE_FORMAT}.json")
    legacy = own.with_name(own.name.replace(f".format{ceilings.CACHE_FORMAT}", ""))
    entry = json.loads(own.read_text())
    entry["format"] = 3
    entry["read_bytes_per_s"] = 12.5e9  # tells the two files apart
    legacy.write_text(json.dumps(entry))
    own.unlink()
    roofs = ceilings.ceilings("cpu")
    assert roofs["read_bytes_per_s"] == 12.5e9  # read, not measured again:
    assert calls[1] == (["float16"], False)  # only float16, which the fake always skips
    # What this call wrote went to its own file; the format-3 file is as the older one left it.
    assert json.loads(own.read_text())["format"] == ceilings.CACHE_FORMAT
    assert json.loads(legacy.read_text()) == entry
    assert first["read_bytes_per_s"] != 12.5e9


AVX2_ONLY = frozenset({"avx2", "fma", "f16c"})  # an AMD EPYC of the Zen 3 kind
AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})


def test_the_bf16_probe_of_a_cpu_without_bf16_products_times_float32_products(monkeypatch):
    monkeypatch.setattr(ceilings, "this_cpu_flags", lambda: AVX2_ONLY)
    roofs = ceilings.measure("cpu", budget_s=2.0, dtypes=["bfloat16"], with_bandwidth=False)
    probe = roofs["probes"]["bfloat16"]
    assert (
        probe["method"] == f"matmul bfloat16 {probe['size']}x{probe['size']}, products in float32"
    )


def test_a_bf16_roof_cached_from_torchs_own_bf16_matmul_is_measured_again_without_bf16_products(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    fake = fake_measure(calls, skipped=())

    def measure(device, budget_s, dtypes, with_bandwidth, progress, needed=None):
        out = fake(device, budget_s, dtypes, with_bandwidth, progress, needed)
        flags = ceilings.this_cpu_flags()
        is_float32 = ceilings.multiplies_in_float32("bfloat16", "cpu", flags)
        out["probes"] = {
            d: {**probe, "method": f"matmul {d} 512x512" + (", products in float32" * is_float32)}
            for d, probe in out["probes"].items()
        }
        return out

    monkeypatch.setattr(ceilings, "measure", measure)
    monkeypatch.setattr(ceilings, "this_cpu_flags", lambda: AVX512_BF16)
    ceilings.ceilings("cpu")  # cached by an llmbench whose probe ran torch's bf16 matmul
    ceilings.ceilings("cpu")
    assert len(calls) == 1  # the same CPU kind: nothing measured again
    monkeypatch.setattr(ceilings, "this_cpu_flags", lambda: AVX2_ONLY)
    roofs = ceilings.ceilings("cpu")
    assert calls[1] == (["bfloat16"], False)
    assert roofs["probes"]["bfloat16"]["method"].endswith(", products in float32")
    ceilings.ceilings("cpu")
    assert len(calls) == 2
