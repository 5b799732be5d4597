"""`llmbench profile`: where a step's time goes, op by op, against each op's own roof.

Builds an `LLMEngine` on the CPU (the profiler records CPU activities), sets up `batch`
sequences at `context` tokens (prefilled first, untimed), then runs real engine steps — decode
steps of the whole batch, verify steps (speculative decoding: each sequence's last token and
k drafts, k + 1 query rows), or prefill steps of `batch` prompts of `context` tokens — under
`torch.profiler` (CPU activities, input shapes). Each step's top-level profiler events are
attributed to the model's ops (`profile_ops.classify`; the stacked decode layers are timed op by
op on their own clock instead, `_profiled`), and each op is put on the roofline with
its share of the cost model's bytes and FLOPs
(`profile_costs.op_costs`: they add up to exactly `cost_model.step_cost` of the step):

  achieved = bytes (FLOPs) / the op's time per step
  bound    = max(bytes / read roof, FLOPs / matmul roof)   (the op's roofline time)
  % roof   = bound / time;  time lost = time − bound

and the step as a whole: its wall time (the profiler's span of `engine.step()`), the cost
model's bound for it, the time no op holds (Python, dispatch, scheduling: wall − Σ ops), and
its wall time without the profiler (the profiler's own overhead is the difference).

Torch and the engine are imported inside the functions (harness layer rules).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from llmbench.errors import UserError
from llmbench.roofline.ceilings import exceeds_ceiling_line, mem_available_bytes
from llmbench.roofline.cost_model import (
    BYTES_PER_ELEM,
    StepShape,
    loaded_bytes_per_param,
    step_cost,
)
from llmbench.roofline.profile_costs import OPS, OpCost, kernel_costs, op_costs
from llmbench.roofline.profile_ops import OpEvent, classify

if TYPE_CHECKING:  # the engine is imported lazily: the roofline layer loads without torch
    from llmbench.engine.engine import EngineConfig

STEP_SCOPE = "llmbench::step"  # the profiler span around each engine.step()
PHASES = ("decode", "prefill", "verify")


@dataclass(frozen=True)
class ProfileSpec:
    """What to profile: a model and dtype, each (batch, context) point, the phase, how many
    measured steps per point (after `num_warmup_steps` unmeasured ones); `quantize`, the
    weights' scheme as the engine takes it (`int8`, `int4`, ...; None: the dtype's);
    `num_drafts`, the draft tokens each sequence verifies a step (phase verify)."""

    model: str
    dtype: str = "bfloat16"
    batches: tuple[int, ...] = (1,)
    contexts: tuple[int, ...] = (1024,)
    phase: str = "decode"
    num_steps: int = 8
    num_warmup_steps: int = 2
    threads: int | None = None
    seed: int = 0
    quantize: str | None = None
    num_drafts: int = 4

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise UserError(f"profile: --phase {self.phase}: use decode, prefill or verify")
        if self.phase == "verify" and self.num_drafts < 1:
            raise UserError(f"profile: --drafts {self.num_drafts}: a verify needs >= 1 draft")
        if self.num_steps < 1 or self.num_warmup_steps < 0:
            raise UserError("profile: --steps must be >= 1")
        if not self.batches or min(self.batches) < 1 or not self.contexts:
            raise UserError("profile: --batch and --context need values >= 1")
        if self.phase != "prefill" and min(self.contexts) < self.num_warmup_steps + 2:
            raise UserError(
                f"profile: --context {min(self.contexts)}: a {self.phase} needs at least "
                f"{self.num_warmup_steps + 2} tokens of context"
            )


@dataclass(frozen=True)
class ProfiledStep:
    """One engine step under the profiler: its wall time, its top-level events, its record
    (`num_draft_tokens`: the drafts it verified, each a query row that needs logits)."""

    wall_us: float
    events: tuple[OpEvent, ...]
    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_draft_tokens: int = 0


def profile(
    spec: ProfileSpec,
    engine_config: EngineConfig,
    roofs: dict[str, Any],
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Profile every (batch, context) point of `spec` against `roofs` (`ceilings.ceilings`),
    on an engine of `engine_config` (the spec's model, dtype and threads, as
    `harness.engine_config` translates them) sized here for the points, on the CPU.

    Returns plain data: the model, the roofs used and where they came from, the machine's load
    before and after, and per point its ops (`point_result`)."""
    from llmbench.engine.engine import LLMEngine
    from llmbench.engine.weights import open_weights

    say = say or (lambda message: None)
    config = open_weights(spec.model).config
    if config.num_experts:
        raise UserError(f"profile: {spec.model} is a mixture of experts; profile a dense model")
    room = max(_tokens_past_context(spec), 1)  # tokens past the context (prefill: its first)
    longest = max(spec.contexts) + room
    if longest > config.max_position_embeddings:
        raise UserError(
            f"profile: --context {max(spec.contexts)} leaves no room for the {room} token(s) its "
            f"steps add in the model's {config.max_position_embeddings}-token window; give a "
            "shorter context"
        )
    # A point's prompts prefilled in one step: decode points then start together (prefilled
    # over several steps, the first sequences decoded during the later ones and finished
    # early, and the unprofiled steps ran fewer of them: at 32 streams 41.9 → 18.5 ms a step
    # over eight steps, reported as the profiler's overhead).
    batched = max(spec.batches) * max(spec.contexts)
    kv_bytes = _kv_bytes(config, spec, longest)
    check_memory(config, spec, kv_bytes, batched, mem_available_bytes())
    engine = LLMEngine(
        replace(
            engine_config,
            device="cpu",  # the profiler records CPU activities: a GPU's kernels run async
            max_num_seqs=max(spec.batches),
            max_num_batched_tokens=max(2048, batched),
            enable_prefix_caching=False,
            kv_cache_memory=kv_bytes,
        ),
        proposer=FixedDrafts(spec.num_drafts) if spec.phase == "verify" else None,
    )
    import torch

    weight_bpp, lm_head_bpp = loaded_bytes_per_param(config, engine.model.weight_bytes)
    peaks = (roofs["read_bytes_per_s"], roofs["matmul_flops_per_s"].get(spec.dtype))
    rng = random.Random(spec.seed)
    load_before = os.getloadavg()[0]
    points = []
    is_clocked = False  # whether a fused stack of layers timed its ops on its own clock
    for context in spec.contexts:
        for batch in spec.batches:
            say(f"{spec.phase}, batch {batch}, context {context}")
            steps, unprofiled_ns = _run_point(engine, spec, batch, context, rng)
            is_clocked |= any(e.op is not None for step in steps for e in step.events)
            shapes = [
                step_shape(s, weight_bpp, engine.kv_cache.bytes_per_elem, lm_head_bpp)
                for s in steps
            ]
            point = point_result(config, steps, shapes, peaks, spec.dtype, engine.config.block_size)
            point.update(
                batch=batch,
                context=context,
                step_ms_unprofiled=statistics.mean(unprofiled_ns) / 1e6,
            )
            points.append(point)
    return {
        "model": spec.model,
        "dtype": spec.dtype,
        "quantize": spec.quantize,
        "phase": spec.phase,
        "num_drafts": spec.num_drafts if spec.phase == "verify" else 0,
        "device": roofs["device"],
        "threads": torch.get_num_threads(),
        "num_steps": spec.num_steps,
        "roofs": {
            "read_bytes_per_s": peaks[0],
            "flops_per_s": peaks[1],
            "sources": {
                "read_bytes_per_s": roofs["sources"].get("read_bytes_per_s", "probe read"),
                "read": roofs["sources"].get("read", "?"),
                "flops_per_s": roofs["sources"].get(spec.dtype, f"no {spec.dtype} matmul roof"),
            },
        },
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "clocked_layers": is_clocked,
        "points": points,
    }


