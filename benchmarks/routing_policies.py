"""Routing policies over a fleet of `llmbench serve` replicas, in one command.

    python benchmarks/routing_policies.py --replicas 2 --workloads agentic,chat --out fleet

Starts `--replicas` servers of `--model` (one thread each, replica i pinned to CPU i mod the
CPUs there are), then for each workload runs it once with every policy as a variant
(`--vary routing.policy=...`) against all of them, the prefix caches emptied before each
variant's measured phase (`backend.reset_prefix_cache`), priced with `--prices` and the machine's
`--gpu-hour-price`: one run folder per workload, `OUT/<workload>/report.html` comparing the
policies. The client is pinned to `--client-cpus`. Stops the servers at the end (or on Ctrl-C).
Prints each workload's comparison (the variants report's "Prefix cache, routing and cost"
table) last.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

POLICIES = "round_robin,least_loaded,session_sticky,prefix_affinity"


def start_replica(model: str, port: int, cpu: int, log: Path) -> subprocess.Popen:
    """`llmbench serve` on 127.0.0.1:`port`, one thread, pinned to `cpu`."""
    command = [sys.executable, "-m", "llmbench", "serve", "--model", model, "--port", str(port)]
    return subprocess.Popen(
        [*command, "--threads", "1"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: the replica at {url} exited ({process.returncode})")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"error: the replica at {url} did not answer /health in {timeout_s:g} s")


def comparison(report: Path) -> str:
    """The routing table of a variants report.md, without its heading."""
    heading = "## Prefix cache, routing and cost\n"
    text = report.read_text()
    start = text.find(heading)
    if start < 0:
        return "(no routing table)"
    return text[start + len(heading) :].split("\n## ", 1)[0].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workloads", default="agentic,chat")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--client-cpus", default=None, help="default: the last CPU")
    parser.add_argument("--prices", default="claude-sonnet-4")
    parser.add_argument("--gpu-hour-price", default=None, help="the machine's price an hour")
    parser.add_argument("--port", type=int, default=8301, help="the first replica's port")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("fleet"))
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    client_cpus = args.client_cpus or str(cpus[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    urls = [f"http://127.0.0.1:{args.port + i}" for i in range(args.replicas)]
    replicas = [
        start_replica(args.model, args.port + i, cpus[i % len(cpus)], args.out / f"replica-{i}.log")
        for i in range(args.replicas)
    ]
    try:
        for url, process in zip(urls, replicas, strict=True):
            wait_healthy(url, process)
        tables = []
        for workload in args.workloads.split(","):
            command = [sys.executable, "-m", "llmbench", "run", workload]
            command += ["--set", f"model={args.model}", "--set", "backend.kind=openai"]
            command += ["--set", f"backend.urls=[{','.join(u + '/v1' for u in urls)}]"]
            command += ["--set", "backend.reset_prefix_cache=true"]
            command += [arg for s in args.sets for arg in ("--set", s)]
            command += ["--vary", f"routing.policy={args.policies}"]
            command += ["--client-cpus", client_cpus, "--prices", args.prices]
            if args.gpu_hour_price:
                command += ["--gpu-hour-price", args.gpu_hour_price]
            command += ["--out", str(args.out / workload), "--force"]
            print("$ " + " ".join(command), file=sys.stderr, flush=True)
            subprocess.run(command, check=True)
            tables.append(f"### {workload}\n\n{comparison(args.out / workload / 'report.md')}")
        print("\n\n".join(tables))
    finally:
        for process in replicas:
            process.terminate()
        for process in replicas:
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
