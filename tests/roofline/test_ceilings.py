"""The measured roofs: real measurements near what numpy sees, sized and bounded by time, cached
per probe with where each number came from."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from llmbench.roofline import ceilings


def test_measured_bandwidth_is_within_10x_of_a_numpy_copy():
    roofs = ceilings.measure("cpu", budget_s=5.0, dtypes=())
    src = np.ones(1 << 26, dtype=np.float32)  # 256 MiB
    dst = np.empty_like(src)
    np.copyto(dst, src)
    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        seconds.append(time.perf_counter() - t0)
    numpy_copy = 2 * src.nbytes / min(seconds)  # read + write, as llmbench counts a copy
    assert 0.1 * numpy_copy < roofs["copy_bytes_per_s"] < 10 * numpy_copy
    assert 0.1 * numpy_copy < roofs["read_bytes_per_s"] < 10 * numpy_copy
    # Three kernels at all threads and at one, each with its best, median and spread.
    threads = roofs["threads"]
    names = {"read", "copy", "triad"}
    if threads > 1:
        names |= {"read_1thread", "copy_1thread", "triad_1thread"}
    assert set(roofs["probes"]) == names
    for probe in roofs["probes"].values():
        assert probe["size"] >= ceilings.MIN_BUFFER_BYTES and probe["unit"] == "B/s"
        assert probe["best_per_s"] >= probe["median_per_s"] > 0 and 0 <= probe["spread"] < 1
        assert probe["repeats"] >= ceilings.BANDWIDTH_RUNS
    read = roofs["probes"]["read"]
    assert roofs["read_bytes_per_s"] == read["best_per_s"] == read["size"] / read["seconds"]
    assert (read["method"], read["threads"]) == ("read-only sum", threads)
    triad = roofs["probes"]["triad"]
    assert triad["best_per_s"] == 3 * triad["size"] / triad["seconds"]  # 2 reads + 1 write


def test_measured_matmuls_are_plausible():
    roofs = ceilings.measure("cpu", with_bandwidth=False)
    # torch 2.13's CPU build has an int8 x int8 -> int32 matmul, so int8 is measured too.
    for dtype in ("float32", "bfloat16", "float16", "int8"):
        assert 1e8 < roofs["matmul_flops_per_s"][dtype] < 1e15  # 0.1 GFLOP/s .. 1 PFLOP/s
        probe = roofs["probes"][dtype]
        assert probe["best_per_s"] == roofs["matmul_flops_per_s"][dtype]
        assert probe["best_per_s"] == 2 * probe["size"] ** 3 / probe["seconds"]
        assert probe["unit"] == "FLOP/s" and probe["repeats"] <= ceilings.MAX_REPEATS


def test_measuring_respects_a_tiny_budget():
    """Bandwidth is always measured (one round); the matmuls get what is left of 0.3 s, and a
    dtype with no time left is skipped and named: the whole call ends within a round's time."""
    t0 = time.perf_counter()
    roofs = ceilings.measure("cpu", budget_s=0.3)
    elapsed_s = time.perf_counter() - t0
    assert elapsed_s < 0.3 + 10, elapsed_s
    assert roofs["read_bytes_per_s"] > 0 and roofs["copy_bytes_per_s"] > 0
    assert roofs["probes"]["read"]["repeats"] == ceilings.BANDWIDTH_RUNS  # one round only
    measured, skipped = set(roofs["matmul_flops_per_s"]), set(roofs["skipped"])
    assert measured | skipped == set(ceilings.MATMUL_DTYPES) and skipped
    for dtype in skipped:
        assert (
            f"matmul {dtype}: not measured, the time budget was spent (a later run measures it)"
            in roofs["notes"]
        )


def slow_matmul(flops_per_s: float):
    """A stand-in for a dtype with no fast path: an n×n matmul that takes 2n³ / rate seconds."""

    def make(dtype, n, device):
        return lambda: time.sleep(2 * n**3 / flops_per_s)

    return make