def step_shape(
    step: ProfiledStep, weight_bpp: float, kv_bytes_per_elem: float, lm_head_bpp: float
) -> StepShape:
    """The cost model's view of a profiled step, as `roofline.cost_steps` builds it: each
    sequence a chunk of q tokens ending at its context c, its verified drafts' rows with
    logits."""
    return StepShape(
        prefill=tuple((c - q, q) for c, q in zip(step.context_lens, step.query_lens, strict=True)),
        weight_bytes_per_param=weight_bpp,
        kv_bytes_per_elem=kv_bytes_per_elem,
        lm_head_bytes_per_param=lm_head_bpp,
        num_draft_tokens=step.num_draft_tokens,
    )


def step_activation_bytes(config, dtype: str, tokens: int) -> int:
    """An upper estimate of one step's activations at `tokens` tokens: a layer's gate_up output
    and SwiGLU activation, its q, k and v, and four hidden-size tensors (x, the residual, the
    normed input, the attention output), all alive at once.

    Formula: tokens · elem · (3·I + q_size + 2·kv_size + 4·hidden), elem the dtype's bytes."""
    elem = int(BYTES_PER_ELEM[dtype])
    width = 3 * config.intermediate_size + config.q_size + 2 * config.kv_size
    return tokens * elem * (width + 4 * config.hidden_size)


