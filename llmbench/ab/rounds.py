"""The rounds of an A/B run: BASE and NEW run alternately, each time in a fresh process, on the
same machine, into OUT/round-NN/base/ and OUT/round-NN/new/ (whole run folders: `llmbench
compare` and `report` read any of them).

The order alternates (BASE first in odd rounds, NEW first in even ones: AB BA AB …), so a
machine that slows down steadily during the job weighs on both sides alike instead of always
on the second. Each process is `<python> -m llmbench run SPEC --out FOLDER --no-report --set …`
(no report pages: `llmbench report` draws a round's when wanted), with its output kept beside
the folder (`base.log`, `new.log`); `python` is this interpreter, or a git ref's build
(`builds`). A process that fails stops the rounds (`RoundFailed`, naming its log);
an interrupt (Ctrl-C) stops them after the process at hand has saved what it measured
(`RoundsInterrupted`): the rounds that finished stay, and can still be judged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmbench.compare.runs import LoadedRun, load_run
from llmbench.compare.verdict import RunSamples
from llmbench.errors import UserError
from llmbench.harness.results import RESULTS_FILE

ROUND_FOLDER = "round-{:02d}"
LOG_TAIL_BYTES = 4096


@dataclass(frozen=True)
class SideProcess:
    """How one side's rounds are started: its name, what to show, the interpreter, the
    `--set` overrides it runs the spec with (the common ones first), and other options of its
    `llmbench run` (`--no-report` where its build has it: the rounds need numbers, not pages)."""

    name: str  # "BASE" / "NEW"
    label: str  # what it runs, for people: `git:HEAD~1 (3f2a1bc)`, `engine.quantize=int8`
    python: Path
    overrides: tuple[str, ...]
    run_options: tuple[str, ...] = ()

    @property
    def folder_name(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Round:
    """One finished round: its number, the order its sides ran in, and both runs."""

    number: int
    order: tuple[str, str]  # ("BASE", "NEW") or ("NEW", "BASE")
    base: LoadedRun
    new: LoadedRun


class RoundFailed(UserError):
    """A side's process exited with an error: the rounds stop, those finished are kept."""

    def __init__(self, message: str, rounds: Sequence[Round]):
        super().__init__(message)
        self.rounds = tuple(rounds)


class RoundsInterrupted(Exception):
    """The user stopped the rounds (SIGINT/SIGTERM): those finished are kept."""

    def __init__(self, rounds: Sequence[Round]):
        super().__init__("interrupted")
        self.rounds = tuple(rounds)


def round_order(number: int) -> tuple[str, str]:
    """Who runs first in round `number` (from 1): BASE in odd rounds, NEW in even ones."""
    return ("BASE", "NEW") if number % 2 == 1 else ("NEW", "BASE")


def command(side: SideProcess, spec_path: Path, folder: Path) -> list[str]:
    """The process of one side in one round."""
    sets = [arg for override in side.overrides for arg in ("--set", override)]
    run = [str(side.python), "-m", "llmbench", "run", str(spec_path), "--out", str(folder)]
    return [*run, *side.run_options, *sets]


def _log_tail(log: Path) -> str:
    """The last non-empty line of a process's log: what it said when it stopped."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return next((line.strip() for line in reversed(lines) if line.strip()), "(empty log)")


def _run_side(side: SideProcess, spec_path: Path, folder: Path) -> int:
    """Run one side once, its output into `<folder>.log`; its exit code. An interrupt here is
    passed on to the child (which saves what it measured) and waited for, then raised."""
    log = folder.with_suffix(".log")
    with log.open("w") as out:
        child = subprocess.Popen(
            command(side, spec_path, folder),
            stdout=out,
            stderr=subprocess.STDOUT,
            # PYTHONSAFEPATH: `-m` would put the working folder first on sys.path, so a build
            # run from a checkout of llmbench would import the checkout, not itself.
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"},
            start_new_session=True,  # a terminal's Ctrl-C reaches this process alone
        )
        try:
            return child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)  # once: the run stops and saves what it measured
            child.wait()
            raise


def run_rounds(
    spec_path: Path,
    sides: tuple[SideProcess, SideProcess],
    out: Path,
    num_rounds: int,
    say: Callable[[str], None],
) -> list[Round]:
    """`num_rounds` rounds of BASE and NEW (`sides`) in alternating order, into OUT/round-NN/;
    `say` gets a line per side run. Raises `RoundFailed` or `RoundsInterrupted` carrying the
    rounds that finished."""
    by_name = {side.name: side for side in sides}
    out = out.resolve()
    finished: list[Round] = []
    for number in range(1, num_rounds + 1):
        folder = out / ROUND_FOLDER.format(number)
        folder.mkdir(parents=True, exist_ok=True)
        order = round_order(number)
        runs: dict[str, LoadedRun] = {}
        for name in order:
            side = by_name[name]
            run_folder = folder / side.folder_name
            started = time.monotonic()
            try:
                code = _run_side(side, spec_path, run_folder)
            except KeyboardInterrupt:
                raise RoundsInterrupted(finished) from None
            log = run_folder.with_suffix(".log")
            if code != 0:
                raise RoundFailed(
                    f"round {number} {name} ({side.label}) exited {code}: {_log_tail(log)} "
                    f"(its output: {log})",
                    finished,
                )
            runs[name] = load_run(run_folder / RESULTS_FILE)
            say(_progress(number, num_rounds, side, runs[name], time.monotonic() - started))
        finished.append(Round(number, order, runs["BASE"], runs["NEW"]))
    return finished


def _progress(number: int, num_rounds: int, side: SideProcess, run: LoadedRun, took: float) -> str:
    """`round 2/6 NEW (git:HEAD (3f2a1bc)): 30.1 output tok/s, TPOT p50 33.2 ms, 14 s`."""
    summary = run.result.summary
    parts = []
    rate = summary.get("output_tok_per_s")
    if isinstance(rate, int | float):
        parts.append(f"{rate:.1f} output tok/s")
    tpot = (summary.get("tpot_ms") or {}).get("p50")
    if isinstance(tpot, int | float):
        parts.append(f"TPOT p50 {tpot:.2f} ms")
    if run.result.provenance.machine_load.is_busy:
        parts.append("machine busy")
    parts.append(f"{took:.0f} s")
    return f"round {number}/{num_rounds} {side.name} ({side.label}): {', '.join(parts)}"


def pooled_run(runs: Sequence[LoadedRun]) -> LoadedRun:
    """One side's rounds as one run, for the HTML diff: every round's requests and steps, its
    repetitions side by side (round 1's result stands for the run's provenance and roofs)."""
    first = runs[0]
    families = {f for run in runs for f in run.samples.per_request}
    metrics = {m for run in runs for m in run.samples.per_repetition}
    samples = RunSamples(
        per_request={
            f: [rep for run in runs for rep in run.samples.per_request.get(f, ())] for f in families
        },
        per_repetition={
            m: [x for run in runs for x in run.samples.per_repetition.get(m, ())] for m in metrics
        },
        device=first.samples.device,
        is_busy=any(run.samples.is_busy for run in runs),
    )
    return LoadedRun(
        path=first.path,
        result=first.result,
        requests=tuple(r for run in runs for r in run.requests),
        steps=tuple(s for run in runs for s in run.steps),
        samples=samples,
        has_records=all(run.has_records for run in runs),
        num_repetitions=sum(run.num_repetitions for run in runs),
    )
