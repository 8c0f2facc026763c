"""Every subgroup-matrix matmul code path compiles on Dawn (its Null backend compiles WGSL, subgroup matrices
included): for each weight format x epilogue x norm, the seeds and every combination of the parameters that choose
generated code, legal on the H200 profile, as shader modules; and a sample of the configs a Null device admits as
whole pipelines."""

from __future__ import annotations

import pytest
from dawn_support import every_code_path, null_device, with_every_fragment

from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.sgmat import device_subgroup_size
from tilewise.kernels.matmul.sgmat import PARAMS, SgmatMatmul

pytestmark = pytest.mark.dawn

VARIANTS = [(f, e, nm) for f in ("nf4", "f16", "f32") for e in ("none", "residual", "swiglu") for nm in (False, True)]
SHAPE = (346, 4608, 1024)  # N and K are constants of the shader; M comes in a uniform


@pytest.fixture(scope="module")
def dev():
    return null_device()


#: the parameters whose values choose the generated code (sgmat_wgsl): fragment types, the W tile's layout, the K
#: step (how many stored words a row of it decodes), split-K, padding and pipelining; the rest (subgroup grid and
#: fragments per subgroup) only repeat or size that code
CODE_PATHS = {"FRAG": ["16x16x16", "16x8x16", "16x8x8"], "SG": [32], "WL": ["nk", "kn"], "BK": [16, 32, 64],
              "KS": [1, 2, 4, 8], "PAD": [0, 8], "PIPE": [1, 2], "VS": [0]}
#: packed stores (VS 1) change the staging code only, which split-K does not touch: one split and none suffice
PACKED_PATHS = {**CODE_PATHS, "KS": [1, 4], "VS": [1]}
#: PIPE 3 changes the K loop only (two register sets, two steps an iteration): its staging code is PIPE 2's, so one
#: fragment shape suffices beside both layouts, every K step, split-K, padding and both store widths
PIPE3_PATHS = {**CODE_PATHS, "FRAG": ["16x8x16"], "KS": [1, 4], "PIPE": [3], "VS": [0, 1]}
#: EP batches the epilogue only: both batch sizes with and without split-K (raw sums) suffice
EP_PATHS = {**CODE_PATHS, "FRAG": ["16x8x16"], "WL": ["nk"], "BK": [32], "KS": [1, 4], "PAD": [0], "PIPE": [1],
            "EP": [2, 4]}


@pytest.mark.parametrize(("fmt", "epilogue", "norm"), VARIANTS, ids=lambda v: str(v))
def test_the_seeds_and_every_code_path_legal_on_the_h200_compile(dev, fmt, epilogue, norm):
    """Shader modules of the seeds and of every combination of the code-path parameters that the H200 admits at
    lfm2-350m's gate/up shape (one config each), for each weight format x epilogue x norm; about 12,000-27,000
    configs of each are legal, so within a combination one is picked, not all compiled."""
    tpl = SgmatMatmul(fmt, epilogue, None, norm)
    h200 = get_profile("h200-dawn")
    space = tpl.space()
    legal = lambda c: not tpl.why_illegal(c, h200, SHAPE)  # noqa: E731
    picked, empty = every_code_path(space, h200, CODE_PATHS, legal)
    packed, packed_empty = every_code_path(space, h200, PACKED_PATHS, legal)
    pipe3, pipe3_empty = every_code_path(space, h200, PIPE3_PATHS, legal)
    batched, batched_empty = every_code_path(space, h200, EP_PATHS, legal)
    assert not batched_empty and len(batched) == 2 * 2
    # a combination is empty only where a rule of the variant refuses it whole: split-K past 4 slices with SwiGLU,
    # and SwiGLU's gate and up held packed in registers in the kn layout (2 x 32 words a unit) with PIPE 2
    assert all(epilogue == "swiglu" and e["KS"] == 8 for e in empty), empty[:3]
    assert all(epilogue == "swiglu" and (e["WL"], e["PIPE"]) == ("kn", 2) for e in packed_empty), packed_empty[:3]
    assert len(picked) == 3 * 2 * 3 * 4 * 2 * 2 - len(empty)
    assert len(packed) == 3 * 2 * 3 * 2 * 2 * 2 - len(packed_empty)
    # PIPE 3 holds two steps: packed kn units (2 x 32 words each, beside x) never fit the prefetch registers
    assert all((e["WL"], e["VS"]) == ("kn", 1) for e in pipe3_empty), pipe3_empty[:3]
    assert len(pipe3) == 2 * 3 * 2 * 2 * 2 - len(pipe3_empty)
    picked += packed + pipe3 + batched
    cfgs = list(dict.fromkeys([c for c in tpl.seed_configs(h200) if space.is_legal(c, h200)] + picked))
    failed = []
    for cfg in cfgs:
        try:
            dev._dev.create_shader_module(code=tpl.source(cfg, SHAPE))
        except Exception as exc:
            failed.append(f"{cfg.key()}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    assert not failed, f"{len(failed)} of {len(cfgs)} failed, first: {failed[:3]}"


@pytest.mark.parametrize(("fmt", "epilogue", "norm"), [("nf4", "swiglu", True), ("f16", "residual", False),
                                                       ("nf4", "none", False)], ids=lambda v: str(v))
def test_pipelines_the_null_device_admits_build(dev, fmt, epilogue, norm):
    """Whole pipelines through the template (workgroup x size against Null's max subgroup size, its limits)."""
    tpl = SgmatMatmul(fmt, epilogue, dev.enabled_features, norm)
    limits = with_every_fragment(dev.info.limits, PARAMS["FRAG"])
    sg = device_subgroup_size(limits)
    legal = [c for c in tpl.space().sample(40, seed=3, limits=limits) if c["SG"] == sg]
    assert legal
    failed = []
    for cfg in legal[:12]:
        try:
            tpl.compile(dev, cfg, SHAPE)
        except Exception as exc:
            failed.append(f"{cfg.key()}: {exc}")
    assert not failed, f"{len(failed)} of {len(legal[:12])} failed, first: {failed[:3]}"


def test_a_device_without_subgroup_matrices_is_refused_before_compiling():
    from tilewise.errors import ShaderCompileError

    class NoMatrices:
        enabled_features = frozenset({"shader-f16"})
        info = type("Info", (), {"name": "an adapter"})()

    tpl = SgmatMatmul("nf4", "none")
    with pytest.raises(ShaderCompileError, match="needs chromium-experimental-subgroup-matrix"):
        tpl.compile(NoMatrices(), tpl.default_config(), SHAPE)
