"""K/V cache storage formats: their names, `k=int8,v=int4` parsing, and the bytes they take.

Torch-free, so the CLI can parse and size a cache without the engine. Keys and values each have
a format of their own:

- `auto`: the model's dtype (the default for both);
- `float32`, `bfloat16`, `float16`: stored in that dtype, cast to the model's on read;
- `int8`, `int4`: symmetric integer codes with one float16 scale per token and KV head
  (`kv_quant` quantises and dequantises them; int4 packs two codes per byte).

A token's K/V in one layer then take, per side, `num_kv_heads · head_dim` float elements, or
`num_kv_heads · (head_dim · bits / 8 + SCALE_BYTES)` bytes for an integer side.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbench.errors import UserError

FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
INT_BITS = {"int8": 8, "int4": 4}
FORMATS = ("auto", *FLOAT_BYTES, *INT_BITS)
# One float16 scale per token and KV head (kv_quant says why float16).
SCALE_BYTES = 2


@dataclass(frozen=True)
class KVCacheDtype:
    """The storage format of the keys (`k`) and of the values (`v`): one of FORMATS each."""

    k: str = "auto"
    v: str = "auto"

    def __post_init__(self) -> None:
        for side in ("k", "v"):
            name = getattr(self, side)
            if name not in FORMATS:
                raise UserError(
                    f"kv cache dtype {side}={name}: unknown; use one of {', '.join(FORMATS)}"
                )

    def resolve(self, model_dtype: str) -> KVCacheDtype:
        """The same formats with `auto` replaced by the model's dtype name."""
        return KVCacheDtype(
            model_dtype if self.k == "auto" else self.k,
            model_dtype if self.v == "auto" else self.v,
        )

    @property
    def is_quantized(self) -> bool:
        return self.k in INT_BITS or self.v in INT_BITS

    @property
    def label(self) -> str:
        """`int8` when both sides agree, else `k=int8,v=int4` (what `parse` reads back)."""
        return self.k if self.k == self.v else f"k={self.k},v={self.v}"


def parse_kv_cache_dtype(text: str) -> KVCacheDtype:
    """`int8` (keys and values), `k=int8,v=int4`, or one side alone (`v=int4`: keys `auto`)."""
    text = text.strip()
    if "=" not in text:
        return KVCacheDtype(text, text)
    sides: dict[str, str] = {}
    for part in text.split(","):
        side, sep, name = (s.strip() for s in part.partition("="))
        if not sep or side not in ("k", "v") or side in sides:
            raise UserError(
                f"kv cache dtype '{text}': expected a format (int8) or k=FORMAT,v=FORMAT, "
                f"each of {', '.join(FORMATS)}"
            )
        sides[side] = name
    return KVCacheDtype(**sides)


def side_bytes_per_head(fmt: str, head_dim: int, model_dtype_bytes: int) -> int:
    """Bytes one token's K (or V) takes in one KV head of one layer.

    Formula: head_dim · float bytes; int8/int4: head_dim · bits / 8 + SCALE_BYTES.
    """
    if fmt == "auto":
        return head_dim * model_dtype_bytes
    if fmt in FLOAT_BYTES:
        return head_dim * FLOAT_BYTES[fmt]
    return head_dim * INT_BITS[fmt] // 8 + SCALE_BYTES


def bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, kv: KVCacheDtype, model_dtype_bytes: int
) -> int:
    """Bytes one token's K and V take in the cache, over all layers, scales included.

    Formula: num_layers · num_kv_heads · (side_bytes(k) + side_bytes(v)).
    """
    k = side_bytes_per_head(kv.k, head_dim, model_dtype_bytes)
    v = side_bytes_per_head(kv.v, head_dim, model_dtype_bytes)
    return num_layers * num_kv_heads * (k + v)
