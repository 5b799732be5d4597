"""Variants run one after another: Ctrl-C in the middle of one keeps the variants done and what
the interrupted one measured (as a plain run keeps it), and still writes the top report."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from tests.harness.test_run import TINY

NO_HANG_S = 120


def test_ctrl_c_mid_variant_keeps_the_variants_done_and_the_partial_one(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "llmbench", "run", "agentic", *TINY,
            "--set", "load.concurrency=1", "--set", "workload.tool_latency_s=0.2",
            "--vary", "workload.sessions=1,40", "--out", str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    # The second variant (40 sessions, 0.2 s per tool call) runs long: stop it once it measured.
    records = out / "variants" / "40" / "requests.jsonl"
    deadline = time.monotonic() + NO_HANG_S
    while not (records.is_file() and records.read_text().count("\n") >= 3):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the second variant measured nothing"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=NO_HANG_S)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stdout.splitlines()[-1] == str(out)
    index = json.loads((out / "variants.json").read_text())
    assert [(v["name"], v["status"], v["error"]) for v in index["variants"]] == [
        ("1", "done", None),
        ("40", "interrupted", "interrupted by SIGINT"),
    ]
    done = json.loads((out / "variants" / "1" / "results.json").read_text())
    partial = json.loads((out / "variants" / "40" / "results.json").read_text())
    assert done["interrupted"] is False and done["spec"]["workload"]["sessions"] == 1
    assert partial["interrupted"] is True and partial["stop_reason"] == "SIGINT"
    assert partial["summary"]["num_completed"] >= 1
    html = (out / "report.html").read_text()
    for name in ("1", "40"):
        assert f'<td><a href="variants/{name}/report.html">{name}</a></td>' in html
    assert "<td>40</td><td>interrupted</td>" in html
