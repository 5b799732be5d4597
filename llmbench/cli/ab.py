"""`llmbench ab SPEC --base … --new …`: BASE and NEW run alternately for N rounds on this machine,
each time in a fresh process, and the gates judged on the paired rounds; the same outputs and
exits as `compare` (0 pass, 1 regression, 2 unusable input or no verdict)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmbench.cli.options import verdict_options

if TYPE_CHECKING:  # the harness is imported when the command runs
    from llmbench.ab.rounds import Round, SideProcess
    from llmbench.ab.sides import Side

DEFAULT_ROUNDS = 6
AB_FILE = "ab.json"
NO_REPORT = ("--no-report",)  # what the rounds need is results.json, not report pages


@click.command()
@click.argument("workload")
@click.option(
    "--base",
    "base_items",
    multiple=True,
    metavar="ITEM",
    help="what BASE changes (repeatable): KEY.PATH=VALUE (a spec field), http(s)://URL (a "
    "server) or git:REF (llmbench at a git ref, built into its own virtual environment); none: "
    "the spec as it is",
)
@click.option(
    "--new", "new_items", multiple=True, metavar="ITEM", help="what NEW changes (as --base)"
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="override a spec field on both sides (repeatable)",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=3),
    default=DEFAULT_ROUNDS,
    show_default=True,
    help="rounds of BASE and NEW, alternating which runs first",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="folder of the rounds (default: <output_dir>/ab-<name>-<time>)",
)
@click.option("--force", is_flag=True, help="replace an A/B run (or a run) already in --out")
@click.option(
    "--gates",
    "gates_path",
    type=click.Path(path_type=Path),
    default=None,
    help="gates YAML (default: compare's shipped gates for the runs' backend)",
)
@verdict_options
@click.option("--seed", type=int, default=0, show_default=True, help="bootstrap seed")
def ab(
    workload: str,
    base_items: tuple[str, ...],
    new_items: tuple[str, ...],
    overrides: tuple[str, ...],
    rounds: int,
    out: Path | None,
    force: bool,
    gates_path: Path | None,
    fmt: str,
    junit_path: Path | None,
    html_path: Path | None,
    allow_busy: bool,
    force_devices: bool,
    allow_missing: bool,
    seed: int,
) -> None:
    """Run WORKLOAD as BASE and as NEW alternately, --rounds times, and gate NEW against BASE.

    Each round runs both sides, each in a fresh process (`llmbench run`), BASE first in odd
    rounds and NEW first in even ones, into OUT/round-NN/base/ and new/. Every gated metric
    gets one value per side per round, and the change is judged on the paired rounds: a paired
    bootstrap over rounds (the same rounds drawn for both sides, so drift shared by a round
    cancels), widened for few rounds; a gate fails only when the whole interval lies past its
    threshold. A git:REF side is resolved in the repository of the current directory and
    built once per commit into $LLMBENCH_CACHE/ab-builds/, reusing this environment's torch.

    Outputs as `compare`: the table (or --format markdown/json) on stdout, --junit, --html (the
    rounds pooled per side), Markdown appended to $GITHUB_STEP_SUMMARY; OUT/ab.json keeps the
    sides, the rounds and the verdicts. Exit 0: no regression; 1: a regression; 2: unusable
    (a side that cannot run: a bad item, a ref that does not exist, a server that refuses
    connections, a round that failed) or no verdict. Ctrl-C stops after the side at hand has
    saved its run; the finished rounds are judged, exit 130."""
    from llmbench.ab import rounds as ab_rounds
    from llmbench.ab.sides import SIDE_NAMES, check_one_run, check_reachable, parse_side
    from llmbench.cli.run import workload_path
    from llmbench.harness.run_folder import claim_folder, default_folder
    from llmbench.harness.spec_load import load_spec

    spec_path = workload_path(workload).resolve()
    items = (base_items, new_items)
    sides = [parse_side(name, given) for name, given in zip(SIDE_NAMES, items, strict=True)]
    specs = []
    notes: dict[str, None] = {}  # in order, once: both sides say the common overrides' notes
    for side in sides:
        spec = load_spec(spec_path, [*overrides, *side.overrides], say=notes.setdefault)
        check_one_run(side, spec)
        check_reachable(side, spec)
        specs.append(spec)
    for note in notes:
        _say(note)
    processes = tuple(_process(side, overrides) for side in sides)
    if out is None:
        out = default_folder(specs[0].output_dir, f"ab-{specs[0].name}")
    out = out.resolve()
    claim_folder(out, force=force)
    _say(f"ab: {rounds} rounds of {spec_path.name} into {out}")
    for process in processes:
        _say(f"  {process.name}: {process.label}")
    if all(not side.overrides and not side.ref for side in sides):
        _say("note: BASE and NEW are the same: an A/A run, measuring the noise alone")
    started = time.monotonic()
    interrupted = False
    try:
        finished = ab_rounds.run_rounds(spec_path, processes, out, rounds, _say)
    except ab_rounds.RoundsInterrupted as e:
        finished, interrupted = list(e.rounds), True
        _say(f"interrupted after {len(finished)} of {rounds} rounds")
    except ab_rounds.RoundFailed as e:
        if e.rounds:
            _say(f"note: {len(e.rounds)} finished rounds are kept in {out}")
        raise
    _say(f"ab: {len(finished)} rounds in {time.monotonic() - started:.0f} s")
    if not finished:
        sys.exit(130)
    _judge(
        finished,
        processes,
        out,
        spec_path,
        gates_path=gates_path,
        fmt=fmt,
        junit_path=junit_path,
        html_path=html_path,
        allow_busy=allow_busy,
        force_devices=force_devices,
        allow_missing=allow_missing,
        seed=seed,
        interrupted=interrupted,
    )


def _say(line: str) -> None:
    click.echo(line, err=True)


def _process(side: Side, common: tuple[str, ...]) -> SideProcess:
    """How a side's rounds start: this interpreter, or its git ref's build (built now)."""
    from llmbench.ab.builds import build, builds_cache
    from llmbench.ab.rounds import SideProcess

    overrides = (*common, *side.overrides)
    if side.ref is None:
        return SideProcess(side.name, side.items, Path(sys.executable), overrides, NO_REPORT)
    made = build(Path.cwd(), side.ref, builds_cache(), log=_say)
    label = " ".join(filter(None, [made.label, side.given_overrides]))
    options = NO_REPORT if made.takes_run_option(*NO_REPORT) else ()
    return SideProcess(side.name, label, made.python, overrides, options)


def _judge(
    finished: list[Round],
    processes: tuple[SideProcess, ...],
    out: Path,
    spec_path: Path,
    *,
    interrupted: bool,
    **options: Any,
) -> None:
    """The gates on the finished rounds: OUT/ab.json, the outputs and the exit of `compare`."""
    from llmbench.ab.rounds import pooled_run
    from llmbench.cli.compare import emit_verdicts, write_text
    from llmbench.compare.gates import load_gates
    from llmbench.compare.output import to_dict
    from llmbench.compare.paired import compare_paired
    from llmbench.compare.runs import RunPair, default_gates_of

    every_run = [run for r in finished for run in (r.base, r.new)]
    if options["gates_path"] is not None:
        gates = load_gates(options["gates_path"])
    else:
        gates, left_out = default_gates_of(every_run)
        if left_out:
            _say(f"note: default latency gates left out ({', '.join(left_out)}): no records")
    comparison = compare_paired(
        [(r.base.samples, r.new.samples) for r in finished],
        gates,
        allow_busy=options["allow_busy"],
        force_devices=options["force_devices"],
        allow_missing=options["allow_missing"],
        seed=options["seed"],
    )
    record = {
        "spec": str(spec_path),
        "sides": {p.name: {"label": p.label, "overrides": list(p.overrides)} for p in processes},
        "interrupted": interrupted,
        "rounds": [
            {
                "round": r.number,
                "order": list(r.order),
                "base": str(r.base.path.parent.relative_to(out)),
                "new": str(r.new.path.parent.relative_to(out)),
            }
            for r in finished
        ],
        "comparison": to_dict(comparison),
    }
    write_text(out / AB_FILE, json.dumps(record, indent=2, allow_nan=False) + "\n", "--out")
    pair = RunPair(
        None,
        pooled_run([r.base for r in finished]),
        pooled_run([r.new for r in finished]),
    )
    try:
        points = [(None, comparison)]
        emit_verdicts(points, [pair], options["fmt"], options["junit_path"], options["html_path"])
    finally:
        if interrupted:
            sys.exit(130)
