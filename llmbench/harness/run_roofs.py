"""The roofs a run is measured against, settled before its workload: this device's ceilings
measured (or read from the cache) within a time budget and with a progress line, the datasheet's
where the device has one, where each number came from, and how each engine step is costed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from llmbench.errors import UserError
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import HardwareCeilings, Roofline, Roofs, from_plain
from llmbench.harness.spec import RunSpec


class _RoofsProgress:
    """The roofs' progress on stderr: a line when measuring starts, the probe under way on a
    terminal (a cache hit prints nothing here)."""

    def __init__(self, device_type: str, budget_s: float):
        self.device_type, self.budget_s = device_type, budget_s
        self.is_measuring = False
        self.is_tty = sys.stderr.isatty()

    def __call__(self, probe: str) -> None:
        if not self.is_measuring:
            self.is_measuring = True
            print(
                f"hardware roofs: measuring this {self.device_type} (once per machine; at most "
                f"{self.budget_s:g} s; cached for the next runs)",
                file=sys.stderr,
                flush=True,
            )
        if self.is_tty:
            print(f"\r  {probe:<40}", end="", file=sys.stderr, flush=True)


def measured_roofs(spec: RunSpec, backend) -> HardwareCeilings | None:
    """The measured roofs of the run's device (engine; openai with `backend.hardware:
    measured`), before the workload, from the cache when it has them; None otherwise."""
    from llmbench.harness import hardware

    if spec.backend.kind == "engine":
        device_type = backend.engine.device.type
    elif spec.backend.kind == "openai" and spec.backend.hardware == "measured":
        device_type = "cpu"
    else:
        return None
    budget_s = _roofs_budget_s(hardware.DEFAULT_BUDGET_S)
    show = _RoofsProgress(device_type, budget_s)
    t0 = time.perf_counter()
    roofs = from_plain(
        HardwareCeilings,
        hardware.ceilings(device_type, budget_s=budget_s, first=spec.dtype, progress=show),
        "hardware roofs",
    )
    took = f" in {time.perf_counter() - t0:.1f} s" if show.is_measuring else ""
    flops = roofs.matmul_flops_per_s.get(spec.dtype)
    rate = f"{flops / 1e9:.0f} GFLOP/s" if flops else "not measured"
    back = "\r" if show.is_measuring and show.is_tty else ""  # over the probe line
    print(
        f"{back}hardware roofs{took}: read "
        f"{roofs.read_bytes_per_s / 1e9:.1f} GB/s, matmul {spec.dtype} {rate} "
        f"({roofs.sources.get('read', '?')})",
        file=sys.stderr,
        flush=True,
    )
    for note in roofs.notes:
        print(f"  {note}", file=sys.stderr)
    return roofs


def _roofs_budget_s(default_s: float) -> float:
    """Seconds the roofs may take when measured: `LLMBENCH_ROOFS_BUDGET_S`, else `default_s`."""
    text = os.environ.get("LLMBENCH_ROOFS_BUDGET_S")
    if not text:
        return default_s
    try:
        budget_s = float(text)
    except ValueError:
        budget_s = -1.0
    if not budget_s > 0:
        raise UserError(f"LLMBENCH_ROOFS_BUDGET_S={text}: give a number of seconds > 0")
    return budget_s


def roofline_setup(
    spec: RunSpec, backend, model_config, measured: HardwareCeilings | None
) -> tuple[Roofline | None, Callable[[Any], dict[str, Any]] | None]:
    """The roofline block of the run before it runs (no phases yet), and how to cost one
    engine step into its steps.jsonl line (engine backend only).

    Engine backend: every engine step, costed (`roofline.cost_steps`), against the roofs
    measured on the engine's device. OpenAI backend: decode windows estimated at the end from
    the client's token times (`roofline.estimate_decode_steps`), against the measured roofs or
    the datasheet `backend.hardware` names. The transformers baseline has neither: None.
    """
    from llmbench.harness import cost_model, hardware, roofline

    cost_step = None
    if spec.backend.kind == "engine":
        engine = backend.engine
        dtype = str(engine.dtype).removeprefix("torch.")
        elem_bytes = engine.dtype.itemsize

        def cost_step(step: Any) -> dict[str, Any]:
            return roofline.cost_steps(model_config, [step], elem_bytes, elem_bytes)[0]

        sheet_name = hardware.datasheet_name_of(measured.device) if measured else None
    elif spec.backend.kind == "openai":
        dtype = spec.dtype
        elem_bytes = cost_model.BYTES_PER_ELEM[dtype]
        sheet_name = spec.backend.hardware if spec.backend.hardware != "measured" else None
    else:
        return None, None
    sheet = hardware.datasheet(sheet_name) if sheet_name else None
    datasheet_roofs = None
    if sheet is not None and sheet["flops_per_s"].get(dtype):
        source = f"datasheet {sheet_name}"
        datasheet_roofs = Roofs(
            label=source,
            read_bytes_per_s=sheet["memory_bandwidth_bytes_per_s"],
            flops_per_s=sheet["flops_per_s"][dtype],
            sources={"read_bytes_per_s": source, "flops_per_s": source},
        )
    roofs = _measured_roofs(measured, dtype, datasheet_roofs) if measured else None
    is_engine = spec.backend.kind == "engine"
    setup = Roofline(
        is_estimated=not is_engine,
        method=(
            "every engine step costed by the cost model"
            if is_engine
            else "decode estimated from the client: a step per inter-token gap, batch = "
            "streams in decode, context from the requests"
        ),
        dtype=dtype,
        weight_bytes_per_param=elem_bytes,
        kv_bytes_per_elem=elem_bytes,
        # MBU/MFU against the measured roofs; a remote server's only roofs may be its datasheet's.
        roofs=roofs or datasheet_roofs,
        datasheet_roofs=datasheet_roofs,
    )
    return setup, cost_step


def _measured_roofs(measured: HardwareCeilings, dtype: str, datasheet_roofs: Roofs | None) -> Roofs:
    """The measured read bandwidth and `dtype` matmul rate; a rate the time budget skipped
    comes from the datasheet when the device has one (None otherwise: no MFU)."""
    flops = measured.matmul_flops_per_s.get(dtype)
    flops_source = measured.sources.get(dtype, "?")
    if flops is None:
        if datasheet_roofs is not None:
            flops, flops_source = datasheet_roofs.flops_per_s, datasheet_roofs.label
        else:
            flops_source = f"none: {dtype} matmul not measured (see provenance.hardware.notes)"
    return Roofs(
        label=f"measured {measured.device}",
        read_bytes_per_s=measured.read_bytes_per_s,
        flops_per_s=flops,
        sources={
            "read_bytes_per_s": measured.sources.get("read", "?"),
            "flops_per_s": flops_source,
        },
    )


def estimated_points(spec: RunSpec, model_config, records: list[RequestRecord]) -> list[dict]:
    """The openai backend's decode roofline points, estimated from the client's token times."""
    from llmbench.harness import cost_model, roofline

    elem_bytes = cost_model.BYTES_PER_ELEM[spec.dtype]
    ok = [r for r in records if not r.is_warmup]
    return roofline.estimate_decode_steps(model_config, ok, elem_bytes, elem_bytes)
