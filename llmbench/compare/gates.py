"""The gates file: which metrics a comparison may gate, and the limits a user sets on them.

A gates file maps a metric to its rules, checked as strictly as a run spec (unknown metrics,
rules and values are refused with `file:line: key.path: reason`):

    tpot_ms.p50: {max_increase: 5%}          # relative: NEW may be at most 5% slower
    output_tok_per_s: {max_decrease: 3%}     # relative: NEW may lose at most 3%
    decode_mbu: {min: 0.5, max_decrease: 15%}  # absolute floor, and a relative rule

Relative rules take a percentage and point the metric's bad way (a latency may not rise, a rate
may not fall). Absolute rules (`min`, `max`) take a number in the metric's unit. Each metric says
whether it is raw (a time or rate: it depends on the machine), hardware-normalised (MBU, MFU,
tokens/s per GB/s of the run's measured read bandwidth: it travels between machines) or
device-independent (a ratio of counts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from llmbench.errors import UserError
from llmbench.harness.metrics import LATENCY_FAMILIES, STATISTICS
from llmbench.harness.yaml_source import SpecError, located, read_yaml

# -- the metrics a gate may name ---------------------------------------------------------------

MetricKind = Literal["raw", "hardware-normalised", "device-independent"]


@dataclass(frozen=True)
class MetricInfo:
    """What a gate needs to know about a metric: its samples, unit, good direction and kind."""

    name: str  # as written in a gates file: "tpot_ms.p50", "decode_mbu"
    unit: str
    is_lower_better: bool
    kind: MetricKind
    # Latency metrics are a statistic over per-request samples of `family`; the others are one
    # value per repetition (family == name, statistic "mean": the mean over repetitions).
    family: str
    statistic: str
    is_per_request: bool

    @property
    def is_portable(self) -> bool:
        """Whether two runs on different devices may be compared on this metric."""
        return self.kind != "raw"


# One value per repetition: (unit, kind). All of them are better when higher.
_PER_REPETITION: dict[str, tuple[str, MetricKind]] = {
    "output_tok_per_s": ("tok/s", "raw"),
    "input_tok_per_s": ("tok/s", "raw"),
    "request_per_s": ("req/s", "raw"),
    "goodput_request_per_s": ("req/s", "raw"),
    "goodput_fraction": ("fraction", "raw"),  # meeting an SLO depends on the machine's speed
    "decode_mbu": ("fraction", "hardware-normalised"),
    "prefill_mfu": ("fraction", "hardware-normalised"),
    # Formula: output_tok_per_s / (measured read bandwidth in bytes/s / 1e9)
    "output_tok_per_s_per_gb_s": ("tok/s per GB/s", "hardware-normalised"),
    "prefix_cache_hit_rate": ("fraction", "device-independent"),  # cached / prompt tokens
}
# One value per repetition, better when lower: the failed fraction of measured requests, and
# mixture-of-experts routing (fewer expert bytes per decode step; a more even load): (unit, kind).
_PER_REPETITION_LOWER: dict[str, tuple[str, MetricKind]] = {
    "failed_fraction": ("fraction", "device-independent"),
    "moe_decode_experts_touched": ("experts per layer", "device-independent"),
    "moe_load_max_over_mean": ("ratio", "device-independent"),
}


def metric_info(name: str) -> MetricInfo | None:
    """The metric a gates file may name, or None for an unknown name."""
    if name in _PER_REPETITION:
        unit, kind = _PER_REPETITION[name]
        return MetricInfo(name, unit, False, kind, name, "mean", False)
    if name in _PER_REPETITION_LOWER:
        unit, kind = _PER_REPETITION_LOWER[name]
        return MetricInfo(name, unit, True, kind, name, "mean", False)
    family, _, statistic = name.rpartition(".")
    if family in LATENCY_FAMILIES and statistic in STATISTICS:
        return MetricInfo(name, "ms", True, "raw", family, statistic, True)
    return None


def _unknown_metric_reason(name: str) -> str:
    if name in LATENCY_FAMILIES:
        return f"name a statistic of it: {', '.join(f'{name}.{s}' for s in STATISTICS)}"
    family = name.rpartition(".")[0]
    if family in LATENCY_FAMILIES:
        return f"unknown statistic; use one of {', '.join(STATISTICS)}"
    return (
        f"unknown metric; use a latency ({', '.join(LATENCY_FAMILIES)}) with "
        f".{'/.'.join(STATISTICS)}, or one of "
        f"{', '.join([*_PER_REPETITION, *_PER_REPETITION_LOWER])}"
    )


# -- gates -------------------------------------------------------------------------------------

Rule = Literal["max_increase", "max_decrease", "min", "max"]
RULES: tuple[Rule, ...] = ("max_increase", "max_decrease", "min", "max")
RELATIVE_RULES = ("max_increase", "max_decrease")


@dataclass(frozen=True)
class Gate:
    """One rule on one metric. `threshold` is a fraction for relative rules (0.05 for 5%) and a
    value in the metric's unit for `min` / `max`."""

    metric: str
    rule: Rule
    threshold: float

    @property
    def info(self) -> MetricInfo:
        info = metric_info(self.metric)
        if info is None:
            raise ValueError(f"unknown metric {self.metric!r}")
        return info

    @property
    def is_relative(self) -> bool:
        return self.rule in RELATIVE_RULES

    @property
    def name(self) -> str:
        """`tpot_ms.p50 max_increase 5%`, `decode_mbu min 0.5`: one gate, one line."""
        if self.is_relative:
            return f"{self.metric} {self.rule} {format_percent(self.threshold)}"
        return f"{self.metric} {self.rule} {self.threshold:g}"


