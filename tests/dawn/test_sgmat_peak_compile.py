"""The subgroup-matrix ceiling experiment's shaders (`experiments/sgmat_peak_dawn.py`) compile on Dawn's Null
backend, for every f16 fragment shape and both accumulator types, where their staged tiles fit Null's 16 KB of
workgroup memory; and the float64 expectation its check uses is the sum the kernels compute."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from dawn_support import null_device

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import sgmat_peak_dawn as peak

pytestmark = pytest.mark.dawn
FRAGS = [(16, 16, 16), (16, 8, 16), (16, 8, 8)]


@pytest.mark.parametrize("frag", FRAGS, ids=lambda f: "x".join(map(str, f)))
@pytest.mark.parametrize("acc", ["f32", "f16"])
def test_every_variant_compiles_on_null(frag, acc):
    dev = null_device()
    m, n, k = frag
    built = 0
    for variant in peak.VARIANTS:
        for fm, fn in ((2, 2), (2, 4), (4, 4)):
            staged = 2 * (fm * m * (peak.P * k + 8) + peak.P * k * (fn * n + 8))
            if variant != "reg" and staged > dev.info.limits.max_workgroup_storage_bytes:
                continue
            dev.compile(peak.peak_wgsl(variant, frag, acc, fm, fn, 4), name=f"peak {variant}")
            built += 1
    assert built >= 7


def test_expected_is_the_k_loop_sum():
    """The K loop written out in numpy, step by step, equals `expected` for both kinds of variant."""
    rng = np.random.default_rng(1)
    frag, fm, fn, iters = (16, 8, 16), 2, 2, 12
    m, n, k = frag
    a = rng.uniform(-1, 1, (fm * m, peak.P * k)).astype(np.float16)
    b = rng.uniform(-1, 1, (peak.P * k, fn * n)).astype(np.float16)
    for variant in ("reg", "wg"):
        acc = np.zeros((fm * m, fn * n))
        for it in range(iters):
            p = 0 if variant == "reg" else it % peak.P
            acc += a[:, p * k:(p + 1) * k].astype(np.float64) @ b[p * k:(p + 1) * k].astype(np.float64)
        np.testing.assert_allclose(peak.expected(variant, a, b, frag, iters), acc, rtol=1e-12)
