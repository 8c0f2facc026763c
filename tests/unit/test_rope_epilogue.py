"""The q/k norm + RoPE epilogue of the qkv matmul (`fuse_rope`) without a GPU: the by-value `RopeArgs` packs as the
C struct lays out, the epilogue's order of the sum of squares is qknorm_rope's (so the bits can be the same), and
the executor's plan folds the qknorm_rope launch into exactly the qkv launches that can take it."""

from __future__ import annotations

import dataclasses
import shutil
import struct
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from tests.unit.test_model_cuda_plan import _wgr_executor, check_launch, kernel_signatures

from tilewise.devices.cuda_struct import StructArg
from tilewise.errors import LaunchError
from tilewise.kernels.matmul.cuda_source import WGR_ARGS, matmul_source, rope_args
from tilewise.model.config import PRESETS


def fake_buffer(ptr: int):
    return SimpleNamespace(handle=SimpleNamespace(data=SimpleNamespace(ptr=ptr)))


def test_rope_args_pack_seven_addresses_then_three_ints_and_a_float(rng):
    ptrs = [int(p) * 256 for p in rng.integers(1, 2**40, 7)]
    start, hq, hkv = (int(v) for v in rng.integers(0, 4096, 3))
    eps = float(rng.uniform(1e-6, 1e-4))
    got = rope_args(*(fake_buffer(p) for p in ptrs), start, hq, hkv, eps).array.tobytes()
    assert got == struct.pack("<7Q3if", *ptrs, start, hq, hkv, np.float32(eps)) and len(got) == 72
    assert rope_args().array.tobytes() == bytes(72)  # the null struct: no q, so no fused epilogue


def test_a_struct_field_that_is_not_a_buffer_or_scalar_is_refused_by_name():
    arg = StructArg([fake_buffer(4096), "q"], "RopeArgs")  # packed only when the bytes are asked for
    with pytest.raises(LaunchError, match="RopeArgs: field 'q'"):
        _ = arg.array


def test_a_struct_is_padded_to_its_fields_alignment():
    arg = StructArg([np.int32(7), fake_buffer(8192), np.int32(9)], "S")
    assert arg.array.tobytes() == struct.pack("<i4xQi4x", 7, 8192, 9)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not found")
def test_the_c_struct_has_the_layout_python_packs(tmp_path):
    size = rope_args().nbytes
    src = tmp_path / "layout.cu"
    src.write_text(matmul_source() + "\n#include <cstddef>\n"
                   f"static_assert(sizeof(RopeArgs) == {size}, \"size\");\n"
                   "static_assert(offsetof(RopeArgs, start) == 56 && offsetof(RopeArgs, HKV) == 64, \"ints\");\n"
                   "static_assert(offsetof(RopeArgs, eps) == 68, \"eps\");\n")
    got = subprocess.run([shutil.which("nvcc"), "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-c",
                          "-o", str(tmp_path / "layout.o"), str(src)], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]


def test_the_epilogues_sum_of_squares_takes_qknorm_ropes_order(rng):
    """qknorm_rope: lane l holds v[l] and v[l + 32]; ss = v[l]^2 then + v[l + 32]^2; xor-shuffle sums 16..1 over the
    warp. rope_chunk: lane j of a half-warp holds v[4j..4j+3], its xor-8 partner the values 32 away; the partials
    summed over lanes xor 4, 2, 1, then elements i ^ 2, i ^ 1. Both in float32, on values of mixed magnitude."""
    f = np.float32
    for _ in range(200):
        v = (rng.standard_normal(64) * np.exp(rng.uniform(-8, 8, 64))).astype(f)
        lane = [f(f(0) + v[i] * v[i]) + v[i + 32] * v[i + 32] for i in range(32)]
        lane = [f(x) for x in lane]
        for s in (16, 8, 4, 2, 1):
            lane = [f(lane[i] + lane[i ^ s]) for i in range(32)]
        want = lane[0]
        p = [[f(f(f(0) + v[4 * j + i] * v[4 * j + i]) + v[4 * j + i + 32] * v[4 * j + i + 32]) for i in range(4)]
             for j in range(8)]
        for s in (4, 2, 1):
            p = [[f(p[j][i] + p[j ^ s][i]) for i in range(4)] for j in range(8)]
        got = {f(f(p[j][0] + p[j][2]) + f(p[j][1] + p[j][3])) for j in range(8)}
        assert all(x == want for x in lane) and got == {want}


