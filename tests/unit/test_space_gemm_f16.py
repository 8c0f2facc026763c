"""gemm-f16's space and rules without a device: legality comes from the device's limits and subgroup-matrix
configs (a fragment the adapter lacks is illegal with that reason; no subgroup matrices at all -> every config
illegal with the fix `use --device dawn`); the problem's reference multiplies the f16-rounded inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.sgmat_wgsl import invocations, storage_bytes, tile
from tilewise.kernels.registry import backends, get_template

H200 = get_profile("h200-dawn")


@pytest.fixture(scope="module")
def tpl():
    return get_template("gemm-f16", "webgpu")


def test_gemm_f16_is_registered_on_webgpu(tpl):
    assert backends("gemm-f16") == ["webgpu"]
    assert tpl.name == "gemm-f16" and tpl.backend == "webgpu"


def test_without_subgroup_matrices_every_config_is_illegal_with_the_fix(tpl):
    space = tpl.space("full")
    for name in ("webgpu-default", "h200-vulkan", "lavapipe"):
        limits = get_profile(name)
        sample = space.sample(50, seed=3)
        assert sample and not space.legal(limits, sample)
        for cfg in sample:
            assert any(w.startswith("fragment_offered: this device has no subgroup matrices") and
                       w.endswith("so use --device dawn (wgpudawn on a GPU with subgroup matrices)")
                       for w in space.why_illegal(cfg, limits))


def test_a_fragment_the_adapter_does_not_offer_is_illegal_with_what_it_offers(tpl):
    cfg = tpl.default_config().replace(FRAG="8x8x8")
    why = tpl.space("full").why_illegal(cfg, H200)
    assert why[0] == ("fragment_offered: fragment 8x8x8 f16->f32 is not offered by this adapter (it offers: "
                      "16x16x16 f16->f32, 16x8x16 f16->f32, 16x8x8 f16->f32)")


def test_only_offered_fragments_and_the_devices_subgroup_size_are_legal(tpl):
    legal = tpl.space("full").legal(H200)
    assert {c["FRAG"] for c in legal} == {"16x16x16", "16x8x16", "16x8x8"}
    assert {c["SG"] for c in legal} == {32}  # the H200's fragments say subgroups of 32
    # Dawn: the workgroup's x size must be a multiple of the adapter's max subgroup size (128 on the H200)
    assert all(invocations(c) % 128 == 0 for c in legal)
    narrow = dataclasses.replace(H200, subgroup_size_max=32)
    assert any(invocations(c) == 64 for c in tpl.space("full").legal(narrow))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_limit_rules_hold_for_every_legal_config_and_name_the_numbers(tpl, seed):
    small = dataclasses.replace(H200, max_workgroup_storage_bytes=12288, max_invocations_per_workgroup=128)
    space = tpl.space("full")
    for cfg in space.sample(300, seed=seed, limits=H200):
        why = space.why_illegal(cfg, small)
        assert (storage_bytes(cfg) > 12288) == any(w.startswith("workgroup_storage:") for w in why)
        assert (invocations(cfg) > 128) == any(w.startswith(f"invocations: SM*SN*SG = {cfg['SM']}*{cfg['SN']}*32 = "
                                                            f"{invocations(cfg)} > ") for w in why)


def test_tile_and_storage_follow_the_parameters(tpl):
    cfg = tpl.default_config()  # 2x2 subgroups of 4x4 16x16 fragments, 2 fragments per K step
    assert tile(cfg) == (128, 128, 32)
    assert storage_bytes(cfg) == 2 * (128 * 32 + 32 * 128) + 4 * 4 * 16 * 16
    assert invocations(cfg) == 128


def test_seed_space_is_legal_on_the_h200(tpl):
    seed = list(tpl.space("seed"))
    assert len(tpl.space("seed").legal(H200)) == len(seed) >= 10


def test_reference_multiplies_the_f16_rounded_inputs(tpl, rng):
    shape = (7, 5, 33)
    host = tpl.problem.make_inputs(shape, rng)
    assert host["a"].dtype == np.float16 and host["b"].dtype == np.float16
    assert np.all(host["a"] != 0) and np.all(host["b"] != 0)
    ref = tpl.problem.reference(host, shape)
    expect = host["a"].astype(np.float64) @ host["b"].astype(np.float64)
    assert ref.shape == (7, 5) and np.array_equal(ref, expect)


def test_generated_offsets_never_use_the_invocation_index_in_a_fragment_op(tpl):
    """Subgroup-matrix builtins need uniform offsets: they derive from workgroup and subgroup ids only."""
    for cfg in tpl.space("seed"):
        for line in tpl.source(cfg).splitlines():
            if "subgroupMatrix" in line:
                assert "tid" not in line and "lane" not in line, line


def test_verify_shape_keeps_edge_structure_and_is_cheaper(tpl):
    cfg = tpl.default_config()
    assert tpl.verify_shape(cfg, (4096, 4096, 4096)) == (517, 1032, 384)
    assert tpl.verify_shape(cfg, (4096, 4100, 4095)) == (517, 1030, 389)  # unaligned stays unaligned
    assert tpl.verify_shape(cfg, (17, 33, 65)) == (17, 33, 65)
