"""Shared fixtures: the real SmolLM2 GGUF (pulled once into the llmbench cache).

Hypothesis: no per-example deadline (a 2-core machine under load makes timing noise, not bugs),
and in CI a fixed example order, so a red CI is always reproducible.
"""

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from llmbench.engine import model_store
from llmbench.kernels import cpu_extension
from llmbench.kernels.cpu_info import this_cpu_flags

# Without a GPU the kernel tests run Triton's CPU interpreter. Triton reads this switch when it
# is first imported, and torch itself may import it during any test, so it is set first thing.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    return model_store.pull("smollm2-135m")


def pytest_configure(config):
    """With xdist workers (two processes on 2 cores), OpenMP threads waiting for work sleep
    instead of spinning (libgomp spins up to ~3 ms by default), so one worker's idle threads do
    not take the other's cores; set before the workers start, so their libgomp reads it. The
    suite checks numbers, not speed."""
    if getattr(config.option, "numprocesses", None):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(config, items):
    """`peer` tests drive another project's server: they run only when `-m` names them (`-m
    peer`), so that neither the default run nor `-m "not slow"` needs that server. `gpu` tests
    need a CUDA device, `quant_kernel` tests a C++ extension with its int8/int4 kernels (AVX2
    or better: not the scalar build): without them they are deselected (not skipped), in every
    folder."""
    if not torch.cuda.is_available():
        _deselect(config, items, "gpu")
    isa, _ = cpu_extension.choose_isa(this_cpu_flags(), cpu_extension.wanted_isa(os.environ))
    if isa == "scalar":
        _deselect(config, items, "quant_kernel")
    if "peer" in (config.option.markexpr or ""):
        return
    _deselect(config, items, "peer")


def _deselect(config, items: list, marker: str) -> None:
    """Take the items marked `marker` out of the run, reported as deselected."""
    marked = [item for item in items if item.get_closest_marker(marker)]
    if marked:
        config.hook.pytest_deselected(items=marked)
        items[:] = [item for item in items if not item.get_closest_marker(marker)]
