"""`profile` on synthetic:tiny: real engine steps under torch.profiler, every event named, the
ops' bytes and FLOPs adding up to the cost model's step, the time nobody holds reported."""

from __future__ import annotations

import pytest

from llmbench.engine.presets import PRESETS
from llmbench.errors import UserError
from llmbench.harness.engine_config import engine_config
from llmbench.harness.spec import EngineSpec
from llmbench.roofline import profile_table
from llmbench.roofline.cost_model import StepShape, step_cost
from llmbench.roofline.profile import ProfileSpec, check_memory, profile
from llmbench.roofline.profile_costs import OPS

# Roofs given, not measured: 10 GB/s read, 100 GFLOP/s in every dtype.
ROOFS = {
    "device": "cpu0",
    "read_bytes_per_s": 10e9,
    "matmul_flops_per_s": {"float32": 100e9, "bfloat16": 100e9},
    "sources": {"read": "given", "read_bytes_per_s": "probe read: given"},
}


def _engine(spec: ProfileSpec):
    """The engine config `llmbench profile` hands `profile` for `spec`."""
    return engine_config(
        spec.model, spec.dtype, "cpu", EngineSpec(threads=spec.threads, quantize=spec.quantize)
    )


@pytest.fixture(
    scope="module", params=[("bfloat16", "decode"), ("float32", "prefill"), ("float32", "verify")]
)
def result(request):
    dtype, phase = request.param
    spec = ProfileSpec(
        "synthetic:tiny",
        dtype,
        batches=(1, 3),
        contexts=(24,),
        phase=phase,
        num_steps=2,
        num_warmup_steps=1,
        num_drafts=3,
    )
    return profile(spec, _engine(spec), ROOFS)


def test_every_point_is_the_steps_it_asked_for(result):
    assert [(p["batch"], p["context"]) for p in result["points"]] == [(1, 24), (3, 24)]
    for point in result["points"]:
        batch = point["batch"]
        for k, step in enumerate(point["steps"]):
            if result["phase"] == "decode":  # the first profiled step runs at the context
                assert step["context_lens"] == [24 + k] * batch
                assert step["query_lens"] == [1] * batch
            elif result["phase"] == "verify":  # the last token and 3 drafts a sequence
                assert step["query_lens"] == [4] * batch
                assert step["num_draft_tokens"] == 3 * batch
                # from the context on (a step adds 1-4 tokens: its accepted drafts and one)
                assert all(c >= 24 + 3 + k for c in step["context_lens"])
            else:  # a whole prompt of each sequence in one step
                assert step["context_lens"] == step["query_lens"] == [24] * batch


def test_a_decode_point_whose_prompts_outgrow_one_default_step_starts_them_together():
    """3 prompts of ~1,000 tokens (more than the 2,048-token default budget of a step): were
    they prefilled over two steps, the first would decode during the second, run ahead and
    finish early, and the unprofiled steps would time a smaller batch (which `profile` now
    refuses)."""
    spec = ProfileSpec(
        "synthetic:tiny", "float32", batches=(3,), contexts=(1000,), num_steps=2, num_warmup_steps=1
    )
    (point,) = profile(spec, _engine(spec), ROOFS)["points"]
    assert [step["context_lens"] for step in point["steps"]] == [[1000] * 3, [1001] * 3]
    assert point["step_ms_unprofiled"] > 0


def test_the_ops_bytes_and_flops_add_up_to_the_cost_models_step(result):
    """The cost model's step (weights in the run's dtype, tied lm_head: bytes per parameter
    = the dtype's size; K/V in the model's dtype) from the steps' own shapes."""
    size = {"bfloat16": 2, "float32": 4}[result["dtype"]]
    for point in result["points"]:
        costs = [
            step_cost(
                PRESETS["tiny"],
                StepShape(
                    prefill=tuple(
                        (c - q, q) for c, q in zip(s["context_lens"], s["query_lens"], strict=True)
                    ),
                    weight_bytes_per_param=size,
                    kv_bytes_per_elem=size,
                    num_draft_tokens=s["num_draft_tokens"],  # rows with logits: k + 1
                ),
            )
            for s in point["steps"]
        ]
        expected_bytes = sum(c.bytes for c in costs) / len(costs)
        expected_flops = sum(c.flops for c in costs) / len(costs)
        assert sum(op["bytes"] for op in point["ops"]) == pytest.approx(expected_bytes)
        assert sum(op["flops"] for op in point["ops"]) == pytest.approx(expected_flops)
        assert point["bytes"] == pytest.approx(expected_bytes)


