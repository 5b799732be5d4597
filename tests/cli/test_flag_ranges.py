"""Counted flags out of their range: click's own error and exit 2 before any work, for every
command that takes them (`--threads` 0 or fewer reached torch.set_num_threads as a traceback;
`--port` above 65535 reached the socket's bind as one)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llmbench.cli.main import cli


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "hi", "--threads", "0"],
        ["profile", "--threads", "-1"],
        ["quality", "--threads", "0"],
        ["hardware", "--threads", "-2"],
        ["serve", "--threads", "0"],
        ["moe", "prune", "synthetic:tiny-moe", "--workload", "rag", "--threads", "0"],
        ["serve", "--port", "65536"],
        ["serve", "--port", "-1"],
    ],
)
def test_a_count_out_of_range_is_refused(args):
    outcome = CliRunner().invoke(cli, args)
    assert outcome.exit_code == 2, outcome.output
    flag = args[-2]
    assert f"Invalid value for '{flag}': {args[-1]} is not in the range" in outcome.output
