"""Kernel tests run the Triton kernels on CUDA when there is one, else in Triton's CPU
interpreter (TRITON_INTERPRET=1, set by tests/conftest.py before anything can import Triton).
Tests marked `gpu` need a compiled GPU and are left out without one; every other test runs
everywhere."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def device() -> torch.device:
    """Where the kernels under test run: the GPU, or the CPU through the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


def pytest_collection_modifyitems(config, items):
    """Without CUDA, deselect this folder's `gpu` tests (a deselection, not a skip)."""
    if HAS_CUDA:
        return
    here = os.path.dirname(__file__)
    gpu = [i for i in items if i.get_closest_marker("gpu") and str(i.path).startswith(here)]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [i for i in items if i not in gpu]
