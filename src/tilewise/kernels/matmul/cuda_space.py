"""The CUDA matmul family's search spaces as data: parameters, values, hand-picked seeds, defaults, and the named
rules that mirror `mma_first_failure`, `splitk_first_failure`, `pipe_first_failure`, `ring_first_failure`,
`wg_first_failure`, `ws_first_failure`, `wgr_first_failure` and `rows_first_failure` in the `.cu` sources, with
the shared-memory and register arithmetic they use. `cuda.py` (the template) re-exports every name."""

from __future__ import annotations

from collections.abc import Callable

from tilewise.kernels.matmul.problem import EPILOGUES
from tilewise.kernels.space import Config, Rule

WARP = 32
KINDS = ("mma", "rows", "splitk", "pipe", "ring", "wg", "wgt", "ws", "wgr")
#: the kinds on Hopper's warpgroup tensor cores with the wg kind's tile parameters, K steps of WG_BK (wgt: the wg
#: kind with its x tiles copied by the TMA); the wgr kind has its own parameters
WGMMA_KINDS = ("wg", "wgt", "ws")
#: the kinds with a KS parameter (slices of K summed through `partial`; split-K's KS is always 2 or more)
KS_KINDS = ("splitk", "pipe", "ring", "wg", "wgt", "ws", "wgr")
#: the kinds whose SR 1 has the last block of each tile sum the slices (no reduction launch)
SR_KINDS = ("splitk", "wgr")
#: the kinds that read x as f16 rows made by the `nf4_mm_prep` launch (into the `xh` scratch)
PREP_KINDS = ("ring", "wg", "wgt", "ws", "wgr")
EPI_CODE = {e: i for i, e in enumerate(EPILOGUES)}  # none 0, residual 1, swiglu 2 (matmul.cu's EPI)
STATIC_SMEM_BYTES = 48 * 1024
MAX_FRAGMENTS = 16
#: the row count from which the tensor-core kernel is the default (below it the short-row kernel)
MMA_FROM_ROWS = 32
DEFAULT_MMA = {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "PIPE": 2}
DEFAULT_ROWS = {"NT": 128, "RM": 4, "WK": 1}
MMA_PARAMS = ("BM", "BN", "BK", "WM", "WN", "PIPE")
SPLITK_PARAMS = (*MMA_PARAMS, "KS", "SR")
KS_VALUES = [2, 4, 8]
#: KS 2 divides every K the mma default admits in two whole 32-wide steps from K = 64
DEFAULT_SPLITK = {**DEFAULT_MMA, "KS": 2, "SR": 0}
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
#: SR 1 twins (the last block of a tile sums its slices: no reduction launch) and SR 2 twins (the tile's blocks one
#: cluster: Hopper only) follow the first two (the bundled model's projections picked the second with SR 1 on the
#: H200)
SPLITK_SEED = [dict(zip(SPLITK_PARAMS, v)) for v in (
    (32, 64, 64, 16, 32, 2, 2, 0), (32, 64, 64, 16, 32, 2, 4, 0), (32, 64, 64, 16, 32, 2, 4, 1),
    (32, 64, 64, 16, 32, 2, 4, 2), (32, 64, 64, 16, 32, 2, 2, 1), (32, 64, 64, 16, 32, 2, 2, 2),
    (64, 64, 32, 32, 32, 2, 4, 0), (64, 64, 32, 32, 32, 2, 2, 0),
    (32, 64, 32, 16, 32, 2, 8, 0), (64, 64, 32, 32, 32, 2, 4, 1), (64, 128, 32, 32, 64, 2, 4, 0),
    (32, 128, 64, 32, 32, 2, 2, 0), (64, 64, 64, 32, 32, 2, 8, 0), (128, 64, 32, 64, 32, 2, 2, 0),
)]
ROWS_PARAMS = ("NT", "RM", "WK")
ROWS_VALUES: dict[str, list[int]] = {"NT": [64, 128, 256], "RM": [1, 2, 4, 8, 16], "WK": [1, 2, 4, 8]}
#: tried after the default by `tune model --budget N`: a decision's last block is one row, where a column's weights
#: are a chain of loads that more warps a column (WK) spread over more of the GPU
ROWS_SEED = [dict(zip(ROWS_PARAMS, v)) for v in (
    (256, 1, 4), (256, 1, 8), (128, 1, 4), (256, 1, 2), (128, 1, 1), (256, 2, 4), (64, 1, 2), (256, 2, 1),
    (128, 2, 2), (256, 4, 8),
)]
#: parameters a config written before they existed lacks, per kind, with the value of the kernel it measured: the
#: short-row kernel's WK (warps per column) and split-K's SR (the last block sums the slices)
LEGACY = {"rows": {"WK": 1}, "splitk": {"SR": 0}}
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
#: the wgmma kind (`nf4_mm_wg`): BM / (64 MT) warpgroups of MT m64 slices, K steps of 64 (fixed: one 128-byte
#: swizzled row of f16)
WG_PARAMS = ("BM", "BN", "MT", "ST", "KS", "MB")
WG_VALUES: dict[str, list[int]] = {"BM": [64, 128, 192, 256, 384], "BN": [32, 64, 128, 256], "MT": [1, 2],
                                    "ST": [3, 4, 5, 6], "KS": [1, 2, 4, 8], "MB": [1, 2]}