def test_every_op_is_named_and_the_shares_leave_a_remainder(result):
    for point in result["points"]:
        names = [op["op"] for op in point["ops"]]
        assert names == [op for op in OPS if op in names]  # forward order, known names
        assert set(names) == set(OPS)  # the torch path runs every one of them
        for op in point["ops"]:
            assert op["calls_per_step"] > 0 and op["ms_per_step"] > 0
            assert op["lost_ms"] == pytest.approx(op["ms_per_step"] - op["bound_ms"])
            assert op["aten_ops"]
        assert sum(op["share"] for op in point["ops"]) <= 1 + 1e-9
        assert point["attributed_ms"] + point["unattributed_ms"] == pytest.approx(point["step_ms"])
        assert point["unattributed_ms"] >= 0
        assert point["attributed_fraction"] == pytest.approx(
            point["attributed_ms"] / point["step_ms"]
        )
        assert point["step_ms_unprofiled"] > 0


def test_a_decode_steps_layers_are_timed_by_the_stacks_own_clock(result):
    """A decode step runs every layer in one C++ call that times its ops itself (and leaves the
    profiler no event inside): each layer op is one row of that clock a layer; a prefill step's
    ops are the profiler's events."""
    is_decode = result["phase"] != "prefill"  # a verify step is decode-shaped
    assert result["clocked_layers"] is is_decode
    layers = PRESETS["tiny"].num_layers
    for point in result["points"]:
        ops = {op["op"]: op for op in point["ops"]}
        for name in ("qkv_proj", "rope", "kv_write", "attention", "o_proj", "silu_mul"):
            clocked = [e for e in ops[name]["aten_ops"] if e.endswith(f"::decode_layers[{name}]")]
            assert len(clocked) == is_decode
            if is_decode:
                assert ops[name]["aten_ops"] == {clocked[0]: layers * 2}  # 2 steps
                assert ops[name]["calls_per_step"] == layers
    text = "\n".join(profile_table.lines(result))
    assert ("the C++ decode layers' ops timed on their own clock" in text) is is_decode


def test_the_bounds_are_the_roofs_over_bytes_and_flops(result):
    for point in result["points"]:
        for op in point["ops"]:
            expected = 1e3 * max(op["bytes"] / 10e9, op["flops"] / 100e9)
            assert op["bound_ms"] == pytest.approx(expected)
        assert point["bound_ms"] == pytest.approx(
            1e3 * max(point["bytes"] / 10e9, point["flops"] / 100e9)
        )


def test_the_table_has_a_row_per_op_and_the_remainder(result):
    text = "\n".join(profile_table.lines(result))
    point = result["points"][0]
    rows = [line.split()[0] for line in profile_table.point_lines(point)[2:]]
    assert rows[: len(OPS)] == list(OPS)
    assert rows[len(OPS) : len(OPS) + 2] == ["attributed", "unattributed"]
    assert "(Python, dispatch, the profiler's own)" in text
    phase = {"verify": "verify (3 drafts a sequence)"}.get(result["phase"], result["phase"])
    assert text.startswith(f"synthetic:tiny {result['dtype']}, {phase}, 2 steps")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"phase": "train"}, "--phase train: use decode, prefill or verify"),
        ({"phase": "verify", "num_drafts": 0}, "--drafts 0: a verify needs >= 1 draft"),
        ({"num_steps": 0}, "--steps must be >= 1"),
        ({"batches": (0,)}, "--batch and --context need values >= 1"),
        ({"contexts": (2,)}, "--context 2: a decode needs at least 4 tokens"),
    ],
)
def test_a_bad_spec_is_a_user_error(kwargs, message):
    with pytest.raises(UserError, match=message):
        ProfileSpec("synthetic:tiny", **kwargs)