def check_memory(
    config, spec: ProfileSpec, kv_bytes: int, tokens: int, available: int | None
) -> None:
    """Refuse, in one line and before anything is loaded, a profile whose weights (in the
    dtype), K/V cache and one step's activations (a point prefills its prompts in one step of
    batch × context tokens) would not fit the memory available (None: unknown, not checked)."""
    elem = int(BYTES_PER_ELEM[spec.dtype])
    weights = config.num_params() * elem
    activations = step_activation_bytes(config, spec.dtype, tokens)
    need = weights + kv_bytes + activations
    if available is not None and need > available:
        raise UserError(
            f"profile: --batch {max(spec.batches)} × --context {max(spec.contexts)} needs "
            f"~{need / 1e9:.1f} GB (weights {weights / 1e9:.1f}, K/V cache {kv_bytes / 1e9:.1f}, "
            f"one step of {tokens:,} tokens {activations / 1e9:.1f}), more than the "
            f"{available / 1e9:.1f} GB available; profile fewer streams or a shorter context"
        )


def _kv_bytes(config, spec: ProfileSpec, longest: int) -> int:
    """A K/V cache that holds the largest point's sequences whole (prefill: its prompts)."""
    from llmbench.engine.kv_cache import blocks_for
    from llmbench.engine.kv_dtype import KVCacheDtype, bytes_per_token

    block_size = 16  # EngineConfig's
    elem = int(BYTES_PER_ELEM[spec.dtype])
    per_token = bytes_per_token(
        config.num_layers, config.num_kv_heads, config.head_dim, KVCacheDtype(), elem
    )
    tokens = max(spec.batches) * (blocks_for(longest, block_size) + 1) * block_size
    return tokens * per_token


def _tokens_past_context(spec: ProfileSpec) -> int:
    """How far a point's sequences may grow past its context: a decode step adds one token, a
    verify step up to k + 1 (and its sequence needs room for k more drafts); prefill none."""
    steps = spec.num_warmup_steps + 2 * spec.num_steps + 2
    if spec.phase == "decode":
        return steps
    if spec.phase == "verify":
        return steps * (spec.num_drafts + 1) + spec.num_drafts + 1
    return 0


class FixedDrafts:
    """A proposer that drafts k tokens for every sequence each step (its last k tokens again):
    each step verifies k + 1 rows a sequence, whether its drafts are accepted or not, as a
    speculative run's steps do while every sequence finds drafts. No model runs."""

    model_config = None
    draft_passes: tuple = ()

    def __init__(self, num_drafts: int):
        self.num_drafts = num_drafts

    def propose(self, seqs, running) -> None:
        from llmbench.engine.speculative import max_draft_tokens

        for seq in seqs:
            k = max_draft_tokens(seq, self.num_drafts)
            seq.spec_token_ids = list(seq.token_ids[-k:]) if k else []
            seq.spec_probs = None


