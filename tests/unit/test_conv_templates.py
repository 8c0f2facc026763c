"""conv1d and dwsep-conv2d templates without a device: rules with numbers, shape refusals, WGSL, references."""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.devices.profiles import PROFILES
from tilewise.errors import ConfigError
from tilewise.kernels.conv1d.problem import check_shape
from tilewise.kernels.conv1d.webgpu import WgslConv1d, conv1d_space, generate_wgsl
from tilewise.kernels.dwsep_conv2d.problem import reference_dwsep
from tilewise.kernels.dwsep_conv2d.webgpu import WgslDwsepConv2d, dwsep_space
from tilewise.kernels.dwsep_conv2d.webgpu import generate_wgsl as dwsep_wgsl

WEBGPU_DEFAULT = PROFILES["webgpu-default"]


def test_conv1d_reference_is_the_full_convolution_definition(rng):
    a, w = rng.standard_normal(23), rng.standard_normal(5)
    direct = np.array([sum(a[i - k] * w[k] for k in range(5) if 0 <= i - k < 23) for i in range(27)])
    tpl = WgslConv1d()
    out = tpl.reference({"a": a.astype(np.float32), "w": w.astype(np.float32)}, (23, 5))
    np.testing.assert_allclose(out, direct, rtol=1e-6, atol=1e-6)


def test_conv1d_refuses_a_kernel_longer_than_the_input():
    with pytest.raises(ConfigError, match=r"N=9 is longer than the input length M=4"):
        check_shape((4, 9))
    cfg = conv1d_space().config(NT=64, TPT=1, RK=1, STAGE="global")
    assert "longer than the input" in WgslConv1d().shape_problems(cfg, (4, 9))[0]


def test_conv1d_reduction_split_must_divide_the_kernel_length():
    cfg = conv1d_space().config(NT=64, TPT=4, RK=8, STAGE="private")
    probs = WgslConv1d().shape_problems(cfg, (100, 12))
    assert probs == ["reduction_split: N % RK = 12 % 8 = 4 != 0 (each step reads RK taps unguarded)"]
    assert WgslConv1d().shape_problems(cfg, (100, 16)) == []


def test_conv1d_rules_name_the_numbers():
    sp = conv1d_space()
    too_many = sp.config(NT=256, TPT=8, RK=16, STAGE="workgroup")
    why = sp.why_illegal(too_many, WEBGPU_DEFAULT)
    assert why == []  # 4*(2048 + 31) = 8316 bytes fit in 16384
    big = sp.config(NT=256, TPT=8, RK=16, STAGE="private")
    assert sp.why_illegal(big, WEBGPU_DEFAULT) == []
    from tilewise.devices.base import Limits

    tight = Limits(4096, 128, (128, 128, 64), 65535, 2**28, 2**27)
    why = sp.why_illegal(too_many, tight)
    assert any(w.startswith("workgroup_storage: workgroup storage = 4*(NT*TPT + 2*RK - 1) = 4*(256*8 + 2*16 - 1) = "
                            "8316 bytes > max_workgroup_storage_bytes 4096") for w in why)
    assert any(w == "invocations: NT = 256 > max_invocations_per_workgroup 128" for w in why)


def test_conv1d_private_staging_has_no_workgroup_memory_or_barrier():
    sp = conv1d_space()
    priv = generate_wgsl(sp.config(NT=64, TPT=4, RK=8, STAGE="private"))
    wg = generate_wgsl(sp.config(NT=64, TPT=4, RK=8, STAGE="workgroup"))
    glob = generate_wgsl(sp.config(NT=64, TPT=4, RK=8, STAGE="global"))
    assert "var<workgroup>" not in priv and "workgroupBarrier" not in priv
    assert "var<workgroup> sa: array<f32, 263>" in wg and wg.count("workgroupBarrier") == 2
    # the private window holds TPT + RK - 1 = 11 inputs; the global variant reads every operand per multiply
    assert "let x_10 = " in priv and "let x_11 = " not in priv
    assert glob.count("ld(") == 4 * 8 + 1  # 32 reads in the unrolled step + the helper's declaration


