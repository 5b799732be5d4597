"""What the engine step's measured steps are put against: the roofs (measured, and the
datasheet's), each step's bytes and FLOPs (llmbench's cost model, as a run costs its steps) and
the what-if roofline's prediction for the same shape (`llmbench roofline`'s rows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Roofs:
    """Read bandwidth and matmul FLOP/s in the engine's dtype: measured here (None: not
    measured) and the datasheet's (None: no datasheet row for this device)."""

    read_bytes_per_s: float | None
    flops_per_s: float | None
    datasheet_bytes_per_s: float | None = None
    datasheet_flops_per_s: float | None = None

    @classmethod
    def of(cls, ceilings: dict[str, Any], datasheet: dict[str, Any] | None, dtype: str) -> Roofs:
        """From `ceilings.ceilings`' result and a `datasheets.HARDWARE` row (or None)."""
        sheet = datasheet or {}
        return cls(
            ceilings.get("read_bytes_per_s"),
            ceilings.get("matmul_flops_per_s", {}).get(dtype),
            sheet.get("memory_bandwidth_bytes_per_s"),
            (sheet.get("flops_per_s") or {}).get(dtype),
        )


@dataclass(frozen=True)
class StepCosting:
    """How a loaded engine's steps are costed: its model's shape and what it stores per
    weight and per K/V element (`cost_model.loaded_bytes_per_param`)."""

    config: Any  # engine.config.ModelConfig
    weight_bytes_per_param: float
    lm_head_bytes_per_param: float
    kv_bytes_per_elem: float

    @classmethod
    def of(cls, engine: Any) -> StepCosting:
        from llmbench.roofline.cost_model import loaded_bytes_per_param

        config = engine.model_config
        weight_bpp, lm_head_bpp = loaded_bytes_per_param(config, engine.model.weight_bytes)
        return cls(config, weight_bpp, lm_head_bpp, engine.kv_cache.bytes_per_elem)

    def phase(self, records: Sequence[Any], roofs: Roofs, phase: str) -> dict[str, Any]:
        """The steps' achieved bandwidth and FLOP/s, MBU and MFU (`analysis.phase_utilization`:
        Σ bytes / Σ seconds / roof; None above the roof) for `phase` (decode or prefill)."""
        from llmbench.roofline.analysis import cost_steps, phase_utilization

        points = cost_steps(
            self.config,
            records,
            self.weight_bytes_per_param,
            self.kv_bytes_per_elem,
            lm_head_bytes_per_param=self.lm_head_bytes_per_param,
        )
        phases = phase_utilization(points, roofs.read_bytes_per_s, roofs.flops_per_s)
        if phase not in phases:
            raise ValueError(f"no {phase} step among {[p['phase'] for p in points]}")
        measured = phases[phase]
        return measured | {
            "bytes_per_step": sum(p["bytes"] for p in points) / len(points),
            "flops_per_step": sum(p["flops"] for p in points) / len(points),
        }

    def what_if(self, context: int, batch: int, peaks: tuple[float | None, float | None]):
        """`llmbench roofline`'s row for one decode batch at `context` on `peaks` (bytes/s,
        FLOP/s): `decode_step_ms` and `ttft_ms_bound` (a prefill of `context` tokens), or None
        without both peaks."""
        from llmbench.roofline.whatif import whatif_rows

        bandwidth, flops = peaks
        if not bandwidth or not flops:
            return None
        (row,) = whatif_rows(
            self.config,
            bandwidth,
            flops,
            [context],
            [batch],
            self.weight_bytes_per_param,
            self.kv_bytes_per_elem,
        )
        return row


def ratio(measured: float | None, predicted: float | None) -> float | None:
    """measured / predicted, None when either is missing."""
    if measured is None or not predicted:
        return None
    return measured / predicted
