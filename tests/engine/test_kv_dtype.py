"""llmbench.engine.kv_dtype: K/V format names, `k=int8,v=int4` parsing, bytes per token."""

from __future__ import annotations

import pytest

from llmbench.engine.kv_dtype import KVCacheDtype, bytes_per_token, parse_kv_cache_dtype
from llmbench.engine.presets import PRESETS
from llmbench.errors import UserError


@pytest.mark.parametrize(
    ("text", "k", "v"),
    [
        ("int8", "int8", "int8"),
        ("auto", "auto", "auto"),
        ("k=int8,v=int4", "int8", "int4"),
        (" k = bfloat16 , v = int8 ", "bfloat16", "int8"),
        ("v=int4", "auto", "int4"),
        ("k=int4", "int4", "auto"),
    ],
)
def test_parse(text, k, v):
    assert parse_kv_cache_dtype(text) == KVCacheDtype(k, v)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("int3", "k=int3: unknown"),
        ("k=int8,v=int9", "v=int9: unknown"),
        ("k=int8,k=int4", "expected a format"),
        ("q=int8", "expected a format"),
        ("k=int8;v=int4", "unknown"),
    ],
)
def test_parse_refuses_in_one_line(text, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_kv_cache_dtype(text)


def test_resolve_and_label():
    kv = KVCacheDtype("auto", "int4").resolve("bfloat16")
    assert kv == KVCacheDtype("bfloat16", "int4")
    assert kv.label == "k=bfloat16,v=int4" and kv.is_quantized
    assert KVCacheDtype("int8", "int8").label == "int8"
    assert parse_kv_cache_dtype(kv.label) == kv
    assert not KVCacheDtype().resolve("float32").is_quantized


# SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64. Per layer, head and side: float32 256 bytes,
# bfloat16 128, int8 64 + 2 = 66, int4 32 + 2 = 34.
@pytest.mark.parametrize(
    ("kv", "model_bytes", "expected"),
    [
        (KVCacheDtype(), 4, 30 * 3 * 512),  # 46,080
        (KVCacheDtype(), 2, 30 * 3 * 256),  # 23,040
        (KVCacheDtype("bfloat16", "int8"), 4, 30 * 3 * (128 + 66)),
        (KVCacheDtype("int8", "int8"), 2, 30 * 3 * 132),  # 11,880
        (KVCacheDtype("int8", "int4"), 2, 30 * 3 * 100),
        (KVCacheDtype("int4", "int4"), 2, 30 * 3 * 68),  # 6,120
    ],
)
def test_bytes_per_token_smollm2(kv, model_bytes, expected):
    cfg = PRESETS["smollm2-135m"]
    got = bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, kv, model_bytes)
    assert got == expected
    if kv == KVCacheDtype():
        assert got == cfg.kv_bytes_per_token(model_bytes)  # the model config's own count