def test_dwsep_reference_matches_direct_loops(rng):
    B, C, H, W, O, K, P = 2, 3, 5, 6, 4, 3, 1
    x, dw, pw = rng.standard_normal((B, C, H, W)), rng.standard_normal((C, K, K)), rng.standard_normal((O, C))
    ref = reference_dwsep(x, dw, pw, P)
    direct = np.zeros((B, O, H, W))
    for b in range(B):
        for o in range(O):
            for y in range(H):
                for xx in range(W):
                    s = 0.0
                    for c in range(C):
                        d = sum(x[b, c, y + ky - P, xx + kx - P] * dw[c, ky, kx] for ky in range(K) for kx in range(K)
                                if 0 <= y + ky - P < H and 0 <= xx + kx - P < W)
                        s += pw[o, c] * d
                    direct[b, o, y, xx] = s
    np.testing.assert_allclose(ref, direct, rtol=1e-10, atol=1e-10)


def test_dwsep_reference_matches_torch(rng):
    torch = pytest.importorskip("torch")
    B, C, H, W, O, K, P = 1, 4, 7, 9, 6, 5, 2
    x, dw, pw = rng.standard_normal((B, C, H, W)), rng.standard_normal((C, K, K)), rng.standard_normal((O, C))
    F = torch.nn.functional
    t = F.conv2d(F.conv2d(torch.from_numpy(x), torch.from_numpy(dw)[:, None], padding=P, groups=C),
                 torch.from_numpy(pw)[:, :, None, None])
    np.testing.assert_allclose(reference_dwsep(x, dw, pw, P), t.numpy(), rtol=1e-10, atol=1e-10)


def test_dwsep_rules_and_shape_refusals():
    sp, tpl = dwsep_space(), WgslDwsepConv2d()
    bad = sp.config(BW=8, TPX=4, BO=4, TO=8, RC=1, STAGE="global")
    assert sp.why_illegal(bad) == ["channel_split: BO % TO = 4 % 8 = 4 != 0"]
    huge = sp.config(BW=64, TPX=1, BO=64, TO=1, RC=8, STAGE="workgroup")
    why = sp.why_illegal(huge, WEBGPU_DEFAULT)
    assert "invocations: NT = (BO/TO)*(BW/TPX) = (64/1)*(64/1) = 4096 > max_invocations_per_workgroup 256" in why
    ok = sp.config(BW=16, TPX=4, BO=8, TO=2, RC=4, STAGE="private")
    assert sp.why_illegal(ok, WEBGPU_DEFAULT) == []
    assert tpl.shape_problems(ok, (1, 6, 8, 8, 8, 3, 1)) == [
        "reduction_split: C % RC = 6 % 4 = 2 != 0 (each step reads RC channels unguarded)"]
    assert "larger than the padded input" in tpl.shape_problems(ok, (1, 8, 4, 4, 8, 7, 1))[0]
    with pytest.raises(ConfigError, match="must be B,C,H,W,O,K,P"):
        tpl.make_inputs((1, 2, 3), np.random.default_rng(0))


def test_dwsep_workgroup_variant_shares_depthwise_values_private_does_not():
    sp = dwsep_space()
    wg = dwsep_wgsl(sp.config(BW=32, TPX=4, BO=32, TO=4, RC=4, STAGE="workgroup"))
    pv = dwsep_wgsl(sp.config(BW=32, TPX=4, BO=32, TO=4, RC=4, STAGE="private"))
    assert "var<workgroup> sd: array<f32, 128>" in wg and "workgroupBarrier" in wg
    assert "var<workgroup>" not in pv and "workgroupBarrier" not in pv
    assert "@workgroup_size(64)" in wg and "@workgroup_size(64)" in pv


def test_every_space_config_generates_balanced_wgsl():
    """Cheap structural check over the whole conv1d grid and a dwsep sample: braces balance, one entry point."""
    for cfg in conv1d_space():
        src = generate_wgsl(cfg)
        assert src.count("{") == src.count("}") and src.count("@compute") == 1
    for cfg in dwsep_space().sample(40, seed=1):
        src = dwsep_wgsl(cfg, 3, 1)
        assert src.count("{") == src.count("}") and src.count("@compute") == 1


def test_inputs_are_random_and_never_zero(rng):
    host = WgslConv1d().make_inputs((300, 7), rng)
    assert np.all(np.abs(host["a"]) >= 0.5) and np.all(np.abs(host["w"]) >= 0.5)
    assert np.unique(host["a"]).size > 250
    host = WgslDwsepConv2d().make_inputs((1, 3, 5, 5, 4, 3, 1), rng)
    assert all(np.all(v != 0) for v in host.values())
