"""`llmbench quality` on synthetic:tiny: a table on stdout, the same as JSON, one-line errors."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import assert_user_error, llmbench

SMALL = ("--model", "synthetic:tiny", "--device", "cpu", "--tokens", "64", "--context", "32")


def test_quality_prints_a_table_and_writes_json(tmp_path):
    out = tmp_path / "quality.json"
    result = llmbench(
        "quality",
        *SMALL,
        "--generate",
        "4",
        "--kv-cache-dtype",
        "int8,int4",
        "--kv-cache-dtype",
        "k=int8,v=int4",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("llmbench quality: synthetic:tiny float32; pydoc-topics 64 tokens")
    assert lines[1].split()[:4] == ["weights", "kv", "cache", "KV"]
    kv_column = [line.split()[2] for line in lines[2:6]]
    assert kv_column == ["float32", "int8", "int4", "k=int8,v=int4"]
    assert lines[6] == str(out)
    data = json.loads(out.read_text())
    assert [t["name"] for t in data["texts"]] == ["pydoc-topics", "stdlib-source"]
    assert [t["num_tokens_scored"] for t in data["texts"]] == [62, 62]  # 2 windows of 31 each
    rows = data["rows"]
    assert [r["kv_cache_dtype"] for r in rows] == [
        {"k": "float32", "v": "float32"},
        {"k": "int8", "v": "int8"},
        {"k": "int4", "v": "int4"},
        {"k": "int8", "v": "int4"},
    ]
    # synthetic:tiny: 2 layers, 2 KV heads, head_dim 16; per layer and head K + V bytes.
    assert [r["kv_bytes_per_token"] for r in rows] == [
        2 * 2 * 128,
        2 * 2 * 36,
        2 * 2 * 20,
        2 * 2 * 28,
    ]
    assert rows[0]["mean_kl"] == 0.0 and rows[0]["is_reference"]
    assert "quality: 4/4 weights as loaded, kv k=int8,v=int4" in result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--kv-cache-dtype", "int3"), "kv cache dtype k=int3: unknown"),
        (("--kv-cache-dtype", "k=int8,w=int4"), "expected a format"),
        (("--context", "1"), "--context and --tokens must be >= 2"),
        (("--generate", "-1"), "--generate must be >= 0"),
        (("--quantize", "none,"), "--quantize: an empty value"),
        # checked before the first row runs: one line, no progress line of the rows before it
        (("--quantize", "none,int9"), "quantize 'int9': unknown scheme"),
        (("--quantize", "int8,int4:48"), "group 48; use one of 32, 64, 128"),
        (("--text", "/nonexistent/eval.txt"), "--text /nonexistent/eval.txt: cannot read"),
        (
            ("--json", "/nonexistent/dir/q.json"),
            "--json /nonexistent/dir/q.json: the folder /nonexistent/dir does not exist",
        ),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args, fragment):
    assert_user_error(llmbench("quality", *SMALL, *args), fragment)
