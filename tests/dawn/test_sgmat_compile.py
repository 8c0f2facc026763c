"""Every gemm-f16 shader compiles on Dawn (its Null backend, which compiles WGSL, subgroup matrices included): all
configs legal on the H200 profile as shader modules, and all configs a Null device admits as whole pipelines."""

from __future__ import annotations

import pytest
from dawn_support import null_device, with_every_fragment

from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.sgmat import device_subgroup_size
from tilewise.kernels.registry import get_template

pytestmark = pytest.mark.dawn


@pytest.fixture(scope="module")
def dev():
    return null_device()


@pytest.fixture(scope="module")
def tpl():
    return get_template("gemm-f16", "webgpu")


def test_every_shader_legal_on_the_h200_compiles(dev, tpl):
    """Shader modules (WGSL parsing, types, uniformity): the pipeline's subgroup-size check needs the H200's 32."""
    legal = tpl.space("full").legal(get_profile("h200-dawn"))
    assert len(legal) > 1000
    failed = []
    for cfg in legal:
        try:
            dev._dev.create_shader_module(code=tpl.source(cfg))
        except Exception as exc:
            failed.append(f"{cfg.key()}: {str(exc).splitlines()[0]}")
    assert not failed, f"{len(failed)} of {len(legal)} failed, first: {failed[:3]}"


def test_every_pipeline_the_null_device_admits_builds(dev, tpl):
    """Whole pipelines through the device (workgroup x size against Null's max subgroup size 128, limits)."""
    limits = with_every_fragment(dev.info.limits, tpl.space("full").params["FRAG"])
    sg = device_subgroup_size(limits)
    legal = [c for c in tpl.space("full").legal(limits) if c["SG"] == sg]
    assert legal and all(c["SM"] * c["SN"] * c["SG"] % dev.info.limits.subgroup_size_max == 0 for c in legal)
    failed = []
    for cfg in legal:
        try:
            tpl.compile(dev, cfg, (64, 64, 64))
        except Exception as exc:
            failed.append(f"{cfg.key()}: {exc}")
    assert not failed, f"{len(failed)} of {len(legal)} failed, first: {failed[:3]}"


def test_a_workgroup_that_is_not_a_multiple_of_the_subgroup_size_is_illegal_and_would_not_build(dev, tpl):
    """The rule reads the device's max subgroup size; Dawn refuses what it refuses."""
    limits = with_every_fragment(dev.info.limits, ["16x16x16"])
    cfg = tpl.space("full").config({"FRAG": "16x16x16", "SG": 32, "SM": 1, "SN": 2, "FM": 2, "FN": 2, "KF": 1,
                                    "SA": "workgroup", "SB": "direct"})
    why = tpl.space("full").why_illegal(cfg, limits)
    assert any(w.startswith("workgroup_x: workgroup x = SM*SN*SG = 1*2*32 = 64 is not a multiple of the device's "
                            "max subgroup size 128") for w in why)
    from tilewise.errors import ShaderCompileError

    with pytest.raises(ShaderCompileError, match="multiple of the device maxSubgroupSize"):
        tpl.compile(dev, cfg, (64, 64, 64))