def test_a_context_past_the_window_and_a_mixture_of_experts_are_refused():
    """synthetic:tiny's window is 4,096 tokens. 8 steps after 2 of warm-up: a decode adds up to
    2 + 16 + 2 = 20 tokens past its context, a verify of 4 drafts 20 · 5 + 5 = 105."""
    with pytest.raises(UserError, match=r"leaves no room for the 20 token\(s\) its steps add"):
        spec = ProfileSpec("synthetic:tiny", contexts=(4090,))
        profile(spec, _engine(spec), ROOFS)
    with pytest.raises(UserError, match=r"--context 4000 leaves no room for the 105 token\(s\)"):
        spec = ProfileSpec("synthetic:tiny", contexts=(4000,), phase="verify")
        profile(spec, _engine(spec), ROOFS)
    with pytest.raises(UserError, match="mixture of experts"):
        spec = ProfileSpec("synthetic:tiny-moe")
        profile(spec, _engine(spec), ROOFS)


def test_a_point_too_large_for_memory_is_refused_before_anything_is_loaded():
    # synthetic:tiny (hidden 64, I 128, q 64, kv 32, 106,816 parameters), bfloat16: weights
    # 213,632 bytes; a step's activations 2·(3·128 + 64 + 2·32 + 4·64) = 1,536 bytes a token.
    tiny = PRESETS["tiny"]
    spec = ProfileSpec("synthetic:tiny", batches=(10,), contexts=(100,))
    need = 213_632 + 1_000_000 + 1000 * 1_536
    check_memory(tiny, spec, 1_000_000, 1000, available=need)
    check_memory(tiny, spec, 1_000_000, 1000, available=None)  # unknown: not checked
    with pytest.raises(UserError, match=r"--batch 10 × --context 100 needs ~0.0 GB .* K/V cache"):
        check_memory(tiny, spec, 1_000_000, 1000, available=need - 1)
    # End to end: a million streams of 4,000 tokens want ~1 TB of K/V cache alone.
    spec = ProfileSpec("synthetic:tiny", batches=(1_000_000,), contexts=(4000,), num_steps=1)
    with pytest.raises(UserError, match="profile fewer streams or a shorter context"):
        profile(spec, _engine(spec), ROOFS)


def test_an_int4_prefill_names_the_int4_matmuls_and_charges_the_bytes_loaded():
    """`--quantize int4`: a prefill's linear layers run the extension's `quant_gemm` on the
    codes (named by x's columns and the codes' row blocks), the lm_head (int8, as int4 schemes
    keep it) `quant_gemv` on the logit rows. synthetic:tiny's 2 layers hold 36,864 matrix
    weights each at 0.625 bytes (half a byte of code, a float16 scale and zero point per 32)
    and 128 norm weights at 2 (bfloat16), the final norm 64 at 2: 46,720 bytes over 74,048
    parameters; the lm_head 512·64 int8 codes and 512 float32 scales: 34,816 bytes."""
    spec = ProfileSpec(
        "synthetic:tiny",
        batches=(2,),
        contexts=(24,),
        phase="prefill",
        num_steps=2,
        num_warmup_steps=1,
        quantize="int4",
    )
    result = profile(spec, _engine(spec), ROOFS)
    assert result["quantize"] == "int4"
    text = "\n".join(profile_table.lines(result))
    assert text.startswith("synthetic:tiny bfloat16, int4 weights, prefill, 2 steps")
    (point,) = result["points"]
    ops = {op["op"]: op for op in point["ops"]}
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        assert [e.rpartition("::")[2] for e in ops[name]["aten_ops"]] == ["quant_gemm"]
    assert any(e.endswith("::quant_gemv") for e in ops["lm_head"]["aten_ops"])
    assert ops["qkv_proj"]["bytes"] == pytest.approx(46_720 / 74_048 * 2 * 64 * 128)
    assert ops["lm_head"]["bytes"] == pytest.approx(34_816)
