"""Shared fixtures: the real SmolLM2 GGUF (pulled once into the llmbench cache)."""

from pathlib import Path

import pytest

from llmbench.engine import model_store


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    return model_store.pull("smollm2-135m")
