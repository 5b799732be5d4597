"""The shipped launchers run a sharded run as their clusters would: the Slurm array script and
the Kubernetes Indexed Job's command, each shard with its index from the launcher's variable
and one `--start-at`, against a loopback `llmbench serve`, then their merge step. What a
cluster adds (scheduling, the shared volume) is not here; the commands are the shipped ones,
with only the mount paths, the server address and the model made local."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.serve.load import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "deploy" / "slurm"
KUBERNETES = ROOT / "deploy" / "kubernetes"
SERVE = ["--model", "synthetic:tiny", "--dtype", "float32", "--kv-cache-memory", str(4 * 2**20)]


@pytest.fixture(scope="module")
def server():
    process = ServerProcess(SERVE)
    yield f"{process.url}/v1"
    process.stop()


def environment(**variables: str) -> dict[str, str]:
    """This environment, `llmbench` on PATH (this interpreter's), and `variables`."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, **variables}


def run_shards(commands: list[tuple[list[str], dict[str, str]]]) -> None:
    """Start every shard's command at once, as the launcher does; each must exit 0."""
    shards = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for command, env in commands
    ]  # fmt: skip
    for shard in shards:
        out, err = shard.communicate(timeout=300)
        assert shard.returncode == 0, err


def check_merged(merged: Path, num_shards: int, stdout: str) -> None:
    results = json.loads((merged / "results.json").read_text())
    client = results["client"]
    assert client["num_shards"] == num_shards and len(client["processes"]) == num_shards
    assert sorted(p["shard"] for p in client["processes"]) == list(range(num_shards))
    for p in client["processes"]:  # each shard says when it began against --start-at
        assert p["schedule_start_unix_s"] is not None and p["start_offset_s"] is not None
        assert p["clock_max_error_s"] is None or p["clock_max_error_s"] >= 0
    assert client["start_spread_s"] is not None and client["start_spread_s"] >= 0
    assert "start: the shards' schedules began " in stdout
    assert (merged / "report.html").is_file()


def test_the_slurm_array_script_and_its_merge(server, tmp_path):
    spec = tmp_path / "run.yaml"
    spec.write_text(
        "name: fleet\nmodel: synthetic:tiny\n"
        f"backend: {{kind: openai, url: '{server}'}}\n"
        "workload: {kind: chat, sessions: 4, turns: 2, think_time_s: 0, output_tokens: 8}\n"
        "load: {kind: poisson, rate_per_s: 8}\n"
    )
    out = tmp_path / "out"
    start = str(int(time.time()) + 4)
    run_shards(
        [
            (
                ["bash", str(SLURM / "llmbench-shards.sbatch"), str(spec), str(out)],
                environment(
                    SLURM_ARRAY_TASK_ID=str(i), SLURM_ARRAY_TASK_COUNT="2", LLMBENCH_START_AT=start
                ),
            )
            for i in range(2)
        ]
    )
    merge = subprocess.run(
        ["bash", str(SLURM / "llmbench-merge.sbatch"), str(out)],
        env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert merge.returncode == 0, merge.stderr
    check_merged(out / "merged", 2, merge.stdout)


def test_the_slurm_script_without_a_start_time_is_one_line(tmp_path):
    result = subprocess.run(
        ["bash", str(SLURM / "llmbench-shards.sbatch"), "spec.yaml", str(tmp_path)],
        env=environment(SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="2"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "LLMBENCH_START_AT: submit with --export=ALL,LLMBENCH_START_AT=" in result.stderr


def local(text: str, tmp_path: Path) -> str:
    """A manifest's command with its volumes' mount paths under `tmp_path`."""
    return text.replace("/spec/", f"{tmp_path}/spec/").replace("/results", f"{tmp_path}/results")


def test_the_kubernetes_indexed_job_and_its_merge(server, tmp_path):
    start = str(int(time.time()) + 6)
    # As the manifest says to apply it: its start time filled in with sed.
    shards_text = (KUBERNETES / "llmbench-shards.yaml").read_text()
    config_map, job = yaml.safe_load_all(shards_text.replace("LLMBENCH_START_AT_VALUE", start))
    (merge_job,) = yaml.safe_load_all((KUBERNETES / "llmbench-merge.yaml").read_text())
    assert job["spec"]["completionMode"] == "Indexed"
    count = job["spec"]["completions"]
    assert job["spec"]["parallelism"] == count
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"] + container["args"]
    assert f'--shard "$JOB_COMPLETION_INDEX/{count}"' in command[-1]  # N as in completions
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["LLMBENCH_START_AT"] == start
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["spec"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert mounts == {"spec": "/spec", "results": "/results"}
    # The ConfigMap's spec, pointed at the loopback server, with a tiny model and workload.
    spec = yaml.safe_load(config_map["data"]["run.yaml"])
    spec["model"] = "synthetic:tiny"
    spec["backend"]["url"] = server
    spec["workload"].update(sessions=8, turns=2, think_time_s=0, output_tokens=8)
    spec["load"]["rate_per_s"] = 16
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "run.yaml").write_text(yaml.safe_dump(spec))
    run_shards(
        [
            (
                [*command[:-1], local(command[-1], tmp_path)],
                environment(JOB_COMPLETION_INDEX=str(i), **env),
            )
            for i in range(count)
        ]
    )
    (merger,) = merge_job["spec"]["template"]["spec"]["containers"]
    merge_command = merger["command"] + merger["args"]
    merge = subprocess.run(
        [*merge_command[:-1], local(merge_command[-1], tmp_path)],
        env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert merge.returncode == 0, merge.stderr
    check_merged(tmp_path / "results" / "merged", count, merge.stdout)