def _requests(engine, batch: int, prompt_len: int, max_tokens: int, rng: random.Random) -> list:
    """`batch` requests of random prompts (distinct: no prefix is shared), greedy, EOS ignored."""
    from llmbench.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    return [
        engine.add_request([rng.randrange(vocab) for _ in range(prompt_len)], params)
        for _ in range(batch)
    ]


def _run_point(
    engine, spec: ProfileSpec, batch: int, context: int, rng: random.Random
) -> tuple[list[ProfiledStep], list[int]]:
    """The profiled steps of one point and the wall times (ns) of as many steps unprofiled.

    Decode: `batch` prompts of context − 1 − warm-up tokens are prefilled (untimed), then
    `num_warmup_steps` decode steps, so the first profiled step runs at `context`. Verify: the
    same with k + 1 rows a sequence a step (from `context` on: a step adds 1 to k + 1 tokens,
    as many as were accepted). Prefill: every step gets `batch` fresh prompts of `context`
    tokens, one token to generate."""
    num_steps, num_warmup = spec.num_steps, spec.num_warmup_steps
    rows = 1 + (spec.num_drafts if spec.phase == "verify" else 0)
    expected_queries = (context if spec.phase == "prefill" else rows,) * batch
    if spec.phase != "prefill":
        max_tokens = _tokens_past_context(spec)
        ids = _requests(engine, batch, context - 1 - num_warmup, max_tokens, rng)
        started: set[str] = set()
        while len(started) < batch:  # the prefill: until every sequence has its first token
            started |= {out.request_id for out in engine.step() if out.new_token_ids}
        for _ in range(num_warmup):
            engine.step()
        steps = _profiled(engine, num_steps, lambda: None)
        unprofiled = [_timed_step(engine, expected_queries) for _ in range(num_steps)]
        for request_id in ids:
            engine.abort(request_id)
        engine.step()  # takes the aborts in: their blocks are free for the next point
    else:

        def add() -> None:
            _requests(engine, batch, context, 1, rng)

        for _ in range(num_warmup):
            add()
            engine.step()
        steps = _profiled(engine, num_steps, add)
        unprofiled = []
        for _ in range(num_steps):
            add()
            unprofiled.append(_timed_step(engine, expected_queries))
    for step in steps:
        _check_queries(step.query_lens, expected_queries)
    return steps, unprofiled


