"""Tests for benchmarks/gguf_dequantize.py: the F32/F16 copy of a tiny GGUF holding every
storage type (F32, F16, BF16, Q8_0, Q4_0, Q4_1), read back by llmbench's own GGUF reader."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from benchmarks.gguf_dequantize import dequantized_path, write_dequantized
from llmbench.engine.gguf_file import GGUFSource
from tests.engine.test_gguf_file import write_tiny_gguf

T = gguf.GGMLQuantizationType


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.Q8_0.gguf"
    write_tiny_gguf(path, is_tied=False)
    return path


def convert(source: Path, out_type: str) -> Path:
    out = source.with_name(f"copy.{out_type}.gguf")
    write_dequantized(source, out, out_type)
    return out


def test_f32_copy_loads_exactly_the_float32_weights_of_the_source(tiny):
    source, copy = GGUFSource(tiny), GGUFSource(convert(tiny, "F32"))
    assert copy.config == source.config
    expected = source.load(torch.float32, torch.device("cpu"))
    got = copy.load(torch.float32, torch.device("cpu"))
    assert got.keys() == expected.keys()
    for name, x in expected.items():
        assert torch.equal(got[name], x), name


def test_f16_copy_holds_the_float32_weights_rounded_to_float16_norms_kept(tiny):
    source, copy = GGUFSource(tiny), GGUFSource(convert(tiny, "F16"))
    expected = source.load(torch.float32, torch.device("cpu"))
    got = copy.load(torch.float32, torch.device("cpu"))
    for name, x in expected.items():
        rounded = x if x.dim() == 1 else x.half().float()  # norms stay F32
        assert torch.equal(got[name], rounded), name
    # Not a no-op: the tiny model's random F32 weights do not all sit on the float16 grid.
    q = "model.layers.1.self_attn.q_proj.weight"  # stored F32 in the source
    assert not torch.equal(got[q], expected[q])


@pytest.mark.parametrize(
    ("out_type", "file_type", "matrix_type"), [("F32", 0, T.F32), ("F16", 1, T.F16)]
)
def test_copy_keeps_every_metadata_key_and_tensor_and_sets_the_file_type(
    tiny, out_type, file_type, matrix_type
):
    source, copy = gguf.GGUFReader(tiny), gguf.GGUFReader(convert(tiny, out_type))
    keys = {k for k in source.fields if not k.startswith("GGUF.")}
    assert {k for k in copy.fields if not k.startswith("GGUF.")} == keys
    for key in keys - {"general.file_type"}:
        assert copy.fields[key].types == source.fields[key].types, key
        assert copy.fields[key].contents() == source.fields[key].contents(), key
    assert copy.fields["general.file_type"].contents() == file_type
    assert [t.name for t in copy.tensors] == [t.name for t in source.tensors]
    for old, new in zip(source.tensors, copy.tensors, strict=True):
        assert new.shape.tolist() == old.shape.tolist(), old.name
        assert new.tensor_type == (T.F32 if len(old.shape) == 1 else matrix_type), old.name


def test_a_q4_1_tensor_is_written_as_its_dequantisation_in_float16(tiny):
    """The bytes on disk: a Q4_1 tensor's F16 copy is gguf's dequantisation cast to float16."""
    source, copy = gguf.GGUFReader(tiny), gguf.GGUFReader(convert(tiny, "F16"))
    name = "blk.0.ffn_gate.weight"  # Q4_1 in layer 0
    old = next(t for t in source.tensors if t.name == name)
    new = next(t for t in copy.tensors if t.name == name)
    assert old.tensor_type == T.Q4_1
    expected = gguf.quants.dequantize(old.data, T.Q4_1).astype(np.float16)
    assert np.array_equal(np.asarray(new.data), expected)


@pytest.mark.parametrize(
    ("name", "out_type", "expected"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "F16", "SmolLM2-135M-Instruct.F16.gguf"),
        ("model.q8_0.gguf", "F32", "model.F32.gguf"),
        ("Llama-3.2-1B.gguf", "F16", "Llama-3.2-1B.F16.gguf"),  # ".2-1B" is no type
    ],
)
def test_dequantized_path_replaces_the_type_in_the_name(name, out_type, expected):
    assert dequantized_path(Path("/m") / name, out_type, Path("/c")) == Path("/c") / expected


def test_an_unknown_type_is_refused(tiny, tmp_path):
    with pytest.raises(SystemExit, match="use one of F32, F16"):
        write_dequantized(tiny, tmp_path / "x.gguf", "Q4_0")
