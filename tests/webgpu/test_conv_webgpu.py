"""WGSL conv1d and dwsep-conv2d on a real adapter (lavapipe in CI): every output value of every ladder rung and of
random legal configs against the float64 reference, at small and ragged shapes."""

from __future__ import annotations

import pytest

from tilewise.kernels.conv1d.webgpu import WgslConv1d
from tilewise.kernels.dwsep_conv2d.webgpu import WgslDwsepConv2d
from tilewise.ladder import LADDERS
from tilewise.tune.verify import compare

pytestmark = pytest.mark.webgpu


# The WebGPU device caches bind groups by the ids of pipeline and buffers; a freed object's id can come back for a
# new one, so every program and buffer set stays alive for the module (as the tuner's Verifier does).
_KEEP: list[object] = []


def _check(dev, tpl, cfg, shape, rng):
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    prog = tpl.compile(dev, cfg, shape)
    _KEEP.append((bufs, prog))
    tpl.poison(dev, bufs, shape)
    dev.run(tpl.launches(prog, bufs, cfg, shape))
    return compare(tpl.read_output(dev, bufs, shape), tpl.reference(host, shape), tpl.dtype)


def _configs(tpl, spec, dev, shape, n, seed):
    sp = tpl.space("full")
    cfgs = [spec.rung_config(sp, r) for r in spec.rungs]
    cfgs += sp.sample(n, seed=seed, limits=dev.info.limits)
    return [c for c in dict.fromkeys(cfgs) if not tpl.shape_problems(c, shape)]


@pytest.mark.parametrize("shape", [(1, 1), (37, 8), (1000, 16), (300, 3)])
def test_conv1d_rungs_and_random_configs(webgpu_device, rng, shape):
    tpl = WgslConv1d()
    configs = _configs(tpl, LADDERS["conv1d-gpu"], webgpu_device, shape, 30, seed=shape[0])
    assert configs
    for cfg in configs:
        check = _check(webgpu_device, tpl, cfg, shape, rng)
        assert check.ok, f"{cfg} at {shape}: {check.message}"


def test_conv1d_every_stage_at_a_ragged_shape(webgpu_device, rng):
    """All three staging scopes at tile sizes that leave a partial last workgroup."""
    tpl = WgslConv1d()
    sp = tpl.space("full")
    shape = (517, 8)  # 524 outputs
    for stage in ("global", "workgroup", "private"):
        for tpt, rk in ((1, 1), (8, 8), (2, 4)):
            cfg = sp.config(NT=32, TPT=tpt, RK=rk, STAGE=stage)
            check = _check(webgpu_device, tpl, cfg, shape, rng)
            assert check.ok, f"{cfg}: {check.message}"


@pytest.mark.parametrize("shape", [(1, 8, 12, 12, 16, 3, 1), (2, 4, 5, 11, 6, 3, 0), (1, 4, 7, 9, 20, 5, 2)])
def test_dwsep_rungs_and_random_configs(webgpu_device, rng, shape):
    tpl = WgslDwsepConv2d()
    configs = _configs(tpl, LADDERS["dwsep-conv2d-gpu"], webgpu_device, shape, 8, seed=shape[1])
    assert configs
    for cfg in configs:
        check = _check(webgpu_device, tpl, cfg, shape, rng)
        assert check.ok, f"{cfg} at {shape}: {check.message}"


def test_gemm_ladder_rungs_are_correct(webgpu_device, rng):
    spec = LADDERS["gemm-gpu"]
    tpl = spec.template()
    sp = tpl.space("full")
    shape = (72, 40, 36)  # not multiples of any block tile: edge guards
    for r in spec.rungs:
        cfg = spec.rung_config(sp, r)
        if tpl.shape_problems(cfg, shape):
            continue
        check = _check(webgpu_device, tpl, cfg, shape, rng)
        assert check.ok, f"{r.name}: {check.message}"
