"""gemm-f16 on a real Dawn adapter with subgroup matrices: every output against the float64 reference of the
f16-rounded inputs, at edge shapes (1x1x1, odd sizes, exact tiles, the model's M=346), through the one engine.
Skips where no such adapter exists (Dawn's Null backend executes nothing)."""

from __future__ import annotations

import pytest
from dawn_support import real_dawn_device

from tilewise.kernels.gemm.sgmat import device_subgroup_size
from tilewise.kernels.registry import get_template
from tilewise.tune.verify import compare

pytestmark = pytest.mark.dawn

SHAPES = [(1, 1, 1), (17, 33, 65), (128, 128, 128), (346, 1024, 1024), (130, 136, 72), (5, 260, 8)]


@pytest.fixture(scope="module")
def dev():
    return real_dawn_device()


@pytest.fixture(scope="module")
def tpl():
    return get_template("gemm-f16", "webgpu")


def configs(tpl, dev):
    """The seed configs at the device's subgroup size, plus a fixed sample of the full space."""
    space = tpl.space("full")
    sg = device_subgroup_size(dev.info.limits)
    seed = [space.config({**dict(c), "SG": sg}) for c in tpl.space("seed")]
    picked = list(dict.fromkeys(c for c in seed if space.is_legal(c, dev.info.limits)))
    return picked + [c for c in space.sample(12, seed=5, limits=dev.info.limits) if c not in picked]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_output_matches_float64(dev, tpl, shape, rng):
    cfgs = configs(tpl, dev)
    assert cfgs, "no legal config on this adapter"
    host = tpl.problem.make_inputs(shape, rng)
    ref = tpl.problem.reference(host, shape)
    bad = []
    for cfg in cfgs:
        prog = tpl.compile(dev, cfg, shape)
        bufs = tpl.upload(dev, host, shape)
        tpl.poison(dev, bufs, shape)
        dev.run(tpl.launches(prog, bufs, cfg, shape))
        out = tpl.read_output(dev, bufs, shape)
        check = compare(out, ref, tpl.dtype)
        if not check.ok:
            bad.append(f"{cfg}: {check.message}")
    assert not bad, f"{len(bad)} of {len(cfgs)} wrong at {shape}: {bad[:3]}"


def test_the_engine_verifies_and_times_gemm_f16(dev, tpl):
    from tilewise.tune.engine import Engine, Item
    from tilewise.tune.store import Store

    shape = (256, 256, 256)
    items = [Item(tpl, c, shape) for c in configs(tpl, dev)[:4]]
    outcomes = Engine(dev, Store()).evaluate(items)
    assert [o.status for o in outcomes] == ["ok"] * len(items), [o.reason for o in outcomes]
    assert all(o.median_ms > 0 for o in outcomes)
