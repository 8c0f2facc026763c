"""gemm-f16 on a real Dawn adapter with subgroup matrices: every output against the float64 reference of the
f16-rounded inputs, at edge shapes (1x1x1, odd sizes, exact tiles, the model's M=346), through the one engine.
Skips where no such adapter exists (Dawn's Null backend executes nothing)."""

from __future__ import annotations

import numpy as np
import pytest
from dawn_support import real_dawn_device

from tilewise.kernels.gemm.sgmat import device_subgroup_size, fit_to_device
from tilewise.kernels.gemm.sgmat_wgsl import tile
from tilewise.kernels.registry import get_template
from tilewise.tune.verify import compare

pytestmark = pytest.mark.dawn

SHAPES = [(1, 1, 1), (17, 33, 65), (128, 128, 128), (346, 1024, 1024), (130, 136, 72), (5, 260, 8)]


@pytest.fixture(scope="module")
def dev():
    return real_dawn_device()


def _software(dev):
    """lavapipe with cooperative matrices (`bash scripts/run test-sgmat`): small sizes only."""
    return dev.info.adapter_type == "cpu"


@pytest.fixture(scope="module")
def tpl():
    return get_template("gemm-f16", "webgpu")


def configs(tpl, dev):
    """The seed configs at the device's subgroup size, plus a fixed sample of the full space."""
    space = tpl.space("full")
    sg = device_subgroup_size(dev.info.limits)
    seed = [fit_to_device(space.config({**dict(c), "SG": sg}), dev.info.limits) for c in tpl.space("seed")]
    picked = list(dict.fromkeys(c for c in seed if space.is_legal(c, dev.info.limits)))
    return picked + [c for c in space.sample(12, seed=5, limits=dev.info.limits) if c not in picked]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_output_matches_float64(dev, tpl, shape, rng):
    if _software(dev) and shape[0] * shape[1] * shape[2] > 1 << 22:
        pytest.skip("a software adapter (lavapipe): the model's size is left to GPUs; the edge shapes run")
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


