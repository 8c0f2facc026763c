"""Verification: NaN poison catches unwritten outputs, tolerances per dtype, fresh inputs per check."""

import numpy as np
import pytest

from tilewise.kernels.gemm.webgpu import WgslGemm
from tilewise.tune.verify import TOLERANCES, Verifier, compare


def test_float32_rounding_passes(rng):
    ref = rng.standard_normal((40, 30))
    out = ref.astype(np.float32)
    chk = compare(out, ref, "f32")
    assert chk.ok and 0 < chk.rel_err < 1e-6


def test_unwritten_element_fails_even_if_rest_is_exact(rng):
    ref = rng.standard_normal((16, 16))
    out = ref.astype(np.float32)
    out[3, 7] = np.nan  # the poison left in place by a kernel that skipped this element
    chk = compare(out, ref, "f32")
    assert not chk.ok and chk.nan_count == 1 and "(3, 7)" in chk.message


def test_one_wrong_value_fails_and_is_located(rng):
    ref = rng.uniform(1, 2, (50, 50))
    out = ref.copy()
    out[10, 20] += 0.05
    chk = compare(out, ref, "f32")
    assert not chk.ok
    assert "(10, 20)" in chk.message and chk.max_abs_err == pytest.approx(0.05)


def test_swapped_layout_fails_even_with_same_argmax(rng):
    # seed 001: matrices loaded sideways can keep the winning class; every value must be compared
    ref = rng.uniform(0, 1, (8, 8))
    ref[0, 0] = 10.0
    out = ref.T.copy()
    assert np.argmax(out) == np.argmax(ref)
    assert not compare(out, ref, "f32").ok


def test_looser_dtype_tolerance(rng):
    ref = rng.standard_normal((64, 64))
    out = ref * (1 + 3e-3 * rng.standard_normal(ref.shape))
    assert not compare(out, ref, "f32").ok
    assert compare(out, ref, "f16").ok
    assert TOLERANCES["f32"].rel_fro <= 1e-3


def test_shape_mismatch_fails(rng):
    assert not compare(np.zeros((2, 3)), np.zeros((3, 2)), "f32").ok


def test_gemm_inputs_are_fresh_and_never_zero(rng):
    t = WgslGemm()
    a = t.make_inputs((33, 17, 9), rng)
    b = t.make_inputs((33, 17, 9), rng)
    assert a["a"].shape == (33, 9) and a["b"].shape == (9, 17)
    assert np.all(np.abs(a["a"]) >= 0.5) and np.all(np.abs(a["b"]) >= 0.5)
    assert not np.array_equal(a["a"], b["a"])


def test_verifier_uses_fresh_inputs_per_check(cpu_device, rng):
    seen = []

    class Recorder(WgslGemm):

        def make_inputs(self, shape, rng):
            host = super().make_inputs(shape, rng)
            seen.append(host["a"].copy())
            return host

        def launches(self, program, bufs, config, shape):
            return []

        def read_output(self, device, bufs, shape):
            return np.full((shape[0], shape[1]), np.nan, np.float32)

        def upload(self, device, host, shape):
            return {"out": device.allocate(4 * shape[0] * shape[1])}

    t = Recorder()
    v = Verifier(t, cpu_device, (8, 8, 8), rng)
    cfg = t.default_config()
    first, second = v.check(None, cfg), v.check(None, cfg)
    assert not first.ok and not second.ok  # nothing wrote the output: the NaN poison stays
    assert len(seen) == 2 and not np.array_equal(seen[0], seen[1])
