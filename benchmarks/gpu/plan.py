"""What a sitting runs: the GPU plan (an H100/H200, the issue's shapes) and the CPU dry run (the
same steps on `synthetic:tiny` and tiny shapes, Triton in its interpreter), as data.

Time: the GPU plan must end within 8 minutes (480 s) of starting; `total_s` leaves 15 s for
the interpreter start and the summary. Each step gets `box_s` at most and never eats into the
`reserve_s` of the steps after it (`budget.step_timeout_s`). The boxes add up to more than the
total on purpose: a step that ends early hands its time on. Worst case, every step running into
its box: device 30, pytest min(90, 435 − 240) = 90, parity min(50, 345 − 220) = 50, roofs
min(75, 295 − 190) = 75, engine min(200, 220 − 70) = 150, run 70: 465 s.
"""

from __future__ import annotations

from dataclasses import dataclass

# Steps in the order they run; each is one child process.
STEPS = ("device", "pytest", "parity", "roofs", "engine", "run")


@dataclass(frozen=True)
class Budget:
    """A step's time: at most `box_s`; the steps before it leave it at least `reserve_s`."""

    box_s: float
    reserve_s: float


@dataclass(frozen=True)
class Plan:
    """Everything that differs between the GPU sitting and its CPU dry run."""

    name: str
    device: str  # cuda | cpu
    dtype: str  # the engine's dtype for decode, prefill and the profile
    model: str  # the decode/prefill/profile/run model
    total_s: float
    budgets: tuple[tuple[str, Budget], ...]
    # (a) pytest: the test files are chosen by `sitting.pytest_files` (gpu-marked + Triton
    # kernels) on a GPU; the dry run names a few interpreted kernel tests instead.
    pytest_files: tuple[str, ...] | None
    pytest_select: str  # -k expression ("" = all)
    # (b) engine vs transformers: tiny random checkpoints, prefill + this many decode steps.
    parity_dtypes: tuple[str, ...]
    parity_archs: tuple[str, ...] = ("llama", "qwen3-moe")
    num_parity_decode_steps: int = 20
    # (c) roofs: `ceilings.ceilings` (what `llmbench hardware` runs) within this budget, and the
    # fp8 matmul at this size.
    roofs_budget_s: float = 60.0
    fp8_matmul_n: int = 8192
    # (d) decode points: batch x context, graphs on then off, warm-up + measured steps each.
    decode_batches: tuple[int, ...] = (1, 8, 64)
    decode_contexts: tuple[int, ...] = (1024, 8192)
    num_warmup_steps: int = 3
    num_decode_steps: int = 20
    # The paged decode attention kernel alone (the 0.8-of-HBM target): batch, context.
    attention_point: tuple[int, int] = (64, 8192)
    # (e) prefill of one prompt of each length, repeated (the best and the median are kept).
    prefill_tokens: tuple[int, ...] = (2048, 8192)
    num_prefill_repeats: int = 3
    # (f) torch.profiler over eager decode steps at these batches (context 1k).
    profile_batches: tuple[int, ...] = (1, 64)
    profile_context: int = 1024
    num_profile_steps: int = 3
    # The engine's K/V cache: bytes, or None for the engine's default (90% of free GPU memory).
    kv_cache_memory: float | None = None
    # Parts of the engine step: each a box within the step's time (`budget.step_timeout_s`).
    engine_parts: tuple[tuple[str, Budget], ...] = (
        ("load", Budget(90, 60)),
        ("decode", Budget(90, 30)),
        ("attention", Budget(10, 5)),
        ("prefill", Budget(25, 10)),
        ("profile", Budget(25, 10)),
    )
    # (f) `llmbench run workloads/agentic.yaml` with these --set overrides.
    run_sets: tuple[str, ...] = ()
    # Environment of every child (the dry run's Triton interpreter).
    env: tuple[tuple[str, str], ...] = ()

    def budget(self, step: str) -> Budget:
        return dict(self.budgets)[step]

    def later_reserve_s(self, step: str) -> float:
        """Σ reserve_s of the steps after `step`."""
        names = [name for name, _ in self.budgets]
        return sum(b.reserve_s for _, b in self.budgets[names.index(step) + 1 :])


GPU = Plan(
    name="gpu",
    device="cuda",
    dtype="bfloat16",
    model="synthetic:llama-3.1-8b",
    total_s=465.0,
    budgets=(
        ("device", Budget(30, 10)),
        ("pytest", Budget(90, 30)),
        ("parity", Budget(50, 20)),
        ("roofs", Budget(75, 30)),
        ("engine", Budget(200, 120)),
        ("run", Budget(100, 70)),
    ),
    pytest_files=None,
    pytest_select="",
    parity_dtypes=("float32", "float16", "bfloat16"),
    run_sets=(
        "model=synthetic:llama-3.1-8b",
        "workload.sessions=16",
        "load.concurrency=16",
        "engine.max_num_seqs=16",
        "workload.tool_latency_s=0.1",
    ),
)

# The same steps on this CPU in well under a minute: float32 (bfloat16 is wrong in Triton's
# interpreter), synthetic:tiny, contexts and batches a few tokens long.
CPU_DRY_RUN = Plan(
    name="cpu-dry-run",
    device="cpu",
    dtype="float32",
    model="synthetic:tiny",
    total_s=240.0,
    budgets=(
        ("device", Budget(30, 5)),
        ("pytest", Budget(60, 10)),
        ("parity", Budget(60, 10)),
        ("roofs", Budget(30, 10)),
        ("engine", Budget(60, 20)),
        ("run", Budget(60, 20)),
    ),
    pytest_files=("tests/kernels/test_rms_norm.py",),
    pytest_select="kernel_matches_reference and 7",
    parity_dtypes=("float32", "float16"),
    num_parity_decode_steps=6,
    roofs_budget_s=3.0,
    fp8_matmul_n=256,
    decode_batches=(1, 4),
    decode_contexts=(64, 256),
    num_warmup_steps=1,
    num_decode_steps=4,
    attention_point=(2, 64),
    prefill_tokens=(64, 256),
    num_prefill_repeats=2,
    profile_batches=(1, 4),
    profile_context=64,
    num_profile_steps=2,
    kv_cache_memory=1 << 24,
    engine_parts=(
        ("load", Budget(20, 10)),
        ("decode", Budget(20, 5)),
        ("attention", Budget(10, 5)),
        ("prefill", Budget(10, 5)),
        ("profile", Budget(10, 5)),
    ),
    run_sets=(
        "model=synthetic:tiny",
        "dtype=float32",
        "workload.sessions=2",
        "load.concurrency=2",
        "workload.tool_latency_s=0.02",
        "warmup_requests=0",
    ),
    # Triton's interpreter for the attention kernel; torch's CPU ops, not the C++ extension (a
    # CPU-only path, and a fresh machine would compile it first).
    env=(("TRITON_INTERPRET", "1"), ("LLMBENCH_CPU_EXTENSION", "torch")),
)

PLANS = {plan.name: plan for plan in (GPU, CPU_DRY_RUN)}
