"""fp32 GEMM for WebGPU: C (M, N) = A (M, K) @ B (K, N), row-major, any M, N, K (edge guards).

Variants (the parameters of seed 003's warp-tiled kernel, mapped to WGSL, plus seed 000's staging scope):

    BM, BN, BK   block tile: one workgroup computes a BM x BN tile of C, stepping K by BK
    WM, WN       "warp" tile: a group of WARP = 32 invocations computes a WM x WN rectangle of the block tile.
                 WGSL has no warps; the grouping is logical (no subgroup operations are used), so the result
                 does not depend on the adapter's subgroup size, only the memory access pattern does.
    WNITER       the warp tile is walked in WMITER x WNITER steps (WMITER is derived, see `wgsl.derived`)
    TM, TN       each invocation owns TM x TN outputs per step (WMITER*TM*WNITER*TN accumulators)
    NT           invocations per workgroup (must equal 32 warps' worth of the tiling: the `threads` rule)
    SA, SB       staging scope of A and B per K step: "workgroup" (cooperatively copied to var<workgroup>
                 memory, barrier, read by all) or "private" (each invocation loads its own operands from
                 global memory into registers, like TVM's cache_read(A, "local"); no barrier)
    VEC          1 or 4: vec4 global loads/stores, vec4 shared-memory reads (needs K and N multiples of 4)
    PF           0, 1 or 2: 1 = register prefetch of the next K tile of the workgroup-staged operands, issued
                 before the current tile's arithmetic so that global latency overlaps it (one tile of
                 registers); 2 = the same plus two workgroup buffers, so each K step needs one barrier, not two

The WGSL is generated per config (`tilewise.kernels.gemm.wgsl`, the per-invocation tile unrolled into named
accumulators). Shapes (M, N, K) come in a uniform, so one pipeline serves every shape (`program_key` is the config
alone). Every assumption the generated body makes is a `Rule` in `RULES` (seed 003's cfg_valid, one guard per
assumption, ordered so a rule only divides by values earlier rules guaranteed non-zero). Two of seed 003's checks
are implied here and left out: whole warps (NT % 32) follows from `threads`, and "each sub-tile has exactly 32
lanes" follows from `warp_steps`, `sub_tile_m` and `sub_tile_n`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Limits, Program
from tilewise.errors import ConfigError
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.gemm.problem import GEMM
from tilewise.kernels.gemm.wgsl import WARP, fmt, generate_wgsl, wmiter
from tilewise.kernels.space import Config, Rule, Space

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
        "SA": "workgroup", "SB": "workgroup", "VEC": 4, "PF": 0}


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
        r("warp_steps", lambda c, L: (c.WM * c.WN) % (WARP * c.TM * c.TN * c.WNITER) == 0 and wmiter(c) >= 1,
          lambda c, L: f"WMITER = WM*WN/(32*TM*TN*WNITER) = {c.WM * c.WN}/{WARP * c.TM * c.TN * c.WNITER} "
                       f"= {c.WM * c.WN / (WARP * c.TM * c.TN * c.WNITER):g}, not a whole number >= 1",
          doc="the warp tile decomposes into whole WMITER x WNITER steps"),
        r("wmiter_divides", lambda c, L: c.WM % wmiter(c) == 0,
          lambda c, L: f"WM % WMITER = {c.WM} % {wmiter(c)} = {c.WM % wmiter(c)} != 0"),
        r("wniter_divides", lambda c, L: c.WN % c.WNITER == 0,
          lambda c, L: f"WN % WNITER = {c.WN} % {c.WNITER} = {c.WN % c.WNITER} != 0"),
        r("sub_tile_m", lambda c, L: (c.WM // wmiter(c)) % c.TM == 0,
          lambda c, L: f"WSUBM % TM = {c.WM // wmiter(c)} % {c.TM} != 0 (WSUBM = WM/WMITER)",
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
        r("accumulators", lambda c, L: wmiter(c) * c.TM * c.WNITER * c.TN <= MAX_ACCUMULATORS,
          lambda c, L: f"accumulators = WMITER*TM*WNITER*TN = {wmiter(c) * c.TM * c.WNITER * c.TN} > "
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
        {"BM": 64, "BN": 64, "WM": 32, "WN": 64, "WNITER": 1, "TM": 8, "TN": 8, "NT": 64},  # 64x64, 8x8 per lane
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


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class WgslGemm(KernelTemplate):
    """fp32 GEMM on WebGPU, generated per config (see the module docstring for the parameters)."""

    problem = GEMM
    backend = "webgpu"

    make_space = gemm_space
    spaces = SPACES

    def default_config(self) -> Config:
        """Seed 003's base config (128x64x16 W64x32 WN2 T4x4 128t), for partial `--show-source` configs."""
        return gemm_space("full").config(BASE)

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
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

    def source(self, config: Config, shape: Shape | None = None) -> str:
        return generate_wgsl(config)

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return config  # M, N and K come in a uniform

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config), "main", name=f"gemm {fmt(config)}")

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

    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N, _ = shape
        return (_ceil(M, config["BM"]) * config["BM"] * _ceil(N, config["BN"]) * config["BN"]) / (M * N)