def _check_queries(query_lens: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """A measured step ran the point's batch: `batch` × 1 query row (decode), × k + 1
    (verify) or × context (prefill)."""
    if tuple(query_lens) != expected:
        raise UserError(
            f"profile: a step ran query lengths {tuple(query_lens)[:4]}..., not "
            f"{len(expected)} x {expected[0]}: the engine split the batch"
        )


# The C++ extension's fused decode layer and stack of layers ("<namespace>::decode_layer",
# "<namespace>::decode_layers"), which `_profiled` opens: their ops are their children, or, for
# the stack, its own clock's op times (`FUSED_LAYER_OPS`).
FUSED_LAYERS = ("::decode_layer", "::decode_layers")
CLOCKED_LAYERS = "::decode_layers"
# The rows of `decode_layers`' op clock (csrc/decode_layer.cpp's OpClock), in a layer's order.
FUSED_LAYER_OPS = (
    "rms_norm",
    "qkv_proj",
    "rope",
    "kv_write",
    "attention",
    "o_proj",
    "rms_norm",
    "gate_up_proj",
    "silu_mul",
    "down_proj",
)


def _timed_step(engine, expected_queries: tuple[int, ...]) -> int:
    t0 = time.perf_counter_ns()
    engine.step()
    elapsed = time.perf_counter_ns() - t0
    _check_queries(engine.step_records[-1].query_lens, expected_queries)
    return elapsed


def _profiled(engine, num_steps: int, before_each: Callable[[], None]) -> list[ProfiledStep]:
    """`num_steps` engine steps under torch.profiler, each in a `STEP_SCOPE` span (what
    `before_each` does stays out of it): each step's wall time and top-level events (a fused
    decode layer's own ops in its place).

    The stack of fused decode layers times its ops on its own clock (`model.layer_op_ns`) and
    leaves the profiler no event inside: ~300 events a step would cost ~2-3 ms of the profiler's
    own, as much as a fifth of a small model's step, between the ops they time."""
    import torch
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    model = engine.model
    op_ns = torch.zeros(len(model.layers), len(FUSED_LAYER_OPS), dtype=torch.int64)
    records, layer_op_ns = [], []
    model.layer_op_ns = op_ns
    try:
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(num_steps):
                before_each()
                op_ns.zero_()
                with record_function(STEP_SCOPE):
                    engine.step()
                records.append(engine.step_records[-1])
                layer_op_ns.append(op_ns.tolist())
    finally:
        model.layer_op_ns = None
    events = prof.events()
    scopes = sorted((e for e in events if e.name == STEP_SCOPE), key=lambda e: e.time_range.start)
    children: dict[int, list] = {scope.id: [] for scope in scopes}
    for event in events:
        parent = event.cpu_parent
        if parent is not None and parent.id in children:
            children[parent.id].append(event)
    steps = []
    for scope, record, clocked in zip(scopes, records, layer_op_ns, strict=True):
        events = []
        for event in sorted(children[scope.id], key=lambda e: e.time_range.start):
            events += _top_events(event, clocked)
        steps.append(
            ProfiledStep(
                wall_us=scope.time_range.elapsed_us(),
                events=tuple(events),
                context_lens=tuple(record.context_lens),
                query_lens=tuple(record.query_lens),
                num_draft_tokens=record.num_proposed_tokens,
            )
        )
    return steps


def _top_events(event, layer_op_ns: list[list[int]]) -> list[OpEvent]:
    """A step's top-level profiler event as the events to classify: a fused stack of decode
    layers as its clock's op times (`layer_op_ns`, layer by layer, each row an event that names
    its op), a fused layer as its ops (through the dispatcher: the profiler records each), any
    other event as itself."""
    if event.name.endswith(CLOCKED_LAYERS) and any(map(any, layer_op_ns)):
        return [
            OpEvent(f"{event.name}[{op}]", (), ns / 1e3, op=op)
            for layer in layer_op_ns
            for op, ns in zip(FUSED_LAYER_OPS, layer, strict=True)
        ]
    inner = event.cpu_children if event.name.endswith(FUSED_LAYERS) else [event]
    return [
        OpEvent(e.name, _shapes(e.input_shapes), e.time_range.elapsed_us())
        for e in sorted(inner, key=lambda e: e.time_range.start)
    ]


def _shapes(input_shapes: Sequence) -> tuple[tuple[int, ...], ...]:
    """The profiler's input shapes as tuples of ints (a tensor list or scalar: ())."""
    return tuple(
        tuple(v for v in shape if isinstance(v, int)) if isinstance(shape, list) else ()
        for shape in input_shapes
    )


def point_result(
    config,
    steps: Sequence[ProfiledStep],
    shapes: Sequence[StepShape],
    peaks: tuple[float, float | None],
    dtype: str,
    block_size: int,
) -> dict[str, Any]:
    """One point's table: per op (`OPS` order, ops with no event and no cost left out) its
    calls and time per step, share of the step, bytes and FLOPs (mean of the steps' costs),
    achieved rates, roofline bound, fraction of its roof and time lost; and the step's totals.

    Formula: bound = max(bytes / read roof, FLOPs / matmul roof); roof_fraction = bound / time;
    lost = time − bound; unattributed = step wall − Σ op times (per step, means over steps).
    """
    bandwidth, peak_flops = peaks
    num_steps = len(steps)
    time_us: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    aten: dict[str, Counter[str]] = {op: Counter() for op in OPS}
    for step in steps:
        for event, op in zip(step.events, classify(step.events, config), strict=True):
            time_us[op] += event.duration_us
            calls[op] += 1
            aten[op][event.name] += 1
    costs = _mean_costs([op_costs(config, shape) for shape in shapes])
    kernel = _mean_costs([kernel_costs(config, shape, dtype, block_size) for shape in shapes])
    whole = [step_cost(config, shape) for shape in shapes]
    step_bytes = statistics.mean(c.bytes for c in whole)
    step_flops = statistics.mean(c.flops for c in whole)
    step_ms = statistics.mean(s.wall_us for s in steps) / 1e3

    def bound_ms(num_bytes: float, flops: float) -> float:
        return 1e3 * max(num_bytes / bandwidth, flops / peak_flops if peak_flops else 0.0)

    ops = []
    for op in OPS:
        cost = costs.get(op, OpCost())
        ms = time_us[op] / num_steps / 1e3
        if not calls[op] and not cost.bytes and not cost.flops:
            continue
        bound = bound_ms(cost.bytes, cost.flops)
        ops.append(
            {
                "op": op,
                "calls_per_step": calls[op] / num_steps,
                "ms_per_step": ms,
                "share": ms / step_ms,
                "bytes": cost.bytes,
                "flops": cost.flops,
                "bytes_per_s": cost.bytes / (ms / 1e3) if ms else None,
                "flops_per_s": cost.flops / (ms / 1e3) if ms else None,
                "bound_ms": bound,
                "roof_fraction": bound / ms if ms else None,
                "lost_ms": ms - bound,
                "aten_ops": dict(aten[op].most_common()),
                **(
                    {"kernel_bytes": kernel[op].bytes, "kernel_flops": kernel[op].flops}
                    if op in kernel
                    else {}
                ),
            }
        )
    attributed_ms = sum(row["ms_per_step"] for row in ops)
    step_bound = bound_ms(step_bytes, step_flops)
    achieved = step_bytes / (step_ms / 1e3)
    warnings = [
        line
        for line in (
            exceeds_ceiling_line("step bandwidth", achieved, bandwidth, "GB/s", 1e9),
            exceeds_ceiling_line(
                "step FLOP/s", step_flops / (step_ms / 1e3), peak_flops, "GFLOP/s", 1e9
            ),
        )
        if line is not None
    ]
    above = [row["op"] for row in ops if (row["roof_fraction"] or 0) > 1]
    if above:
        warnings.append(
            f"above their own roof: {', '.join(above)} (their bytes came from cache, not "
            "memory: the data is small enough to stay there between steps)"
        )
    return {
        "ops": ops,
        "step_ms": step_ms,
        "bytes": step_bytes,
        "flops": step_flops,
        "bytes_per_s": achieved,
        "flops_per_s": step_flops / (step_ms / 1e3),
        "bound_ms": step_bound,
        "roof_fraction": step_bound / step_ms,
        "lost_ms": step_ms - step_bound,
        "attributed_ms": attributed_ms,
        "unattributed_ms": step_ms - attributed_ms,
        "attributed_fraction": attributed_ms / step_ms,
        "steps": [
            {
                "wall_ms": s.wall_us / 1e3,
                "context_lens": list(s.context_lens),
                "query_lens": list(s.query_lens),
                "num_draft_tokens": s.num_draft_tokens,
            }
            for s in steps
        ],
        "warnings": warnings,
    }


def _mean_costs(per_step: Sequence[dict[str, OpCost]]) -> dict[str, OpCost]:
    """The mean of each op's cost over the steps (ops every step has)."""
    if not per_step or not per_step[0]:
        return {}
    return {
        op: OpCost(
            statistics.mean(costs[op].bytes for costs in per_step),
            statistics.mean(costs[op].flops for costs in per_step),
        )
        for op in per_step[0]
    }
