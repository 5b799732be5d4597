"""Strict YAML reading: lines of key paths, and mistakes as `file:line: key.path: reason`."""

from __future__ import annotations

import pytest

from llmbench.errors import UserError
from llmbench.harness.yaml_source import SpecError, located, read_yaml

TEXT = """\
name: x
load:
  kind: poisson
  rate_per_s: 2
"""


def test_every_key_path_has_its_line():
    data, lines = read_yaml(TEXT, "w.yaml")
    assert data == {"name": "x", "load": {"kind": "poisson", "rate_per_s": 2}}
    assert (lines["name"], lines["load"], lines["load.kind"], lines["load.rate_per_s"]) == (
        1,
        2,
        3,
        4,
    )


def test_a_mistake_is_located_at_its_key_or_the_nearest_parent():
    _, lines = read_yaml(TEXT, "w.yaml")
    assert str(located(SpecError("load.rate_per_s", "must be > 0"), "w.yaml", lines)) == (
        "w.yaml:4: load.rate_per_s: must be > 0"
    )
    # A key that is not in the file (a default found impossible) points at its section.
    assert str(located(SpecError("load.burstiness", "bad"), "w.yaml", lines)) == (
        "w.yaml:2: load.burstiness: bad"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: 1\nb:\n  c: 2\n  c: 3\n", "w.yaml:4: b.c: duplicate key"),
        ("a: [1, 2\nb: 3\n", "w.yaml:2: not valid YAML"),
    ],
)
def test_broken_yaml_is_one_line_with_the_file_and_line(text, message):
    with pytest.raises(UserError) as e:
        read_yaml(text, "w.yaml")
    assert str(e.value).startswith(message)


def test_an_empty_document_is_none():
    assert read_yaml("  \n", "w.yaml") == (None, {})
