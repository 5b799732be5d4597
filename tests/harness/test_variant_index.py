"""variants.json: written atomically, read back as written, a damaged file one line."""

from __future__ import annotations

import json

import pytest

from llmbench.errors import UserError
from llmbench.harness.variant_index import (
    INDEX_FILE,
    VariantEntry,
    VariantIndex,
    is_variants_folder,
    read_index,
    write_index,
)

INDEX = VariantIndex(
    "chat",
    (
        VariantEntry("bf16", {}, "done", None, "variants/bf16"),
        VariantEntry(
            "kv", {"engine.kv_cache_dtype": {"k": "int8", "v": "int4"}}, "failed", "boom", "v/kv"
        ),
    ),
)


def test_round_trip_and_file_layout(tmp_path):
    assert not is_variants_folder(tmp_path)
    path = write_index(tmp_path, INDEX)
    assert path == tmp_path / INDEX_FILE and is_variants_folder(tmp_path)
    assert read_index(tmp_path) == INDEX
    data = json.loads(path.read_text())
    assert data["index_version"] == 1
    assert data["variants"][1] == {
        "name": "kv",
        "set": {"engine.kv_cache_dtype": {"k": "int8", "v": "int4"}},
        "status": "failed",
        "error": "boom",
        "folder": "v/kv",
    }
    assert [p.name for p in tmp_path.iterdir()] == [INDEX_FILE]  # no partial file left


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ('{"index_version": 9, "name": "x", "variants": []}', "index_version 9; this llmbench"),
        ('{"index_version": 1, "name": "x"}', "damaged (KeyError: 'variants')"),
        (
            '{"index_version": 1, "name": "x", "variants": [{"name": "a", "set": {}, '
            '"status": "odd", "error": null, "folder": "variants/a"}]}',
            "damaged (variant 'a')",
        ),
        (
            '{"index_version": 1, "name": "x", "variants": [{"name": "a", "set": {}, '
            '"status": "done", "error": null, "folder": "../elsewhere"}]}',
            "damaged (variant 'a')",
        ),
    ],
)
def test_a_damaged_index_is_one_line(tmp_path, text, message):
    (tmp_path / INDEX_FILE).write_text(text)
    with pytest.raises(UserError) as err:
        read_index(tmp_path)
    assert message in str(err.value) and str(err.value).startswith(str(tmp_path / INDEX_FILE))
