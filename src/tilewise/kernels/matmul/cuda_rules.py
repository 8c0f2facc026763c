"""The named rules of the CUDA matmul kinds, each list mirroring its kernel's `*_first_failure` in the `.cu`
sources rule for rule (`mma`, `splitk`, `pipe`, `ring`, `wg`, `ws`, `wgr`, `rows`), then the device's limits.
`cuda.py` (the template) re-exports every name."""

from __future__ import annotations

from collections.abc import Callable

from tilewise.kernels.matmul.cuda_space import (
    KS_VALUES,
    MAX_FRAGMENTS,
    PIPE_SMEM_MAX,
    SMEM_RESERVED_PER_BLOCK,
    STATIC_SMEM_BYTES,
    WARP,
    WG_COMPUTE_CAPABILITY,
    WG_SPARE,
    WGR_DECODES,
    WGR_SPARE,
    WGR_TABLE_REGS,
    mma_held_registers,
    mma_smem_bytes,
    mma_threads,
    pipe_smem_bytes,
    ring_smem_bytes,
    ring_spare_needed,
    ring_spare_registers,
    splitk_cluster_tile_bytes,
    wg_smem_bytes,
    wg_spare_registers,
    wg_threads,
    wgr_smem_bytes,
    wgr_spare_registers,
    wgr_threads,
    ws_consumer_regs,
    ws_smem_bytes,
    ws_threads,
)
from tilewise.kernels.space import Config, Rule


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
        Rule("dec_nf4", lambda c, _: c.DEC in (0, 1, 2, 3) and (c.DEC == 0 or fmt == "nf4"),
             lambda c, _: (f"DEC = {c.DEC} is not 0..3" if c.DEC not in (0, 1, 2, 3) else
                           f"DEC = {c.DEC} ({WGR_DECODES[c.DEC]}) decodes nf4, not {fmt} weights"),
             doc="0: f32 code table in shared memory, scaled in f32; 1: f16 code table in registers; 2, 3: a table "
                 "of 256 f16 code pairs in shared memory (8 or 32 copies); 1-3 scale in f16"),
        Rule("registers_spare",
             lambda c, _: wgr_spare_registers(c, sets) >= WGR_SPARE + WGR_TABLE_REGS * (c.DEC == 1),
             lambda c, _: f"the launch bound ({wgr_threads(c)} threads x {c.MB} blocks) leaves "
                          f"{wgr_spare_registers(c, sets)} registers beside the accumulators and the two fragment "
                          f"sets, < {WGR_SPARE + WGR_TABLE_REGS * (c.DEC == 1)}",
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
        Rule("warp_columns_1_2_4", lambda c, _: c.CW in (1, 2, 4),
             lambda c, _: f"CW = {c.CW} columns a warp is not 1, 2 or 4"),
        Rule("warp_columns_rows_4", lambda c, _: c.CW == 1 or c.RM <= 4,
             lambda c, _: f"CW = {c.CW} columns a warp hold CW x RM = {c.CW * c.RM} sums a weight set; with CW > 1 "
                          f"RM = {c.RM} must be at most 4",
             doc="the CW columns' decoded weights and sums stay in registers"),
        Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= c.NT,
             lambda c, lim: f"NT = {c.NT} > the device's {lim.max_invocations_per_workgroup}", needs_limits=True),
    ]
