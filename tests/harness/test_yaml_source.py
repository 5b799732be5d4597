"""Strict YAML reading: lines of key paths, and mistakes as `file:line: key.path: reason`."""

from __future__ import annotations

import pytest

from llmbench.errors import UserError
from llmbench.harness.yaml_source import MAX_BYTES, SpecError, check_plain, located, read_yaml

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


# Nine nested aliases of nine items: 9^9 (387 million) values once expanded. Before, reading it
# ran CPU-bound with memory growing until killed.
ALIAS_BOMB = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (ALIAS_BOMB, "w.yaml:1: YAML anchor &a: not read (an alias can expand without bound)"),
        ("x: 1\nlater: *x\n", "w.yaml:2: YAML alias *x: not read"),
        ("base: &b {k: 1}\nother:\n  <<: *b\n", "w.yaml:1: YAML anchor &b: not read"),
        ("x: " + "[" * 40 + "]" * 40 + "\n", "w.yaml:1: nested deeper than 32 levels"),
        ("run: !!python/name:os.system x\n", "w.yaml:1: run: not a plain YAML value (could not"),
    ],
)
def test_more_than_plain_data_is_one_line_before_anything_is_built(text, message):
    with pytest.raises(UserError) as e:
        read_yaml(text, "w.yaml")
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_an_alias_alone_names_its_line():
    """An alias whose anchor is refused first names the anchor; a `--set` value (no file) has
    no line."""
    with pytest.raises(UserError, match=r"^--set x=\*a: YAML alias \*a: not read"):
        check_plain("*a", "--set x=*a", has_lines=False)


def test_a_text_over_the_limit_is_refused_without_parsing():
    with pytest.raises(UserError, match=r"^w\.yaml: 1,048,577 characters, over the 1,048,576"):
        read_yaml("#" * (MAX_BYTES + 1), "w.yaml")