WG_BK = 64
#: wgmma exists on compute capability 9.0 only (sm_90a code runs on no other architecture)
WG_COMPUTE_CAPABILITY = "9.0"
#: registers beside the accumulators (`WG_SPARE` in matmul_wg.cu)
WG_SPARE = 72
DEFAULT_WG = {"BM": 64, "BN": 64, "MT": 1, "ST": 4, "KS": 1, "MB": 1}  # legal in every variant
# ordered by what won at 346 rows (`tune model --budget N` takes the first N): 128- and 192-row tiles with deep
# rings, split-K for the N = 1024 ones; then 384 rows (3 warpgroups x 2 slices: each weight decoded once) and more
WG_SEED = [dict(zip(WG_PARAMS, v)) for v in (
    (128, 128, 1, 5, 1, 1), (192, 64, 1, 6, 1, 1), (128, 64, 1, 4, 1, 2), (192, 64, 1, 6, 4, 1),
    (128, 128, 1, 4, 1, 1), (192, 64, 1, 4, 1, 1), (192, 64, 1, 4, 4, 1), (384, 64, 2, 4, 1, 1),
    (256, 64, 2, 5, 1, 1), (64, 128, 1, 3, 1, 2), (64, 64, 1, 6, 4, 2), (128, 64, 2, 5, 2, 1),
    (128, 128, 1, 4, 2, 1), (64, 256, 1, 4, 1, 1), (64, 32, 1, 6, 1, 2), (64, 32, 1, 4, 2, 1),
    (384, 32, 2, 4, 4, 1), (64, 64, 1, 3, 1, 1),
    (384, 128, 2, 4, 1, 1),  # illegal on purpose: accumulators_128 (2 slices x 128 columns)
)]
#: the warp-specialized wgmma kind (`nf4_mm_ws`): the wg kind's parameters, with BM / (64 MT) consumer warpgroups
#: (1..3) beside PW producer warpgroups (1 or 2) that copy and decode
WS_PARAMS = (*WG_PARAMS, "PW")
WS_VALUES: dict[str, list[int]] = {**WG_VALUES, "PW": [1, 2]}
#: registers a producer thread keeps after `setmaxnreg` (`WS_PRODUCER_REGS` in matmul_ws.cu)
WS_PRODUCER_REGS = 40
DEFAULT_WS = {"BM": 128, "BN": 64, "MT": 1, "ST": 4, "KS": 1, "MB": 1, "PW": 1}  # legal in every variant
# first the tiles the wg kind could not hold (two consumers of 128 x 128 SwiGLU pairs, 256-wide tiles), then the wg
# kind's winners at 346 rows with one or two producer warpgroups beside them, split-K for the N = 1024 projections
WS_SEED = [dict(zip(WS_PARAMS, v)) for v in (
    (128, 128, 1, 4, 1, 1, 2), (128, 128, 1, 4, 1, 1, 1), (192, 64, 1, 5, 1, 1, 2), (128, 64, 1, 5, 4, 1, 2),
    (128, 64, 1, 6, 1, 1, 1), (192, 64, 1, 5, 1, 1, 1), (128, 64, 1, 5, 4, 1, 1), (128, 64, 1, 6, 1, 1, 2),
    (128, 256, 1, 3, 1, 1, 1), (64, 128, 1, 6, 1, 1, 1), (192, 64, 1, 5, 4, 1, 1), (128, 128, 1, 4, 2, 1, 2),
    (64, 256, 1, 4, 1, 1, 2), (256, 64, 2, 4, 1, 1, 1), (64, 64, 1, 6, 2, 2, 1), (128, 64, 1, 4, 1, 2, 1),
    (192, 128, 1, 3, 1, 1, 1), (64, 128, 1, 3, 2, 1, 2), (64, 64, 1, 4, 1, 1, 1),
    (256, 64, 1, 4, 1, 1, 1),  # illegal on purpose: consumers_1_3 (four consumer warpgroups)
)]
#: the swapped wgmma kind (`nf4_mm_wgr`): W is the A operand, decoded into registers; BF / 64 warpgroups of 64
#: output features each, BT tokens (the wgmma n, a multiple of 8) per block, x copied by the TMA
WGR_PARAMS = ("BF", "BT", "ST", "KS", "MB", "DEC", "SR")
WGR_VALUES: dict[str, list[int]] = {"BF": [64, 128, 192, 256], "BT": list(range(16, 257, 8)), "ST": [3, 4, 5, 6],
                                     "KS": [1, 2, 4, 8], "MB": [1, 2], "DEC": [0, 1], "SR": [0, 1, 2]}
