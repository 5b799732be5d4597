"""The GPU sitting: llmbench's CUDA path on a lent H100/H200 in one command, at most 8 minutes,
at most 8 files under $OUT, a short summary printed last (docs/gpu-sitting.md).

    OUT=/some/folder benchmarks/gpu/sitting               # on the GPU machine
    OUT=/tmp/dry benchmarks/gpu/sitting --cpu-dry-run     # the same steps here, tiny shapes

Steps, each a child process in its own time box (`plan`, `budget`), each one's failure
recorded while the next still runs:

  device  the card, driver and software in their own words; modules missing (`device_info`)
  pytest  the gpu-marked tests and the Triton kernel tests, junit xml
  parity  the engine vs transformers, Llama and Qwen3-MoE, per dtype (`parity`)
  roofs   measured HBM and matmul roofs beside the datasheet row (`roofs`)
  engine  decode, attention kernel, prefill, profile on the 8B (`engine_steps`)
  run     `llmbench run workloads/agentic.yaml` (short), its report and telemetry copied

Files under $OUT: summary.md, summary.json (rewritten after every step), sitting.log (each
step's output), pytest-gpu.xml, agentic-report.html, agentic-results.json,
agentic-telemetry.csv. Exit 0 when every step ended ok, 1 otherwise, 2 on a bad $OUT.

`--inject STEP` (or LLMBENCH_SITTING_INJECT=STEP,STEP) replaces a step's command by one that
fails, to check that a failed step is recorded and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu import report
from benchmarks.gpu.budget import MIN_STEP_S, step_timeout_s
from benchmarks.gpu.device_info import missing_modules
from benchmarks.gpu.part_records import error_line
from benchmarks.gpu.plan import CPU_DRY_RUN, GPU, STEPS, Plan
from benchmarks.gpu.step_process import StepOutcome, run_step, tail_text

ROOT = Path(__file__).resolve().parents[2]
# Wheels brought for a machine that lacks them: git-ignored (build/), carried to the device.
WHEELS = Path(os.environ.get("LLMBENCH_SITTING_WHEELS") or ROOT / "build" / "gpu-wheels")
INJECT_ENV = "LLMBENCH_SITTING_INJECT"
# What the run step copies from its run folder into $OUT.
RUN_FILES = {
    "report.html": "agentic-report.html",
    "results.json": "agentic-results.json",
    "telemetry.csv": "agentic-telemetry.csv",
}
MAX_FILES = 8
OUT_FILES = ("summary.md", "summary.json", "sitting.log", "pytest-gpu.xml")


class OutError(Exception):
    """$OUT is missing or cannot be written: one line, exit 2, before any step."""


def pytest_files(root: Path = ROOT) -> list[str]:
    """The GPU plan's tests: every test file with a `gpu` mark, and the Triton kernels' tests
    (tests/kernels/test_*.py but the CPU extension's test_cpu_*), which run compiled on CUDA."""
    marked = {
        path for path in (root / "tests").rglob("test_*.py") if "mark.gpu" in path.read_text()
    }
    kernels = {
        path
        for path in (root / "tests" / "kernels").glob("test_*.py")
        if not path.name.startswith("test_cpu_")
    }
    return sorted(str(path.relative_to(root)) for path in marked | kernels)


def options(**values: object) -> list[str]:
    """`--name value` pairs (`decode_steps=20` → `--decode-steps 20`)."""
    return [
        arg for key, value in values.items() for arg in (f"--{key.replace('_', '-')}", str(value))
    ]


def commands(plan: Plan, work: Path, out: Path, timeout_s: float) -> dict[str, list[str]]:
    """Each step's command line (the engine step is told its own time box)."""
    module = [sys.executable, "-m"]
    files = list(plan.pytest_files) if plan.pytest_files is not None else pytest_files()
    select = ["-k", plan.pytest_select] if plan.pytest_select else []
    sets = [arg for item in plan.run_sets for arg in ("--set", item)]
    junit = f"--junitxml={out / 'pytest-gpu.xml'}"
    return {
        "device": [*module, "benchmarks.gpu.device_info", *options(work=work)],
        "pytest": [*module, "pytest", "-p", "no:cacheprovider", "-q", "-m", "not slow", junit]
        + [*select, *files],
        "parity": [*module, "benchmarks.gpu.parity"]
        + options(
            work=work,
            device=plan.device,
            dtypes=",".join(plan.parity_dtypes),
            archs=",".join(plan.parity_archs),
            decode_steps=plan.num_parity_decode_steps,
        ),
        "roofs": [*module, "benchmarks.gpu.roofs"]
        + options(
            work=work, device=plan.device, budget_s=plan.roofs_budget_s, fp8_n=plan.fp8_matmul_n
        ),
        "engine": [*module, "benchmarks.gpu.engine_steps"]
        + options(work=work, plan=plan.name, seconds=f"{timeout_s:.0f}"),
        "run": [*module, "llmbench", "run", "workloads/agentic.yaml", *sets]
        + options(out=work / "agentic")
        + ["--force"],
    }


def injected_failure(step: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.exit('sitting: injected failure in {step}')"]


def child_env(plan: Plan, work: Path) -> dict[str, str]:
    """The children's environment: this tree first on the path (llmbench needs no install),
    no network, the plan's switches, and a private llmbench cache unless one is named (the
    roofs measured here are this sitting's, and never replace a user's cached ones)."""
    env = dict(os.environ)
    site = work / "site"
    paths = [str(site)] if site.is_dir() else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env.update(
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        KINETO_LOG_LEVEL="6",  # torch.profiler's per-profile start/stop lines
        TQDM_DISABLE="1",
    )
    env.update(dict(plan.env))
    env.setdefault("LLMBENCH_CACHE", str(work / "cache"))
    return env


def _dist_key(name: str) -> str:
    """A distribution's name as wheel files spell it (PEP 503 normalised, `_` for `-`)."""
    return name.lower().replace("-", "_").replace(".", "_")


def install_wheels(work: Path, log) -> None:
    """The distributions llmbench needs that this machine lacks, from the wheels brought for
    it (`WHEELS`, docs/gpu-sitting.md), into a folder first on the children's path: no index,
    no dependencies resolved (the wheels are the whole list). What has no wheel is logged;
    the device step names it again."""
    missing = missing_modules()
    if not missing:
        return
    brought = {_dist_key(path.name.split("-")[0]) for path in WHEELS.glob("*.whl")}
    install = [name for name in missing if _dist_key(name) in brought]
    lacking = [name for name in missing if _dist_key(name) not in brought]
    if lacking:
        log.write(f"== wheels: missing here and not in {WHEELS}: {', '.join(lacking)}\n")
    if not install:
        return
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet"]
    command += ["--find-links", str(WHEELS), "--target", str(work / "site"), *install]
    done = subprocess.run(command, capture_output=True, text=True)
    log.write(f"== wheels: {' '.join(install)} -> exit {done.returncode}\n")
    log.write(done.stdout + done.stderr)


def copy_run_files(work: Path, out: Path) -> None:
    for name, target in RUN_FILES.items():
        source = work / "agentic" / name
        if source.is_file():
            shutil.copyfile(source, out / target)


def check_out(text: str | None) -> Path:
    if not text:
        raise OutError("sitting: set OUT (or --out) to the folder for the results")
    out = Path(text)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".sitting-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise OutError(f"sitting: OUT {out} cannot be written ({error.strerror})") from None
    return out


def summarize(work: Path, out: Path, plan: Plan, outcomes: list[StepOutcome], t0: float):
    """Rebuild summary.json and summary.md from what the steps recorded. A summary that cannot
    be built (a record of an unexpected shape) is said in summary.md, with the steps, and the
    sitting goes on."""
    seconds = time.monotonic() - t0
    try:
        summary = report.collect(work, out, plan.name, outcomes, seconds)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        (out / "summary.md").write_text(report.markdown(summary))
        return summary
    except Exception as error:
        summary = report.steps_only(plan.name, outcomes, seconds)
        line = f"the summary could not be built: {error_line(error)}"
        print(f"sitting: {line}", file=sys.stderr)
        (out / "summary.md").write_text(report.markdown(summary) + f"\n{line}\n")
        return summary


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_steps(plan: Plan, work: Path, out: Path, inject: set[str], log, t0: float):
    """Every step in turn, each in its time box; yields each step's outcome as it ends."""
    deadline = t0 + plan.total_s
    env = child_env(plan, work)
    for step in STEPS:
        budget = plan.budget(step)
        timeout_s = step_timeout_s(
            budget.box_s, deadline - time.monotonic(), plan.later_reserve_s(step)
        )
        if timeout_s < MIN_STEP_S:
            yield StepOutcome(step, "skipped", 0.0, None, "no time left")
            continue
        command = commands(plan, work, out, timeout_s)[step]
        if step in inject:
            command = injected_failure(step)
        print(f"sitting: {step} (up to {timeout_s:.0f} s)", file=sys.stderr, flush=True)
        output = work / f"{step}.out"
        try:
            outcome = run_step(step, command, timeout_s, output, env, ROOT)
        except KeyboardInterrupt:
            outcome = StepOutcome(step, "interrupted", 0.0, None, "the sitting was stopped")
        log.write(f"\n== {step}: {outcome.status} in {outcome.seconds:.1f} s\n")
        log.write(f"$ {shlex.join(command)}\n{tail_text(output)}")
        log.flush()
        if step == "run":
            copy_run_files(work, out)
        yield outcome
        if outcome.status == "interrupted":
            return


def sit(plan: Plan, out: Path, inject: set[str]) -> int:
    """Run every step of `plan`, the summary rewritten after each; print the short summary
    last. Returns the exit status: 0 all steps ok, 1 not, 130 stopped (SIGINT or SIGTERM)."""
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="llmbench-sitting-"))
    for name in (*OUT_FILES, *RUN_FILES.values()):  # a previous sitting's, never read as ours
        (out / name).unlink(missing_ok=True)
    outcomes: list[StepOutcome] = []
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with (out / "sitting.log").open("w") as log:
            log.write(f"== sitting {plan.name}, work folder {work}\n")
            install_wheels(work, log)
            for outcome in run_steps(plan, work, out, inject, log, t0):
                outcomes.append(outcome)
                summary = summarize(work, out, plan, outcomes, t0)
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(work, ignore_errors=True)
    files = sorted(p for p in out.iterdir() if p.is_file())
    if len(files) > MAX_FILES:  # the plan writes 7 at most; anything more was there before
        print(f"sitting: {len(files)} files in {out}, more than {MAX_FILES}", file=sys.stderr)
    print("\n".join(report.short_lines(summary, files)), flush=True)
    if any(o.status == "interrupted" for o in outcomes):
        return 130
    return 0 if all(o.is_ok for o in outcomes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/gpu/sitting", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on this CPU")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="results folder ($OUT)")
    parser.add_argument(
        "--inject", action="append", default=[], choices=STEPS, help="make STEP fail (a test)"
    )
    args = parser.parse_args(argv)
    inject = set(args.inject) | {s for s in os.environ.get(INJECT_ENV, "").split(",") if s}
    unknown = inject - set(STEPS)
    if unknown:
        print(f"sitting: {INJECT_ENV}: unknown steps {sorted(unknown)}", file=sys.stderr)
        return 2
    try:
        out = check_out(args.out)
    except OutError as error:
        print(error, file=sys.stderr)
        return 2
    return sit(CPU_DRY_RUN if args.cpu_dry_run else GPU, out, inject)


if __name__ == "__main__":
    sys.exit(main())
