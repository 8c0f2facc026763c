"""Each kernel family's math exists once: every backend's template of a family holds the one problem object, so the
same seed draws the same inputs and they have the same float64 reference, output shape and counts. Built through the
registry, without a device (no GPU, TVM or CuPy is imported)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.kernels.conv1d.problem import CONV1D
from tilewise.kernels.dwsep_conv2d.problem import DWSEP
from tilewise.kernels.gemm.cuda import CudaGemm
from tilewise.kernels.gemm.problem import GEMM, GemmProblem
from tilewise.kernels.registry import get_template


def _same_math(templates, problem, shape):
    assert all(t.problem is problem for t in templates), [(t.name, t.backend) for t in templates]
    assert all(t.shape_names == problem.shape_names for t in templates)
    inputs = [t.make_inputs(shape, np.random.default_rng(7)) for t in templates]
    refs = [t.reference(host, shape) for t, host in zip(templates, inputs)]
    for host, ref in zip(inputs[1:], refs[1:]):
        assert host.keys() == inputs[0].keys()
        for k in host:
            np.testing.assert_array_equal(host[k], inputs[0][k])
        np.testing.assert_array_equal(ref, refs[0])
    for host in inputs[0].values():
        assert host.dtype == np.float32 and np.all(host != 0)  # random, never zero
    assert refs[0].dtype == np.float64 and refs[0].shape == problem.output_shape(shape)
    assert {(t.flops(shape), t.bytes_moved(shape)) for t in templates} == {(problem.flops(shape),
                                                                             problem.bytes_moved(shape))}
    return inputs[0], refs[0]


def test_gemm_backends_share_one_problem():
    templates = [get_template("gemm", "webgpu"), get_template("gemm", "cuda"), get_template("gemm-tvm", "cuda")]
    host, ref = _same_math(templates, GEMM, (37, 68, 20))
    np.testing.assert_array_equal(ref, host["a"].astype(np.float64) @ host["b"].astype(np.float64))
    assert GEMM.initial_output(host, (37, 68, 20)) is None  # beta = 0: C is an output only


def test_gemm_beta_makes_c_an_input_with_the_same_distribution():
    scaled = CudaGemm(alpha=0.5, beta=2.0)
    assert isinstance(scaled.problem, GemmProblem) and scaled.problem is not GEMM and CudaGemm().problem is GEMM
    shape = (9, 12, 8)
    host = scaled.make_inputs(shape, np.random.default_rng(7))
    plain = GEMM.make_inputs(shape, np.random.default_rng(7))
    np.testing.assert_array_equal(host["a"], plain["a"])
    np.testing.assert_array_equal(host["b"], plain["b"])
    assert host["c"].shape == (9, 12) and np.all(host["c"] != 0)
    assert scaled.problem.initial_output(host, shape) is host["c"]
    assert scaled.bytes_moved(shape) == GEMM.bytes_moved(shape) + 4 * 9 * 12


def test_conv1d_backends_share_one_problem():
    templates = [get_template("conv1d", b) for b in ("webgpu", "tvm-llvm", "cuda")]
    host, ref = _same_math(templates, CONV1D, (700, 16))
    np.testing.assert_allclose(ref, np.convolve(host["a"].astype(np.float64), host["w"].astype(np.float64)))


def test_dwsep_conv2d_backends_share_one_problem():
    templates = [get_template("dwsep-conv2d", b) for b in ("webgpu", "cuda")]
    _, ref = _same_math(templates, DWSEP, (2, 8, 5, 13, 20, 3, 1))
    assert ref.shape == (2, 20, 5, 13)


@pytest.mark.parametrize("keys,bad", [
    ((("gemm", "webgpu"), ("gemm", "cuda"), ("gemm-tvm", "cuda")), (0, 4, 4)),
    ((("conv1d", "webgpu"), ("conv1d", "tvm-llvm"), ("conv1d", "cuda")), (4, 9)),
    ((("dwsep-conv2d", "webgpu"), ("dwsep-conv2d", "cuda")), (1, 8, 2, 2, 8, 5, 1)),
])
def test_one_shape_check_per_family(keys, bad):
    """A malformed shape is refused by the family's problem, in the same words on every backend."""
    templates = [get_template(*k) for k in keys]
    with pytest.raises(ConfigError) as err:
        templates[0].problem.check_shape(bad)
    for tpl in templates:
        with pytest.raises(ConfigError, match=re.escape(err.value.problem)):
            tpl.make_inputs(bad, np.random.default_rng(0))
        if tpl.backend != "webgpu" or tpl.name != "gemm":  # the WGSL gemm checks only vec4 alignment
            cfg = next(iter(tpl.space("seed")))
            try:
                problems = tpl.shape_problems(cfg, bad)
            except ConfigError as exc:  # the warp-tiled CUDA gemm raises the problem's refusal
                problems = [f"shape: {exc.problem}"]
            assert problems == [f"shape: {err.value.problem}"]
