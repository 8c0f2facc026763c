"""The classifier's weight matmuls on CUDA (`matmul.cu`): tensor cores (mma.sync f16 -> f32) fed by register
prefetch or a cp.async pipeline, split-K and a short-row path.

Problem: `matmul.problem.MatmulProblem` (y = epilogue(norm(x) @ W^T), W (N, K) nf4 / f16 / f32). Five kinds:

- `mma` (`nf4_mm_mma<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE>`): a BM x BN output tile per block, BK inputs per
  step through PIPE shared-memory buffers (x normed and rounded to f16, W decoded once per step, the next step's
  words loaded into registers during the math), WM x WN per warp in m16n8k16 `mma.sync` steps fed by `ldmatrix`
  (inline PTX). f16 operands, so it is verified at the f16 tolerance;
- `splitk` (`nf4_mm_splitk<..., PIPE, KS>` + `nf4_mm_splitk_reduce<EPI, NT>`): the same main loop over KS slices
  of K (grid z), raw f32 partial sums into the `partial` scratch (KS, SETS, M, N), then a second launch adds the
  slices in a fixed order and applies the epilogue: it fills the GPU where N / BN * M / BM tiles would not (the
  N = 1024 projections);
- `pipe` (`nf4_mm_pipe<..., ST, KS, MB>`): the same tiles fed by a cp.async ring of ST raw stages in dynamic shared
  memory (opted in above 48 KB), converted into two operand buffers with one barrier a step; KS 1 applies the
  epilogue, KS > 1 sums slices like split-K; MB is the launch bound's blocks per SM;
- `ring` (`nf4_mm_prep<NORM, NT>` + `nf4_mm_ring<FMT, EPI, ..., ST, KS, MB>`): x rounded to f16 once (normed first
  with the fused norm) into the `xh` scratch, then a cp.async ring of ST stages holding f16 x and W as stored, with
  nothing converted in shared memory: W's fragments are decoded in registers. KS > 1 sums slices like split-K;
- `rows` (`nf4_mm_rows<FMT, EPI, NORM, NT, RM>`): one warp per output column over RM rows, f32 arithmetic, for few
  rows (a decision's last block, short extends).

Arguments: x, x_row0 (first row of x read), w, absmax, w_up, absmax_up, norm_w, eps, out, M, N, K; every size is an
argument, so one program serves every shape (`program_key` is the config); split-K's main launch takes `partial`
in place of out. A later step with a seam here: swizzled shared layouts instead of padded rows.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.cudasrc import FMT_CODE, arg_or, compile_cuda, cu_source, name_expression, upload_all
from tilewise.kernels.matmul.problem import EPILOGUES, MatmulProblem
from tilewise.kernels.space import Config, Rule, Space

WARP = 32
KINDS = ("mma", "rows", "splitk", "pipe", "ring")
EPI_CODE = {e: i for i, e in enumerate(EPILOGUES)}  # none 0, residual 1, swiglu 2 (matmul.cu's EPI)
STATIC_SMEM_BYTES = 48 * 1024
MAX_FRAGMENTS = 16
#: the row count from which the tensor-core kernel is the default (below it the short-row kernel)
MMA_FROM_ROWS = 32
DEFAULT_MMA = {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "PIPE": 2}
DEFAULT_ROWS = {"NT": 128, "RM": 4}
MMA_PARAMS = ("BM", "BN", "BK", "WM", "WN", "PIPE")
SPLITK_PARAMS = (*MMA_PARAMS, "KS")
KS_VALUES = [2, 4, 8]
#: KS 2 divides every K the mma default admits in two whole 32-wide steps from K = 64
DEFAULT_SPLITK = {**DEFAULT_MMA, "KS": 2}
#: threads per block of the split-K reduction (one output value per thread)
REDUCE_NT = 256

MMA_VALUES: dict[str, list[int]] = {"BM": [32, 64, 128], "BN": [32, 64, 128, 256], "BK": [32, 64],
                                     "WM": [16, 32, 64], "WN": [16, 32, 64], "PIPE": [1, 2]}
MMA_SEED = [dict(zip(MMA_PARAMS, v)) for v in (
    (64, 64, 32, 32, 32, 2), (128, 64, 32, 64, 32, 2), (64, 128, 32, 32, 64, 2), (32, 64, 64, 16, 32, 2),
    (128, 128, 32, 64, 64, 2), (128, 128, 32, 64, 32, 2), (64, 128, 64, 32, 32, 1), (64, 64, 64, 32, 32, 2),
    (32, 128, 64, 32, 32, 2), (64, 256, 32, 32, 64, 1), (128, 64, 64, 32, 32, 1), (32, 32, 32, 16, 16, 2),
    (128, 256, 64, 64, 64, 2), (128, 128, 64, 64, 64, 2),  # the last two are illegal on purpose: smem_48k
)]
SPLITK_SEED = [dict(zip(SPLITK_PARAMS, v)) for v in (
    (32, 64, 64, 16, 32, 2, 2), (32, 64, 64, 16, 32, 2, 4), (64, 64, 32, 32, 32, 2, 4), (64, 64, 32, 32, 32, 2, 2),
    (32, 64, 32, 16, 32, 2, 8), (64, 128, 32, 32, 64, 2, 4), (32, 128, 64, 32, 32, 2, 2), (64, 64, 64, 32, 32, 2, 8),
    (128, 64, 32, 64, 32, 2, 2),
)]
ROWS_VALUES: dict[str, list[int]] = {"NT": [64, 128, 256], "RM": [1, 2, 4, 8, 16]}
PIPE_PARAMS = ("BM", "BN", "BK", "WM", "WN", "ST", "KS", "MB")
PIPE_VALUES: dict[str, list[int]] = {"BM": [32, 64, 128], "BN": [32, 64, 128, 256], "BK": [32, 64],
                                      "WM": [16, 32, 64], "WN": [16, 32, 64], "ST": [3, 4, 6], "KS": [1, 2, 4, 8],
                                      "MB": [1, 2]}
DEFAULT_PIPE = {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "ST": 4, "KS": 1, "MB": 1}
PIPE_SEED = [dict(zip(PIPE_PARAMS, v)) for v in (
    (64, 64, 32, 32, 32, 4, 1, 1), (64, 128, 32, 32, 64, 4, 1, 1), (128, 128, 32, 64, 32, 3, 1, 1),
    (64, 64, 32, 32, 32, 4, 1, 2),
    (64, 64, 64, 32, 32, 4, 1, 2), (32, 64, 64, 16, 32, 4, 1, 2), (64, 64, 32, 32, 32, 4, 4, 2),
    (64, 64, 32, 32, 32, 6, 2, 2), (128, 64, 32, 64, 32, 4, 2, 1), (64, 128, 64, 32, 64, 3, 1, 1),
    (32, 64, 32, 16, 32, 6, 4, 2), (128, 128, 64, 64, 64, 3, 1, 1), (64, 128, 32, 32, 32, 4, 2, 2),
    (64, 64, 32, 32, 32, 2, 1, 2),  # illegal on purpose: stages_3_8
)]
#: the most dynamic shared memory a block may opt into on sm_80..sm_90, as PIPE_SMEM_MAX in matmul_pipe.cu
PIPE_SMEM_MAX = 227 * 1024
#: shared memory the driver reserves per block (sm_80+), for the blocks-per-SM rule
SMEM_RESERVED_PER_BLOCK = 1024
RING_PARAMS = PIPE_PARAMS
RING_VALUES: dict[str, list[int]] = {**PIPE_VALUES, "BK": [32, 64], "ST": [2, 3, 4, 6]}
DEFAULT_RING = {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "ST": 4, "KS": 1, "MB": 2}  # legal in every variant
# ordered by what won first (`tune model --budget N` takes the default and the first legal seeds): the small tiles
# for N <= 3072, the 64x128 / 128x128 halves of a SwiGLU pair, split-K for the N = 1024 projections
RING_SEED = [dict(zip(RING_PARAMS, v)) for v in (
    (64, 64, 64, 32, 32, 3, 1, 1), (64, 128, 32, 64, 32, 4, 1, 1), (128, 128, 32, 64, 32, 3, 1, 1),
    (64, 128, 64, 64, 32, 3, 1, 2), (64, 64, 64, 32, 32, 3, 2, 2), (64, 64, 64, 32, 32, 3, 4, 2),
    (128, 64, 32, 64, 32, 3, 1, 1), (64, 64, 32, 32, 32, 4, 4, 2), (64, 64, 64, 32, 32, 3, 1, 2),
    (64, 256, 64, 64, 64, 3, 1, 1), (128, 128, 64, 64, 64, 3, 1, 2), (64, 128, 64, 64, 32, 3, 1, 1),
    (64, 64, 64, 32, 32, 4, 1, 2), (128, 128, 64, 64, 32, 3, 1, 1), (64, 64, 32, 32, 32, 4, 1, 2),
    (128, 64, 64, 64, 32, 3, 1, 1), (32, 64, 64, 16, 32, 4, 1, 2), (64, 64, 32, 32, 32, 2, 1, 2),
    (64, 128, 32, 32, 64, 6, 2, 1),
    (128, 128, 64, 64, 64, 6, 1, 1),  # f32: over smem_227k; with swiglu fragments_per_warp_16 refuses the 64x64s
    (128, 128, 64, 32, 32, 3, 1, 2),  # illegal on purpose: registers_spare (512 threads, 2 blocks: 64 each)
)]
#: threads per block of the ring kind's x prologue (one block per row)
PREP_NT = 128


def mma_smem_bytes(c: Config, sets: int) -> int:
    """Static shared memory of a block, as `mma_smem_bytes` in matmul.cu computes it."""
    return c.PIPE * (c.BM + sets * c.BN) * (c.BK + 8) * 2 + c.BM * 4 + 16 * 4


def mma_held_registers(c: Config, fmt: str, sets: int, norm: bool = False) -> int:
    """Accumulators plus the next K step's words per thread (with a norm, their norm weights and the late norm's
    sums), as `mma_held_registers` in matmul.cu."""
    nt = max(mma_threads(c), 1)  # a tile smaller than its warp tile fails warp_tiles_divide first
    xpt, wpt = -(-c.BM * c.BK // 4 // nt), -(-sets * c.BN * c.BK // 8 // nt)
    return (sets * (c.WM // 16) * (c.WN // 8) * 4 + xpt * 4 + wpt * {"nf4": 2, "f16": 4, "f32": 8}[fmt]
            + (8 + xpt if norm else 0))  # the norm weights ahead (a float4, and its products), the late norm's sums


#: the family's CUDA source files, compiled as one text in this order (the later ones use matmul.cu's helpers)
SOURCE_FILES = ("matmul.cu", "matmul_pipe.cu", "matmul_ring.cu", "matmul_rows.cu")


def matmul_source() -> str:
    """The family's CUDA C++ text: `SOURCE_FILES` joined."""
    return "\n".join(cu_source("matmul", f) for f in SOURCE_FILES)


