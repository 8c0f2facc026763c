"""Every gemm-f16 code path compiles on Dawn (its Null backend, which compiles WGSL, subgroup matrices included):
every combination of the parameters that choose generated code, legal on the H200 profile, as shader modules; and
a sample of the configs a Null device admits as whole pipelines. The grid is 691,200 configs, so within a
combination the configs that only repeat or size its code are picked, not all compiled."""

from __future__ import annotations

import itertools

import pytest
from dawn_support import every_code_path, null_device, with_every_fragment

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


#: the parameters whose values choose gemm-f16's generated code (sgmat_wgsl): fragment types, where each operand
#: comes from, staging, padding and split-K; the rest (subgroup grid, fragments per subgroup, K step) only repeat or
#: size that code
CODE_PATHS = {"FRAG": ["16x16x16", "16x8x16", "16x8x8"], "SG": [32], "SA": ["direct", "workgroup"],
              "SB": ["direct", "workgroup"], "PIPE": [1, 2, 3], "PAD": [0, 8], "SPLITK": [1, 2, 4, 8],
              "VS": [0, 1]}


def test_every_code_path_legal_on_the_h200_compiles(dev, tpl):
    """Shader modules (WGSL parsing, types, uniformity) of every combination of the code-path parameters the H200
    admits, two configs each (the smallest and the largest tile of the combination), split-K's reduction
    included; the pipeline's subgroup-size check needs the H200's 32. The whole grid is 691,200 configs."""
    space, h200 = tpl.space("full"), get_profile("h200-dawn")
    assert [f"{c.m}x{c.n}x{c.k}" for c in h200.subgroup_matrix_configs if c.result_component_type == "f32"
            ] == CODE_PATHS["FRAG"]
    picked, empty = every_code_path(space, h200, CODE_PATHS, lambda c: True, per_path=2)
    # PIPE 2 and 3, PAD 8 and VS 1 change how staged operands are laid out: with both operands straight from storage,
    # they are illegal (rules `pipe_staged`, `packed_staged`), so no shader of those combinations exists
    nothing_staged = [e for e in (dict(zip(CODE_PATHS, v)) for v in itertools.product(*CODE_PATHS.values()))
                      if e["SA"] == e["SB"] == "direct" and (e["PIPE"] > 1 or e["PAD"] == 8 or e["VS"] == 1)]
    assert empty == nothing_staged
    assert len(picked) == 2 * (3 * 4 * 3 * 2 * 4 * 2 - len(empty))
    failed = []
    for cfg in picked:
        for src in tpl.sources(cfg):
            try:
                dev._dev.create_shader_module(code=src)
            except Exception as exc:
                failed.append(f"{cfg.key()}: {str(exc).splitlines()[0]}")
    assert not failed, f"{len(failed)} of {len(picked)} failed, first: {failed[:3]}"


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
                                    "SA": "workgroup", "SB": "direct", "PIPE": 1, "PAD": 0, "SPLITK": 1, "VS": 0})
    why = tpl.space("full").why_illegal(cfg, limits)
    assert any(w.startswith("workgroup_x: workgroup x = SM*SN*SG = 1*2*32 = 64 is not a multiple of the device's "
                            "max subgroup size 128") for w in why)
    from tilewise.errors import ShaderCompileError

    with pytest.raises(ShaderCompileError, match="multiple of the device maxSubgroupSize"):
        tpl.compile(dev, cfg, (64, 64, 64))
