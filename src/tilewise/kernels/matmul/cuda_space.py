"""The CUDA matmul family's search spaces as data: parameters, values, hand-picked seeds, defaults, and the
shared-memory and register arithmetic their rules (`cuda_rules.py`) use, as the `.cu` sources compute it. `cuda.py`
(the template) re-exports every name.

The kinds:

- `mma` (`nf4_mm_mma<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE>`): a BM x BN output tile per block, BK inputs per
  step through PIPE shared-memory buffers (x normed and rounded to f16, W decoded once per step, the next step's
  words loaded into registers during the math), WM x WN per warp in m16n8k16 `mma.sync` steps fed by `ldmatrix`
  (inline PTX). f16 operands, so it is verified at the f16 tolerance;
- `splitk` (`nf4_mm_splitk<..., PIPE, KS, SR>` + `nf4_mm_splitk_reduce<EPI, NT>`): the same main loop over KS
  slices of K (grid z), raw f32 partial sums into the `partial` scratch (KS, SETS, M, N), then a second launch adds
  the slices in a fixed order and applies the epilogue (SR 1: the last block of each tile does, as wgr's; SR 2,
  Hopper: `nf4_mm_splitk_cluster`, the tile's blocks one cluster, as wgr's): it fills
  the GPU where N / BN * M / BM tiles would not (the N = 1024 projections);
- `pipe` (`nf4_mm_pipe<..., ST, KS, MB>`): the same tiles fed by a cp.async ring of ST raw stages in dynamic shared
  memory (opted in above 48 KB), converted into two operand buffers with one barrier a step; KS 1 applies the
  epilogue, KS > 1 sums slices like split-K; MB is the launch bound's blocks per SM;
- `ring` (`nf4_mm_prep<NORM, NT>` + `nf4_mm_ring<FMT, EPI, ..., ST, KS, MB>`): x rounded to f16 once (normed first
  with the fused norm) into the `xh` scratch, then a cp.async ring of ST stages holding f16 x and W as stored, with
  nothing converted in shared memory: W's fragments are decoded in registers. KS > 1 sums slices like split-K;
- `wg` (`nf4_mm_prep<NORM, NT>` + `nf4_mm_wg<FMT, EPI, BM, BN, MT, ST, KS, MB>`, Hopper only): the same f16 x,
  then BM / (64 MT) warpgroups of MT m64 slices on `wgmma` (both operands from shared memory in the 128-byte
  swizzle), K steps of 64 through a cp.async ring of ST stages of x and W as stored; nf4 and f32 W decoded once per
  step and block, one step ahead. KS > 1 sums slices;
- `wgt` (`nf4_mm_prep` + `nf4_mm_wgt<...the wg parameters>`, Hopper only): `wg` with each step's x tile copied by
  the TMA (one thread issues BM / 64 boxes of 64 x 64 f16, 128-byte swizzle, completing an mbarrier per stage),
  through a tensor map of `xh` passed by value (`devices/cuda_tma.py`) as the last argument;
- `ws` (`nf4_mm_prep<NORM, NT>` + `nf4_mm_ws<FMT, EPI, BM, BN, MT, ST, KS, MB>`, Hopper only): the wg kind's tiles
  with warp specialization: BM / (64 MT) consumer warpgroups only issue wgmma and store, one producer warpgroup
  copies and decodes, handing stages over through named barriers; `setmaxnreg` gives the consumers the producer's
  registers. KS > 1 sums slices;
- `wgr` (`nf4_mm_prep` + `nf4_mm_wgr<FMT, EPI, BF, BT, ST, KS, MB, DEC, SR>`, Hopper only): the operands swapped: W
  is wgmma's A operand, each thread decoding its own fragments from the stored rows straight into registers, and x
  (BT tokens, the wgmma n, in steps of 8) its B operand, one TMA box per step; BF / 64 warpgroups of 64 features.
  KS > 1 sums slices (SR 1: the last block of a tile does, through the `counters` scratch, with no reduction launch;
  SR 2: `nf4_mm_wgr_cluster`, the tile's KS blocks one cluster summing from each other's shared memory, with no
  partial sums in global memory either);
  DEC 1 decodes nf4 through an f16 code table in registers (byte permutes, f16 scaling), DEC 2 and 3 through a table
  of 256 f16 code pairs in shared memory (one load a stored byte; 8 or 32 copies against bank conflicts);
- `rows` (`nf4_mm_rows<FMT, EPI, NORM, NT, RM, WK, CW>`): WK warps per group of CW output columns over RM rows,
  splitting its K words, f32 arithmetic, for few rows (a decision's last blocks, short extends); CW > 1 has a
  warp's loads of CW columns in flight together and fewer blocks (the same bits as CW 1).
"""

