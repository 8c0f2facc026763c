"""fp32 GEMM for WebGPU: C (M, N) = A (M, K) @ B (K, N), row-major, any M, N, K (edge guards).

Variants (the parameters of seed 003's warp-tiled kernel, mapped to WGSL, plus seed 000's staging scope):

    BM, BN, BK   block tile: one workgroup computes a BM x BN tile of C, stepping K by BK
    WM, WN       "warp" tile: a group of WARP = 32 invocations computes a WM x WN rectangle of the block tile.
                 WGSL has no warps; the grouping is logical (no subgroup operations are used), so the result
                 does not depend on the adapter's subgroup size, only the memory access pattern does.
    WNITER       the warp tile is walked in WMITER x WNITER steps (WMITER is derived, see `derived`)
    TM, TN       each invocation owns TM x TN outputs per step (WMITER*TM*WNITER*TN accumulators)
    NT           invocations per workgroup (must equal 32 warps' worth of the tiling: the `threads` rule)
    SA, SB       staging scope of A and B per K step: "workgroup" (cooperatively copied to var<workgroup>
                 memory, barrier, read by all) or "private" (each invocation loads its own operands from
                 global memory into registers, like TVM's cache_read(A, "local"); no barrier)
    VEC          1 or 4: vec4 global loads/stores, vec4 shared-memory reads (needs K and N multiples of 4)
    PF           0, 1 or 2: 1 = register prefetch of the next K tile of the workgroup-staged operands, issued
                 before the current tile's arithmetic so that global latency overlaps it (one tile of
                 registers); 2 = the same plus two workgroup buffers, so each K step needs one barrier, not two

The WGSL is generated per config: accumulators are named scalars (or vec4s) and the per-invocation tile is
fully unrolled, because on an H200 the same 64x64 tile ran 5-45x faster that way than with loop-indexed
local arrays. Shapes (M, N, K) come in a uniform, so one pipeline serves every shape. Every assumption the
generated body makes is a `Rule` in `RULES` (seed 003's cfg_valid, one guard per assumption, ordered so a
rule only divides by values earlier rules guaranteed non-zero). Two of seed 003's checks are implied here and
left out: whole warps (NT % 32) follows from `threads`, and "each sub-tile has exactly 32 lanes" follows from
`warp_steps`, `sub_tile_m` and `sub_tile_n`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Limits, Program
from tilewise.errors import ConfigError
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.space import Config, Rule, Space

WARP = 32  # invocations per logical warp
MAX_ACCUMULATORS = 128  # above this the accumulators alone spill (seed 003)
MAX_PREFETCH_REGISTERS = 32  # floats held for the next tile on top of the accumulators
# big shapes are verified here: partial tiles in M and N for every BM/BN, in K for every BK > 4 (vec4 needs K % 4)
VERIFY_SHAPE = (517, 1036, 388)
PARAMS: dict[str, list[Any]] = {
    "BM": [16, 32, 64, 128, 256],
    "BN": [16, 32, 64, 128, 256],
    "BK": [4, 8, 16, 32],
    "WM": [8, 16, 32, 64, 128],
    "WN": [8, 16, 32, 64, 128],
    "WNITER": [1, 2, 4],
    "TM": [1, 2, 4, 8],
    "TN": [1, 2, 4, 8],
    "NT": [32, 64, 128, 256, 512],
    "SA": ["workgroup", "private"],
    "SB": ["workgroup", "private"],
    "VEC": [1, 4],
    "PF": [0, 1, 2],
}
BASE = {"BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32, "WNITER": 2, "TM": 4, "TN": 4, "NT": 128,
        "SA": "workgroup", "SB": "workgroup", "VEC": 4,
        "PF": 0}


def fmt(c: Config) -> str:
    """`128x64x16 W64x32 WN2 T4x4 128t workgroup vec4` (staging written per operand when A and B differ)."""
    stage = c["SA"] if c["SA"] == c["SB"] else f"A:{c['SA']} B:{c['SB']}"
    return (f"{c['BM']}x{c['BN']}x{c['BK']} W{c['WM']}x{c['WN']} WN{c['WNITER']} T{c['TM']}x{c['TN']} "
            f"{c['NT']}t {stage} vec{c['VEC']}" + ("", " pf", " pf2")[c["PF"]])


# ---- derived quantities (valid once the rules before their use have passed) ---------------------------------
def _wmiter(c: Config) -> int:
    return (c["WM"] * c["WN"]) // (WARP * c["TM"] * c["TN"] * c["WNITER"])


def derived(c: Config) -> dict[str, int]:
    """WMITER, WSUBM, WSUBN and the lane layout of one legal config."""
    wmiter = _wmiter(c)
    if wmiter < 1:
        raise ConfigError(f"{fmt(c)}: WMITER = WM*WN/(32*TM*TN*WNITER) = 0",
                          "this config breaks rule warp_steps; check `tilewise tune gemm --dry-run`")
    wsubm, wsubn = c["WM"] // wmiter, c["WN"] // c["WNITER"]
    return {"WMITER": wmiter, "WSUBM": wsubm, "WSUBN": wsubn, "LANE_COLS": max(1, wsubn // c["TN"]),
            "WARPS_N": max(1, c["BN"] // c["WN"])}


def _storage_bytes(c: Config) -> int:
    per_tile = (c["BM"] * c["BK"] if c["SA"] == "workgroup" else 0) + (c["BK"] * c["BN"] if c["SB"] == "workgroup"
                                                                       else 0)
    return 4 * per_tile * (2 if c["PF"] == 2 else 1)


def _load_count(rows: int, cols: int, c: Config) -> float:
    return rows * cols / c["VEC"] / c["NT"]


def _prefetch_regs(c: Config) -> float:
    return c["VEC"] * ((_load_count(c.BM, c.BK, c) if c.SA == "workgroup" else 0)
                       + (_load_count(c.BK, c.BN, c) if c.SB == "workgroup" else 0))


def _rules() -> list[Rule]:
    def r(name: str, check: Any, explain: Any, needs_limits: bool = False, doc: str = "") -> Rule:
        return Rule(name, check, explain, needs_limits, doc)

    return [
        r("warp_tile_m", lambda c, L: c.BM % c.WM == 0,
          lambda c, L: f"BM % WM = {c.BM} % {c.WM} = {c.BM % c.WM} != 0", doc="warp tiles cover the block rows"),
        r("warp_tile_n", lambda c, L: c.BN % c.WN == 0,
          lambda c, L: f"BN % WN = {c.BN} % {c.WN} = {c.BN % c.WN} != 0", doc="warp tiles cover the block columns"),
        r("threads", lambda c, L: (c.BM // c.WM) * (c.BN // c.WN) * WARP == c.NT,
          lambda c, L: f"threads = (BM/WM)*(BN/WN)*32 = ({c.BM}/{c.WM})*({c.BN}/{c.WN})*32 = "
                       f"{(c.BM // c.WM) * (c.BN // c.WN) * WARP} != NT {c.NT}",
          doc="one warp per warp tile, no idle or missing warps"),
        r("warp_steps", lambda c, L: (c.WM * c.WN) % (WARP * c.TM * c.TN * c.WNITER) == 0 and _wmiter(c) >= 1,
          lambda c, L: f"WMITER = WM*WN/(32*TM*TN*WNITER) = {c.WM * c.WN}/{WARP * c.TM * c.TN * c.WNITER} "
                       f"= {c.WM * c.WN / (WARP * c.TM * c.TN * c.WNITER):g}, not a whole number >= 1",
          doc="the warp tile decomposes into whole WMITER x WNITER steps"),
        r("wmiter_divides", lambda c, L: c.WM % _wmiter(c) == 0,
          lambda c, L: f"WM % WMITER = {c.WM} % {_wmiter(c)} = {c.WM % _wmiter(c)} != 0"),
        r("wniter_divides", lambda c, L: c.WN % c.WNITER == 0,
          lambda c, L: f"WN % WNITER = {c.WN} % {c.WNITER} = {c.WN % c.WNITER} != 0"),
        r("sub_tile_m", lambda c, L: (c.WM // _wmiter(c)) % c.TM == 0,
          lambda c, L: f"WSUBM % TM = {c.WM // _wmiter(c)} % {c.TM} != 0 (WSUBM = WM/WMITER)",
          doc="each warp step's rows split into whole TM strips (then (WSUBM/TM)*(WSUBN/TN) = 32 follows)"),
        r("sub_tile_n", lambda c, L: (c.WN // c.WNITER) % c.TN == 0,
          lambda c, L: f"WSUBN % TN = {c.WN // c.WNITER} % {c.TN} != 0 (WSUBN = WN/WNITER)"),
        r("vec4_bk", lambda c, L: c.VEC == 1 or c.BK % 4 == 0,
          lambda c, L: f"vec4 loads need BK % 4 == 0, BK = {c.BK}"),
        r("vec4_tn", lambda c, L: c.VEC == 1 or c.TN % 4 == 0,
          lambda c, L: f"vec4 operands and stores need TN % 4 == 0, TN = {c.TN}"),
        r("load_a", lambda c, L: c.SA == "private" or (_load_count(c.BM, c.BK, c).is_integer()
                                                       and _load_count(c.BM, c.BK, c) >= 1),
          lambda c, L: f"A tile loads per invocation = BM*BK/VEC/NT = {c.BM}*{c.BK}/{c.VEC}/{c.NT} = "
                       f"{_load_count(c.BM, c.BK, c):g}, not a whole number >= 1",
          doc="the cooperative copy of the A tile covers it exactly"),
        r("load_b", lambda c, L: c.SB == "private" or (_load_count(c.BK, c.BN, c).is_integer()
                                                       and _load_count(c.BK, c.BN, c) >= 1),
          lambda c, L: f"B tile loads per invocation = BK*BN/VEC/NT = {c.BK}*{c.BN}/{c.VEC}/{c.NT} = "
                       f"{_load_count(c.BK, c.BN, c):g}, not a whole number >= 1"),
        r("prefetch_staged", lambda c, L: c.PF == 0 or "workgroup" in (c.SA, c.SB),
          lambda c, L: f"PF={c.PF} prefetches workgroup tiles, but SA = SB = {c.SA} (same kernel as PF=0)"),
        r("prefetch_registers", lambda c, L: c.PF == 0 or _prefetch_regs(c) <= MAX_PREFETCH_REGISTERS,
          lambda c, L: f"prefetch registers = VEC*(loads of A + loads of B) = {_prefetch_regs(c):g} > "
                       f"{MAX_PREFETCH_REGISTERS}"),
        r("accumulators", lambda c, L: _wmiter(c) * c.TM * c.WNITER * c.TN <= MAX_ACCUMULATORS,
          lambda c, L: f"accumulators = WMITER*TM*WNITER*TN = {_wmiter(c) * c.TM * c.WNITER * c.TN} > "
                       f"{MAX_ACCUMULATORS} (certain register spill)"),
        r("workgroup_storage", lambda c, L: _storage_bytes(c) <= L.max_workgroup_storage_bytes,
          lambda c, L: f"workgroup storage = {'2*' if c.PF == 2 else ''}4*({'BM*BK' if c.SA == 'workgroup' else '0'} + "
                       f"{'BK*BN' if c.SB == 'workgroup' else '0'}) = {_storage_bytes(c)} bytes > "
                       f"max_workgroup_storage_bytes {L.max_workgroup_storage_bytes}", needs_limits=True),
        r("invocations", lambda c, L: min(L.max_invocations_per_workgroup, L.max_workgroup_size[0]) >= c.NT,
          lambda c, L: f"NT = {c.NT} > max_invocations_per_workgroup "
                       f"{min(L.max_invocations_per_workgroup, L.max_workgroup_size[0])}", needs_limits=True),
    ]


RULES = _rules()


def _seed_configs() -> list[dict[str, Any]]:
    """Seed 003's 16 hand-picked points: one or two dimensions at a time around 128x64x16 W64x32 WN2 T4x4 128t."""
    b = BASE
    variants: list[dict[str, Any]] = [
        {},
        {"BK": 8},
        {"BK": 32},
        {"BM": 64, "NT": 64},
        {"BN": 128, "NT": 256},
        {"TM": 8, "TN": 8, "WNITER": 1},
        {"PF": 1},
        {"WNITER": 1},
        {"WNITER": 4},
        {"WM": 32, "WN": 64},
        {"SA": "private", "SB": "private"},
        {"SA": "private"},
        {"VEC": 1},
        {"BM": 64, "BN": 64, "WM": 32, "WN": 64, "WNITER": 1, "TM": 8, "TN": 8, "NT": 64},  # the H200 probe tile
        {"NT": 256},  # illegal: threads
        {"TN": 2, "WNITER": 4},  # illegal: vec4 needs TN % 4 == 0
    ]
    return [{**b, **v} for v in variants]