#: registers beside the accumulators and the two fragment sets (`WGR_SPARE` in matmul_wgr.cu); DEC 1's code table
#: takes `WGR_TABLE_REGS` more
WGR_SPARE = 48
WGR_TABLE_REGS = 8
DEFAULT_WGR = {"BF": 64, "BT": 64, "ST": 3, "KS": 1, "MB": 1, "DEC": 0, "SR": 0}  # legal in every variant
# ordered by what won at 346 rows (`tune model --budget N` takes the first N): the winners of gate/up, down,
# in_proj and qkv, out_proj, attn.out_proj, each with the register-table decode first (nf4 only: illegal in the
# other formats) and then the shared-memory one; two of them with two blocks an SM (one 4-warp block left each
# scheduler one warp); then token tiles that pad the model's row counts little (346 rows: 4 x 88, 3 x 120, 2 x 176,
# 5 x 72; a 299-row extend: 4 x 80, 3 x 104, 2 x 152). The split winners (KS > 1) come again with SR 2, their
# slices summed inside a cluster of the tile's blocks instead of a reduction launch, right after them (SR 1, the
# last block summing them through global memory, lost every race it ran; it stays in the space).
_WGR_WINNERS = ((128, 120, 4, 1, 1), (64, 88, 6, 4, 2), (64, 176, 4, 1, 1), (64, 120, 4, 4, 1), (64, 152, 4, 2, 1))
WGR_SEED = [dict(zip(WGR_PARAMS, v)) for v in (
    *((*w, dec, sr) for w in _WGR_WINNERS for dec in (1, 0) for sr in ((0, 2) if w[3] > 1 else (0,))),
    (64, 176, 4, 1, 2, 1, 0), (64, 120, 4, 2, 2, 1, 0), (64, 176, 4, 1, 2, 0, 0), (64, 120, 4, 2, 2, 0, 0),
    (128, 88, 4, 1, 1, 0, 0), (64, 88, 4, 2, 1, 0, 0), (128, 88, 4, 2, 1, 0, 0), (128, 72, 5, 1, 1, 0, 0),
    (128, 80, 4, 1, 1, 0, 0), (128, 104, 4, 1, 1, 0, 0), (128, 64, 6, 1, 1, 0, 0), (192, 88, 4, 1, 1, 0, 0),
    (256, 56, 4, 1, 1, 0, 0), (128, 48, 4, 1, 2, 0, 0), (64, 64, 3, 1, 1, 0, 0),
    (128, 176, 4, 1, 1, 0, 0),  # swiglu: illegal on purpose (accumulators_128: 2 x 176 / 2)
)]


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
    """Registers the ring kind needs beside the accumulators (`ring_spare_needed` in matmul_ring.cu). nf4 at BK 64
    with fewer than 128 to spare unrolls its K step two m16n8k16 steps at a time (`ring_kk_unroll`), which keeps it
    from spilling."""
    return 64


