"""The roofs a run is measured against, settled before its workload: this device's ceilings
measured (or read from the cache) within a time budget, with a progress line and the machine's
load watched around the measurement (`provenance.LoadMonitor`: roofs measured busy are not
cached as the machine's), the datasheet's where the device has one, where each number came from,
and how each engine step is costed. The run says in one line which roofs it uses, how old and
how settled they are, and whether the machine was quiet (`roofs_line`), and how big the
engine's K/V cache is and why (`kv_cache_line`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmbench.errors import UserError
from llmbench.harness.provenance import LoadMonitor
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import HardwareCeilings, Roofline, Roofs, from_plain
from llmbench.harness.run_warnings import assumed_weights_line
from llmbench.harness.spec import RunSpec
from llmbench.harness.speculative_stats import draft_model_of

if TYPE_CHECKING:  # aiohttp loads only with the openai backend
    from llmbench.harness.backends.openai import ServedModel


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
    from llmbench.roofline import ceilings

    dtype = spec.dtype
    if spec.backend.kind == "engine":
        device_type = backend.engine.device.type
    elif spec.backend.kind == "openai" and spec.backend.hardware == "measured":
        device_type = "cpu"
        dtype = served_dtype(served_model(backend)) or dtype  # the matmul the server runs
    else:
        return None
    budget_s = _roofs_budget_s(ceilings.DEFAULT_BUDGET_S)
    show = _RoofsProgress(device_type, budget_s)
    t0 = time.perf_counter()
    plain = ceilings.ceilings(
        device_type, budget_s=budget_s, first=dtype, progress=show, watch_load=LoadMonitor
    )
    loads = plain.pop("probe_loads", {})
    roofs = from_plain(HardwareCeilings, plain, "hardware roofs")
    took_s = time.perf_counter() - t0  # said when any of them was measured now
    back = "\r" if show.is_measuring and show.is_tty else ""  # over the probe line
    line = roofs_line(roofs, loads, dtype, time.time(), took_s)
    print(f"{back}{line}", file=sys.stderr, flush=True)
    for note in roofs.notes:
        if not note.startswith(ceilings.BUSY_NOTE_START):  # the roofs line says it
            print(f"  {note}", file=sys.stderr)
    return roofs


def roofs_line(
    roofs: HardwareCeilings,
    loads: dict[str, Any],
    dtype: str,
    now_unix_s: float,
    took_s: float | None = None,
) -> str:
    """The run's roofs in one line: the read roof and the `dtype` matmul, each with the spread
    of its runs (± the slowest run's shortfall, `unsettled` when its best runs never agreed),
    where they came from (measured now, in `took_s`; or cached, with the date and age of the
    older), and how busy the machine was when they were measured (`loads`, the probes'
    `ceilings` load readings: a probe without one is taken as quiet, None is unknown).

    `roofs: cached 2026-11-26 14:02 (3 h old), read 9.5 GB/s ±2%, bfloat16 57.0 GFLOP/s ±5%;
    measured on a quiet machine`
    """
    from llmbench.roofline.ceilings import date_text

    used = [name for name in ("read", dtype) if name in roofs.probes]
    cached = {name for name in used if roofs.sources.get(name) != "measured now"}
    parts = []
    for name, unit in (("read", "GB/s"), (dtype, "GFLOP/s")):
        probe = roofs.probes.get(name)
        if probe is None or probe.best_per_s is None:
            parts.append(f"{name} not measured")
            continue
        spread = "" if probe.spread is None else f" ±{probe.spread:.0%}"
        unsettled = " unsettled" if probe.converged is False else ""
        when = ""
        if cached and len(cached) < len(used):  # some measured now, some cached: each says
            when = " (measured now)" if name not in cached else ""
            when = when or f" (cached {date_text(probe.measured_unix_s)})"
        parts.append(f"{name} {probe.best_per_s / 1e9:.1f} {unit}{spread}{unsettled}{when}")
    if not cached:
        origin = "measured now" + (f" in {took_s:.1f} s" if took_s is not None else "")
    elif len(cached) == len(used):
        oldest = min(roofs.probes[name].measured_unix_s for name in used)
        origin = f"cached {date_text(oldest)} ({_age(now_unix_s - oldest)} old)"
    else:
        origin = "measured now and cached"
    load_words = _load_words([loads.get(name, {}) for name in used])
    return f"roofs: {origin}, {', '.join(parts)}; {load_words}"


def _load_words(loads: list[dict[str, Any] | None]) -> str:
    """How busy the machine was when the roofs were measured, in words."""
    from llmbench.roofline.ceilings import BUSY_NOTE_START, busy_cores_text

    busy = [load for load in loads if load and load["is_busy"]]
    if busy:
        return (
            f"{BUSY_NOTE_START} ({busy_cores_text(busy)}): cached marked busy, not as this "
            "machine's; the next run on a quiet machine measures them again"
        )
    if any(load is None for load in loads):
        return "the machine's load was not watched when they were measured"
    return "measured on a quiet machine"


def _age(seconds: float) -> str:
    """3 h, 12 min, 5 days: how long ago, in its largest whole unit (< 1 min: seconds)."""
    for unit_s, unit in ((86400, "days"), (3600, "h"), (60, "min")):
        if seconds >= unit_s:
            count = int(seconds // unit_s)
            return f"{count} {'day' if unit == 'days' and count == 1 else unit}"
    return f"{max(0, int(seconds))} s"


def kv_cache_line(engine) -> str:
    """The engine's K/V cache in one line: its size, the tokens it holds and how it was sized
    (`LLMEngine.kv_cache_sizing`)."""
    kv = engine.kv_cache
    return (
        f"K/V cache: {kv.num_bytes / 2**20:,.0f} MiB, {kv.num_tokens:,} tokens "
        f"({engine.kv_cache_sizing})"
    )


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

    Engine backend: every engine step, costed (`analysis.cost_steps`), against the roofs
    measured on the engine's device. OpenAI backend: decode windows estimated at the end from
    the client's token times (`analysis.estimate_decode_steps`), against the measured roofs or
    the datasheet `backend.hardware` names, in the dtype the server says it computes in
    (`served_model`; the spec's `dtype` when it does not say). The transformers baseline has
    neither: None.
    """
    from llmbench.roofline import analysis, cost_model, datasheets

    cost_step = None
    if spec.backend.kind == "engine":
        engine = backend.engine
        dtype = str(engine.dtype).removeprefix("torch.")
        # The loaded weights' own bytes: a quantised model's codes, scales and zero points.
        elem_bytes, lm_head_bytes = cost_model.loaded_bytes_per_param(
            model_config, engine.model.weight_bytes
        )
        engine_weights = weights_label(engine, dtype)
        kv_elem_bytes = engine.kv_cache.bytes_per_elem  # its K/V formats, scales included

        draft = draft_model_of(engine)  # speculative decoding's draft model, if any
        print(kv_cache_line(engine), file=sys.stderr, flush=True)

        def cost_step(step: Any) -> dict[str, Any]:
            return analysis.cost_steps(
                model_config, [step], elem_bytes, kv_elem_bytes, draft, lm_head_bytes
            )[0]

        sheet_name = datasheets.datasheet_name_of(measured.device) if measured else None
    elif spec.backend.kind == "openai":
        served = served_model(backend)
        dtype = served_dtype(served) or spec.dtype
        kv_elem_bytes = cost_model.BYTES_PER_ELEM[dtype]  # the server's K/V cache: its dtype
        sheet_name = spec.backend.hardware if spec.backend.hardware != "measured" else None
    else:
        return None, None
    sheet = datasheets.datasheet(sheet_name) if sheet_name else None
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
    if is_engine:
        weight_bytes, weights, method = elem_bytes, engine_weights, ENGINE_METHOD
    else:
        weight_bytes, weights = server_weights(spec, served)
        method = ESTIMATED_METHOD + _weights_source(spec, served, weights, dtype)
    setup = Roofline(
        is_estimated=not is_engine,
        method=method,
        dtype=dtype,
        weight_bytes_per_param=weight_bytes,
        kv_bytes_per_elem=kv_elem_bytes,
        # MBU/MFU against the measured roofs; a remote server's only roofs may be its datasheet's.
        roofs=roofs or datasheet_roofs,
        datasheet_roofs=datasheet_roofs,
        weights=weights,
        lm_head_bytes_per_param=lm_head_bytes if is_engine else None,
    )
    assumed = assumed_weights_line(setup)
    if assumed is not None:  # said now too: the run's warnings say it at the end
        print(f"roofline: {assumed}", file=sys.stderr, flush=True)
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


def weights_label(engine, dtype: str) -> str:
    """How the engine stores its weights: `dtype`, or its quantization (`int4:32, lm_head
    int8`; the embedding and norms stay in `dtype`)."""
    from llmbench.engine.quant.scheme import lm_head_scheme

    if engine.quantize is None:
        return dtype
    return f"{engine.quantize.name}, lm_head {lm_head_scheme(engine.quantize).name}"


ENGINE_METHOD = "every engine step costed by the cost model"
ESTIMATED_METHOD = (
    "decode estimated from the client: a step per inter-token gap, batch = streams in decode, "
    "context from the requests; weights "
)
# The dtypes a server's word is taken for: its bytes per weight are then known.
SERVED_DTYPES = ("float32", "bfloat16", "float16")


def served_model(backend) -> ServedModel | None:
    """What the server says of the model the run asks for (`GET /models`; the first endpoint
    that answers of a routed run), asked before the workload; None without an openai backend,
    or when the server cannot be asked (starting the backend then says why)."""
    from llmbench.harness.backends.openai import OpenAIBackend
    from llmbench.harness.backends.routed import RoutedBackend

    if not isinstance(backend, OpenAIBackend | RoutedBackend):
        return None
    return asyncio.run(backend.describe())


def served_dtype(served: ServedModel | None) -> str | None:
    """The dtype a server says it computes and stores its weights in, when it is one of
    `SERVED_DTYPES` (`llmbench serve` says it; most servers say nothing: None)."""
    if served is None or served.dtype is None:
        return None
    dtype = served.dtype.removeprefix("torch.")
    return dtype if dtype in SERVED_DTYPES else None


def server_weights(spec: RunSpec, served: ServedModel | None = None) -> tuple[float, str | None]:
    """A server's weight bytes per parameter for its estimated roofline, and how they are
    stored: `backend.weights` (a storage name), else `backend.weights_bytes_per_param` ("0.6
    bytes/param"), else the dtype the server says (`served_dtype`) when it says its weights are
    not quantized, else unknown (None): the bytes then assume the server's dtype when it says
    one, the spec's `dtype` when not."""
    from llmbench.roofline import cost_model

    backend = spec.backend
    if backend.weights is not None:
        return cost_model.BYTES_PER_ELEM[backend.weights], backend.weights
    if backend.weights_bytes_per_param is not None:
        size = backend.weights_bytes_per_param
        return size, f"{size:g} bytes/param"
    dtype = served_dtype(served)
    if dtype is not None and served is not None and served.quantization is None:
        return cost_model.BYTES_PER_ELEM[dtype], dtype
    return cost_model.BYTES_PER_ELEM[dtype or spec.dtype], None


def _weights_source(
    spec: RunSpec, served: ServedModel | None, weights: str | None, dtype: str
) -> str:
    """The end of an estimated roofline's method: the weights and who said so."""
    if weights is None:
        quantized = f", quantized ({served.quantization})" if served and served.quantization else ""
        return f"unknown{quantized} (the bytes assume {dtype}: set backend.weights)"
    if spec.backend.weights is None and spec.backend.weights_bytes_per_param is None:
        return f"{weights}, as the server says"
    return weights


def estimated_points(
    spec: RunSpec, model_config, records: list[RequestRecord], roofline: Roofline | None = None
) -> list[dict]:
    """The openai backend's decode roofline points, estimated from the client's token times:
    the weights' and KV cache's bytes as the run's `roofline` (`roofline_setup`) costed them;
    without it, the weights' as `server_weights(spec)` says and the KV cache's as the spec's
    `dtype`."""
    from llmbench.roofline import analysis, cost_model

    if roofline is not None:
        weight_bytes, kv_bytes = roofline.weight_bytes_per_param, roofline.kv_bytes_per_elem
    else:
        weight_bytes, _ = server_weights(spec)
        kv_bytes = cost_model.BYTES_PER_ELEM[spec.dtype]
    ok = [r for r in records if not r.is_warmup]
    return analysis.estimate_decode_steps(model_config, ok, weight_bytes, kv_bytes)
