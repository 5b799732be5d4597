"""Step `engine`: one engine of the plan's model (the 8B's 16 GB of weights are made once, ~45 s
on the host), then its parts in order, each in its own time box (`plan.engine_parts`,
`budget.step_timeout_s`) and each one's failure recorded while the next still runs:

  decode     every (batch, context) point, graphs on and off (`decode`)
  attention  the paged decode attention kernel alone (`attention`)
  prefill    one prompt of each length (`prefill`)
  profile    eager decode steps under torch.profiler (`step_profile`)

Every result is appended to `<work>/engine.jsonl` as it is measured.

    python -m benchmarks.gpu.engine_steps --work DIR --plan gpu --seconds 200
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.gpu.budget import MIN_STEP_S, step_timeout_s
from benchmarks.gpu.costing import Roofs, StepCosting
from benchmarks.gpu.decode import DoesNotFit, PartTimeout
from benchmarks.gpu.part_records import PartWriter
from benchmarks.gpu.plan import PLANS, Plan
from benchmarks.gpu.step_process import interrupt_grace_s

# The parts end this long before the parent interrupts the step (`interrupt_grace_s`).
EXIT_MARGIN_S = 2.0
ENGINE_ROOFS_BUDGET_S = 30.0  # when the roofs step left nothing in the cache


def load_engine(plan: Plan):
    from llmbench.engine.engine import EngineConfig, LLMEngine

    batches = (*plan.decode_batches, *plan.profile_batches)
    return LLMEngine(
        EngineConfig(
            model=plan.model,
            dtype=plan.dtype,
            device=plan.device,
            max_num_seqs=max(batches),
            max_num_batched_tokens=max(2048, *plan.prefill_tokens),
            enable_prefix_caching=False,  # random prompts; no hit may shorten a prefill
            kv_cache_memory=plan.kv_cache_memory,
        )
    )


def engine_row(engine, load_s: float) -> dict:
    import torch

    graphs = engine.runner.decode_graphs
    row = {
        "model": engine.source_description,
        "load_s": load_s,
        "kernels": engine.model.kernels_description,
        "kv_cache_blocks": engine.blocks.num_blocks,
        "kv_cache_tokens": engine.kv_cache.num_tokens,
        "kv_cache_sizing": engine.kv_cache_sizing,
        "graphs": graphs.describe() if graphs is not None else None,
    }
    if engine.device.type == "cuda":
        row["memory_allocated_bytes"] = torch.cuda.memory_allocated()
    return row


def measured_roofs(plan: Plan) -> tuple[Roofs, dict]:
    """The roofs the roofs step cached (measured again within a short budget if it did not)."""
    from benchmarks.gpu.roofs import datasheet_row
    from llmbench.harness.provenance import LoadMonitor
    from llmbench.roofline import ceilings

    found = ceilings.ceilings(
        plan.device,
        budget_s=min(plan.roofs_budget_s, ENGINE_ROOFS_BUDGET_S),
        first=plan.dtype,
        watch_load=LoadMonitor,
    )
    sheet = datasheet_row(found["device"])
    roofs = Roofs.of(found, sheet, plan.dtype)
    return roofs, {"roofs": vars(roofs), "sources": found.get("sources", {})}


def run_parts(plan: Plan, writer: PartWriter, deadline: float) -> None:
    from benchmarks.gpu.attention import attention_alone
    from benchmarks.gpu.decode import decode_point
    from benchmarks.gpu.prefill import prefill_point
    from benchmarks.gpu.step_profile import profile_point
    from llmbench.engine.presets import preset_config

    try:
        roofs, used = measured_roofs(plan)
        writer.row("roofs", used)
    except Exception as error:  # the steps are still measured, with no MBU or MFU
        writer.error("roofs", error)
        roofs = Roofs(None, None)
    state: dict = {}

    def load(part_deadline: float) -> None:
        t0 = time.monotonic()
        state["engine"] = engine = load_engine(plan)
        state["costing"] = StepCosting.of(engine)
        writer.row("engine", engine_row(engine, time.monotonic() - t0))

    def decode(part_deadline: float) -> None:
        for batch in plan.decode_batches:
            for context in plan.decode_contexts:
                each(
                    f"decode b{batch} c{context}",
                    part_deadline,
                    lambda d, b=batch, c=context: decode_point(
                        state["engine"],
                        state["costing"],
                        roofs,
                        b,
                        c,
                        plan.num_warmup_steps,
                        plan.num_decode_steps,
                        d,
                    ),
                    "decode",
                )

    def attention(part_deadline: float) -> None:
        batch, context = plan.attention_point
        config = preset_config(plan.model.removeprefix("synthetic:"))
        row = attention_alone(
            config, batch, context, plan.dtype, plan.device, roofs.read_bytes_per_s
        )
        writer.row("attention", row)

    def prefill(part_deadline: float) -> None:
        for num_tokens in plan.prefill_tokens:
            each(
                f"prefill {num_tokens}",
                part_deadline,
                lambda d, n=num_tokens: [
                    prefill_point(
                        state["engine"], state["costing"], roofs, n, plan.num_prefill_repeats, d
                    )
                ],
                "prefill",
            )

    def profile(part_deadline: float) -> None:
        for batch in plan.profile_batches:
            each(
                f"profile b{batch}",
                part_deadline,
                lambda d, b=batch: [
                    profile_point(
                        state["engine"], b, plan.profile_context, plan.num_profile_steps, d
                    )
                ],
                "profile",
            )

    def each(label: str, part_deadline: float, measure: Callable, part: str) -> None:
        """One point of a part: its rows, or its skip or error recorded under `label`."""
        if time.monotonic() > part_deadline:
            writer.skipped(label, "its part's time box ended")
            return
        try:
            for row in measure(part_deadline):
                writer.row(part, row)
        except (DoesNotFit, PartTimeout) as why:
            writer.skipped(label, str(why))
        except Exception as error:
            writer.error(label, error)

    parts = {
        "load": load,
        "decode": decode,
        "attention": attention,
        "prefill": prefill,
        "profile": profile,
    }
    names = [name for name, _ in plan.engine_parts]
    for index, (name, box) in enumerate(plan.engine_parts):
        needs_engine = name not in ("load", "attention")
        if needs_engine and "engine" not in state:
            writer.skipped(name, "the engine did not load")
            continue
        later = sum(b.reserve_s for _, b in plan.engine_parts[index + 1 :])
        timeout_s = step_timeout_s(box.box_s, deadline - time.monotonic(), later)
        if timeout_s < MIN_STEP_S:
            writer.skipped(name, f"no time left ({timeout_s:.0f} s) after {names[:index]}")
            continue
        print(f"engine: {name} (up to {timeout_s:.0f} s)", flush=True)
        try:
            parts[name](time.monotonic() + timeout_s)
        except Exception as error:
            writer.error(name, error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--plan", choices=sorted(PLANS), default="gpu")
    parser.add_argument("--seconds", type=float, required=True, help="the step's time box")
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds - interrupt_grace_s(args.seconds) - EXIT_MARGIN_S
    run_parts(PLANS[args.plan], PartWriter(args.work / "engine.jsonl"), deadline)


if __name__ == "__main__":
    main()
