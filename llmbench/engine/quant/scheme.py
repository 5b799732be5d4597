"""Weight quantization schemes: their names (`int8`, `int4:64`, `int4:128:asym`), parsing, and
the bytes a quantised weight takes.

Torch-free, so a run spec or a CLI flag is checked before the engine loads. The schemes:

- `int8`: one code in [-127, 127] per weight, one scale per output channel (row):
  w ≈ scale[row] · q.
- `int4[:group][:sym]`: one 4-bit code q in [0, 15] per weight, a scale and a zero point per
  `group` consecutive weights of a row (32, 64 or 128; default 32), w ≈ scale · (q − 8) + zero,
  so the 16 levels span the group's [min, max] (GGUF's Q4_1 is `int4:32` with the minimum stored
  in place of the zero point). `sym` fixes zero = 0. With a zero point is the default: torch's
  CPU kernel reads a zero point per group either way, and on SmolLM2-135M the symmetric grid
  costs far more quality (`benchmarks/quant_quality.py`: perplexity 15.6 vs 11.9).
  `int4:64:asym` is accepted and means `int4:64`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbench.errors import UserError

INT4_GROUP_SIZES = (32, 64, 128)
DEFAULT_INT4_GROUP_SIZE = 32
NAMES_HELP = "int8, int4, int4:GROUP or int4:GROUP:sym (GROUP 32, 64 or 128), or none"


@dataclass(frozen=True)
class QuantScheme:
    """How the weights of a linear layer are stored: `bits` 8 (per output channel) or 4 (per
    `group_size` weights of a row, with a zero point per group when `has_zero`)."""

    bits: int
    group_size: int | None = None  # None: one scale per output channel (int8)
    has_zero: bool = False  # int4 only

    def __post_init__(self) -> None:
        if self.bits == 8 and (self.group_size is not None or self.has_zero):
            raise UserError("quantize int8: one symmetric scale per output channel; no group")
        if self.bits == 4 and self.group_size not in INT4_GROUP_SIZES:
            raise UserError(
                f"quantize int4: group {self.group_size}; use one of "
                f"{', '.join(map(str, INT4_GROUP_SIZES))}"
            )
        if self.bits not in (4, 8):
            raise UserError(f"quantize: {self.bits}-bit weights; use {NAMES_HELP}")

    @property
    def name(self) -> str:
        """What `parse_quantize` reads back: `int8`, `int4:32`, `int4:64:sym`."""
        if self.bits == 8:
            return "int8"
        return f"int4:{self.group_size}" + ("" if self.has_zero else ":sym")


INT8 = QuantScheme(bits=8)


def parse_quantize(text: str | None) -> QuantScheme | None:
    """`int8`, `int4` (group 32, zero points), `int4:64`, `int4:128:sym`, `int4:sym` → a
    scheme; None, `""` or `none` → None (the weights stay in the model's dtype). Anything else:
    a one-line `UserError`."""
    if text is None or text.strip().lower() in ("", "none"):
        return None
    parts = text.strip().lower().split(":")
    bad = UserError(f"quantize '{text}': unknown scheme; use {NAMES_HELP}")
    if parts == ["int8"]:
        return INT8
    if parts[0] != "int4" or len(parts) > 3:
        raise bad
    group, has_zero = DEFAULT_INT4_GROUP_SIZE, True
    rest = parts[1:]
    if rest and rest[-1] in ("asym", "sym"):
        has_zero = rest.pop() == "asym"
    if len(rest) > 1:
        raise bad
    if rest:
        if not rest[0].isdigit():
            raise bad
        group = int(rest[0])
    return QuantScheme(bits=4, group_size=group, has_zero=has_zero)


def lm_head_scheme(scheme: QuantScheme | None) -> QuantScheme | None:
    """The lm_head's scheme when the layers use `scheme`: int8 for both int8 and int4 layers.

    The lm_head is 22% of SmolLM2-135M's 16-bit weight bytes, and would be a third of an int4
    model's bytes if left in 16 bits. Measured (`benchmarks/quant_quality.py`, int4:32 layers,
    KL against float32): lm_head bfloat16 0.0012, int8 0.0028, int4 0.0501; int8 layers with a
    bfloat16 / int8 lm_head: 0.0038 / 0.0053. int8 costs little, int4 too much. llama.cpp keeps
    the output matrix of a Q4 model at 6 or 8 bits for the same reason.
    """
    return None if scheme is None else INT8
