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
    built = set()
    for variant in peak.VARIANTS:
        for fm, fn in ((1, 1), (2, 2), (2, 4), (4, 4)):
            gm, gn = peak.grid_of(variant, 4)
            staged = 2 * (gm * fm * m * (peak.P * k + 8) + peak.P * k * (gn * fn * n + 8))
            if variant != "reg" and staged > dev.info.limits.max_workgroup_storage_bytes:
                continue
            dev.compile(peak.peak_wgsl(variant, frag, acc, fm, fn, 4), name=f"peak {variant}")
            built.add(variant)
    assert built == set(peak.VARIANTS)  # each variant at one shape at least


def test_expected_is_the_k_loop_sum():
    """Each subgroup's K loop written out in numpy, step by step from its corner of the staged tiles, equals
    `expected` for every kind of variant."""
    rng = np.random.default_rng(1)
    frag, fm, fn, nsg, iters = (16, 8, 16), 2, 2, 4, 12
    m, n, k = frag
    tm, tn = fm * m, fn * n
    for variant in peak.VARIANTS:
        gm, gn = peak.grid_of(variant, nsg)
        a = rng.uniform(-1, 1, (gm * tm, peak.P * k)).astype(np.float16)
        b = rng.uniform(-1, 1, (peak.P * k, gn * tn)).astype(np.float16)
        want = peak.expected(variant, a, b, frag, fm, fn, nsg, iters)
        for s in range(nsg):
            r0, c0 = (s // gn) % gm * tm, s % gn * tn
            acc = np.zeros((tm, tn))
            for it in range(iters):
                p = 0 if variant == "reg" else it % peak.P
                acc += (a[r0:r0 + tm, p * k:(p + 1) * k].astype(np.float64)
                        @ b[p * k:(p + 1) * k, c0:c0 + tn].astype(np.float64))
            np.testing.assert_allclose(want[s], acc, rtol=1e-12)