from __future__ import annotations

from tilewise.kernels.matmul.problem import EPILOGUES
from tilewise.kernels.space import Config

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
DEFAULT_ROWS = {"NT": 128, "RM": 4, "WK": 1, "CW": 1}
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
ROWS_PARAMS = ("NT", "RM", "WK", "CW")
ROWS_VALUES: dict[str, list[int]] = {"NT": [64, 128, 256], "RM": [1, 2, 4, 8, 16], "WK": [1, 2, 4, 8],
                                     "CW": [1, 2, 4]}
#: tried after the default by `tune model --budget N`: a decision's last blocks are 1 and 3 rows, where a column's
#: weights are a chain of loads that more warps a column (WK) spread over more of the GPU, or more columns a warp
#: (CW) put in flight together in fewer blocks; both kinds of seed come early
ROWS_SEED = [dict(zip(ROWS_PARAMS, v)) for v in (
    (128, 1, 1, 4), (256, 1, 2, 2), (128, 4, 1, 2), (256, 1, 4, 1), (128, 1, 1, 2), (256, 1, 8, 1), (128, 4, 1, 4),
    (128, 1, 4, 1), (64, 1, 1, 4), (256, 1, 2, 1), (128, 1, 1, 1), (256, 2, 4, 1), (64, 1, 2, 1), (256, 2, 1, 1),
    (128, 2, 2, 1), (256, 4, 8, 1), (256, 4, 1, 2), (128, 2, 1, 4),
)]
#: parameters a config written before they existed lacks, per kind, with the value of the kernel it measured: the
#: short-row kernel's WK (warps per column) and CW (columns a warp), split-K's SR (the last block sums the slices)
LEGACY = {"rows": {"WK": 1, "CW": 1}, "splitk": {"SR": 0}}
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
                                     "KS": [1, 2, 4, 8], "MB": [1, 2], "DEC": [0, 1, 2, 3], "SR": [0, 1, 2]}
#: registers beside the accumulators and the two fragment sets (`WGR_SPARE` in matmul_wgr.cu); DEC 1's code table
#: takes `WGR_TABLE_REGS` more
WGR_SPARE = 48
WGR_TABLE_REGS = 8
#: nf4's decodes in wgr (DEC), and the copies of DEC 2 and 3's table of 256 f16 code pairs in shared memory
WGR_DECODES = {0: "the f32 code table in shared memory", 1: "the f16 code table in registers",
               2: "the pair table in 8 copies", 3: "the pair table in 32 copies"}
