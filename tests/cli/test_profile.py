"""`llmbench profile`: the table, the JSON and the page from the command line, on roofs read
from a cache written here (nothing measured), and its errors as one line each."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import assert_user_error, llmbench
from tests.fresh_cache import fresh_cache


def write_roofs_cache(cache) -> None:
    """A cache entry for this machine's torch and threads: 10 GB/s read, 100 GFLOP/s."""
    import torch

    from llmbench.roofline import ceilings

    probe = {
        "size": 256 << 20,
        "repeats": 6,
        "seconds": 0.0268435456,
        "measured_unix_s": 0.0,
        "note": None,
        "method": "read-only sum",
        "threads": torch.get_num_threads(),
        "unit": "B/s",
        "best_per_s": 10e9,
        "median_per_s": 9e9,
        "spread": 0.1,
        "converged": True,
    }
    entry = {
        "device": "cpu0",
        "device_type": "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "copy_bytes_per_s": 9e9,
        "read_bytes_per_s": 10e9,
        "matmul_flops_per_s": {d: 100e9 for d in ceilings.MATMUL_DTYPES},
        "method": "best of hand-written runs",
        "notes": [],
        "probes": {"read": probe},
        "unsupported": [],
        "format": ceilings.CACHE_FORMAT,
    }
    key = f"cpu-{torch.get_num_threads()}threads-torch{torch.__version__}"
    path = cache / "hardware" / ceilings._cache_path(key).name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(entry))


def test_profile_prints_a_table_and_writes_json_and_html(tmp_path):
    write_roofs_cache(fresh_cache(tmp_path / "cache"))
    out_json, out_html = tmp_path / "profile.json", tmp_path / "profile.html"
    args = ["-m", "synthetic:tiny", "--batch", "1,2", "--context", "32", "--steps", "2"]
    result = llmbench(
        "profile", *args, "--json", str(out_json), "--html", str(out_html), cache=tmp_path / "cache"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("synthetic:tiny bfloat16, decode, 2 steps per point")
    assert "roofs: read 10.0 GB/s (probe read: the best read-only sum" in lines[0]
    # A machine busy with other work is named first (a shared CI machine may be).
    lines = [lines[0], *(line for line in lines[1:] if not line.startswith("warning: "))]
    assert lines[2] == "batch 1, context 32"
    assert lines[3].split() == [
        "op", "calls", "ms/step", "share", "MB/step", "GB/s", "GFLOP/s", "bound", "ms",
        "%", "roof", "lost", "ms",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[4:21]] == [
        "schedule", "inputs", "embedding", "rms_norm", "qkv_proj", "rope", "kv_write",
        "attention", "o_proj", "gate_up_proj", "silu_mul", "down_proj", "lm_head", "sampling",
        "outputs", "attributed", "unattributed",
    ]  # fmt: skip
    assert "batch 2, context 32" in lines
    data = json.loads(out_json.read_text())
    assert [p["batch"] for p in data["points"]] == [1, 2]
    for point in data["points"]:
        assert sum(op["bytes"] for op in point["ops"]) == pytest.approx(point["bytes"])
    page = out_html.read_text()
    assert '<figure id="profile-time-b1-c32">' in page
    assert '<figure id="profile-roofline-b2-c32">' in page
    assert (tmp_path / "figures" / "profile-time-b2-c32.png").is_file()
    assert lines[-2:] == [str(out_json), str(out_html)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--phase", "train"], "--phase train: use decode, prefill or verify"),
        (["--phase", "verify", "--drafts", "0"], "--drafts 0: a verify needs >= 1 draft"),
        (["--batch", "x"], "--batch x: 'x' is not a count"),
        (["--dtype", "int3"], "--dtype int3: use float32, bfloat16 or float16"),
        (["--quantize", "int3"], "quantize 'int3': unknown scheme; use int8, int4"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--html", "/no/such/folder/p.html"], "the folder /no/such/folder does not exist"),
    ],
)
def test_profile_errors_are_one_line(args, message):
    assert_user_error(llmbench("profile", "-m", "synthetic:tiny", *args), message)


def test_profile_of_a_missing_or_moe_model_is_one_line(tmp_path):
    write_roofs_cache(tmp_path)
    assert_user_error(llmbench("profile", "-m", "no-such-model", cache=tmp_path), "no-such-model")
    assert_user_error(
        llmbench("profile", "-m", "synthetic:tiny-moe", cache=tmp_path), "mixture of experts"
    )


def test_profile_names_a_busy_machine_as_a_run_does(monkeypatch, tmp_path):
    """The load is measured around the profile as around a run (other processes' CPU): busy, the
    table, the JSON and the page say so first. Load and profile injected: nothing is timed."""
    from click.testing import CliRunner

    from llmbench.cli.profile import profile
    from llmbench.harness import provenance
    from llmbench.harness.results import MachineLoad
    from llmbench.roofline import ceilings
    from llmbench.roofline import profile as profile_module
    from tests.reports.test_profile_page import BUSY
    from tests.reports.test_profile_page import result as canned

    class BusyMonitor:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def load(self):
            return MachineLoad(2, 1.5, 2.0, 0.9, 1.0, True)

    monkeypatch.setattr(provenance, "LoadMonitor", BusyMonitor)
    monkeypatch.setattr(ceilings, "ceilings", lambda *args, **kwargs: {})
    monkeypatch.setattr(profile_module, "profile", lambda *args: canned())
    out_json = tmp_path / "profile.json"
    args = ["-m", "synthetic:tiny", "--json", str(out_json), "--html", str(tmp_path / "p.html")]
    outcome = CliRunner().invoke(profile, args)
    assert outcome.exit_code == 0, outcome.output
    assert outcome.output.splitlines()[1] == f"warning: {BUSY}"
    data = json.loads(out_json.read_text())
    assert data["warnings"] == [BUSY] and data["machine_load"]["is_busy"] is True
    assert f"{BUSY[0].upper()}{BUSY[1:]}." in (tmp_path / "p.html").read_text()