def test_a_slow_dtype_is_measured_small_and_says_so(monkeypatch):
    # At 0.5 GFLOP/s: 256² takes 67 ms, so 512² (0.54 s) is a run under MAX_RUN_S = 0.75 s and
    # 1024² (4.3 s) is not: the probe stops at 512, 100x below a dtype that reached 2048².
    monkeypatch.setitem(ceilings.MATMULS, "float16", slow_matmul(0.5e9))
    monkeypatch.setitem(ceilings.MATMULS, "bfloat16", slow_matmul(500e9))  # 2048²: 34 ms
    roofs = ceilings.measure("cpu", dtypes=("bfloat16", "float16"), with_bandwidth=False)
    assert (
        roofs["probes"]["bfloat16"]["size"] == 2048 and roofs["probes"]["bfloat16"]["note"] is None
    )
    probe = roofs["probes"]["float16"]
    assert probe["size"] == 512
    assert roofs["matmul_flops_per_s"]["float16"] == pytest.approx(0.5e9, rel=0.2)
    assert roofs["notes"] == [probe["note"]]
    assert probe["note"].startswith("matmul float16: measured at 512x512, not 2048x2048")
    assert probe["note"].endswith("below bfloat16: no fast path for it here")
    assert "read_bytes_per_s" not in roofs


def test_size_by_time_grows_a_fast_probe_to_full_size():
    sizes = []

    def make(n):
        sizes.append(n)
        return lambda: None

    n, times = ceilings.size_by_time(make, lambda: None, 256, 2048, cap_s=5.0)
    assert (n, sizes) == (2048, [256, 512, 1024, 2048])
    assert 2 <= len(times) <= ceilings.MAX_REPEATS
    assert len(times) == ceilings.MAX_REPEATS or ceilings.has_converged(times)


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
    }


def fake_measure(calls):
    def measure(device, budget_s, dtypes, with_bandwidth, progress):
        calls.append((list(dtypes), with_bandwidth))
        probe = fake_probe("FLOP/s")
        out = {
            "device": "cpu0",
            "device_type": "cpu",
            "threads": 2,
            "torch": "2.13.0",
            "method": "best of fake runs",
            "matmul_flops_per_s": {d: 1e9 for d in dtypes if d != "float16"},
            "probes": {d: probe for d in dtypes if d != "float16"},
            "skipped": ["float16"] if "float16" in dtypes else [],
            "unsupported": [],
            "notes": [],
        }
        if with_bandwidth:
            out.update(copy_bytes_per_s=2e9, read_bytes_per_s=3e9)
            out["probes"] |= {
                "copy": fake_probe(best_per_s=2e9),
                "read": fake_probe(best_per_s=3e9),
            }
        return out

    return measure


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
        lambda device, budget_s, dtypes, with_bandwidth, progress: {
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
        "processes had the cores, so the roof is low",
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
        (32 << 20, 16 << 30, (256 << 20, None)),  # 8x a 32 MiB L3
        (96 << 20, 16 << 30, (768 << 20, None)),  # 8x a 96 MiB L3
        (2 << 20, 16 << 30, (256 << 20, None)),  # never below 256 MiB
        (None, None, (256 << 20, None)),  # nothing known: 256 MiB
    ],
)
def test_buffers_are_eight_times_the_last_level_cache(llc, available, expected):
    assert ceilings.buffer_bytes(llc, available) == expected


def test_buffers_shrink_to_fit_memory_and_say_so():
    # 3 buffers of 512 MiB (8x 64 MiB) want 1.5 GiB; half of 2 GiB is 1 GiB: 341 MiB each.
    size, note = ceilings.buffer_bytes(64 << 20, 2 << 30)
    assert size == 341 << 20
    assert note == (
        "bandwidth buffers 341 MiB, not 512 MiB (8x the last-level cache): memory is short; "
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