QKV_CASES = {"ks1": ({"KS": 1}, True), "cluster": ({"KS": 2, "SR": 2}, True), "reduce-launch": ({"KS": 2, "SR": 0},
                                                                                                False)}


@pytest.mark.parametrize("case", list(QKV_CASES))
def test_the_qkv_launch_takes_the_q_k_norm_and_rope_where_it_sums_in_its_launch(rng, monkeypatch, case):
    """fuse_rope on a model with heads of 64: a qkv launch that applies its own epilogue (wgr KS 1, or SR 2) gets
    RopeArgs holding exactly what the qknorm_rope launch it replaces held (norm weights, RoPE tables, q, this
    state's K/V cache, the start row, heads, eps), and that launch is gone; a qkv whose slices a reduction launch
    sums keeps it. Off, every qkv launch passes the null struct."""
    from tilewise.kernels.matmul.cuda import DEFAULT_WGR

    cfg = dataclasses.replace(PRESETS["tiny"], hidden_size=128, intermediate_size=384, head_dim=64, name="tiny-64")
    H, F, d, hq, hkv = cfg.hidden_size, cfg.ffn_dim, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    extra, fused = QKV_CASES[case]
    ex = _wgr_executor(monkeypatch, [("none", 3 * H, H, True, DEFAULT_WGR),
                                     ("none", (hq + 2 * hkv) * d, H, True, {**DEFAULT_WGR, **extra}),
                                     ("residual", H, H, False, DEFAULT_WGR),
                                     ("residual", H, hq * d, False, DEFAULT_WGR), ("swiglu", F, H, True, DEFAULT_WGR),
                                     ("residual", H, F, False, DEFAULT_WGR)], cfg)
    sigs = kernel_signatures()
    attn = cfg.layer_types.count("full_attention")
    n = int(rng.integers(9, 60))
    ids = rng.integers(0, 512, n)
    apart, _ = ex.plan(ids, 0, None, False)
    ropes = [launch for launch in apart.launches if launch.program.meta["entry"].startswith("qknorm_rope")]
    assert len(ropes) == attn
    qkvs = [launch for launch, lab in zip(apart.launches, apart.labels) if lab == "attn.qkv"
            and "reduce" not in launch.program.meta["entry"] and "prep" not in launch.program.meta["entry"]]
    assert all(launch.buffers[WGR_ARGS["rope"]].fields[4] is None for launch in qkvs)
    ex.fuse_rope = True
    base, state = ex.plan(ids, 0, None, False)
    assert len(base.launches) == len(apart.launches) - (attn if fused else 0)
    tail = ex.plan(rng.integers(0, 512, 12), n, state, False)  # an extend branch, on the table's wgr
    for start, (plan, new) in ((0, (base, state)), (n, tail)):
        for launch in plan.launches:
            check_launch(launch, sigs)
        left = [launch for launch in plan.launches if launch.program.meta["entry"].startswith("qknorm_rope")]
        assert len(left) == (0 if fused else attn)
        if not fused:
            continue
        main = [launch for launch, lab in zip(plan.launches, plan.labels) if lab == "attn.qkv"
                and launch.program.meta["entry"].startswith("nf4_mm_wgr")]
        attn_layers = [i for i, lay in enumerate(ex.layers) if lay["kind"] != "conv"]
        assert len(main) == len(attn_layers) == attn
        for launch, i in zip(main, attn_layers):
            ra = launch.buffers[WGR_ARGS["rope"]].fields
            assert ra[0] is ex.layers[i]["q_norm"] and ra[1] is ex.layers[i]["k_norm"]
            assert ra[2] is ex.rope[0] and ra[3] is ex.rope[1] and ra[4] is ex.act["q"]
            assert ra[5] is new.kv[i][0] and ra[6] is new.kv[i][1]
            assert [int(x) for x in ra[7:10]] == [start, hq, hkv] and ra[10] == np.float32(cfg.norm_eps)
