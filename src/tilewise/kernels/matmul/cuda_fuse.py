"""Launches the CUDA executor may fold together, each one launch fewer with the same bits:

- a matmul's f16 prologue (`nf4_mm_prep`) joined with the launch before it, where that launch wrote exactly the
  prologue's rows (`fuse_preps`, `fuse_prep`);
- a split-K config whose slices a reduction launch sums, made to sum them in the last block of each tile instead
  (`serial_reduce`, `summed_config`): the table's config was timed alone, where the reduction's launch costs less
  than in a decision's chain of launches, so the executor's setting is raced on whole decisions;
- a residual matmul that sums in its own launch (wgr with KS 1 or a cluster, splitk with a cluster) and the
  RMSNorm prologue of the next wgr matmul, the norm folded into the two matmuls (`fold_norm`): one launch fewer,
  not the same bits (the f16 rounding falls on h * g instead of on the normed row), so its race compares within a
  tolerance;
- the q/k/v matmul (wgr, no epilogue, summing in its own launch) and the q/k norm + RoPE launch after it
  (`fuse_rope`): the matmul's epilogue writes q and the KV cache rows itself, one launch fewer, its head sums of
  squares added in another order (within the f32 rounding, not the same bits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.errors import LaunchError, ShaderCompileError
from tilewise.kernels.cudasrc import NULL, compile_cuda, name_expression
from tilewise.kernels.matmul.cuda_source import WGR_ARGS, matmul_source
from tilewise.kernels.matmul.cuda_space import EPI_CODE, PREP_NT
from tilewise.kernels.space import Config

#: matmul_reduce.cu's RopeOut: q_norm, k_norm, cos, sin, q, k_cache, v_cache (device addresses), start, HQ, HKV, eps
ROPE_OUT = np.dtype([("ptr", "<u8", 7), ("start", "<i4"), ("hq", "<i4"), ("hkv", "<i4"), ("eps", "<f4")])
ROPE_HEAD_DIM = 64  # rope_chunk's head: the 16 4-column chunks of a half-warp


def fuse_prep(device: Device, prev: Launch, prep: Launch, programs: dict[Any, Program]) -> Launch | None:
    """The launch that does `prev` and the f16 prologue `prep` right after it, where the prologue reads exactly the
    rows `prev` wrote (None where the pair does not fit). The same arithmetic, so the same bits:

    - a residual split-K reduction and a prologue (normed or not) of its rows: one `nf4_mm_reduce_prep` launch
      (`programs` caches its programs by key);
    - a launch that offers f16 output (`cudasrc.offers_f16_out`: wgr applying its own epilogue, the short conv,
      attention) and an unnormed prologue of that output: the same launch storing f16 rows where the prologue would
      have. Its f32 output is then not written: the caller fuses only where the prologue's matmul is that output's
      only reader.
    """
    role = prep.program.meta.get("role")
    if role is None or role[0] != "prep":
        return None
    x, x_row0, norm_w, eps, xh, k = prep.buffers
    if int(x_row0) != 0:
        return None
    if prev.program.meta.get("role") == ("reduce", EPI_CODE["residual"]):
        partial, ks, out, m, n = prev.buffers
        if x is not out or int(k) != int(n) or int(n) % 4 or prep.grid[0] != int(m):
            return None
        prog = programs.get(("reduce_prep", role[1]))
        if prog is None:
            prog = programs[("reduce_prep", role[1])] = compile_cuda(
                device, matmul_source(), name_expression("nf4_mm_reduce_prep", role[1], PREP_NT), PREP_NT,
                f"nf4_mm_reduce_prep[norm={role[1]}]")
        return Launch(prog, (int(m), 1, 1), [partial, ks, out, m, n, norm_w, eps, xh])
    offer = prev.program.meta.get("f16_out")
    if offer is not None and role[1] == 0:
        out, out_h, rows, cols, cols_scale = offer
        args = list(prev.buffers)
        if (args[out] is not x or args[out_h] is not NULL or int(args[rows]) != prep.grid[0]
                or int(args[cols]) * cols_scale != int(k)):
            return None
        args[out_h] = xh
        return Launch(prev.program, prev.grid, args)
    return None


def summed_config(tpl: Any, config: Config, limits: Any, shape: tuple[int, int, int],
                  compile: Callable[[Config], Any]) -> Config:
    """`config` with SR 1 (the last block of each tile sums the slices) where it splits K with SR 0 (wgr, splitk)
    and SR 1 is legal at `shape` and compiles (`compile(config)` raises otherwise); else `config` unchanged. It adds
    the slices in the reduction's order: the same bits."""
    if "SR" not in config or config["SR"] or not tpl.splits(config):
        return config
    summed = tpl.config_of({**config, "SR": 1})
    if tpl.why_illegal(summed, limits, shape):
        return config
    try:
        compile(summed)
    except (ShaderCompileError, LaunchError):
        return config
    return summed


