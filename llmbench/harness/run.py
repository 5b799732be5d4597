"""`llmbench run`: spec → backend → warm-up → measured sessions → run folder + summary."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmbench.errors import UserError
from llmbench.harness import arrivals, metrics
from llmbench.harness.driver import DriveOptions, Driver
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import (
    LoadMonitor,
    cpu_name,
    local_server_pids,
    provenance,
    session_summary,
    write_run,
)
from llmbench.harness.spec import RunSpec
from llmbench.harness.telemetry import Telemetry
from llmbench.harness.telemetry import summarize as summarize_telemetry
from llmbench.harness.workloads import Session, Tokens, build_sessions, sessions_hash


def _open_backend(spec: RunSpec):
    """The backend, the client-side tokenizer (the model's own, for exact prompt counts) and
    the model's config (for the roofline)."""
    if spec.backend.kind == "engine":
        from llmbench.engine.engine import EngineConfig
        from llmbench.harness.backends.engine import EngineBackend

        e = spec.engine
        backend = EngineBackend(
            EngineConfig(
                model=spec.model,
                dtype=spec.dtype,
                device=spec.device,
                block_size=e.block_size,
                kv_cache_memory=e.kv_cache_memory,
                max_num_batched_tokens=e.max_num_batched_tokens,
                max_num_seqs=e.max_num_seqs,
                enable_prefix_caching=e.prefix_caching,
                num_threads=e.threads,
            )
        )
        return backend, backend.engine.tokenizer, backend.engine.model_config
    if spec.backend.kind == "openai":
        from llmbench.engine.weights import open_weights
        from llmbench.harness.backends.openai import OpenAIBackend

        weights = open_weights(spec.model)
        tokenizer = weights.tokenizer()
        backend = OpenAIBackend(
            spec.backend.url,
            model=spec.backend.served_model,
            count_tokens=lambda text: len(tokenizer.encode(text)),
            timeout_s=spec.backend.timeout_s,
        )
        return backend, tokenizer, weights.config
    from llmbench.harness.backends.transformers import TransformersBackend

    backend = TransformersBackend(spec.model, spec.dtype, spec.engine.threads)
    return backend, backend.tokenizer, None


def _device_info(spec: RunSpec, backend) -> dict[str, Any]:
    if spec.backend.kind == "transformers":
        import torch

        return {
            "type": "cpu",
            "name": cpu_name(),
            "threads": torch.get_num_threads(),
            "kernels": "transformers.generate",
        }
    if spec.backend.kind == "engine":
        import torch

        device = backend.engine.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
        return {
            "type": device.type,
            "name": name,
            "threads": torch.get_num_threads(),
            "kernels": "torch reference ops",
        }
    return {"type": "remote", "url": spec.backend.url}


class Progress:
    """One status line on stderr: requests done, output tokens/s, errors."""

    def __init__(self, total: int):
        self.total = total
        self.done = self.failed = self.tokens = 0
        self.start = time.perf_counter()
        self.is_tty = sys.stderr.isatty()

    def __call__(self, record: RequestRecord) -> None:
        if record.is_warmup:
            return
        self.done += 1
        self.failed += not record.ok
        self.tokens += record.num_output_tokens
        if self.is_tty or self.done == self.total or self.done % max(1, self.total // 10) == 0:
            rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
            end = "\n" if not self.is_tty or self.done == self.total else ""
            print(
                f"\r  {self.done}/{self.total} requests, {rate:.1f} output tok/s, "
                f"{self.failed} errors",
                end=end,
                file=sys.stderr,
                flush=True,
            )


async def _drive(
    driver: Driver,
    backend,
    spec: RunSpec,
    sessions: list[Session],
    warmup: list[Session],
    point: float | None,
) -> None:
    try:
        await backend.start()
    except Exception as e:  # noqa: BLE001 — e.g. an unreachable server: the user's to fix
        raise UserError(f"backend {spec.backend.kind}: {e}") from None
    try:
        await driver.warm_up(warmup)
        # Everything allocated so far lives for the whole run: keep the garbage collector off
        # it, or a full collection (torch is imported) stalls every stream for 20-40 ms.
        gc.collect()
        gc.freeze()
        load = spec.load
        if load.kind == "concurrency":
            await driver.run_closed_loop(sessions, int(point or load.concurrency))
        else:
            rate = point or load.rate_per_s
            n = len(sessions)
            if load.kind == "constant":
                offsets = arrivals.constant_offsets(rate, n)
            elif load.kind == "poisson":
                offsets = arrivals.poisson_offsets(rate, n, spec.seed)
            elif load.kind == "gamma":
                offsets = arrivals.gamma_offsets(rate, load.burstiness, n, spec.seed)
            else:
                offsets = arrivals.trace_offsets(Path(load.trace))
                if len(offsets) < n:
                    sessions = sessions[: len(offsets)]
                offsets = offsets[: len(sessions)]
            await driver.run_open_loop(sessions, offsets)
    finally:
        await backend.close()


def execute(spec: RunSpec, out_dir: Path | None, write_reports: Callable[[Path], object]) -> Path:
    """Run the spec (every sweep point) and write the run folder; returns its path.

    `write_reports(folder)` renders the reports of a finished run or sweep folder (the reports
    layer sits above this one, so the caller hands it in)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = out_dir or Path(spec.output_dir) / f"{spec.name}-{stamp}"
    if not spec.load.sweep:
        return _execute_point(spec, root, None, write_reports)
    for value in arrivals.sweep_points(list(spec.load.sweep)):
        _execute_point(spec, root / f"point-{value:g}", value, write_reports)
    write_reports(root)
    return root


def _execute_point(
    spec: RunSpec, folder: Path, point: float | None, write_reports: Callable[[Path], object]
) -> Path:
    backend, tokenizer, model_config = _open_backend(spec)
    tokens = Tokens(tokenizer.encode, tokenizer.decode)
    sessions = build_sessions(spec.workload, spec.seed, tokens)
    warm_spec = replace(spec.workload, sessions=spec.warmup_requests)
    warmup = build_sessions(warm_spec, spec.seed, tokens, salt="warmup-")
    use_chat = spec.backend.api == "chat"
    driver = Driver(
        backend,
        count_prompt_tokens=lambda messages: len(tokenizer.encode_chat(messages)),
        render_prompt=tokenizer.apply_chat_template,
        options=DriveOptions(use_chat, spec.temperature, spec.ignore_eos),
        on_record=Progress(sum(len(s.turns) for s in sessions)),
    )
    interrupted = False
    own_pids = local_server_pids(spec.backend.url) if spec.backend.kind == "openai" else []
    with LoadMonitor(own_pids=own_pids) as monitor, Telemetry() as telemetry:
        try:
            asyncio.run(_drive(driver, backend, spec, sessions, warmup, point))
        except KeyboardInterrupt:
            interrupted = True
            print("\ninterrupted: saving what was measured", file=sys.stderr)
    records = driver.result.records
    summary = metrics.summarize(records, spec.slo)
    summary["sessions"] = session_summary(driver.result.sessions)
    load = monitor.as_dict()
    summary["machine_busy"] = load["is_busy"]
    spec_dict = spec.to_dict()
    results = {
        "name": spec.name,
        "interrupted": interrupted,
        "sweep_point": point,
        "provenance": provenance(
            spec_dict, spec.hash(), sessions_hash(sessions), _device_info(spec, backend), load
        ),
        "spec": spec_dict,
        "summary": summary,
        "telemetry": {
            "interval_s": telemetry.interval_s,
            "notes": telemetry.notes,
            "summary": summarize_telemetry(telemetry.samples),
        },
    }
    points, roof, measured = _roofline(spec, backend, model_config, records)
    if measured is not None:
        results["provenance"]["hardware"] = measured
    if roof is not None:
        results["roofline"] = roof
        phases = roof["phases"]
        summary["decode_mbu"] = phases.get("decode", {}).get("mbu")
        summary["prefill_mfu"] = phases.get("prefill", {}).get("mfu")
        summary["roofline_is_estimated"] = roof["is_estimated"]
    write_run(folder, results, records, points, driver.result.sessions, telemetry)
    print(format_summary(results), file=sys.stderr if point is not None else sys.stdout)
    write_reports(folder)
    print(folder)
    if interrupted:
        raise KeyboardInterrupt
    return folder


def _roofline(
    spec: RunSpec, backend, model_config, records: list[RequestRecord]
) -> tuple[list[dict], dict | None, dict | None]:
    """Roofline points, their per-phase share of the roofs, and the measured roofs used.

    Engine backend: every engine step, costed (`roofline.cost_steps`), against the roofs
    measured on the engine's device. OpenAI backend: decode windows estimated from the client's
    token times (`roofline.estimate_decode_steps`), against `backend.hardware` when the spec
    names it. The transformers baseline has neither steps nor a stream of its own: none.
    """
    from llmbench.harness import cost_model, hardware, roofline

    measured = None
    if spec.backend.kind == "engine":
        engine = backend.engine
        dtype = str(engine.dtype).removeprefix("torch.")
        elem_bytes = engine.dtype.itemsize
        points = roofline.cost_steps(model_config, backend.engine.step_records, elem_bytes, elem_bytes)
        measured = hardware.ceilings(engine.device.type)
        roofs = _measured_roofs(measured, dtype)
        sheet_name = hardware.datasheet_name_of(measured["device"])
    elif spec.backend.kind == "openai":
        dtype = spec.dtype
        elem_bytes = cost_model.BYTES_PER_ELEM[dtype]
        ok = [r for r in records if not r.is_warmup]
        points = roofline.estimate_decode_steps(model_config, ok, elem_bytes, elem_bytes)
        roofs, sheet_name = None, None
        if spec.backend.hardware == "measured":
            measured = hardware.ceilings("cpu")
            roofs = _measured_roofs(measured, dtype)
        elif spec.backend.hardware is not None:
            sheet_name = spec.backend.hardware
    else:
        return [], None, None
    sheet = hardware.datasheet(sheet_name) if sheet_name else None
    datasheet_roofs = None
    if sheet is not None and sheet["flops_per_s"].get(dtype):
        datasheet_roofs = {
            "label": f"datasheet {sheet_name}",
            "read_bytes_per_s": sheet["memory_bandwidth_bytes_per_s"],
            "flops_per_s": sheet["flops_per_s"][dtype],
        }
    # MBU/MFU against the measured roofs; a remote server's only roofs may be its datasheet's.
    peaks = roofs or datasheet_roofs
    phases = roofline.phase_utilization(
        points,
        peaks and peaks["read_bytes_per_s"],
        peaks and peaks["flops_per_s"],
    )
    return (
        points,
        {
            "is_estimated": spec.backend.kind != "engine",
            "method": (
                "every engine step costed by the cost model"
                if spec.backend.kind == "engine"
                else "decode estimated from the client: a step per inter-token gap, batch = "
                "streams in decode, context from the requests"
            ),
            "dtype": dtype,
            "weight_bytes_per_param": elem_bytes,
            "kv_bytes_per_elem": elem_bytes,
            "roofs": peaks,
            "datasheet_roofs": datasheet_roofs,
            "phases": phases,
        },
        measured,
    )


def _measured_roofs(measured: dict, dtype: str) -> dict:
    return {
        "label": f"measured {measured['device']}",
        "read_bytes_per_s": measured["read_bytes_per_s"],
        "flops_per_s": measured["matmul_flops_per_s"][dtype],
    }


def format_summary(results: dict[str, Any]) -> str:
    """The table printed after a run (also what `report.md` will start from)."""
    s, p = results["summary"], results["provenance"]
    header = (
        f"{results['name']}: {p['backend']} {p['model']} {p['dtype']} on "
        f"{p['device'].get('name', '?')} - {s['num_completed']} requests completed, "
        f"{s['num_failed']} failed in {s['duration_s'] or 0:.1f} s"
    )
    lines = [
        header,
        f"{'':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"):
        d = s[name]
        cells = "".join(
            f"{d[k]:>10.1f}" if d[k] is not None else f"{'-':>10}"
            for k in ("mean", "p50", "p90", "p99", "max")
        )
        lines.append(f"{name:<10}{cells}")
    hit = s.get("prefix_cache_hit_rate")
    lines.append(
        f"throughput: {s['output_tok_per_s']:.1f} output tok/s, {s['input_tok_per_s']:.1f} input "
        f"tok/s, {s['request_per_s']:.2f} req/s; goodput {s['goodput_request_per_s']:.2f} req/s; "
        f"prefix-cache hit rate {'-' if hit is None else f'{hit:.2f}'}"
    )
    roof = results.get("roofline") or {}
    estimated = " (estimated from the client)" if roof.get("is_estimated") else ""
    if roof.get("roofs"):
        r = roof["roofs"]
        mbu, mfu = s.get("decode_mbu"), s.get("prefill_mfu")
        lines.append(
            f"roofline{estimated}: decode MBU {'-' if mbu is None else f'{mbu:.2f}'}, prefill MFU "
            f"{'-' if mfu is None else f'{mfu:.2f}'} against {r['label']} "
            f"({r['read_bytes_per_s'] / 1e9:.1f} GB/s, {r['flops_per_s'] / 1e9:.0f} GFLOP/s "
            f"{roof['dtype']})"
        )
    elif roof.get("phases", {}).get("decode"):
        lines.append(
            f"roofline{estimated}: decode at {roof['phases']['decode']['bytes_per_s'] / 1e9:.2f} "
            "GB/s achieved (set backend.hardware for MBU/MFU)"
        )
    sessions = s.get("sessions", {})
    if sessions.get("num_sessions"):
        lines.append(
            f"sessions: {sessions['num_sessions']}, mean {sessions['mean_session_s']:.1f} s "
            f"(waiting on the model {sessions['mean_model_wait_s']:.1f} s, on tools "
            f"{sessions['mean_tool_wait_s']:.1f} s)"
        )
    if s.get("machine_busy"):
        load = p["machine_load"]
        lines.append(
            f"WARNING: the machine was busy: other processes used "
            f"{load['other_processes_cores_before']} cores just before the run and "
            f"{load['other_processes_cores']} during it (of {load['cpu_count']}); "
            f"the numbers are pessimistic"
        )
    if results.get("interrupted"):
        lines.append("interrupted: partial results")
    return "\n".join(lines)