def pipe_smem_bytes(c: Config, fmt: str, sets: int) -> int:
    """Dynamic shared memory of a pipe block, as `pipe_smem_bytes` in matmul_pipe.cu: ST raw stages (x f32, W as stored,
    nf4's absmax per row, the step's norm weights), two f16 operand buffers, the rows' 1/rms and the NF4 code."""
    row = {"nf4": c.BK // 2, "f16": c.BK * 2, "f32": c.BK * 4}[fmt]
    absmax = max(1, c.BK // 64) if fmt == "nf4" else 0
    raw = c.BM * c.BK * 4 + sets * c.BN * row + sets * c.BN * absmax * 4 + c.BK * 4  # + the step's norm weights
    return c.ST * raw + 2 * (c.BM + sets * c.BN) * (c.BK + 8) * 2 + c.BM * 4 + 16 * 4


def ring_smem_bytes(c: Config, fmt: str, sets: int) -> int:
    """Dynamic shared memory of a ring block, as `ring_smem_bytes` in matmul_ring.cu: ST stages of the x tile (f16)
    and SETS W tiles as stored (nf4 with the rows' absmax; f16 and f32 rows padded), then the NF4 code."""
    w_tile = {"nf4": c.BN * (c.BK // 2) + c.BN * 4, "f16": c.BN * (c.BK + 8) * 2, "f32": c.BN * (c.BK + 4) * 4}[fmt]
    return c.ST * (c.BM * (c.BK + 8) * 2 + sets * w_tile) + 16 * 4


def ring_spare_registers(c: Config, sets: int) -> int:
    """Registers per thread the launch bound leaves beside the accumulators (`ring_register_cap` in matmul_ring.cu)."""
    cap = min(255, 65536 // max(mma_threads(c) * c.MB, 1))
    return cap - sets * (c.WM // 16) * (c.WN // 8) * 4


def ring_spare_needed(fmt: str, bk: int) -> int:
    """Registers the ring kind needs beside the accumulators (`ring_spare_needed`): nf4's decode at BK 64 holds a
    step's raw words, and spilled with 127."""
    return 128 if fmt == "nf4" and bk == 64 else 64


def mma_threads(c: Config) -> int:
    return (c.BM // c.WM) * (c.BN // c.WN) * WARP


def mma_rules(sets: int, fmt: str = "nf4", norm: bool = False) -> list[Rule]:
    """matmul.cu's `mma_first_failure`, rule for rule (its `variant` check is the constructor's)."""
    return [
        Rule("fragments_16", lambda c, _: all(v % 16 == 0 and v >= 16 for v in (c.WM, c.WN, c.BK)),
             lambda c, _: f"WM = {c.WM}, WN = {c.WN}, BK = {c.BK} must be multiples of 16 (m16n8k16 steps)",
             doc="each warp tile and K step is whole m16n8k16 steps (WN in pairs of n8)"),
        Rule("warp_tiles_divide", lambda c, _: c.BM % c.WM == 0 and c.BN % c.WN == 0,
             lambda c, _: f"block tile {c.BM}x{c.BN} is not a whole number of {c.WM}x{c.WN} warp tiles"),
        Rule("threads_1024", lambda c, _: mma_threads(c) <= 1024,
             lambda c, _: f"(BM/WM)*(BN/WN)*32 = {mma_threads(c)} threads > 1024"),
        Rule("smem_48k", lambda c, _: mma_smem_bytes(c, sets) <= STATIC_SMEM_BYTES,
             lambda c, _: f"{mma_smem_bytes(c, sets)} bytes of static shared memory > {STATIC_SMEM_BYTES}",
             doc="PIPE buffers of the f16 operand tiles, the rows' 1/rms and the NF4 code"),
        Rule("fragments_per_warp_16", lambda c, _: (c.WM // 16) * (c.WN // 16) * sets <= MAX_FRAGMENTS,
             lambda c, _: f"(WM/16)*(WN/16)*{sets} = {(c.WM // 16) * (c.WN // 16) * sets} accumulator fragments > "
                          f"{MAX_FRAGMENTS} per warp (certain spilling)"),
        Rule("pipe_1_2", lambda c, _: c.PIPE in (1, 2), lambda c, _: f"PIPE = {c.PIPE} is not 1 or 2",
             doc="operand buffers in shared memory: 1 (two barriers a step) or 2 (one)"),
        Rule("registers_160", lambda c, _: mma_held_registers(c, fmt, sets, norm) <= 160,
             lambda c, _: f"{mma_held_registers(c, fmt, sets, norm)} accumulator and next-step registers per thread "
                          "> 160 (ptxas spills)",
             doc="accumulators + the words (and norm weights) loaded a step ahead; above 160 it spilled"),
        Rule("threads_per_block", lambda c, lim: mma_threads(c) <= lim.max_invocations_per_workgroup,
             lambda c, lim: f"{mma_threads(c)} threads > the device's {lim.max_invocations_per_workgroup}",
             needs_limits=True),
    ]


def splitk_rules(sets: int, fmt: str = "nf4", norm: bool = False) -> list[Rule]:
    """matmul.cu's `splitk_first_failure`: the mma rules, then the slice count (limit-dependent rules last)."""
    rules = mma_rules(sets, fmt, norm)
    ks = Rule("ks_2_4_8", lambda c, _: c.KS in KS_VALUES, lambda c, _: f"KS = {c.KS} is not 2, 4 or 8",
              doc="slices of K; the partial-sum scratch holds at most 8 slices of SETS x M x N")
    return [*(r for r in rules if not r.needs_limits), ks, *(r for r in rules if r.needs_limits)]


def pipe_rules(sets: int, fmt: str = "nf4") -> list[Rule]:
    """matmul_pipe.cu's `pipe_first_failure`, rule for rule, then the device's shared-memory limits."""
    mma = {r.name: r for r in mma_rules(sets, fmt)}
    smem = lambda c: pipe_smem_bytes(c, fmt, sets)  # noqa: E731
    return [
        mma["fragments_16"], mma["warp_tiles_divide"], mma["threads_1024"], mma["fragments_per_warp_16"],
        Rule("warp_tile_2048", lambda c, _: c.WM * c.WN <= 2048,
             lambda c, _: f"warp tile {c.WM}x{c.WN} > 2048 outputs (ptxas spilled the 64x64 tile in every format)",
             doc="128 accumulators plus 8 B fragments per thread spilled; the mma kernel's registers_160 refuses it"),
        Rule("raw_rows_16b", lambda c, _: c.BK % 32 == 0,
             lambda c, _: f"BK = {c.BK} is not a multiple of 32 (a raw nf4 row of a step is whole 16-byte copies)"),
        Rule("stages_3_8", lambda c, _: 3 <= c.ST <= 8, lambda c, _: f"ST = {c.ST} raw stages is not in 3..8",
             doc="raw stages in flight: step kt + 1 is converted while kt multiplies, so ST - 2 steps hide latency"),
        Rule("ks_1_2_4_8", lambda c, _: c.KS in (1, 2, 4, 8), lambda c, _: f"KS = {c.KS} is not 1, 2, 4 or 8",
             doc="slices of K (1: no split, the epilogue in the kernel)"),
        Rule("mb_1_2", lambda c, _: c.MB in (1, 2), lambda c, _: f"MB = {c.MB} blocks per SM is not 1 or 2",
             doc="the launch bound's blocks per SM (2 caps the registers so that two blocks fit)"),
        Rule("smem_227k", lambda c, _: smem(c) <= PIPE_SMEM_MAX,
             lambda c, _: f"{smem(c)} bytes of shared memory > {PIPE_SMEM_MAX} (the sm_80..sm_90 opt-in maximum)"),
        mma["threads_per_block"],
        Rule("smem_per_block", lambda c, lim: lim.shared_bytes_per_block_optin is None
             or smem(c) <= lim.shared_bytes_per_block_optin,
             lambda c, lim: f"{smem(c)} bytes of shared memory > the device's {lim.shared_bytes_per_block_optin} "
                            "per block", needs_limits=True),
        Rule("mb_fit_smem", lambda c, lim: lim.shared_bytes_per_multiprocessor is None
             or c.MB * (smem(c) + SMEM_RESERVED_PER_BLOCK) <= lim.shared_bytes_per_multiprocessor,
             lambda c, lim: f"MB = {c.MB} blocks of {smem(c)} bytes do not fit the device's "
                            f"{lim.shared_bytes_per_multiprocessor} bytes of shared memory per SM", needs_limits=True),
    ]


def ring_rules(sets: int, fmt: str = "nf4") -> list[Rule]:
    """matmul_ring.cu's `ring_first_failure`, rule for rule, then the device's limits."""
    pipe = {r.name: r for r in pipe_rules(sets, fmt)}
    mma = {r.name: r for r in mma_rules(sets, fmt)}
    smem = lambda c: ring_smem_bytes(c, fmt, sets)  # noqa: E731
    return [
        Rule("fragments_16", lambda c, _: all(v % 16 == 0 and v >= 16 for v in (c.WM, c.WN)),
             lambda c, _: f"WM = {c.WM}, WN = {c.WN} must be multiples of 16 (m16n8k16 steps)"),
        Rule("bk_32_64", lambda c, _: c.BK in (32, 64),
             lambda c, _: f"BK = {c.BK} is not 32 or 64 (whole 16-byte nf4 copies, one absmax per row a step)"),
        mma["warp_tiles_divide"], mma["threads_1024"], mma["fragments_per_warp_16"], pipe["mb_1_2"],
        Rule("registers_spare", lambda c, _: ring_spare_registers(c, sets) >= ring_spare_needed(fmt, c.BK),
             lambda c, _: f"the launch bound ({mma_threads(c)} threads x {c.MB} blocks) leaves "
                          f"{ring_spare_registers(c, sets)} registers beside the accumulators, < "
                          f"{ring_spare_needed(fmt, c.BK)} (ptxas spills)",
             doc="fragments and addresses need 64 registers beside the accumulators; nf4's decode at BK 64, 128"),
        Rule("stages_2_6", lambda c, _: 2 <= c.ST <= 6, lambda c, _: f"ST = {c.ST} ring stages is not in 2..6",
             doc="K steps in shared memory; the copies run ST - 1 steps ahead"),
        pipe["ks_1_2_4_8"],
        Rule("smem_227k", lambda c, _: smem(c) <= PIPE_SMEM_MAX,
             lambda c, _: f"{smem(c)} bytes of shared memory > {PIPE_SMEM_MAX} (the sm_80..sm_90 opt-in maximum)"),
        mma["threads_per_block"],
        Rule("smem_per_block", lambda c, lim: lim.shared_bytes_per_block_optin is None
             or smem(c) <= lim.shared_bytes_per_block_optin,
             lambda c, lim: f"{smem(c)} bytes of shared memory > the device's {lim.shared_bytes_per_block_optin} "
                            "per block", needs_limits=True),
        Rule("mb_fit_smem", lambda c, lim: lim.shared_bytes_per_multiprocessor is None
             or c.MB * (smem(c) + SMEM_RESERVED_PER_BLOCK) <= lim.shared_bytes_per_multiprocessor,
             lambda c, lim: f"MB = {c.MB} blocks of {smem(c)} bytes do not fit the device's "
                            f"{lim.shared_bytes_per_multiprocessor} bytes of shared memory per SM", needs_limits=True),
    ]


def rows_rules() -> list[Rule]:
    """matmul_rows.cu's `rows_first_failure`, rule for rule."""
    return [
        Rule("whole_warps", lambda c, _: c.NT % WARP == 0 and WARP <= c.NT <= 1024,
             lambda c, _: f"NT = {c.NT} is not a whole number of warps in 32..1024"),
        Rule("rows_1_16", lambda c, _: 1 <= c.RM <= 16, lambda c, _: f"RM = {c.RM} rows per block is not in 1..16",
             doc="RM accumulators per weight set per lane"),
        Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= c.NT,
             lambda c, lim: f"NT = {c.NT} > the device's {lim.max_invocations_per_workgroup}", needs_limits=True),
    ]


class CudaMatmul(KernelTemplate):
    """One matmul variant (kind, weight format, epilogue, fused norm) on CUDA; see the module docstring."""

    backend = "cuda"
    shape_names = MatmulProblem.shape_names
    # a 346-row float64 reference of a 4608x1024 pair costs more than a candidate's compile and run: eight checks
    # share one input set (outputs re-poisoned before each)
    verify_reuse = 8

    def __init__(self, kind: str = "mma", fmt: str = "nf4", epilogue: str = "none", norm: bool = False,
                 eps: float = 1e-5) -> None:
        if kind not in KINDS or fmt not in FMT_CODE or epilogue not in EPI_CODE:
            raise ValueError(f"unknown CUDA matmul kind={kind} fmt={fmt} epilogue={epilogue}")
        self.kind, self.fmt, self.epilogue, self.norm, self.eps = kind, fmt, epilogue, norm, eps
        self.problem = MatmulProblem(fmt, epilogue, norm, eps)
        self.sets = self.problem.sets
        self.name = f"{fmt}_matmul.{kind}.{epilogue}" + (".norm" if norm else "")
        self.dtype = "f16" if kind != "rows" else self.problem.dtype
        #: split-K's partial sums are poisoned and guarded like "out" (`KernelTemplate.scratch_buffers`)
        self.scratch_buffers = {"splitk": ("partial",), "pipe": ("partial",), "ring": ("partial", "xh")}.get(kind, ())

    @classmethod
    def from_name(cls, name: str, eps: float = 1e-5) -> CudaMatmul:
        """The template a name like `nf4_matmul.rows.swiglu.norm` stands for."""
        parts = name.split(".")
        fmt = parts[0].split("_")[0]
        return cls(parts[1], fmt, parts[2], len(parts) > 3 and parts[3] == "norm", eps)

    # ---- spaces -----------------------------------------------------------------------------------------------
    spaces = ("seed", "full")

    def space(self, which: str = "full") -> Space:
        if self.kind == "rows":
            return Space("cuda-matmul-rows", {k: list(v) for k, v in ROWS_VALUES.items()}, rows_rules())
        if self.kind == "ring":
            return Space(f"cuda-matmul-ring-{which}", {k: list(v) for k, v in RING_VALUES.items()},
                         ring_rules(self.sets, self.fmt), points=RING_SEED if which == "seed" else None)
        if self.kind == "pipe":
            return Space(f"cuda-matmul-pipe-{which}", {k: list(v) for k, v in PIPE_VALUES.items()},
                         pipe_rules(self.sets, self.fmt), points=PIPE_SEED if which == "seed" else None)
        values = {k: list(v) for k, v in MMA_VALUES.items()}
        if self.kind == "splitk":
            values["KS"] = list(KS_VALUES)
            return Space(f"cuda-matmul-splitk-{which}", values, splitk_rules(self.sets, self.fmt, self.norm),
                         points=SPLITK_SEED if which == "seed" else None)
        points = MMA_SEED if which == "seed" else None
        return Space(f"cuda-matmul-mma-{which}", values, mma_rules(self.sets, self.fmt, self.norm), points=points)

    def default_config(self) -> Config:
        return self.config_of({"rows": DEFAULT_ROWS, "mma": DEFAULT_MMA, "splitk": DEFAULT_SPLITK,
                               "pipe": DEFAULT_PIPE, "ring": DEFAULT_RING}[self.kind])

    def splits(self, config: Config) -> bool:
        """The config sums slices of K through `partial` and a further launch (split-K, or pipe / ring with KS > 1)."""
        return self.kind == "splitk" or (self.kind in ("pipe", "ring") and config["KS"] > 1)

    def scratch_bytes(self, config: Config, rows: int, n: int, k: int) -> dict[str, int]:
        """The scratch buffers a config's launches need at `rows` rows, by name: split-K's partial sums, the ring
        kind's f16 copy of x (`xh`, rows x K)."""
        out = {"partial": self.partial_bytes(config["KS"], rows, n)} if self.splits(config) else {}
        if self.kind == "ring":
            out["xh"] = 2 * rows * k
        return out

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        m, _, k = shape
        out = []
        if self.kind in ("splitk", "pipe", "ring"):
            if k % (config["KS"] * config["BK"]):
                out.append(f"k_slices: K = {k} is not KS = {config['KS']} slices of whole BK = {config['BK']} steps "
                           f"(a multiple of {config['KS'] * config['BK']})")
        elif k % (step := config["BK"] if self.kind == "mma" else 8):
            out.append(f"k_steps: K = {k} is not a multiple of {'BK' if self.kind == 'mma' else 'a word of 8'} "
                       f"= {step}")
        if self.fmt == "nf4" and k % 64:
            out.append(f"nf4_blocks: K = {k} is not a multiple of 64 (one absmax per 64 weights of a row)")
        bm = config["RM"] if self.kind == "rows" else config["BM"]
        if math.ceil(m / bm) > 65535:
            out.append(f"grid_y: ceil(M / {bm}) = {math.ceil(m / bm)} blocks > 65535")
        return out

    # ---- source and compile -----------------------------------------------------------------------------------
    def entry(self, config: Config) -> str:
        head = (FMT_CODE[self.fmt], EPI_CODE[self.epilogue], int(self.norm))
        if self.kind == "rows":
            return name_expression("nf4_mm_rows", *head, config["NT"], config["RM"])
        if self.kind == "splitk":
            return name_expression("nf4_mm_splitk", *head, *(config[p] for p in SPLITK_PARAMS))
        if self.kind == "pipe":
            return name_expression("nf4_mm_pipe", *head, *(config[p] for p in PIPE_PARAMS))
        if self.kind == "ring":  # the norm is the prologue's (`prep_entry`)
            return name_expression("nf4_mm_ring", *head[:2], *(config[p] for p in RING_PARAMS))
        return name_expression("nf4_mm_mma", *head, *(config[p] for p in MMA_PARAMS))

    def prep_entry(self) -> str:
        """The ring kind's first kernel: x rows to f16 (normed first with the fused norm)."""
        return name_expression("nf4_mm_prep", int(self.norm), PREP_NT)

    def reduce_entry(self) -> str:
        """split-K's second kernel: the slices' sum with the epilogue."""
        return name_expression("nf4_mm_splitk_reduce", EPI_CODE[self.epilogue], REDUCE_NT)

    def source(self, config: Config, shape: Shape | None = None) -> str:
        return f"{matmul_source()}\n// instantiated as {self.entry(config)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return config

    def threads(self, config: Config) -> int:
        return config["NT"] if self.kind == "rows" else mma_threads(config)

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        src = matmul_source()
        dyn = {"pipe": pipe_smem_bytes, "ring": ring_smem_bytes}.get(self.kind)
        prog = compile_cuda(device, src, self.entry(config), self.threads(config), f"{self.name}[{config}]",
                            dynamic_shared_bytes=dyn(config, self.fmt, self.sets) if dyn else 0)
        if self.kind == "ring":
            prog.meta["prep"] = compile_cuda(device, src, self.prep_entry(), PREP_NT, f"{self.name}.prep")
        if self.splits(config):
            prog.meta["reduce"] = compile_cuda(device, src, self.reduce_entry(), REDUCE_NT, f"{self.name}.reduce")
        return prog

    # ---- data -------------------------------------------------------------------------------------------------
    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, n, _ = shape
        bufs = upload_all(device, {k: v for k, v in host.items() if k != "residual"})
        bufs["out"] = device.allocate(4 * m * n)
        if self.kind in ("splitk", "pipe", "ring"):  # for the largest KS, so every candidate shares one input set
            bufs["partial"] = device.allocate(self.partial_bytes(max(KS_VALUES), m, n))
        if self.kind == "ring":
            bufs["xh"] = device.allocate(2 * m * shape[2])
        init = self.problem.initial_output(host, shape)
        if init is not None:
            device.write(bufs["out"], init)
        return self.attach_initial(device, host, shape, bufs)

    def partial_bytes(self, ks: int, m: int, n: int) -> int:
        """Bytes of split-K's partial sums: KS slices of SETS x M x N f32."""
        return 4 * ks * self.sets * m * n

    def grid(self, config: Config, shape: Shape) -> tuple[int, int, int]:
        m, n, _ = shape
        if self.kind == "rows":
            return (math.ceil(n / (config["NT"] // WARP)), math.ceil(m / config["RM"]), 1)
        return (math.ceil(n / config["BN"]), math.ceil(m / config["BM"]), config.get("KS", 1))

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return self.launches_at(program, bufs, config, shape, 0)

    def launches_at(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape,
                    x_row0: int) -> list[Launch]:
        """The launch reading x from row `x_row0` (the executor's last block reads a window of the rows); split-K:
        the slices into `partial`, then the reduction into out; ring: x to f16 into `xh` first."""
        m, n, k = shape
        split = self.splits(config)
        if self.kind == "ring":
            prep = Launch(program.meta["prep"], (m, 1, 1), [bufs["x"], np.int32(x_row0), arg_or(bufs, "norm_w", "x"),
                                                            np.float32(self.eps), bufs["xh"], np.int32(k)])
            main = Launch(program, self.grid(config, shape),
                          [bufs["xh"], bufs["w"], arg_or(bufs, "absmax", "w"), arg_or(bufs, "w_up", "w"),
                           arg_or(bufs, "absmax_up", "w"), bufs["partial" if split else "out"], np.int32(m),
                           np.int32(n), np.int32(k)])
            return [prep, main, *self._reduce(program, bufs, config, m, n)]
        args: list[Any] = [bufs["x"], np.int32(x_row0), bufs["w"], arg_or(bufs, "absmax", "w"),
                           arg_or(bufs, "w_up", "w"), arg_or(bufs, "absmax_up", "w"), arg_or(bufs, "norm_w", "x"),
                           np.float32(self.eps), bufs["partial" if split else "out"], np.int32(m), np.int32(n),
                           np.int32(k)]
        return [Launch(program, self.grid(config, shape), args), *self._reduce(program, bufs, config, m, n)]

    def _reduce(self, program: Program, bufs: DeviceBuffers, config: Config, m: int, n: int) -> list[Launch]:
        """split-K's sum of the slices with the epilogue (none without slices)."""
        if not self.splits(config):
            return []
        return [Launch(program.meta["reduce"], (math.ceil(m * n / REDUCE_NT), 1, 1),
                       [bufs["partial"], np.int32(config["KS"]), bufs["out"], np.int32(m), np.int32(n)])]

    # ---- the cuBLAS peer ---------------------------------------------------------------------------------------
    peer_name = "cuBLAS f16"

    def peer_program(self, device: Device) -> Program:
        """cuBLAS f16 GEMM (CuPy matmul: f16 x f16, f32 accumulation) of the same shape on its own f16 copies of x
        and the dequantized W, timed by the device like any kernel: the dense tensor-core bound this kernel is
        measured against. It reads and writes its own buffers (made at its first, untimed warm-up call)."""
        cp = device._cp  # type: ignore[attr-defined]
        held: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}

        def cublas_hgemm(M: Any, N: Any, K: Any) -> None:
            m, n, k = int(M), int(N), int(K)
            if (m, n, k) not in held:
                rng = cp.random.default_rng(0)
                held[(m, n, k)] = (rng.standard_normal((m, k), dtype=cp.float32).astype(cp.float16),
                                   rng.standard_normal((n, k), dtype=cp.float32).astype(cp.float16),
                                   cp.empty((m, n), dtype=cp.float16))
            x, w, out = held[(m, n, k)]
            cp.matmul(x, w.T, out=out)

        return Program("cublas_hgemm", cublas_hgemm, "cublas-f16", meta={"callable": True})

    def peer_launches(self, program: Program, bufs: DeviceBuffers, shape: Shape) -> list[Launch]:
        m, n, k = shape
        return [Launch(program, (1, 1, 1), [np.int32(m), np.int32(n * self.sets), np.int32(k)])]  # swiglu: both

    def describe(self, config: Config) -> str:
        if self.kind == "rows":
            return f"rows nt{config['NT']} rm{config['RM']}"
        tile = f"{config['BM']}x{config['BN']}x{config['BK']} w{config['WM']}x{config['WN']}"
        if self.kind in ("pipe", "ring"):
            return f"{self.kind} {tile} st{config['ST']} ks{config['KS']} mb{config['MB']}"
        tile += f" p{config['PIPE']}"
        return f"splitk {tile} ks{config['KS']}" if self.kind == "splitk" else f"mma {tile}"

    def tile_waste(self, config: Config, shape: Shape) -> float:
        m, n, _ = shape
        bm, bn = (config["RM"], config["NT"] // WARP) if self.kind == "rows" else (config["BM"], config["BN"])
        return (math.ceil(m / bm) * bm * math.ceil(n / bn) * bn) / (m * n)

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "source": "+".join(SOURCE_FILES), "kind": self.kind, "fmt": self.fmt,
                "epilogue": self.epilogue, "norm": self.norm}


def all_variants(eps: float = 1e-5) -> list[CudaMatmul]:
    """Every (kind, format, epilogue, norm) the executor can launch (the compile checks instantiate these)."""
    return [CudaMatmul(k, f, e, nm, eps) for k in KINDS for f in FMT_CODE for e in EPILOGUES for nm in (False, True)]


# no-argument classes for `tilewise.kernels.registry` (`tilewise tune nf4-matmul --device cuda --shape M,N,K`)
class CudaNF4MatmulMma(CudaMatmul):
    """Tensor-core NF4 matmul, plain epilogue."""

    def __init__(self) -> None:
        super().__init__("mma", "nf4", "none", False)


class CudaNF4MatmulRows(CudaMatmul):
    """Short-row NF4 matmul, plain epilogue."""

    def __init__(self) -> None:
        super().__init__("rows", "nf4", "none", False)


class CudaNF4SwigluMma(CudaMatmul):
    """Tensor-core paired gate/up NF4 matmul with SwiGLU and the fused RMSNorm (the FFN's first half)."""

    def __init__(self) -> None:
        super().__init__("mma", "nf4", "swiglu", True)