def wg_smem_bytes(c: Config, fmt: str, sets: int, tma: bool = False) -> int:
    """Dynamic shared memory of a wg block, as `wg_smem_bytes` in matmul_wg.cu: nf4 and f32, three decoded W tiles
    and ST - 1 W tiles as stored; f16, ST W tiles; ST x tiles; the NF4 code; with `tma` (the wgt kind) 64 bytes for
    the x stages' mbarriers; and 1024 bytes to start on the swizzle's 1024-byte boundary. The kernel has no static
    shared memory, so this is all a launch asks for."""
    raw = sets * c.BN * {"nf4": 32 + 4, "f16": 128, "f32": 256}[fmt]
    w = c.ST * raw if fmt == "f16" else 3 * sets * c.BN * 128 + (c.ST - 1) * raw
    return w + c.ST * c.BM * 128 + 16 * 4 + (64 if tma else 0) + 1024  # + the NF4 code


def wg_threads(c: Config) -> int:
    return c.BM // (64 * c.MT) * 128 if c.MT in (1, 2) else 0


def wg_spare_registers(c: Config, sets: int) -> int:
    """Registers per thread the launch bound leaves beside the accumulators (`wg_register_cap` in matmul_wg.cu)."""
    cap = min(255, 65536 // max(wg_threads(c) * c.MB, 1))
    return cap - c.MT * sets * c.BN // 2


def ws_consumers(c: Config) -> int:
    return c.BM // (64 * c.MT) if c.MT in (1, 2) else 0


def ws_threads(c: Config) -> int:
    """The consumer warpgroups and the PW producer ones (`ws_threads` in matmul_ws.cu)."""
    return (ws_consumers(c) + c.PW) * 128


def ws_consumer_regs(c: Config) -> int:
    """A consumer thread's registers after `setmaxnreg` (`ws_consumer_regs` in matmul_ws.cu): the launch bound's
    share of the register file for the block, less the producers', in steps of 8, at most 240."""
    nt = ws_threads(c) * max(c.MB, 1)
    launch = min(255, 65536 // max(nt, 1)) // 8 * 8
    return min(240, (launch * ws_threads(c) - c.PW * 128 * WS_PRODUCER_REGS) // (max(ws_consumers(c), 1) * 128)
               // 8 * 8)


def ws_smem_bytes(c: Config, fmt: str, sets: int) -> int:
    """Dynamic shared memory of a ws block, as `ws_smem_bytes` in matmul_ws.cu: ST stages of the x tile and the W
    operand tiles (f16, 128 bytes a row), ST - 1 raw W slots (nf4: 32 bytes a row and an absmax per 16-byte chunk;
    f32: 256 bytes a row; f16: none), the NF4 code and 1024 bytes to reach the swizzle's boundary."""
    raw = sets * c.BN * {"nf4": 32 + 8, "f16": 0, "f32": 256}[fmt]
    return c.ST * (c.BM + sets * c.BN) * 128 + (c.ST - 1) * raw + 16 * 4 + 1024


def wgr_threads(c: Config) -> int:
    return c.BF // 64 * 128


def wgr_smem_bytes(c: Config, fmt: str, sets: int) -> int:
    """Dynamic shared memory of a wgr block, as `wgr_smem_bytes` in matmul_wgr.cu: ST stages of the x tile (BT rows
    of 128 bytes) and SETS x BF W rows as stored, each 16 bytes longer (nf4 with the rows' absmax), or the
    epilogue's (BT, BF + 4) f32 tile staged in their place where that is larger; the NF4 code, the stages' `full`
    and `empty` mbarriers (128 bytes) and 1024 bytes to start on the swizzle's boundary. With SR 2 the tile holds
    every weight set's sums at once (the cluster's blocks read them from each other)."""
    w = sets * c.BF * ({"nf4": 32, "f16": 128, "f32": 256}[fmt] + 16 + (4 if fmt == "nf4" else 0))
    tiles = sets if c.SR == 2 else 1
    return max(c.ST * (c.BT * 128 + w), tiles * c.BT * (c.BF + 4) * 4) + 16 * 4 + 128 + 1024


def wgr_spare_registers(c: Config, sets: int) -> int:
    """Registers per thread the launch bound leaves beside the accumulators and the two A fragment sets
    (`wgr_register_cap` in matmul_wgr.cu)."""
    cap = min(255, 65536 // max(wgr_threads(c) * c.MB, 1))
    return cap - sets * c.BT // 2 - 32 * sets


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
    sr = Rule("sr_0_1_2", lambda c, _: c.SR in (0, 1, 2), lambda c, _: f"SR = {c.SR} is not 0, 1 or 2",
              doc="1: the last of a tile's KS blocks sums the slices and applies the epilogue (no reduction launch); "
                  "2: the tile's KS blocks are one cluster and sum them from each other's shared memory")
    tile = Rule("cluster_tile_48k",
                lambda c, _: c.SR != 2 or mma_smem_bytes(c, sets) + splitk_cluster_tile_bytes(c, sets) <= 48 * 1024,
                lambda c, _: f"{mma_smem_bytes(c, sets)} bytes of main-loop buffers + "
                             f"{splitk_cluster_tile_bytes(c, sets)} of SR 2's tile > 48 KB of static shared memory")
    cluster = Rule("cluster_sm90", lambda c, lim: c.SR != 2 or lim.compute_capability == WG_COMPUTE_CAPABILITY,
                   lambda c, lim: f"SR 2 (a thread block cluster per tile) needs compute capability "
                                  f"{WG_COMPUTE_CAPABILITY} (Hopper); this device has {lim.compute_capability}",
                   needs_limits=True)
    return [*(r for r in rules if not r.needs_limits), ks, sr, tile, *(r for r in rules if r.needs_limits), cluster]


def splitk_cluster_tile_bytes(c: Config, sets: int) -> int:
    """SR 2's tile of raw sums, (SETS, BM, BN + 4) f32, as `splitk_cluster_tile_bytes` in matmul.cu."""
    return sets * c.BM * (c.BN + 4) * 4


def dynamic_smem_rules(smem: Callable[[Config], int]) -> list[Rule]:
    """The rules of a kernel whose dynamic shared memory is `smem(config)` bytes: the sm_80..sm_90 opt-in maximum
    (`smem_227k`, mirrored in the C++), then the device's per-block and per-SM limits (MB blocks per SM)."""
    return [
        Rule("smem_227k", lambda c, _: smem(c) <= PIPE_SMEM_MAX,
             lambda c, _: f"{smem(c)} bytes of shared memory > {PIPE_SMEM_MAX} (the sm_80..sm_90 opt-in maximum)"),
        Rule("smem_per_block", lambda c, lim: lim.shared_bytes_per_block_optin is None
             or smem(c) <= lim.shared_bytes_per_block_optin,
             lambda c, lim: f"{smem(c)} bytes of shared memory > the device's {lim.shared_bytes_per_block_optin} "
                            "per block", needs_limits=True),
        Rule("mb_fit_smem", lambda c, lim: lim.shared_bytes_per_multiprocessor is None
             or c.MB * (smem(c) + SMEM_RESERVED_PER_BLOCK) <= lim.shared_bytes_per_multiprocessor,
             lambda c, lim: f"MB = {c.MB} blocks of {smem(c)} bytes do not fit the device's "
                            f"{lim.shared_bytes_per_multiprocessor} bytes of shared memory per SM", needs_limits=True),
    ]


def threads_rule(threads: Callable[[Config], int]) -> Rule:
    """`threads_per_block` for a kernel whose block is `threads(config)` threads."""
    return Rule("threads_per_block", lambda c, lim: threads(c) <= lim.max_invocations_per_workgroup,
                lambda c, lim: f"{threads(c)} threads > the device's {lim.max_invocations_per_workgroup}",
                needs_limits=True)


def pipe_rules(sets: int, fmt: str = "nf4") -> list[Rule]:
    """matmul_pipe.cu's `pipe_first_failure`, rule for rule, then the device's shared-memory limits."""
    mma = {r.name: r for r in mma_rules(sets, fmt)}
    smem_rules = dynamic_smem_rules(lambda c: pipe_smem_bytes(c, fmt, sets))
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
        smem_rules[0], mma["threads_per_block"], *smem_rules[1:],
    ]


def ring_rules(sets: int, fmt: str = "nf4") -> list[Rule]:
    """matmul_ring.cu's `ring_first_failure`, rule for rule, then the device's limits."""
    pipe = {r.name: r for r in pipe_rules(sets, fmt)}
    mma = {r.name: r for r in mma_rules(sets, fmt)}
    smem_rules = dynamic_smem_rules(lambda c: ring_smem_bytes(c, fmt, sets))
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
             doc="fragments, addresses and the decode need 64 registers beside the accumulators"),
        Rule("stages_2_6", lambda c, _: 2 <= c.ST <= 6, lambda c, _: f"ST = {c.ST} ring stages is not in 2..6",
             doc="K steps in shared memory; the copies run ST - 1 steps ahead"),
        pipe["ks_1_2_4_8"],
        smem_rules[0], mma["threads_per_block"], *smem_rules[1:],
    ]


def wg_rules(sets: int, fmt: str = "nf4", tma: bool = False) -> list[Rule]:
    """matmul_wg.cu's `wg_first_failure`, rule for rule, then the device's limits (wgmma needs compute capability
    9.0). `tma`: the wgt kind's (the same rules; its mbarriers count in the shared memory)."""
    pipe = {r.name: r for r in pipe_rules(sets, fmt)}
    smem_rules = dynamic_smem_rules(lambda c: wg_smem_bytes(c, fmt, sets, tma))
    return [
        Rule("mt_1_2", lambda c, _: c.MT in (1, 2), lambda c, _: f"MT = {c.MT} m64 slices per warpgroup is not 1 or 2"),
        Rule("warpgroups_1_4", lambda c, _: c.BM % (64 * c.MT) == 0 and 64 * c.MT <= c.BM <= 4 * 64 * c.MT,
             lambda c, _: f"BM = {c.BM} is not 1..4 warpgroups of MT x 64 = {64 * c.MT} rows"),
        Rule("bn_32_256", lambda c, _: c.BN in (32, 64, 128, 256),
             lambda c, _: f"BN = {c.BN} is not 32, 64, 128 or 256 (a wgmma n size)"),
        Rule("accumulators_128", lambda c, _: c.MT * sets * c.BN <= 256,
             lambda c, _: f"MT x {sets} x BN / 2 = {c.MT * sets * c.BN // 2} accumulators per thread > 128",
             doc="a warpgroup thread holds BN / 2 f32 accumulators per slice and weight set"),
        pipe["mb_1_2"],
        Rule("registers_spare", lambda c, _: wg_spare_registers(c, sets) >= WG_SPARE,
             lambda c, _: f"the launch bound ({wg_threads(c)} threads x {c.MB} blocks) leaves "
                          f"{wg_spare_registers(c, sets)} registers beside the accumulators, < {WG_SPARE} (ptxas "
                          "spilled with 64)",
             doc="over the whole space ptxas spilled with 64 registers to spare and never with 69 or more"),
        Rule("stages_3_6", lambda c, _: 3 <= c.ST <= 6, lambda c, _: f"ST = {c.ST} ring stages is not in 3..6",
             doc="x lands ST - 2 steps ahead of its wgmma; a decoded W ST - 2 steps ahead of its decode"),
        pipe["ks_1_2_4_8"],
        smem_rules[0],
        Rule("wgmma_sm90", lambda c, lim: lim.compute_capability == WG_COMPUTE_CAPABILITY,
             lambda c, lim: f"wgmma needs compute capability {WG_COMPUTE_CAPABILITY} (Hopper); this device has "
                            f"{lim.compute_capability}", needs_limits=True),
        threads_rule(wg_threads),
        *smem_rules[1:],
    ]


def ws_rules(sets: int, fmt: str = "nf4") -> list[Rule]:
    """matmul_ws.cu's `ws_first_failure`, rule for rule, then the device's limits (wgmma needs compute capability
    9.0)."""
    wg = {r.name: r for r in wg_rules(sets, fmt)}
    smem_rules = dynamic_smem_rules(lambda c: ws_smem_bytes(c, fmt, sets))
    return [
        wg["mt_1_2"],
        Rule("consumers_1_3", lambda c, _: c.BM % (64 * c.MT) == 0 and 64 * c.MT <= c.BM <= 3 * 64 * c.MT,
             lambda c, _: f"BM = {c.BM} is not 1..3 consumer warpgroups of MT x 64 = {64 * c.MT} rows",
             doc="a fourth consumer warpgroup would leave each consumer thread under 120 registers"),
        wg["bn_32_256"], wg["accumulators_128"], wg["mb_1_2"],
        Rule("pw_1_2", lambda c, _: c.PW in (1, 2), lambda c, _: f"PW = {c.PW} producer warpgroups is not 1 or 2",
             doc="warpgroups that copy and decode (2: x and W chunks spread over twice the threads)"),
        Rule("registers_spare", lambda c, _: ws_consumer_regs(c) - c.MT * sets * c.BN // 2 >= WG_SPARE,
             lambda c, _: f"a consumer's {ws_consumer_regs(c)} registers after setmaxnreg ({ws_threads(c)} threads "
                          f"x {c.MB} blocks) leave {ws_consumer_regs(c) - c.MT * sets * c.BN // 2} beside the "
                          f"accumulators, < {WG_SPARE}",
             doc="the producer keeps WS_PRODUCER_REGS; the consumers share the rest of the block's registers"),
        wg["stages_3_6"], wg["ks_1_2_4_8"],
        smem_rules[0], wg["wgmma_sm90"],
        threads_rule(ws_threads),
        *smem_rules[1:],
    ]


def wgr_rules(sets: int, fmt: str = "nf4") -> list[Rule]:
    """matmul_wgr.cu's `wgr_first_failure`, rule for rule, then the device's limits (wgmma needs compute capability
    9.0)."""
    wg = {r.name: r for r in wg_rules(sets, fmt)}
    smem_rules = dynamic_smem_rules(lambda c: wgr_smem_bytes(c, fmt, sets))
    return [
        Rule("warpgroups_1_4", lambda c, _: c.BF % 64 == 0 and 64 <= c.BF <= 256,
             lambda c, _: f"BF = {c.BF} is not 1..4 warpgroups of 64 features"),
        Rule("bt_8_256", lambda c, _: c.BT % 8 == 0 and 8 <= c.BT <= 256,
             lambda c, _: f"BT = {c.BT} tokens is not a multiple of 8 in 8..256 (a wgmma n size)"),
        Rule("accumulators_128", lambda c, _: sets * c.BT <= 256,
             lambda c, _: f"{sets} x BT / 2 = {sets * c.BT // 2} accumulators per thread > 128",
             doc="a warpgroup thread holds BT / 2 f32 accumulators per weight set"),
        wg["mb_1_2"],
        Rule("dec_nf4", lambda c, _: c.DEC in (0, 1) and (c.DEC == 0 or fmt == "nf4"),
             lambda c, _: (f"DEC = {c.DEC} is not 0 or 1" if c.DEC not in (0, 1) else
                           f"DEC = 1 (the register code table) decodes nf4, not {fmt} weights"),
             doc="0: f32 code table in shared memory, scaled in f32; 1: f16 code table in registers, scaled in f16"),
        Rule("registers_spare", lambda c, _: wgr_spare_registers(c, sets) >= WGR_SPARE + WGR_TABLE_REGS * c.DEC,
             lambda c, _: f"the launch bound ({wgr_threads(c)} threads x {c.MB} blocks) leaves "
                          f"{wgr_spare_registers(c, sets)} registers beside the accumulators and the two fragment "
                          f"sets, < {WGR_SPARE + WGR_TABLE_REGS * c.DEC}",
             doc="addresses, the words being decoded and the code need about 48 registers (56 with DEC 1)"),
        wg["stages_3_6"], wg["ks_1_2_4_8"],
        Rule("sr_with_slices", lambda c, _: c.SR in (0, 1, 2) and (c.SR == 0 or c.KS > 1),
             lambda c, _: (f"SR = {c.SR} is not 0, 1 or 2" if c.SR not in (0, 1, 2) else
                           f"SR = {c.SR} (who sums the slices) needs slices to sum: KS > 1"),
             doc="1: the last of a tile's KS blocks sums the slices and applies the epilogue (no reduction launch); "
                 "2: the tile's KS blocks are one cluster and sum them from each other's shared memory"),
        smem_rules[0], wg["wgmma_sm90"],
        threads_rule(wgr_threads),
        *smem_rules[1:],
    ]


def rows_rules() -> list[Rule]:
    """matmul_rows.cu's `rows_first_failure`, rule for rule."""
    return [
        Rule("whole_warps", lambda c, _: c.NT % WARP == 0 and WARP <= c.NT <= 1024,
             lambda c, _: f"NT = {c.NT} is not a whole number of warps in 32..1024"),
        Rule("rows_1_16", lambda c, _: 1 <= c.RM <= 16, lambda c, _: f"RM = {c.RM} rows per block is not in 1..16",
             doc="RM accumulators per weight set per lane"),
        Rule("column_warps_1_2_4_8", lambda c, _: c.WK in (1, 2, 4, 8),
             lambda c, _: f"WK = {c.WK} warps per output column is not 1, 2, 4 or 8"),
        Rule("column_warps_divide_warps", lambda c, _: (c.NT // WARP) % c.WK == 0,
             lambda c, _: f"NT / 32 = {c.NT // WARP} warps do not form whole groups of WK = {c.WK}",
             doc="a column's WK warps split its K words and add their sums in shared memory"),
        Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= c.NT,
             lambda c, lim: f"NT = {c.NT} > the device's {lim.max_invocations_per_workgroup}", needs_limits=True),
    ]
