"""How often the self-gate is right: benchmarks/ci/self-gate run many times on this machine with
NEW a commit that changes only a comment (it must pass), and commits that make every engine step
15% and 30% slower (a sleep of that fraction of the step's own time: it must fail).

    python benchmarks/ci/self_gate_study.py [--identical 20] [--slower 5] [--rounds 6]

The commits are made in a temporary clone of this repository, on top of its HEAD (which is the
BASE of every self-gate run); the runs go in a seeded shuffled order, so a machine that drifts
during the study weighs on every kind alike. Each run's exit, TPOT change and interval, and time
go to runs/self-gate-study/runs.jsonl; the table is printed last. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "runs" / "self-gate-study"
ENGINE = "llmbench/engine/engine.py"
DOC = "Run one batch; returns the outputs of every request that advanced or was aborted."
STEP = f'    def step(self) -> list[RequestOutput]:\n        """{DOC}"""\n'


def slowed_step(fraction: float) -> str:
    """Engine.step that sleeps `fraction` of its own time after every step."""
    return (
        STEP
        + "        started = time.perf_counter()\n"
        + "        outputs = self._step_unslowed()\n"
        + f"        time.sleep({fraction} * (time.perf_counter() - started))\n"
        + "        return outputs\n\n"
        + "    def _step_unslowed(self) -> list[RequestOutput]:\n"
    )


def git(clone: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(clone), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def commit_variant(clone: Path, head: str, name: str, change) -> str:
    """A commit on top of `head` that changes engine.py by `change`; its sha."""
    git(clone, "checkout", "-q", "--detach", head)
    path = clone / ENGINE
    text = path.read_text()
    changed = change(text)
    assert changed != text, f"{name}: the change did not apply"
    path.write_text(changed)
    git(clone, "commit", "-q", "-am", f"self-gate study: {name}")
    return git(clone, "rev-parse", "HEAD")


VARIANTS = {
    "identical (a comment)": lambda t: t.replace(
        "# -- stepping ----", "# -- stepping (a comment changed) ----", 1
    ),
    "15% slower steps": lambda t: t.replace(STEP, slowed_step(0.15), 1),
    "30% slower steps": lambda t: t.replace(STEP, slowed_step(0.30), 1),
}


def run_gate(clone: Path, base: str, new: str, rounds: int) -> dict:
    """One self-gate run from the clone (its refs), with this environment's llmbench."""
    started = time.monotonic()
    result = subprocess.run(
        [str(clone / "benchmarks/ci/self-gate"), "--base", base, "--new", new, "--rounds",
         str(rounds), "--format", "json"],
        capture_output=True,
        text=True,
        cwd=clone,
    )  # fmt: skip
    took = time.monotonic() - started
    row = {"exit": result.returncode, "seconds": round(took, 1)}
    try:
        gates = {g["metric"]: g for g in json.loads(result.stdout)["gates"]}
        tpot = gates["tpot_ms.p50"]
        row.update(
            tpot_change=tpot["delta"],
            tpot_ci=tpot["delta_ci"],
            verdicts={m: g["verdict"] for m, g in gates.items()},
        )
    except (ValueError, KeyError):
        row["stderr_tail"] = result.stderr.strip().splitlines()[-3:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identical", type=int, default=20)
    parser.add_argument("--slower", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "llmbench"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        git(clone, "config", "user.email", "study@llmbench.invalid")
        git(clone, "config", "user.name", "self-gate study")
        head = git(clone, "rev-parse", "HEAD")
        shas = {name: commit_variant(clone, head, name, f) for name, f in VARIANTS.items()}
        counts = {"identical (a comment)": args.identical}
        counts |= {"15% slower steps": args.slower, "30% slower steps": args.slower}
        plan = [name for name, n in counts.items() for _ in range(n)]
        random.Random(args.seed).shuffle(plan)
        rows = []
        with (OUT / "runs.jsonl").open("w") as log:
            for k, name in enumerate(plan, 1):
                load = os.getloadavg()[0]
                row = {"run": k, "variant": name, "load_before": round(load, 2)}
                row |= run_gate(clone, head, shas[name], args.rounds)
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                change = row.get("tpot_change")
                shown = "?" if change is None else f"{change * 100:+.1f}%"
                print(
                    f"{k}/{len(plan)} {name}: exit {row['exit']}, TPOT {shown}, "
                    f"{row['seconds']:.0f} s, load {load:.2f}",
                    file=sys.stderr,
                    flush=True,
                )
    print("| NEW | runs | failed (exit 1) | TPOT p50 change, median | time per run, median |")
    print("|---|---|---|---|---|")
    for name in VARIANTS:
        mine = [r for r in rows if r["variant"] == name]
        failed = sum(r["exit"] == 1 for r in mine)
        changes = sorted(r["tpot_change"] for r in mine if r.get("tpot_change") is not None)
        seconds = sorted(r["seconds"] for r in mine)
        median_change = f"{changes[len(changes) // 2] * 100:+.1f}%" if changes else "–"
        print(
            f"| {name} | {len(mine)} | {failed} of {len(mine)} | {median_change} | "
            f"{seconds[len(seconds) // 2]:.0f} s |"
        )
    other = [r for r in rows if r["exit"] not in (0, 1)]
    if other:
        print(f"{len(other)} runs could not judge (exit 2): see {OUT / 'runs.jsonl'}")


if __name__ == "__main__":
    main()