class GemmSpace(Space):
    """The GEMM grid with a fast legal enumeration: NT is determined by the tiling, so it is derived, not looped."""

    def legal(self, limits: Limits | None = None, configs: Any = None) -> list[Config]:
        if configs is not None or self.points is not None:
            return super().legal(limits, configs)
        cache: dict[Any, list[Config]] = self.__dict__.setdefault("_legal_cache", {})
        if limits not in cache:
            cache[limits] = [c for c in self._candidates() if self.is_legal(c, limits)]
        return list(cache[limits])

    def _candidates(self) -> Iterator[Config]:
        """A superset of the legal configs, enumerated with cheap inline pre-checks of the structural rules
        (the rules themselves still decide; a test checks this agrees with filtering the whole grid)."""
        p = self.params
        for bm, wm, bn, wn in itertools.product(p["BM"], p["WM"], p["BN"], p["WN"]):
            if bm % wm or bn % wn:
                continue
            nt = (bm // wm) * (bn // wn) * WARP
            if nt not in p["NT"]:
                continue
            for wniter, tm, tn in itertools.product(p["WNITER"], p["TM"], p["TN"]):
                denom = WARP * tm * tn * wniter
                if (wm * wn) % denom or wm * wn < denom:
                    continue
                wmiter = wm * wn // denom
                if wm % wmiter or wn % wniter or (wm // wmiter) % tm or (wn // wniter) % tn:
                    continue
                if wmiter * tm * wniter * tn > MAX_ACCUMULATORS:
                    continue
                for bk, sa, sb, vec, pf in itertools.product(p["BK"], p["SA"], p["SB"], p["VEC"], p["PF"]):
                    if vec == 4 and (bk % 4 or tn % 4):
                        continue
                    if sa == "workgroup" and (bm * bk) % (vec * nt):
                        continue
                    if sb == "workgroup" and (bk * bn) % (vec * nt):
                        continue
                    yield Config((("BM", bm), ("BN", bn), ("BK", bk), ("WM", wm), ("WN", wn), ("WNITER", wniter),
                                  ("TM", tm), ("TN", tn), ("NT", nt), ("SA", sa), ("SB", sb), ("VEC", vec),
                                  ("PF", pf)), self.fmt)


SPACES = ("seed", "full", "large")


@functools.cache
def gemm_space(which: str = "full") -> Space:
    """The named GEMM spaces: "seed" (seed 003's 16 points), "full" (the whole grid) and "large" (the full
    grid narrowed to vec4 and >= 4x4 outputs per invocation: a prior for big shapes, where small
    per-invocation tiles never win)."""
    if which == "full":
        return GemmSpace("full", {k: list(v) for k, v in PARAMS.items()}, list(RULES), fmt)
    if which == "large":
        params = {**{k: list(v) for k, v in PARAMS.items()}, "BM": [64, 128, 256], "BN": [64, 128, 256],
                  "BK": [8, 16, 32], "TM": [4, 8], "TN": [4, 8], "NT": [64, 128, 256, 512], "VEC": [4]}
        return GemmSpace("large", params, list(RULES), fmt)
    if which == "seed":
        points = _seed_configs()
        params = {k: sorted({p[k] for p in points} | set(PARAMS[k]), key=lambda v: (str(type(v)), v))
                  for k in PARAMS}
        return Space("seed", params, list(RULES), fmt, points=points)
    raise ConfigError(f"unknown space {which!r} for gemm", f"use --space with one of: {', '.join(SPACES)}")


# ---- WGSL generation ----------------------------------------------------------------------------------------
def generate_wgsl(c: Config) -> str:
    """The WGSL of one config: readable, every per-invocation loop unrolled into named accumulators."""
    d = derived(c)
    BM, BN, BK, TM, TN, NT, V = c["BM"], c["BN"], c["BK"], c["TM"], c["TN"], c["NT"], c["VEC"]
    WMITER, WNITER, WSUBM, WSUBN = d["WMITER"], c["WNITER"], d["WSUBM"], d["WSUBN"]
    sa, sb = c["SA"] == "workgroup", c["SB"] == "workgroup"
    vt = "vec4<f32>" if V == 4 else "f32"
    as_vec = sa and V == 4 and TM % 4 == 0  # read the transposed A tile 4 rows at a time
    # private A with vec4 loads reads 4 consecutive k at once, so the inner loop steps k by 4
    kstep = 4 if (not sa and V == 4) else 1
    out: list[str] = []
    w = out.append
    w(f"// tilewise gemm: {fmt(c)}")
    w(f"// C (M, N) = A (M, K) @ B (K, N), fp32, row-major. WMITER={WMITER} WSUBM={WSUBM} WSUBN={WSUBN}; "
      f"{WMITER * TM * WNITER * TN} accumulators per invocation.")
    w("struct Dims { M: u32, N: u32, K: u32, pad: u32 }")
    w(f"@group(0) @binding(0) var<storage, read> A: array<{vt}>;  // (M, K/{V})")
    w(f"@group(0) @binding(1) var<storage, read> B: array<{vt}>;  // (K, N/{V})")
    w(f"@group(0) @binding(2) var<storage, read_write> C: array<{vt}>;  // (M, N/{V})")
    w("@group(0) @binding(3) var<uniform> dims: Dims;")
    nbuf = 2 if c["PF"] == 2 else 1
    lead = f"{nbuf}, " if nbuf > 1 else ""
    if sa:
        if as_vec:
            w(f"var<workgroup> As: array<vec4<f32>, {nbuf * BK * BM // 4}>;  // ({lead}BK, BM/4): A tile, transposed")
        else:
            w(f"var<workgroup> As: array<f32, {nbuf * BK * BM}>;  // ({lead}BK, BM): A tile, transposed")
    if sb:
        w(f"var<workgroup> Bs: array<{vt}, {nbuf * BK * BN // V}>;  // ({lead}BK, BN/{V})")
    w("")
    w(f"@compute @workgroup_size({NT})")
    w("fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>) {")
    w("  let M = dims.M; let N = dims.N; let K = dims.K;")
    w(f"  let KV = K / {V}u; let NV = N / {V}u;")
    w(f"  let bm0 = wg.y * {BM}u; let bn0 = wg.x * {BN}u;")
    w(f"  let warp = tid / {WARP}u; let lane = tid % {WARP}u;")
    wn_, lc = d["WARPS_N"], d["LANE_COLS"]
    w(f"  let mrow = (warp / {wn_}u) * {c['WM']}u + (lane / {lc}u) * {TM}u;  // first row (in tile)")
    w(f"  let ncol = (warp % {wn_}u) * {c['WN']}u + (lane % {lc}u) * {TN}u;  // first col (in tile)")
    # accumulators: acc_{wm}_{i}_{wn}_{j} (j counts vec4s when VEC=4)
    tnv = TN // V
    accs = [(wm, i, wn, j) for wm in range(WMITER) for i in range(TM) for wn in range(WNITER) for j in range(tnv)]
    zero = "vec4<f32>()" if V == 4 else "0.0"
    for a in accs:
        w(f"  var acc_{a[0]}_{a[1]}_{a[2]}_{a[3]}: {vt} = {zero};")
    if not sa:
        for wm in range(WMITER):
            for i in range(TM):
                w(f"  let ga_{wm}_{i} = bm0 + mrow + {wm * WSUBM + i}u;  // global row of A operand")
    if not sb:
        for wn in range(WNITER):
            for j in range(tnv):
                w(f"  let gb_{wn}_{j} = bn0 + ncol + {wn * WSUBN + j * V}u;  // global col of B operand")
    pf = c["PF"] >= 1
    db = c["PF"] == 2  # two workgroup buffers: fill one while computing from the other, one barrier per K step
    comps = ["x", "y", "z", "w"] if V == 4 else [""]
    loads_a = BM * BK // V // NT if sa else 0
    loads_b = BK * BN // V // NT if sb else 0

    def store_a(r: str, kq: str, v: str, ind: str, base: str = "") -> None:
        for q, comp in enumerate(comps):
            val = f"{v}.{comp}" if V == 4 else v
            if as_vec:
                w(f"{ind}As[({base}({kq} + {q}u) * {BM}u + {r}) / 4u][{r} % 4u] = {val};")
            else:
                w(f"{ind}As[{base}({kq} + {q}u) * {BM}u + {r}] = {val};")

    def store_prefetched(ind: str, abase: str = "", bbase: str = "") -> None:
        for l in range(loads_a):
            store_a(f"ra_{l}", f"ka_{l}", f"pa_{l}", ind, abase)
        for l in range(loads_b):
            w(f"{ind}Bs[{bbase}rb_{l} * {BN // V}u + nb_{l} / {V}u] = pb_{l};")

    def load_next(ind: str) -> None:
        w(f"{ind}let nk = bk0 + {BK}u;")
        for l in range(loads_a):
            w(f"{ind}pa_{l} = {zero};")
            w(f"{ind}if (bm0 + ra_{l} < M && nk + ka_{l} < K) {{ "
              f"pa_{l} = A[(bm0 + ra_{l}) * KV + (nk + ka_{l}) / {V}u]; }}")
        for l in range(loads_b):
            w(f"{ind}pb_{l} = {zero};")
            w(f"{ind}if (nk + rb_{l} < K && bn0 + nb_{l} < N) {{ "
              f"pb_{l} = B[(nk + rb_{l}) * NV + (bn0 + nb_{l}) / {V}u]; }}")

    if pf:
        # register prefetch: slot l of this invocation's share of the tiles, fixed across K steps
        for l in range(loads_a):
            w(f"  let ra_{l} = (tid + {l * NT}u) / {BK // V}u; let ka_{l} = ((tid + {l * NT}u) % {BK // V}u) * {V}u;")
            w(f"  var pa_{l}: {vt} = {zero};")
            w(f"  if (bm0 + ra_{l} < M && ka_{l} < K) {{ pa_{l} = A[(bm0 + ra_{l}) * KV + ka_{l} / {V}u]; }}")
        for l in range(loads_b):
            w(f"  let rb_{l} = (tid + {l * NT}u) / {BN // V}u; let nb_{l} = ((tid + {l * NT}u) % {BN // V}u) * {V}u;")
            w(f"  var pb_{l}: {vt} = {zero};")
            w(f"  if (rb_{l} < K && bn0 + nb_{l} < N) {{ pb_{l} = B[rb_{l} * NV + (bn0 + nb_{l}) / {V}u]; }}")
    if db:
        w("  // the first K tile goes to buffer 0 before the loop")
        store_prefetched("  ")
        w("  workgroupBarrier();")
    w(f"  for (var bk0 = 0u; bk0 < K; bk0 += {BK}u) {{")
    abase = bbase = ""
    if db:
        w(f"    let cur = (bk0 / {BK}u) & 1u;  // buffer holding this K tile; the other one receives the next")
        w(f"    let a_off = cur * {BK * BM}u; let b_off = cur * {BK * BN // V}u;")
        w(f"    let a_nxt = (1u - cur) * {BK * BM}u; let b_nxt = (1u - cur) * {BK * BN // V}u;")
        abase, bbase = "a_off + ", "b_off + "
        load_next("    ")
    elif pf:
        w("    // prefetched registers -> workgroup tiles, then start loading the next K tile")
        store_prefetched("    ")
        w("    workgroupBarrier();")
        load_next("    ")
    else:
        if sa:
            w(f"    for (var l = 0u; l < {loads_a}u; l++) {{  // A tile -> As (transposed), {loads_a} {vt} each")
            w(f"      let e = tid + l * {NT}u; let r = e / {BK // V}u; let kq = (e % {BK // V}u) * {V}u;")
            w(f"      var v: {vt} = {zero};")
            w("      if (bm0 + r < M && bk0 + kq < K) { v = A[(bm0 + r) * KV + (bk0 + kq) / " + f"{V}u]; }}")
            store_a("r", "kq", "v", "      ")
            w("    }")
        if sb:
            w(f"    for (var l = 0u; l < {loads_b}u; l++) {{  // B tile -> Bs, {loads_b} {vt} per invocation")
            w(f"      let e = tid + l * {NT}u; let r = e / {BN // V}u; let nq = (e % {BN // V}u) * {V}u;")
            w(f"      var v: {vt} = {zero};")
            w("      if (bk0 + r < K && bn0 + nq < N) { v = B[(bk0 + r) * NV + (bn0 + nq) / " + f"{V}u]; }}")
            w(f"      Bs[r * {BN // V}u + nq / {V}u] = v;")
            w("    }")
        if sa or sb:
            w("    workgroupBarrier();")
    w(f"    for (var k = 0u; k < {BK}u; k += {kstep}u) {{")
    # A operands for this k (or 4 k's)
    a_names: dict[tuple[int, int, int], str] = {}  # (wm, i, sub-k) -> scalar expression
    for wm in range(WMITER):
        if sa and as_vec:
            for i4 in range(TM // 4):
                w(f"      let av_{wm}_{i4} = As[({abase}k * {BM}u + mrow + {wm * WSUBM + 4 * i4}u) / 4u];")
                for q, comp in enumerate("xyzw"):
                    a_names[(wm, 4 * i4 + q, 0)] = f"av_{wm}_{i4}.{comp}"
        elif sa:
            for i in range(TM):
                w(f"      let a_{wm}_{i} = As[{abase}k * {BM}u + mrow + {wm * WSUBM + i}u];")
                a_names[(wm, i, 0)] = f"a_{wm}_{i}"
        else:
            for i in range(TM):
                g = f"ga_{wm}_{i}"
                if kstep == 4:
                    w(f"      var a_{wm}_{i} = vec4<f32>();")
                    w(f"      if ({g} < M && bk0 + k < K) {{ a_{wm}_{i} = A[{g} * KV + (bk0 + k) / 4u]; }}")
                    for q, comp in enumerate("xyzw"):
                        a_names[(wm, i, q)] = f"a_{wm}_{i}.{comp}"
                else:
                    w(f"      var a_{wm}_{i} = 0.0;")
                    w(f"      if ({g} < M && bk0 + k < K) {{ a_{wm}_{i} = A[{g} * KV + bk0 + k]; }}")
                    a_names[(wm, i, 0)] = f"a_{wm}_{i}"
    for sub in range(kstep):
        kexpr = f"k + {sub}u" if kstep > 1 else "k"
        b_names: dict[tuple[int, int], str] = {}
        for wn in range(WNITER):
            for j in range(tnv):
                if sb:
                    off = wn * WSUBN + j * V
                    w(f"      let b_{sub}_{wn}_{j} = Bs[{bbase}({kexpr}) * {BN // V}u + (ncol + {off}u) / {V}u];")
                else:
                    g = f"gb_{wn}_{j}"
                    w(f"      var b_{sub}_{wn}_{j}: {vt} = {zero};")
                    w(f"      if ({g} < N && bk0 + {kexpr} < K) {{ "
                      f"b_{sub}_{wn}_{j} = B[(bk0 + {kexpr}) * NV + {g} / {V}u]; }}")
                b_names[(wn, j)] = f"b_{sub}_{wn}_{j}"
        for wm, i, wn, j in accs:
            a = a_names[(wm, i, sub if kstep == 4 else 0)]
            acc = f"acc_{wm}_{i}_{wn}_{j}"
            av = f"vec4<f32>({a})" if V == 4 else a
            w(f"      {acc} = fma({av}, {b_names[(wn, j)]}, {acc});")
    w("    }")
    if db:
        store_prefetched("    ", "a_nxt + ", "b_nxt + ")
    if sa or sb:
        w("    workgroupBarrier();")
    w("  }")
    for wm in range(WMITER):
        for i in range(TM):
            w(f"  let cm_{wm}_{i} = bm0 + mrow + {wm * WSUBM + i}u;")
            w(f"  if (cm_{wm}_{i} < M) {{")
            for wn in range(WNITER):
                for j in range(tnv):
                    col = f"bn0 + ncol + {wn * WSUBN + j * V}u"
                    w(f"    if ({col} < N) {{ C[cm_{wm}_{i} * NV + ({col}) / {V}u] = acc_{wm}_{i}_{wn}_{j}; }}")
            w("  }")
    w("}")
    return "\n".join(out) + "\n"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class WgslGemm(KernelTemplate):
    """fp32 GEMM on WebGPU, generated per config (see the module docstring for the parameters)."""

    name = "gemm"
    backend = "webgpu"
    shape_names = ("M", "N", "K")
    dtype = "f32"

    def space(self, which: str = "full") -> Space:
        return gemm_space(which)

    def space_names(self) -> tuple[str, ...]:
        return SPACES

    def default_config(self) -> Config:
        """Seed 003's base config (128x64x16 W64x32 WN2 T4x4 128t), for partial `--show-source` configs."""
        return gemm_space("full").config(BASE)

    def shape_problems(self, config: Config, shape: Shape) -> list[str]:
        _, N, K = shape
        problems = []
        if config["VEC"] == 4 and (K % 4 or N % 4):
            problems.append(f"vec4_shape: vec4 rows need K % 4 == 0 and N % 4 == 0, got K={K}, N={N}")
        return problems

    def verify_shape(self, config: Config, shape: Shape) -> Shape:
        """Verify at `VERIFY_SHAPE` when it is cheaper than `shape` and the config admits it.

        The pipeline does not depend on the shape (M, N, K come in a uniform), and `VERIFY_SHAPE` gives
        every legal config partial tiles in M and N (and in K for BK > 4) and several tiles along each, so it
        takes the edge guards a large shape can take while its float64 reference stays cheap on the host.
        """
        if self.flops(shape) <= self.flops(VERIFY_SHAPE) or self.shape_problems(config, VERIFY_SHAPE):
            return shape
        return VERIFY_SHAPE

    def source(self, config: Config) -> str:
        return generate_wgsl(config)

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config), "main", name=f"gemm {fmt(config)}")

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        M, N, K = shape
        # uniform(-1, 1) plus an offset so no element is ever zero
        a = rng.uniform(0.5, 1.5, (M, K)) * rng.choice([-1.0, 1.0], (M, K))  # (M, K)
        b = rng.uniform(0.5, 1.5, (K, N)) * rng.choice([-1.0, 1.0], (K, N))  # (K, N)
        return {"a": a.astype(np.float32), "b": b.astype(np.float32)}

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N, K = shape
        return {"a": device.upload(host["a"]), "b": device.upload(host["b"]),
                "out": device.allocate(4 * M * N),
                "dims": device.upload(np.array([M, N, K, 0], dtype=np.uint32), uniform=True)}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        M, N, _ = shape
        grid = (_ceil(N, config["BN"]), _ceil(M, config["BM"]), 1)
        order: list[Buffer] = [bufs["a"], bufs["b"], bufs["out"], bufs["dims"]]
        return [Launch(program, grid, order)]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        M, N, _ = shape
        return device.download(bufs["out"], np.float32, (M, N))

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        return host["a"].astype(np.float64) @ host["b"].astype(np.float64)

    def flops(self, shape: Shape) -> int:
        M, N, K = shape
        return 2 * M * N * K

    def bytes_moved(self, shape: Shape) -> int:
        M, N, K = shape
        return 4 * (M * K + K * N + M * N)

    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N, _ = shape
        return (_ceil(M, config["BM"]) * config["BM"] * _ceil(N, config["BN"]) * config["BN"]) / (M * N)
