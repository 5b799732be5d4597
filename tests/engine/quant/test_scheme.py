"""Quantization scheme names: what parses to what, what reads back, what is refused."""

from __future__ import annotations

import pytest

from llmbench.engine.quant.scheme import INT8, QuantScheme, lm_head_scheme, parse_quantize
from llmbench.errors import UserError


@pytest.mark.parametrize(
    ("text", "bits", "group", "has_zero"),
    [
        ("int8", 8, None, False),
        ("int4", 4, 32, True),
        ("int4:64", 4, 64, True),
        ("int4:128:asym", 4, 128, True),
        ("int4:sym", 4, 32, False),
        ("int4:64:sym", 4, 64, False),
        (" INT4:32 ", 4, 32, True),
    ],
)
def test_names_parse_to_schemes(text, bits, group, has_zero):
    assert parse_quantize(text) == QuantScheme(bits=bits, group_size=group, has_zero=has_zero)


@pytest.mark.parametrize("text", [None, "", "none", "None"])
def test_none_means_unquantised(text):
    assert parse_quantize(text) is None


@pytest.mark.parametrize("text", ["int8", "int4:32", "int4:64", "int4:128:sym"])
def test_name_reads_back(text):
    assert parse_quantize(text).name == text
    assert parse_quantize(parse_quantize(text).name) == parse_quantize(text)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("int3", "unknown scheme"),
        ("gguf", "unknown scheme"),
        ("int8:32", "unknown scheme"),
        ("int4:abc", "unknown scheme"),
        ("int4:64:128", "unknown scheme"),
        ("int4:32:sym:asym", "unknown scheme"),
        ("int4:48", "group 48; use one of 32, 64, 128"),
        ("int4:0", "group 0"),
    ],
)
def test_bad_names_are_one_line_errors(text, fragment):
    with pytest.raises(UserError) as e:
        parse_quantize(text)
    message = str(e.value)
    assert fragment in message and "\n" not in message


def test_int8_takes_no_group():
    with pytest.raises(UserError):
        QuantScheme(bits=8, group_size=32)


def test_lm_head_is_int8_under_every_scheme():
    assert lm_head_scheme(None) is None
    for text in ("int8", "int4", "int4:128:sym"):
        assert lm_head_scheme(parse_quantize(text)) == INT8