WGR_PAIR_COPIES = {2: 8, 3: 32}
DEFAULT_WGR = {"BF": 64, "BT": 64, "ST": 3, "KS": 1, "MB": 1, "DEC": 0, "SR": 0}  # legal in every variant
# ordered by what won at 346 rows (`tune model --budget N` takes the first N): the winners of gate/up, down,
# in_proj and qkv, out_proj, attn.out_proj, each with the register-table decode first (nf4 only: illegal in the
# other formats) and then the shared-memory one; two of them with two blocks an SM (one 4-warp block left each
# scheduler one warp); then token tiles that pad the model's row counts little (346 rows: 4 x 88, 3 x 120, 2 x 176,
# 5 x 72; a 299-row extend: 4 x 80, 3 x 104, 2 x 152). The split winners (KS > 1) come again with SR 2, their
# slices summed inside a cluster of the tile's blocks instead of a reduction launch, right after them (SR 1, the
# last block summing them through global memory, lost every race it ran; it stays in the space). gate/up's winner
# also comes with the pair table in 32 copies (DEC 3), which won that wide SwiGLU tile and lost on the narrower ones.
_WGR_WINNERS = ((128, 120, 4, 1, 1), (64, 88, 6, 4, 2), (64, 176, 4, 1, 1), (64, 120, 4, 4, 1), (64, 152, 4, 2, 1))
WGR_SEED = [dict(zip(WGR_PARAMS, v)) for v in (
    *((*w, dec, sr) for w in _WGR_WINNERS
      for dec in ((1, 3, 0) if w == _WGR_WINNERS[0] else (1, 0)) for sr in ((0, 2) if w[3] > 1 else (0,))),
    (64, 176, 4, 1, 2, 1, 0), (64, 120, 4, 2, 2, 1, 0), (64, 176, 4, 1, 2, 0, 0), (64, 120, 4, 2, 2, 0, 0),
    (128, 88, 4, 1, 1, 0, 0), (64, 88, 4, 2, 1, 0, 0), (128, 88, 4, 2, 1, 0, 0), (128, 72, 5, 1, 1, 0, 0),
    (128, 80, 4, 1, 1, 0, 0), (128, 104, 4, 1, 1, 0, 0), (128, 64, 6, 1, 1, 0, 0), (192, 88, 4, 1, 1, 0, 0),
    (256, 56, 4, 1, 1, 0, 0), (128, 48, 4, 1, 2, 0, 0), (64, 64, 3, 1, 1, 0, 0),
    (128, 176, 4, 1, 1, 0, 0),  # swiglu: illegal on purpose (accumulators_128: 2 x 176 / 2)
    (128, 120, 4, 1, 1, 2, 0),  # the pair table in 8 copies: slower than 32 on every shape so far
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
    and `empty` mbarriers (128 bytes), DEC 2 and 3's pair table and 1024 bytes to start on the swizzle's boundary.
    With SR 2 the tile holds every weight set's sums at once, and the sums a block receives from its KS - 1 peers
    for the token groups it owns (every KS-th group of 8 tokens) follow it where the ring was."""
    w = sets * c.BF * ({"nf4": 32, "f16": 128, "f32": 256}[fmt] + 16 + (4 if fmt == "nf4" else 0))
    tiles = sets if c.SR == 2 else 1
    pairs = 256 * 4 * WGR_PAIR_COPIES.get(c.DEC, 0)
    own = (c.BT // 8 + c.KS - 1) // c.KS
    recv = (c.KS - 1) * own * sets * wgr_threads(c) * 16 if c.SR == 2 else 0
    return max(c.ST * (c.BT * 128 + w), tiles * c.BT * (c.BF + 4) * 4 + recv) + 16 * 4 + 128 + pairs + 1024


def wgr_spare_registers(c: Config, sets: int) -> int:
    """Registers per thread the launch bound leaves beside the accumulators and the two A fragment sets
    (`wgr_register_cap` in matmul_wgr.cu)."""
    cap = min(255, 65536 // max(wgr_threads(c) * c.MB, 1))
    return cap - sets * c.BT // 2 - 32 * sets


def splitk_cluster_tile_bytes(c: Config, sets: int) -> int:
    """SR 2's tile of raw sums, (SETS, BM, BN + 4) f32, as `splitk_cluster_tile_bytes` in matmul.cu."""
    return sets * c.BM * (c.BN + 4) * 4


def mma_threads(c: Config) -> int:
    return (c.BM // c.WM) * (c.BN // c.WN) * WARP
