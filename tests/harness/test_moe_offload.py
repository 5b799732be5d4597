"""`--moe-offload` and `engine.moe_offload`: the compact syntax, the link names, the engine
config they make, and the spec's checks."""

from __future__ import annotations

import pytest

from llmbench.errors import UserError
from llmbench.harness.moe_offload import engine_offload, link_line, parse_moe_offload
from llmbench.harness.spec import MoEOffloadSpec, load_spec
from llmbench.roofline.datasheets import link_bandwidth


def test_the_compact_syntax():
    assert parse_moe_offload("none") is None
    assert parse_moe_offload("resident=4") == MoEOffloadSpec(resident=4)
    spec = parse_moe_offload("resident=2,cache=3,link=pcie5,profile=runs/a/experts.json,sleep")
    assert spec == MoEOffloadSpec(2, 3, "pcie5", "runs/a/experts.json", True)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cache=2", "resident=N is required"),
        ("resident=4,resident=2", "each key once"),
        ("resident=4,speed=9", "got 'speed=9'"),
        ("resident=-1", "whole number >= 0"),
        ("resident=4,link=pcie9", "link 'pcie9'"),
        ("resident=4,sleep=maybe", "sleep is a flag"),
    ],
)
def test_bad_compact_syntax_is_one_user_error(text, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_moe_offload(text)


def test_link_bandwidths_from_the_hardware_table_or_a_number():
    assert link_bandwidth("pcie4-x16") == link_bandwidth("pcie4") == 32e9
    assert link_bandwidth("pcie3") == 16e9
    assert link_bandwidth("12.5GB/s") == 12.5e9
    for bad in ("12.5", "0GB/s", "fastGB/s"):
        with pytest.raises(UserError):
            link_bandwidth(bad)


def test_the_engine_config_on_a_cpu_simulates_pcie4_by_default():
    config = engine_offload(MoEOffloadSpec(resident=4, cache=1), "cpu")
    assert (config.num_resident, config.num_cached) == (4, 1)
    assert config.link_bytes_per_s == 32e9 and config.is_simulated and not config.sleep
    assert engine_offload(MoEOffloadSpec(4, link="25GB/s", sleep=True), "cpu").sleep
    real = engine_offload(MoEOffloadSpec(resident=4, link="real"), "cpu")
    assert real.link_bytes_per_s is None  # the engine refuses it on a CPU


def test_link_line_totals_the_steps():
    class Step:
        def __init__(self, link_bytes, link_s_simulated):
            self.link_bytes, self.link_s_simulated = link_bytes, link_s_simulated

    steps = [Step(2**20, 0.001), Step(0, 0.0), Step(2**20, 0.002)]
    assert link_line(steps) == "link 2.00 MiB in 2 of 3 steps, 3 ms simulated"


def _spec(tmp_path, offload: str, backend: str = "engine"):
    path = tmp_path / "w.yaml"
    url = "\n  url: http://127.0.0.1:1/v1" if backend == "openai" else ""
    path.write_text(
        f"model: synthetic:tiny-moe\nbackend:\n  kind: {backend}{url}\n"
        f"engine:\n  moe_offload: {offload}\n"
    )
    return load_spec(path)


def test_the_spec_reads_and_checks_moe_offload(tmp_path):
    spec = _spec(tmp_path, "{resident: 4, cache: 2, link: pcie3-x16}")
    assert spec.engine.moe_offload == MoEOffloadSpec(4, 2, "pcie3-x16")
    assert _spec(tmp_path, "null").engine.moe_offload is None
    for offload, fragment in [
        ("{resident: -1}", "engine.moe_offload.resident: must be >= 0"),
        ("{resident: 1, link: pcie9}", "engine.moe_offload.link"),
        ("{resident: 1, link: real, sleep: true}", "only for a simulated link"),
        ("{resident: 1, speed: 3}", "unknown key"),
    ]:
        with pytest.raises(UserError, match=fragment):
            _spec(tmp_path, offload)
    with pytest.raises(UserError, match="only for backend kind 'engine'"):
        _spec(tmp_path, "{resident: 1}", backend="openai")
