"""Gates files: metrics and rules read strictly; every mistake is one line at its file line."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbench.compare.gates import (
    Gate,
    default_gates,
    format_percent,
    load_gates,
    metric_info,
    parse_gates,
)
from llmbench.errors import UserError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text(text)
    return path


def test_rules_in_file_order_with_fractions_for_percentages(tmp_path):
    gates = load_gates(
        write(
            tmp_path,
            """
# comments are fine
tpot_ms.p50: {max_increase: 5%}
output_tok_per_s: {max_decrease: 3%}
decode_mbu:
  min: 0.5
  max_decrease: 12.5%
ttft_ms.p99: {max: 250}
""",
        )
    )
    assert gates == (
        Gate("tpot_ms.p50", "max_increase", 0.05),
        Gate("output_tok_per_s", "max_decrease", 0.03),
        Gate("decode_mbu", "min", 0.5),
        Gate("decode_mbu", "max_decrease", 0.125),
        Gate("ttft_ms.p99", "max", 250.0),
    )
    assert [g.name for g in gates] == [
        "tpot_ms.p50 max_increase 5%",
        "output_tok_per_s max_decrease 3%",
        "decode_mbu min 0.5",
        "decode_mbu max_decrease 12.5%",
        "ttft_ms.p99 max 250",
    ]


def test_metric_kinds():
    tpot = metric_info("tpot_ms.p50")
    assert (tpot.family, tpot.statistic, tpot.unit) == ("tpot_ms", "p50", "ms")
    assert tpot.is_per_request and tpot.is_lower_better and tpot.kind == "raw"
    assert not tpot.is_portable
    rate = metric_info("output_tok_per_s")
    assert (rate.kind, rate.is_lower_better, rate.is_per_request) == ("raw", False, False)
    for name in ("decode_mbu", "prefill_mfu", "output_tok_per_s_per_gb_s"):
        info = metric_info(name)
        assert info.kind == "hardware-normalised" and info.is_portable
        assert not info.is_lower_better
    assert metric_info("prefix_cache_hit_rate").kind == "device-independent"
    assert metric_info("prefix_cache_hit_rate").is_portable
    assert metric_info("ttft_ms.mean").statistic == "mean"
    assert metric_info("tpot_ms.max") is None  # a bootstrap cannot bound a maximum
    assert metric_info("tpot_ms") is None
    assert metric_info("tokens_per_s") is None


def test_format_percent():
    assert format_percent(0.05) == "5%"
    assert format_percent(0.125) == "12.5%"
    assert format_percent(0.0) == "0%"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "decode_mbu: {max_decrease: 15%}\ntokens_per_s: {min: 1}\n",
            "gates.yaml:2: tokens_per_s: unknown metric",
        ),
        (
            "tpot_ms: {max_increase: 5%}\n",
            "gates.yaml:1: tpot_ms: name a statistic of it: tpot_ms.mean",
        ),
        (
            "tpot_ms.p42: {max_increase: 5%}\n",
            "gates.yaml:1: tpot_ms.p42: unknown statistic; use one of mean, p50",
        ),
        (
            "tpot_ms.p50:\n  max_increase: 5%\n  max_rise: 3%\n",
            "gates.yaml:3: tpot_ms.p50.max_rise: unknown key; "
            "known keys here: max, max_decrease, max_increase, min",
        ),
        (
            "tpot_ms.p50:\n  max_increase: 5\n",
            "gates.yaml:2: tpot_ms.p50.max_increase: must be a percentage such as 5%, got 5",
        ),
        (
            "tpot_ms.p50: {max_increase: -5%}\n",
            "gates.yaml:1: tpot_ms.p50.max_increase: must be a percentage such as 5%, got '-5%'",
        ),
        (
            "\n\ntpot_ms.p50: {max_decrease: 5%}\n",
            "gates.yaml:3: tpot_ms.p50.max_decrease: "
            "tpot_ms.p50 is better when lower; gate it with max_increase",
        ),
        (
            "decode_mbu:\n  max_increase: 5%\n",
            "gates.yaml:2: decode_mbu.max_increase: "
            "decode_mbu is better when higher; gate it with max_decrease",
        ),
        (
            "decode_mbu: {max_decrease: 100%}\n",
            "gates.yaml:1: decode_mbu.max_decrease: must be < 100%",
        ),
        (
            "decode_mbu:\n  min: high\n",
            "gates.yaml:2: decode_mbu.min: must be a number in fraction, got 'high'",
        ),
        (
            "decode_mbu:\n  min: true\n",
            "gates.yaml:2: decode_mbu.min: must be a number in fraction, got True",
        ),
        ("ttft_ms.p99:\n  max: -1\n", "gates.yaml:2: ttft_ms.p99.max: must be >= 0, got -1"),
        (
            "decode_mbu:\n  max: 0.4\n  min: 0.6\n",
            "gates.yaml:3: decode_mbu.min: must be <= max (0.4), got 0.6",
        ),
        (
            "decode_mbu: {}\n",
            "gates.yaml:1: decode_mbu: must be a mapping with one or more of max_increase",
        ),
        ("decode_mbu: 0.5\n", "gates.yaml:1: decode_mbu: must be a mapping with one or more of"),
        (
            "decode_mbu: {max_decrease: 15%}\nprefill_mfu: {min: 0.1}\ndecode_mbu: {min: 0.2}\n",
            "gates.yaml:3: decode_mbu: duplicate key",
        ),
        ("decode_mbu: {max_decrease: 15%\n", "gates.yaml:2: not valid YAML"),
        ("- decode_mbu\n", "gates.yaml: (top): must be a mapping of metric names to rules"),
        ("# nothing here\n", "gates.yaml: (top): no gates; name at least one metric"),
    ],
)
def test_mistakes_name_file_line_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        load_gates(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(str(path.parent) + "/" + expected), message


def test_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"missing\.yaml: cannot read .*give a gates YAML file"):
        load_gates(tmp_path / "missing.yaml")


def test_parse_gates_names_its_source():
    with pytest.raises(UserError, match=r"^inline:1: tpot_ms\.p50\.min: must be a number in ms"):
        parse_gates("tpot_ms.p50: {min: fast}", "inline")


def test_default_gates_are_hardware_normalised_and_wide():
    gates = default_gates()
    assert {g.metric for g in gates} == {"decode_mbu", "prefill_mfu", "output_tok_per_s_per_gb_s"}
    for gate in gates:
        assert gate.info.kind == "hardware-normalised"
        assert gate.rule == "max_decrease"
        # wide enough for a noisy 2-core machine, tight enough to catch a 30% slower decode
        assert 0.10 <= gate.threshold < 0.30


def test_default_gates_by_backend_device_and_slo():
    def names(*args, **kwargs):
        return [g.name for g in default_gates(*args, **kwargs)]

    normalised = [
        "decode_mbu max_decrease 10%",
        "output_tok_per_s_per_gb_s max_decrease 10%",
        "prefill_mfu max_decrease 15%",
    ]
    assert names("engine") == names("transformers") == normalised
    assert names("engine", is_same_device=True) == [
        *normalised,
        "tpot_ms.p50 max_increase 10%",
        "itl_ms.p90 max_increase 15%",
        "output_tok_per_s max_decrease 10%",
    ]
    server = [
        "ttft_ms.p50 max_increase 10%",
        "ttft_ms.p90 max_increase 15%",
        "tpot_ms.p50 max_increase 10%",
        "tpot_ms.p90 max_increase 15%",
        "itl_ms.p90 max_increase 15%",
        "output_tok_per_s max_decrease 10%",
        "failed_fraction max 0.01",
    ]
    assert names("openai") == names("openai", is_same_device=True) == server
    assert names("openai", has_slo=True) == [*server, "goodput_request_per_s max_decrease 10%"]
    assert metric_info("failed_fraction").is_lower_better


def test_moe_routing_metrics_are_device_independent_and_better_when_lower():
    for name, unit in (
        ("moe_decode_experts_touched", "experts per layer"),
        ("moe_load_max_over_mean", "ratio"),
    ):
        info = metric_info(name)
        assert (info.unit, info.kind, info.is_lower_better) == (unit, "device-independent", True)
        assert not info.is_per_request and info.is_portable
    gates = parse_gates(
        "moe_load_max_over_mean: {max_increase: 10%, max: 3}\n"
        "moe_decode_experts_touched: {max_increase: 5%}\n",
        "g.yaml",
    )
    assert [g.name for g in gates] == [
        "moe_load_max_over_mean max_increase 10%",
        "moe_load_max_over_mean max 3",
        "moe_decode_experts_touched max_increase 5%",
    ]
    with pytest.raises(UserError, match="better when lower; gate it with max_increase"):
        parse_gates("moe_load_max_over_mean: {max_decrease: 10%}\n", "g.yaml")
