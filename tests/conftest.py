"""Shared fixtures: the real SmolLM2 GGUF (pulled once into the llmbench cache).

Hypothesis: no per-example deadline (a 2-core machine under load makes timing noise, not bugs),
and in CI a fixed example order, so a red CI is always reproducible.
"""

import os
from pathlib import Path

import pytest
from hypothesis import settings

from llmbench.engine import model_store

settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    return model_store.pull("smollm2-135m")
