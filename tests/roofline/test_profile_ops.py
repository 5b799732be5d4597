"""Profiler events to ops: a step's top-level aten events, as the engine's torch path runs
them (the sequences below were read off `torch.profiler` for synthetic:tiny), each named."""

from __future__ import annotations

import dataclasses

from llmbench.engine import spans
from llmbench.engine.presets import PRESETS
from llmbench.roofline.profile_ops import OpEvent, classify

TINY = PRESETS["tiny"]  # h 64, q 64, kv 32, I 128, V 512, 2 layers


def ev(name: str, *shapes: tuple[int, ...]) -> OpEvent:
    return OpEvent(name, tuple(shapes), 1.0)


INPUTS = [ev("aten::lift_fresh", (2,)), ev("aten::arange"), ev("aten::cat"), ev("aten::index")]


def layer(weights_transposed: bool) -> list[tuple[OpEvent, str]]:
    """One bf16 decode layer of two rows (weights [out, in]: a `.t()` view before each matmul),
    or float32's (qkv and gate_up input-major: no `.t()`)."""
    t = weights_transposed
    return [
        (ev("aten::rms_norm", (2, 64), (), (64,)), "rms_norm"),
        *([(ev("aten::t", (128, 64)), "qkv_proj")] if t else []),
        (ev("aten::mm", (2, 64), (64, 128)), "qkv_proj"),
        (ev("aten::slice", (2, 128)), "rope"),
        (ev("aten::view_as_complex", (2, 6, 8, 2)), "rope"),
        (ev("aten::mul", (2, 6, 8), (2, 1, 8)), "rope"),
        (ev("aten::copy_", (2, 96), (2, 96)), "rope"),
        (ev("aten::view", (2, 64)), "rope"),
        (ev("aten::index_copy_", (512, 2, 2, 16), (), (2,), (2, 2, 2, 16)), "kv_write"),
        (ev("aten::index_select", (512, 2, 2, 16), (), (46,)), "attention"),
        (ev("aten::transpose", (2, 23, 2, 16)), "attention"),
        (ev("aten::scaled_dot_product_attention", (2, 2, 2, 16)), "attention"),
        (ev("aten::reshape", (2, 2, 2, 16)), "attention"),
        (ev("aten::view", (2, 4, 16)), "attention"),
        (ev("aten::t", (64, 64)), "o_proj"),
        (ev("aten::addmm", (2, 64), (2, 64), (64, 64)), "o_proj"),
        (ev("aten::rms_norm", (2, 64), (), (64,)), "rms_norm"),
        *([(ev("aten::t", (256, 64)), "gate_up_proj")] if t else []),
        (ev("aten::mm", (2, 64), (64, 256)), "gate_up_proj"),
        (ev("aten::slice", (2, 256)), "silu_mul"),
        (ev("aten::silu", (2, 128)), "silu_mul"),
        (ev("aten::mul", (2, 128), (2, 128)), "silu_mul"),
        (ev("aten::t", (64, 128)), "down_proj"),
        (ev("aten::addmm", (2, 64), (2, 128), (128, 64)), "down_proj"),
    ]


def step(weights_transposed: bool = True) -> list[tuple[OpEvent, str]]:
    return [
        *((e, "inputs") for e in INPUTS),
        (ev("aten::embedding", (512, 64), (2,)), "embedding"),
        *layer(weights_transposed),
        *layer(weights_transposed),
        (ev("aten::lift_fresh", (2,)), "lm_head"),  # the rows that need logits, gathered
        (ev("aten::index", (2, 64)), "lm_head"),
        (ev("aten::rms_norm", (2, 64), (), (64,)), "rms_norm"),
        (ev("aten::t", (512, 64)), "lm_head"),
        (ev("aten::mm", (2, 64), (64, 512)), "lm_head"),
        (ev("aten::to", (2, 512)), "sampling"),
        (ev("aten::argmax", (2, 512)), "sampling"),
    ]


def test_a_bfloat16_decode_step_is_named_op_by_op():
    events, expected = zip(*step(), strict=True)
    assert classify(events, TINY) == list(expected)


def test_input_major_weights_need_no_transpose():
    events, expected = zip(*step(weights_transposed=False), strict=True)
    assert classify(events, TINY) == list(expected)


def test_the_lm_head_is_told_apart_from_a_layer_of_the_same_shape():
    """A vocabulary of 2·I makes the lm_head [64, 256], gate_up_proj's shape: only a matmul after
    every layer's down_proj is the lm_head."""
    config = dataclasses.replace(TINY, vocab_size=256)
    events, expected = zip(*step(), strict=True)
    events = [
        ev("aten::mm", (2, 64), (64, 256)) if e.shapes == ((2, 64), (64, 512)) else e
        for e in events
    ]
    assert classify(events, config) == list(expected)


def test_linear_takes_its_weight_out_by_in():
    events = [ev("aten::linear", (2, 64), (128, 64)), ev("aten::linear", (2, 128), (64, 128))]
    assert classify(events, TINY) == ["qkv_proj", "down_proj"]


def test_an_unknown_matmul_belongs_to_the_region_it_runs_in():
    events = [ev("aten::mm", (2, 64), (64, 128)), ev("aten::mm", (6, 8), (8, 3))]
    assert classify(events, TINY) == ["qkv_proj", "rope"]


def test_the_engines_spans_name_its_host_work():
    """The spans the engine opens around its host work (`engine.spans`) are ops of their own,
    whatever ran before them; the ops around them are named as without them."""
    events, expected = zip(*step(), strict=True)
    events = [
        ev(spans.SCHEDULE),
        ev(spans.INPUTS),
        *events,
        ev(spans.SAMPLING),
        ev(spans.OUTPUTS),
    ]
    assert classify(events, TINY) == ["schedule", "inputs", *expected, "sampling", "outputs"]
