"""The client's own load: CPU lists, pinning, the CPU meter, the warnings it raises."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time

import pytest

from llmbench.errors import UserError
from llmbench.harness import client_load
from llmbench.harness.results import ClientLoad, ClientProcess, read_results
from llmbench.harness.shards import ClockAnchor
from tests.harness.synthetic_runs import write_run
from tests.harness.virtual_time import LOOP_ROUNDING_NS, VirtualClock

CLOCK = ClockAnchor(1, 1, 1, "h", "b")


@pytest.mark.parametrize(
    ("text", "cpus"), [("1", (1,)), ("2-3", (2, 3)), ("0,2-3", (0, 2, 3)), ("3, 1-2", (1, 2, 3))]
)
def test_cpu_lists_as_taskset_takes_them(text, cpus):
    assert client_load.parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "1,,2", "1-"])
def test_a_bad_cpu_list_is_one_line(text):
    with pytest.raises(UserError) as e:
        client_load.parse_cpu_list(text)
    assert str(e.value) == f"--client-cpus {text}: expected CPU numbers like 1 or 2-3 or 0,2-3"


def test_format_cpu_list():
    assert client_load.format_cpu_list([6, 0, 1, 2, 4, 7, 1]) == "0-2,4,6-7"
    assert client_load.format_cpu_list([3]) == "3"
    assert client_load.format_cpu_list([]) == ""


def test_pin_moves_every_thread_of_the_process():
    """In a child process: a thread started before the pin is pinned too."""
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import os, threading, time; from llmbench.harness import client_load\n"
        "seen = []\n"
        "def later(): time.sleep(0.3); seen.append(os.sched_getaffinity(0))\n"
        "t = threading.Thread(target=later)\n"
        f"t.start(); client_load.pin(({cpu},), '{cpu}'); t.join()\n"
        "print(sorted(os.sched_getaffinity(0)), sorted(seen[0]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == f"[{cpu}] [{cpu}]"


def test_pinning_to_a_cpu_the_machine_lacks_is_one_line():
    with pytest.raises(UserError) as e:
        client_load.pin((0, 4096), "0,4096")
    available = client_load.format_cpu_list(range(os.cpu_count()))
    assert str(e.value) == (
        f"--client-cpus 0,4096: no CPU 4096 on this machine (it has {available})"
    )


def test_thread_cpu_is_the_window_s_busiest_first():
    start = {1: 0.5, 2: 0.1}
    end = {1: 0.8, 2: 0.105, 3: 0.2, 4: 0.4}
    names = {1: "loop", 2: "idle", 3: "pool", 4: "pool"}
    # 1: 0.3 s; 2: 0.005 s (below the floor); 3 and 4 started in the window and share a name.
    assert client_load.thread_cpu_s(start, end, names) == {
        "pool (4)": 0.4,
        "loop": 0.3,
        "pool (3)": 0.2,
    }


def test_busy_fraction():
    assert client_load.busy_fraction(0.5, 2.0) == 0.25
    assert client_load.busy_fraction(1.5, 1.0) == 1.5  # two threads busy
    assert client_load.busy_fraction(0.1, 0.0) == 0.0


def process(busy: float, cpus=(0, 1), shard=0) -> ClientProcess:
    return ClientProcess(shard, 100 + shard, tuple(cpus), 2.0, busy * 2.0, 0.0, busy)


def test_a_saturated_client_sharing_cores_with_the_server_gets_both_warnings():
    base = ClientLoad(shard=None, num_shards=2, clock=CLOCK)
    client = client_load.combine(
        base, [process(0.3, shard=0), process(0.9, shard=1)], [7], (1, 2), 4.0
    )
    assert client.cpu_s == pytest.approx(2.4) and client.max_busy_fraction == 0.9
    assert client.is_saturated and client.shares_cores_with_server
    assert client.warnings == (
        "the client worker 1 of 2 was busy 0.90 of a core: it may have been the bottleneck "
        "(spread it over more processes with load.workers, or give it a core of its own with "
        "--client-cpus)",
        "the client (CPUs 0-1) and the server (pid 7, CPUs 1-2) may share cores: pin them "
        "apart (taskset -c <cpus> for the server, --client-cpus <others>)",
    )


def test_a_client_pinned_apart_from_the_server_and_not_busy_is_clean():
    base = ClientLoad(shard=None, num_shards=1, clock=CLOCK)
    client = client_load.combine(base, [process(0.79, cpus=(1,))], [7], (0,), 4.0)
    assert not client.is_saturated and client.shares_cores_with_server is False
    assert client.warnings == ()
    remote = client_load.combine(base, [process(0.85, cpus=(1,))], [], None, None)
    assert remote.shares_cores_with_server is None
    assert remote.warnings == (
        "the client was busy 0.85 of a core: it may have been the bottleneck (spread it over "
        "more processes with load.workers, or give it a core of its own with --client-cpus)",
    )


def test_the_meter_counts_the_cpu_spent_in_the_window_only():
    meter = client_load.ClientMeter(server_pids=[os.getpid()])  # itself as the "server"
    _spin(0.2)  # before the window: not counted

    async def work() -> None:
        _spin(0.3)
        await asyncio.sleep(0.2)

    asyncio.run(meter.measure(work()))
    _spin(0.2)  # after the window: not counted
    start = client_load.start_block(None, 1, CLOCK)
    client = meter.block(start)
    (p,) = client.processes
    cpu_s = p.user_s + p.system_s
    assert 0.28 <= cpu_s <= 0.4
    assert p.wall_s >= 0.5 and p.busy_fraction == pytest.approx(cpu_s / p.wall_s, abs=0.01)
    assert p.pid == os.getpid() and p.shard == 0
    assert p.cpu_affinity == tuple(sorted(os.sched_getaffinity(0)))
    assert p.threads["MainThread"] >= 0.25
    assert client.server_cpu_s == pytest.approx(cpu_s, abs=0.03)  # /proc's 10 ms ticks
    assert client.server_pids == (os.getpid(),) and client.shares_cores_with_server is True


def test_a_shard_s_window_starts_at_its_common_start():
    """Waiting for the other shards (0.3 s here) and for the start (0.1 s ahead) is no load:
    the window is the first repetition's 0.2 s, the second's wait (0.3 + 0.1) and its 0.2 s, not
    1.2 s (virtual time: exact)."""
    clock = VirtualClock()
    meter = client_load.ClientMeter(clock=clock)

    async def start_at() -> int:
        await asyncio.sleep(0.3)
        return clock() + 100_000_000

    started = meter.starting(start_at)

    async def work() -> None:
        for _ in range(2):  # a second repetition's start leaves the window where it is
            start_ns = await started()
            await asyncio.sleep(max(0, start_ns - clock()) / 1e9)
            await asyncio.sleep(0.2)

    clock.run(meter.measure(work()))
    (p,) = meter.block(client_load.start_block(0, 2, CLOCK)).processes
    assert p.wall_s == pytest.approx(0.2 + 0.3 + 0.1 + 0.2, abs=4 * LOOP_ROUNDING_NS / 1e9)
    assert p.shard == 0 and meter.starting(None) is None


def test_a_meter_that_never_started_measures_nothing():
    start = client_load.start_block(1, 2, CLOCK)
    assert client_load.ClientMeter().block(start) == start


def test_attach_adds_the_warnings_to_the_summary(tmp_path):
    result = read_results(write_run(tmp_path / "run", seed=0))
    base = ClientLoad(shard=None, num_shards=1, clock=CLOCK)
    client = client_load.combine(base, [process(0.95)], [], None, None)
    attached = client_load.attach(result, client)
    assert attached.client == client
    assert attached.summary["warnings"][-1] == client.warnings[0]
    assert attached.summary["warnings"][:-1] == list(result.summary.get("warnings", []))
    assert client_load.attach(result, None) is result


def test_the_summary_line():
    base = ClientLoad(shard=None, num_shards=2, clock=CLOCK)
    client = client_load.combine(
        base, [process(0.25, cpus=(1,)), process(0.5, cpus=(2,), shard=1)], [7], (0,), 3.25
    )
    assert client_load.summary_line(client) == (
        "client: 1.50 CPU s in 2.0 s (2 processes, busiest 0.50 of a core) on CPUs 1-2; server "
        "on CPUs 0, 3.25 CPU s"
    )
    assert client_load.summary_line(None) is None
    assert client_load.summary_line(base) is None


def _spin(cpu_s: float) -> None:
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def test_shards_starts_are_compared_and_a_late_one_is_named():
    """Two hosts, schedules at 100.0000 and 100.0025 s, the second 0.3 s past --start-at
    (started late): 2.5 ms apart, one warning, and the kernels' clock bound in the line."""
    anchor = ClockAnchor(1, 2, 3, "a", None)

    def process(shard: int, host: str, start: float, offset: float) -> ClientProcess:
        return ClientProcess(
            shard, 10 + shard, (0,), 1.0, 0.1, 0.0, 0.1, host=host, clock_synced=True,
            clock_max_error_s=0.004, schedule_start_unix_s=start, start_offset_s=offset,
        )  # fmt: skip

    processes = [process(0, "a", 100.0, 0.0), process(1, "b", 100.0025, 0.3)]
    client = client_load.combine(ClientLoad(None, 2, anchor), processes, (), None, None)
    assert client.start_spread_s == pytest.approx(0.0025)
    assert client.warnings == (
        "shard 1 on b began 0.30 s after the agreed --start-at: its schedule ran that much "
        "behind the others' (give the shards more time to start)",
    )
    assert client_load.start_line(client) == (
        "start: the shards' schedules began 2.5 ms apart, the latest +300.0 ms from --start-at "
        "(by each host's wall clock; each within ±4 ms of true time, as their kernels say)"
    )
    unsynced = [dataclasses.replace(p, clock_synced=p.shard == 0) for p in processes]
    one = client_load.combine(ClientLoad(None, 2, anchor), unsynced, (), None, None)
    assert "not synchronized on b: the hosts may start seconds apart" in client_load.start_line(one)
    alone = client_load.combine(ClientLoad(None, 1, anchor), [processes[0]], (), None, None)
    assert alone.start_spread_s is None  # one process: nothing to line up with