# PIPE, PAD, SPLITK and small tiles, each where its edges are: K shorter than one step and than the slices (empty
# slices store zeros), K not a multiple of 8 (edge loop everywhere), exact tiles, interior plus edge tiles, M = 346
VARIANTS = [
    {"SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8},
    {"SA": "workgroup", "SB": "workgroup", "PIPE": 2},
    {"SA": "workgroup", "SB": "workgroup", "PAD": 8},
    {"SA": "workgroup", "PIPE": 2, "PAD": 8},
    {"SB": "workgroup", "PIPE": 2, "PAD": 8, "KF": 1},
    {"FRAG": "16x8x8", "SM": 4, "SN": 4, "FM": 1, "FN": 1, "KF": 2, "SA": "workgroup", "SB": "workgroup",
     "PIPE": 2, "PAD": 8},
    {"FM": 2, "FN": 2, "SPLITK": 2},
    {"FM": 2, "FN": 2, "SPLITK": 8},
    {"SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "SPLITK": 4},
    {"FRAG": "16x8x8", "SM": 4, "SN": 4, "FM": 1, "FN": 2, "KF": 2, "SA": "workgroup", "SB": "workgroup",
     "PIPE": 2, "PAD": 8, "SPLITK": 4},
    {"SM": 2, "SN": 2, "FM": 1, "FN": 4, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "SPLITK": 8},
]
VARIANT_SHAPES = [(1, 1, 1), (64, 64, 8), (128, 128, 1000), (130, 136, 72), (256, 256, 512), (346, 1024, 1024),
                  (33, 520, 4608), (200, 264, 1003)]


def variant_configs(tpl, dev):
    base = tpl.default_config()
    sg = device_subgroup_size(dev.info.limits)
    cfgs = [fit_to_device(base.replace(SG=sg, **v), dev.info.limits) for v in VARIANTS]
    legal = [c for c in cfgs if tpl.space("full").is_legal(c, dev.info.limits)]
    # as written on the H200; fitted to a software adapter's 8x8x8 fragments, 16 subgroups may outgrow its memory
    assert len(legal) >= len(cfgs) - (3 if _software(dev) else 0), [
        tpl.space("full").why_illegal(c, dev.info.limits) for c in cfgs if c not in legal]
    return legal


@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pipelined_padded_and_split_k_variants_match_float64(dev, tpl, shape, rng):
    """Every output value of each variant against float64, the partial buffer poisoned with NaN first (a slice
    left unwritten fails), each config on fresh inputs."""
    if _software(dev) and shape[0] * shape[1] * shape[2] > 1 << 22:
        pytest.skip("a software adapter (lavapipe): the model's sizes are left to GPUs; the edge shapes run")
    bad = []
    for cfg in variant_configs(tpl, dev):
        host = tpl.problem.make_inputs(shape, rng)
        ref = tpl.problem.reference(host, shape)
        prog = tpl.compile(dev, cfg, shape)
        bufs = tpl.upload(dev, host, shape)
        tpl.poison(dev, bufs, shape)
        launches = tpl.launches(prog, bufs, cfg, shape)
        assert len(launches) == (2 if cfg["SPLITK"] > 1 else 1)
        dev.run(launches)
        out = tpl.read_output(dev, bufs, shape)
        check = compare(out, ref, tpl.dtype)
        if not check.ok or not np.all(np.isfinite(out)):
            bad.append(f"{cfg}: {check.message}")
    assert not bad, f"{len(bad)} wrong at {shape}: {bad[:3]}"


# one and three K steps of 16 and of 32 (the fast loop needs whole steps: PIPE 3 ends on an odd step or on one)
SAME_BITS_SHAPES = [(130, 136, 72), (64, 64, 8), (200, 264, 1003), (256, 256, 16), (256, 256, 32), (256, 256, 48),
                    (256, 256, 96)]


@pytest.mark.parametrize("shape", SAME_BITS_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_packed_stores_and_loads_two_steps_ahead_give_the_same_bits(dev, tpl, shape, rng):
    """VS = 1 copies the same halves into workgroup memory, 8 a store (interior tiles as loaded, edge tiles packed
    from guarded loads), and PIPE = 3 stages the same steps as PIPE = 2 two steps ahead instead of one, so every
    output equals the VS = 0 (PIPE = 2) twin's bit for bit: each staged variant with its twins, at interior plus
    edge tiles, a K below one step, K not a multiple of 8 (the edge loop everywhere), one and three K steps."""
    space = tpl.space("full")
    staged = [c for c in variant_configs(tpl, dev) if "workgroup" in (c["SA"], c["SB"])]
    twins = [c.replace(VS=1) for c in staged] + [c.replace(PIPE=3, VS=v) for c in staged if c["PIPE"] == 2
                                                 for v in (0, 1)]
    pairs = [(c.replace(VS=0, PIPE=2 if c["PIPE"] == 3 else c["PIPE"]), c) for c in twins]
    pairs = [(a, b) for a, b in pairs if space.is_legal(b, dev.info.limits)]
    assert len(pairs) >= 8 and {b["PIPE"] for _, b in pairs} == {1, 2, 3}
    host = tpl.problem.make_inputs(shape, rng)
    bad, outs = [], {}
    for a, b in pairs:
        for cfg in (a, b):
            if cfg not in outs:
                prog = tpl.compile(dev, cfg, shape)
                bufs = tpl.upload(dev, host, shape)
                tpl.poison(dev, bufs, shape)
                dev.run(tpl.launches(prog, bufs, cfg, shape))
                outs[cfg] = tpl.read_output(dev, bufs, shape)
        ref, got = outs[a], outs[b]
        assert np.isfinite(ref).all() and np.abs(ref).max() > 0
        if not np.array_equal(ref.view(np.uint32), got.view(np.uint32)):
            bad.append(f"{b}: {int((ref != got).sum())} of {ref.size} outputs differ from [{a}]'s")
    assert not bad, f"{len(bad)} differ at {shape}: {bad[:3]}"


def test_split_k_partials_hold_each_slice(dev, tpl, rng):
    """Slice z of the partial buffer is A[:, Kz] @ B[Kz, :] for its whole-step K range (the sum alone could hide
    two slices that swap or double work)."""
    shape = (130, 136, 72)  # K steps of 32, slices of 32: the fourth slice is empty and must hold zeros
    cfg = fit_to_device(tpl.default_config().replace(SG=device_subgroup_size(dev.info.limits), FM=2, FN=2,
                                                     SPLITK=4), dev.info.limits)
    host = tpl.problem.make_inputs(shape, rng)
    prog = tpl.compile(dev, cfg, shape)
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    dev.run(tpl.launches(prog, bufs, cfg, shape)[:1])  # the slices only, no reduction
    M, N, K = shape
    part = dev.download(bufs["partial"], np.float32, (4, M, N))
    bk = tile(cfg)[2]
    kch = -(-K // (4 * bk)) * bk
    a, b = host["a"].astype(np.float64), host["b"].astype(np.float64)
    for z in range(4):
        lo, hi = min(K, z * kch), min(K, (z + 1) * kch)
        if hi == lo:
            assert np.all(part[z] == 0), f"empty slice {z} holds {part[z][part[z] != 0][:4]}"
            continue
        check = compare(part[z], a[:, lo:hi] @ b[lo:hi, :], tpl.dtype)
        assert check.ok, (z, check.message)
    assert kch * 3 >= K  # the shape does leave the last slice empty


def test_the_engine_verifies_split_k_with_guarded_partials(dev, tpl, monkeypatch):
    """With guard regions on, the engine binds `partial` between canaries; the split-K seeds verify and time."""
    from tilewise.tune.engine import Engine, Item
    from tilewise.tune.store import Store

    monkeypatch.setenv("TILEWISE_GUARD_OUTPUTS", "1")
    shape = (130, 136, 72) if _software(dev) else (346, 1024, 1024)
    split = [c for c in variant_configs(tpl, dev) if c["SPLITK"] > 1]
    outcomes = Engine(dev, Store()).evaluate([Item(tpl, c, shape) for c in split])
    assert [o.status for o in outcomes] == ["ok"] * len(split), [o.reason for o in outcomes]
