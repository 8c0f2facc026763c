"""TVM-emitted depthwise-separable conv2d kernels on a real NVIDIA GPU through tilewise's CUDA device: every output
value of every seed config against the float64 reference on random inputs, the parallel precompile, and timing.

The sources come from TVM when it imports, else from the pre-emitted store named by TILEWISE_TVM_CUDA_SOURCES
(`python tools/tvm_cuda_emit.py --arch sm_90 --out DIR` on a machine with TVM). A test skips cleanly without CuPy
or a GPU, and when neither TVM nor a store holding every source it needs is available.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm_support import need_sources, tvm_cuda_device

from tilewise.devices.base import Program
from tilewise.kernels.dwsep_conv2d.tiling import fmt
from tilewise.kernels.dwsep_conv2d.tvm_cuda import TvmCudaDwsepConv2d
from tilewise.tune.verify import compare

pytestmark = pytest.mark.cuda

# What these tests compile (tools/tvm_cuda_emit.py pre-emits the same; a unit test checks it covers them):
#: seed configs at: partial pixel and channel tiles with two images, a 5x5 kernel with padding 2, a 1x1 kernel
#: with more pixels than the widest tile, and the ladder's shape
SHAPES = [(2, 8, 5, 13, 20, 3, 1), (1, 16, 9, 11, 24, 5, 2), (1, 8, 7, 70, 9, 1, 0), (1, 64, 56, 56, 128, 3, 1)]
#: the config and shape that are timed
TIMED = ({"BW": 32, "TPX": 4, "BO": 32, "TO": 4, "RC": 4, "STAGE": "local"}, (8, 64, 56, 56, 128, 3, 1))


@pytest.fixture(scope="module")
def dev():
    return tvm_cuda_device()


@pytest.fixture(scope="module")
def tpl():
    return TvmCudaDwsepConv2d()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: ",".join(map(str, s)))
def test_every_seed_config_matches_float64(dev, tpl, shape, rng):
    legal, _ = tpl.space("seed").split(dev.info.limits)
    assert len(legal) == 12
    configs = [c for c in legal if not tpl.shape_problems(c, shape)]
    need_sources(dev, tpl, configs, shape)
    programs = tpl.precompile(dev, configs, shape)
    assert set(programs) == set(configs)
    for cfg in configs:
        prog = programs[cfg]
        assert isinstance(prog, Program), (fmt(cfg), prog)
        host = tpl.make_inputs(shape, rng)
        bufs = tpl.upload(dev, host, shape)
        tpl.poison(dev, bufs, shape)
        dev.run(tpl.launches(prog, bufs, cfg, shape))
        check = compare(tpl.read_output(dev, bufs, shape), tpl.reference(host, shape), "f32")
        assert check.ok, (fmt(cfg), shape, check.message)


def test_program_meta_and_timing(dev, tpl, rng):
    values, shape = TIMED
    cfg = tpl.space("full").config(values)
    need_sources(dev, tpl, [cfg], shape)
    prog = tpl.compile(dev, cfg, shape)
    assert prog.meta["block"] == (8, 8, 1) and prog.meta["grid"] == (2, 8 * 56, 4)
    assert prog.meta["local_bytes"] == 0  # windows, taps and weights stayed in registers
    bufs = tpl.upload(dev, tpl.make_inputs(shape, rng), shape)
    times_ms = dev.time(tpl.launches(prog, bufs, cfg, shape) * 5)
    assert times_ms.shape == (5,) and np.all(times_ms > 0)
