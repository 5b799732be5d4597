"""An F32 or F16 copy of a quantised GGUF file: every tensor dequantised, all metadata kept.

    python benchmarks/gguf_dequantize.py --type F16 [--model smollm2-135m] [--out FILE]

llama.cpp runs a model in the types its file stores, so comparing llmbench's float32 and
bfloat16 engine with llama.cpp's F32 and F16 needs GGUF files in those types. The default model
ships only as Q4_1 (its Q8_0 token embeddings aside); this writes the same weights dequantised:

- each tensor goes through `gguf.quants.dequantize`, the function llmbench's own GGUF reader
  (`llmbench.engine.gguf_file`) loads weights with, so the F32 file holds exactly the float32
  values llmbench's float32 engine runs; the F16 file holds them rounded to float16 (llmbench's
  bfloat16 engine rounds the same values to bfloat16, a coarser grid);
- tensors keep their GGUF names, shapes and layout (llama.cpp's Q/K row order included);
- as llama.cpp's own converter does for F16, 1-D tensors (the RMSNorm weights) stay F32;
- every metadata key is copied but `general.file_type`, which becomes ALL_F32 or MOSTLY_F16.

Files go to `~/.cache/llmbench/peers/` (`$LLMBENCH_CACHE/peers/`) unless `--out` says, written
under a temporary name and renamed, so a cached file is always whole.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

# Output type → (general.file_type, numpy dtype of the matrices).
TYPES = {
    "F32": (gguf.LlamaFileType.ALL_F32, np.float32),
    "F16": (gguf.LlamaFileType.MOSTLY_F16, np.float16),
}
# Keys the writer produces itself (the GGUF.* header fields are the reader's view of it).
_WRITER_KEYS = (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE)


def dequantized_path(source: Path, out_type: str, folder: Path) -> Path:
    """Where the `out_type` copy of `source` lives: Model.Q4_1.gguf → folder/Model.F16.gguf.

    Formula: folder / (source's stem less its last ".TYPE" part) + f".{out_type}.gguf".
    """
    stem = source.stem
    head, dot, tail = stem.rpartition(".")
    if dot and tail.upper() in gguf.GGMLQuantizationType.__members__:
        stem = head
    return folder / f"{stem}.{out_type}.gguf"


def stored_dtype(numpy_shape: tuple[int, ...], out_type: str) -> np.dtype:
    """float32 for 1-D tensors (norms) and every tensor of an F32 file; else float16."""
    return np.dtype(np.float32 if len(numpy_shape) == 1 else TYPES[out_type][1])


def dequantized(tensor: gguf.ReaderTensor, out_type: str) -> np.ndarray:
    """One tensor's float32 values (as llmbench's reader gets them), in its stored dtype.

    The shape is numpy's (outermost first): GGUF's dimensions reversed.
    """
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    return values.astype(stored_dtype(shape, out_type))


def write_dequantized(source: Path, out: Path, out_type: str) -> None:
    """Write `source` to `out` with every tensor dequantised to `out_type` (F32 or F16)."""
    if out_type not in TYPES:
        raise SystemExit(f"type {out_type!r}: use one of {', '.join(TYPES)}")
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    for field in reader.fields.values():
        if field.name in _WRITER_KEYS or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    writer.add_file_type(TYPES[out_type][0])
    for tensor in reader.tensors:  # the table first: sizes only, nothing dequantised yet
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        dtype = stored_dtype(shape, out_type)
        writer.add_tensor_info(tensor.name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:  # then one tensor at a time: F32 smollm2 is 540 MB
        writer.write_tensor_data(dequantized(tensor, out_type))
    writer.close()
    tmp.replace(out)


def ensure_dequantized(source: Path, out_type: str, folder: Path) -> Path:
    """The cached `out_type` copy of `source`, written first when absent."""
    out = dequantized_path(source, out_type, folder)
    if not out.is_file():
        print(f"writing {out} (every tensor of {source.name} as {out_type}) ...", flush=True)
        write_dequantized(source, out, out_type)
    return out


def main() -> None:
    from llmbench.engine import model_store

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--type", choices=sorted(TYPES), default="F16")
    parser.add_argument("--model", default="smollm2-135m", help="a model `llmbench models` knows")
    parser.add_argument("--out", type=Path, default=None, help="default: the peers cache")
    args = parser.parse_args()
    source = model_store.pull(args.model)
    if args.out is None:
        print(ensure_dequantized(source, args.type, model_store.cache_dir() / "peers"))
    else:
        write_dequantized(source, args.out, args.type)
        print(args.out)


if __name__ == "__main__":
    main()
