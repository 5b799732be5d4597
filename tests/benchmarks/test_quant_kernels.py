"""Tests for benchmarks/quant_kernels.py: every path it times multiplies by the same weights
(to its quantisation's error), and a pass times them all."""

from __future__ import annotations

import torch

from benchmarks import quant_kernels


def test_every_path_is_the_product_it_names():
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(*shape, generator=g) * 0.02 for shape in quant_kernels.SHAPES]
    xs = {k: torch.randn(32, k, generator=g).bfloat16() for k in (576, 1536)}
    paths = quant_kernels._paths(weights)
    assert {"bf16", "int8 kernel", "int8 deq+mm", "int4 kernel", "int4 deq+mm"} <= set(paths)
    for name, layers in paths.items():
        # int4 in groups of 32: a step of ~1/15 of the group's range, ~10% rms of a Gaussian's
        # product; int8 per channel and bfloat16: well under 2%.
        limit = 0.15 if name.startswith("int4") else 0.02
        for layer, weight in zip(layers, weights, strict=True):
            x = xs[weight.shape[1]]
            exact = x.float() @ weight.t()
            y = layer(x).float()
            assert y.shape == exact.shape
            assert ((y - exact).norm() / exact.norm()).item() < limit, name
        assert quant_kernels.time_pass(layers, xs, repeats=1) > 0
