"""Every gemm-f16 shader compiles on Dawn (its Null backend, which compiles WGSL, subgroup matrices included): all
configs legal on the H200 profile as shader modules, and configs a Null device admits as whole pipelines (both
sampled: PIPE, PAD and SPLITK make the grid a million configs; every corner of the three is in the sample)."""

from __future__ import annotations

import itertools

import pytest
from dawn_support import null_device, with_every_fragment

from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.sgmat import device_subgroup_size
from tilewise.kernels.registry import get_template
from tilewise.kernels.space import Space

pytestmark = pytest.mark.dawn


@pytest.fixture(scope="module")
def dev():
    return null_device()


@pytest.fixture(scope="module")
def tpl():
    return get_template("gemm-f16", "webgpu")


def h200_configs(tpl):
    """What the H200 may run, sampled: the seed points, and legal configs of each PIPE x PAD x SPLITK corner (the
    whole grid is a million configs)."""
    space, h200 = tpl.space("full"), get_profile("h200-dawn")
    picked = list(tpl.space("seed"))
    for pipe, pad, split in itertools.product(*(space.params[k] for k in ("PIPE", "PAD", "SPLITK"))):
        corner = Space("corner", {**space.params, "PIPE": [pipe], "PAD": [pad], "SPLITK": [split]}, space.rules)
        picked += [space.config(dict(c)) for c in corner.sample(40, seed=pipe * 100 + pad * 10 + split, limits=h200)]
    return list(dict.fromkeys(picked))


def test_every_shader_legal_on_the_h200_compiles(dev, tpl):
    """Shader modules (WGSL parsing, types, uniformity) of every module (split-K: and its reduction): the
    pipeline's subgroup-size check needs the H200's 32."""
    legal = h200_configs(tpl)
    assert len(legal) > 500 and all(tpl.space("full").is_legal(c, get_profile("h200-dawn")) for c in legal)
    assert {(c["PIPE"], c["PAD"], c["SPLITK"]) for c in legal} == set(itertools.product([1, 2], [0, 8], [1, 2, 4, 8]))
    failed = []
    for cfg in legal:
        for src in tpl.sources(cfg):
            try:
                dev._dev.create_shader_module(code=src)
            except Exception as exc:
                failed.append(f"{cfg.key()}: {str(exc).splitlines()[0]}")
    assert not failed, f"{len(failed)} of {len(legal)} failed, first: {failed[:3]}"


def test_every_pipeline_the_null_device_admits_builds(dev, tpl):
    """Whole pipelines through the device (workgroup x size against Null's max subgroup size 128, limits), split-K
    reductions included; sampled at the device's subgroup size."""
    limits = with_every_fragment(dev.info.limits, tpl.space("full").params["FRAG"])
    sg = device_subgroup_size(limits)
    full = tpl.space("full")
    at_sg = Space("at_sg", {**full.params, "SG": [sg]}, full.rules)
    legal = [full.config(dict(c)) for c in at_sg.sample(600, seed=7, limits=limits)]
    assert len(legal) > 100 and all(c["SM"] * c["SN"] * c["SG"] % dev.info.limits.subgroup_size_max == 0
                                    for c in legal)
    assert any(c["PIPE"] == 2 for c in legal) and any(c["SPLITK"] > 1 for c in legal)
    failed = []
    for cfg in legal:
        try:
            prog = tpl.compile(dev, cfg, (64, 64, 64))
            assert ("reduce" in prog.meta) == (cfg["SPLITK"] > 1)
        except Exception as exc:
            failed.append(f"{cfg.key()}: {exc}")
    assert not failed, f"{len(failed)} of {len(legal)} failed, first: {failed[:3]}"


def test_a_workgroup_that_is_not_a_multiple_of_the_subgroup_size_is_illegal_and_would_not_build(dev, tpl):
    """The rule reads the device's max subgroup size; Dawn refuses what it refuses."""
    limits = with_every_fragment(dev.info.limits, ["16x16x16"])
    cfg = tpl.space("full").config({"FRAG": "16x16x16", "SG": 32, "SM": 1, "SN": 2, "FM": 2, "FN": 2, "KF": 1,
                                    "SA": "workgroup", "SB": "direct", "PIPE": 1, "PAD": 0, "SPLITK": 1})
    why = tpl.space("full").why_illegal(cfg, limits)
    assert any(w.startswith("workgroup_x: workgroup x = SM*SN*SG = 1*2*32 = 64 is not a multiple of the device's "
                            "max subgroup size 128") for w in why)
    from tilewise.errors import ShaderCompileError

    with pytest.raises(ShaderCompileError, match="multiple of the device maxSubgroupSize"):
        tpl.compile(dev, cfg, (64, 64, 64))