def fold_norm(prev: Launch, prep: Launch, main: Launch, ss: Any) -> tuple[Launch, Launch] | None:
    """`prev` and `main` with the normed prologue `prep` between them folded away (matmul_reduce.cu's `fold_chunk`):
    the residual launch `prev` also stores main's x as f16 (h * g) rows and each row's sums of squares per 64
    columns into `ss` (at least M x N / 64 floats), and `main` multiplies its rows by 1 / rms(h) before its epilogue.
    None where they do not fit: prev a residual launch that sums in the kernel and stores the fold's rows (its
    program's `fold_from`: wgr with KS 1 or SR 2, splitk with SR 2) and writes no f16 rows yet, prep the normed
    prologue of exactly prev's output rows, main a wgr launch reading prep's rows whose sums are whole in the launch
    (`fold_into`: KS 1, or SR 2, whose cluster scales the summed slices). The fold never changes a config: a split
    config the table summed in a reduction launch keeps it (a cluster forced for the fold's sake cost more than the
    launches it saved)."""
    role = prep.program.meta.get("role")
    at = prev.program.meta.get("fold_from")
    if role != ("prep", 1) or not at or not main.program.meta.get("fold_into"):
        return None
    x, x_row0, norm_w, eps, xh, k = prep.buffers
    p, m = list(prev.buffers), list(main.buffers)
    n = int(p[at["n"]])
    if (int(x_row0) != 0 or p[0] is xh or p[at["final_out"]] is not x or p[at["out_h"]] is not NULL
            or int(p[at["m"]]) != prep.grid[0] or n != int(k) or n % 64 or m[0] is not xh or int(m[WGR_ARGS["k"]]) != n
            or ss.nbytes < 4 * int(p[at["m"]]) * (n // 64)):
        return None
    p[at["out_h"]], p[at["fold_g"]], p[at["ss_out"]] = xh, norm_w, ss
    m[WGR_ARGS["ss_in"]], m[WGR_ARGS["eps"]] = ss, eps
    return Launch(prev.program, prev.grid, p), Launch(main.program, main.grid, m)


def fuse_rope(device: Device, main: Launch, rope: Launch) -> tuple[Launch, Any] | None:
    """`main`, the q/k/v matmul, doing the q/k norm + RoPE launch `rope` (attention.cu's `qknorm_rope`) after it in
    its own epilogue (matmul_reduce.cu's `rope_chunk`), and the 72-byte device buffer holding the RopeOut it reads
    (the caller keeps it as long as the launch). None where they do not fit: main a wgr launch of no epilogue that
    sums in its own launch (`rope_into`: KS 1 or a cluster) writing f32 rows (no f16 output) into exactly the rows
    rope reads, heads of 64."""
    if not main.program.meta.get("rope_into"):
        return None
    qkv, q_norm, k_norm, cos, sin, q, k_cache, v_cache, m, start, hq, hkv, eps = rope.buffers
    args = list(main.buffers)
    n = int(args[WGR_ARGS["n"]])
    if (args[WGR_ARGS["final_out"]] is not qkv or args[WGR_ARGS["out_h"]] is not NULL or args[WGR_ARGS["rope"]]
            is not NULL or int(args[WGR_ARGS["m"]]) != int(m) or n != (int(hq) + 2 * int(hkv)) * ROPE_HEAD_DIM):
        return None
    record = np.zeros(1, ROPE_OUT)
    record["ptr"][0] = [device.address(b) for b in (q_norm, k_norm, cos, sin, q, k_cache, v_cache)]
    record["start"], record["hq"], record["hkv"], record["eps"] = int(start), int(hq), int(hkv), float(eps)
    desc = device.allocate(ROPE_OUT.itemsize)
    device.write(desc, record.view(np.uint8))
    args[WGR_ARGS["rope"]] = desc
    return Launch(main.program, main.grid, args), desc
