"""Tests for benchmarks/peer_table.py: the peer table's numbers against hand computations."""

from __future__ import annotations

from benchmarks.peer_table import (
    RowResult,
    agreed_prefix,
    estimated_bytes_per_token,
    mbu,
    table_lines,
    target_lines,
    transformers_row,
)
from llmbench.engine.config import ModelConfig

# smollm2-135m's shape: 30 layers, 3 KV heads of 64.
SMOLLM2 = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    intermediate_size=1536,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def row(name, precision, rates, gb_per_s, ids=(1, 2, 3, 4)):
    return RowResult(name, precision, tuple(rates), gb_per_s * 1e9, tuple(ids))


def test_estimated_bytes_are_the_weights_plus_kv_at_the_mean_context():
    # c = 39 + 256 // 2 = 167 positions read, 1 written; one position in all layers holds
    # K and V: 2 · 192 · 2 bytes · 30 layers = 23,040 bytes.
    expected = 270_000_000 + (167 + 1) * 23_040
    assert estimated_bytes_per_token(SMOLLM2, 270_000_000, 2, 39, 256) == expected


def test_agreed_prefix_counts_leading_equal_tokens():
    assert agreed_prefix([5, 6, 7, 8], [5, 6, 9, 8]) == 2
    assert agreed_prefix([5, 6], [5, 6, 7]) == 2
    assert agreed_prefix([4], [5]) == 0


def test_mbu_is_none_above_the_ceiling():
    assert mbu(8e9, 16e9) == 0.5
    assert mbu(17e9, 16e9) is None


def test_transformers_row_by_precision():
    assert transformers_row("float32") == "transformers float32"
    for precision in ("16-bit", "8-bit", "4-bit"):
        assert transformers_row(precision) == "transformers bfloat16"


RESULTS = [
    row("llmbench float32", "float32", [30, 34, 32], 16.0),
    row("llmbench bfloat16", "16-bit", [60, 64, 62], 17.0, ids=(1, 2, 9, 4)),
    row("transformers float32", "float32", [10, 16, 12], 6.0),
    row("transformers bfloat16", "16-bit", [20, 21, 22], 5.0),
    row("llama.cpp F16", "16-bit", [40, 40, 40], 11.0),
    row("llmbench int8", "8-bit", [100, 110, 105], 15.0),
]


def test_table_line_has_median_range_gb_per_s_mbu_ratio_and_agreement():
    lines = table_lines(RESULTS, 20e9)
    assert lines[0].split() == ["engine", "tok/s", "(min-max)", "GB/s", "MBU", "x", "HF", "agree"]
    # bfloat16: median 62 of (60, 64, 62); 17 GB/s / 20 = 0.85; 62 / 21 = 2.95; 2 of 4 agree.
    assert lines[2].split() == [
        *("llmbench", "bfloat16", "62.0", "(60.0-64.0)", "17.00", "0.85", "2.95", "2/4")
    ]


def test_a_row_above_the_ceiling_shows_no_mbu_and_a_note():
    lines = table_lines(RESULTS, 16.5e9)
    assert lines[2].split()[5] == ">1"
    assert lines[-1].startswith("llmbench bfloat16 achieved 17.0 GB/s > measured ceiling 16.5")


def test_targets_give_value_threshold_and_verdict():
    lines = target_lines(RESULTS, 20e9)
    by_label = {line[:50].strip(): line[50:].split() for line in lines}
    assert by_label["llmbench float32 MBU"] == ["0.80", "(>=", "0.85)", "NOT", "met"]
    assert by_label["llmbench bfloat16 MBU"] == ["0.85", "(>=", "0.8)", "met"]
    # 62 / 40, 32 / 12, 62 / 21
    assert by_label["llmbench bfloat16 / llama.cpp F16 tok/s"][0] == "1.55"
    assert by_label["llmbench float32 / transformers float32 tok/s"][:2] == ["2.67", "(>="]
    assert by_label["llmbench bfloat16 / transformers bfloat16 tok/s"][-2:] == ["NOT", "met"]
    assert by_label["llmbench int8 / CTranslate2 int8 tok/s"] == ["-", "(>=", "1)", "not", "run"]
    # int8: 15 GB/s / 20 = 0.75 MBU, 105 / 62 = 1.69 bfloat16's speed: just short of 1.7.
    assert by_label["llmbench int8 MBU"] == ["0.75", "(>=", "0.7)", "met"]
    assert by_label["llmbench int8 / llmbench bfloat16 tok/s"] == [
        "1.69",
        "(>=",
        "1.7)",
        "NOT",
        "met",
    ]
    assert by_label["llmbench int4 / llmbench bfloat16 tok/s"][0] == "-"


def test_a_target_mbu_above_the_ceiling_says_so():
    lines = target_lines(RESULTS, 15e9)
    assert lines[0].split()[-3:] == ["above", "the", "ceiling"]
