"""`--moe-offload` and `engine.moe_offload`: the compact syntax, the link line, and the spec's
checks (the engine config they make: test_engine_config)."""

from __future__ import annotations

import pytest

from llmbench.errors import UserError
from llmbench.harness.moe_offload import link_line, parse_moe_offload
from llmbench.harness.spec import MoEOffloadSpec
from llmbench.harness.spec_load import load_spec


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