def format_percent(fraction: float) -> str:
    """0.05 → "5%", 0.125 → "12.5%"."""
    return f"{fraction * 100:g}%"


_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*$")


def _parse_rule(info: MetricInfo, rule: str, value: Any, path: str) -> Gate:
    if rule not in RULES:
        raise SpecError(path, f"unknown key; known keys here: {', '.join(sorted(RULES))}")
    if rule in RELATIVE_RULES:
        match = _PERCENT.match(value) if isinstance(value, str) else None
        if match is None:
            raise SpecError(path, f"must be a percentage such as 5%, got {value!r}")
        fraction = float(match.group(1)) / 100
        bad_rule = "max_decrease" if info.is_lower_better else "max_increase"
        if rule == bad_rule:
            better, good_rule = (
                ("lower", "max_increase")
                if info.is_lower_better
                else (
                    "higher",
                    "max_decrease",
                )
            )
            raise SpecError(path, f"{info.name} is better when {better}; gate it with {good_rule}")
        if rule == "max_decrease" and fraction >= 1:
            raise SpecError(path, f"must be < 100% (a metric >= 0 cannot fall by {value})")
        return Gate(info.name, rule, fraction)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, f"must be a number in {info.unit}, got {value!r}")
    if value < 0:
        raise SpecError(path, f"must be >= 0, got {value}")
    return Gate(info.name, rule, float(value))


def _build_gates(data: Any) -> tuple[Gate, ...]:
    """Plain YAML data → gates, in file order; SpecError on the first mistake."""
    if not isinstance(data, dict):
        raise SpecError("(top)", "must be a mapping of metric names to rules")
    if not data:
        raise SpecError("(top)", "no gates; name at least one metric, e.g. decode_mbu")
    gates: list[Gate] = []
    for metric, rules in data.items():
        info = metric_info(metric)
        if info is None:
            raise SpecError(metric, _unknown_metric_reason(metric))
        if not isinstance(rules, dict) or not rules:
            raise SpecError(metric, f"must be a mapping with one or more of {', '.join(RULES)}")
        own = [_parse_rule(info, rule, value, f"{metric}.{rule}") for rule, value in rules.items()]
        low = next((g.threshold for g in own if g.rule == "min"), None)
        high = next((g.threshold for g in own if g.rule == "max"), None)
        if low is not None and high is not None and low > high:
            raise SpecError(f"{metric}.min", f"must be <= max ({high:g}), got {low:g}")
        gates += own
    return tuple(gates)


def parse_gates(text: str, source: str) -> tuple[Gate, ...]:
    """Gates from the text of a gates file; `source` names it in errors (`source:line: ...`)."""
    data, lines = read_yaml(text, source)
    try:
        return _build_gates({} if data is None else data)
    except SpecError as e:
        raise located(e, source, lines) from None


def load_gates(path: Path) -> tuple[Gate, ...]:
    """Read and check a gates file."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror}); give a gates YAML file") from None
    return parse_gates(text, str(path))


DEFAULT_GATES_FILE = "default_gates.yaml"


def default_gates(
    backend: str = "engine", *, is_same_device: bool = False, has_slo: bool = False
) -> tuple[Gate, ...]:
    """The shipped gates for two runs of `backend` (engine, transformers or openai): engine
    runs gate hardware-normalised metrics, plus raw latency and throughput when both ran on
    one device; server runs gate the client's latency and throughput, the failed fraction,
    and goodput when the specs set SLOs (`default_gates.yaml` says why each)."""
    source = f"llmbench/compare/{DEFAULT_GATES_FILE}"
    text = resources.files("llmbench.compare").joinpath(DEFAULT_GATES_FILE).read_text()
    data, lines = read_yaml(text, source)
    if backend == "openai":
        sections = ["server", *(["server_with_slo"] if has_slo else [])]
    else:
        sections = ["engine", *(["engine_same_device"] if is_same_device else [])]
    try:
        return tuple(gate for name in sections for gate in _build_gates(data[name]))
    except SpecError as e:
        raise located(e, source, lines) from None
