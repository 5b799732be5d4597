"""The suite's scheduling hint (`tests/conftest.py`) names files that exist, each once: a file
renamed or removed would lose its place at the front without a word."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FILES

ROOT = Path(__file__).resolve().parents[1]


def test_the_longest_files_exist_and_each_is_named_once():
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    assert [path for path in LONGEST_FILES if not (ROOT / path).is_file()] == []
