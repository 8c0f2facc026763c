"""fp32 warp-tiled SGEMM on CUDA (seed 003's kernel) as a tilewise kernel template.

The source is `gemm.cu`: one C++ template `sgemm_warptile<BM, BN, BK, WM, WN, WNITER, TM, TN, NT>`,
instantiated per config by an NVRTC name expression. The rules below are seed 003's `cfg_valid`, one
`Rule` per group of checks, in the seed's order (each guard protects the divisions of the rules after
it), followed by the device's real limits. `gemm.cu` mirrors the ten seed rules with `static_assert`s,
so an illegal config is refused here before compiling and cannot compile either.

Shapes (M, N, K), row-major C (M, N) = alpha * A (M, K) @ B (K, N) + beta * C (`tilewise.kernels.gemm.problem`):
any M >= 1; N and K multiples of 4 (float4 loads and stores never straddle a row end); partial tiles in every
dimension are bounds-guarded; ceil(M / BM) <= 65535 (CUDA's grid y limit). M, N and K are kernel arguments, so one
compiled program serves every shape (`program_key` is the config alone).
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Limits, Program
from tilewise.errors import ConfigError, LaunchError
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.gemm.problem import GEMM, GemmProblem
from tilewise.kernels.space import Config, Rule, Space

WARPSIZE = 32
PARAMS = ("BM", "BN", "BK", "WM", "WN", "WNITER", "TM", "TN", "NT")
KERNEL = "sgemm_warptile"
STATIC_SMEM_CAP_BYTES = 48 * 1024
MAX_ACCUMULATORS = 128
MAX_GRID_Y = 65535

#: where `verify_shape` checks configs timed at larger shapes (the bench's choice): partial tiles in every
#: dimension for every config of the grid: M odd, N = 4*259 a multiple of no BN, K = 4*97 of no BK >= 8
VERIFY_SHAPE = (517, 1036, 388)

#: seed 003's base ("kernel 7 shape") and the config its sweep ranked first
KERNEL7 = (128, 128, 16, 64, 64, 4, 8, 4, 128)
SEED_WINNER = (128, 64, 16, 64, 32, 2, 4, 4, 128)

#: 16 hand-picked points around kernel 7's shape, varying one or two dimensions at a time (seed 003).
#: Two are illegal on purpose: T8x8 at WNITER 4 (WMITER would be 1/2) and 256 threads for 4 warp tiles.
SEED_POINTS: tuple[tuple[int, ...], ...] = (
    KERNEL7,                                  # kernel 7's shape
    (128, 128, 8, 64, 64, 4, 8, 4, 128),      # BK 8
    (128, 128, 32, 64, 64, 4, 8, 4, 128),     # BK 32
    (128, 128, 16, 64, 64, 2, 8, 4, 128),     # WNITER 2
    (128, 128, 16, 64, 64, 1, 8, 4, 128),     # WNITER 1
    (128, 128, 16, 64, 64, 4, 4, 4, 128),     # thread tile 4x4
    (128, 128, 16, 64, 64, 4, 8, 8, 128),     # thread tile 8x8: illegal (wmiter_integral)
    (128, 128, 16, 64, 64, 4, 8, 4, 256),     # 256 threads, 4 warp tiles: illegal (warps_count)
    (128, 128, 16, 64, 32, 1, 8, 8, 256),     # 8x8 thread tile, legal at 256 threads
    (128, 128, 16, 64, 32, 2, 4, 4, 256),     # 4x4 thread tile, 256 threads
    SEED_WINNER,                              # 128x64x16 W64x32 WNITER2 T4x4 128t: the seed's winner
    (128, 64, 32, 64, 32, 2, 4, 4, 128),      # the winner at BK 32
    (64, 128, 16, 32, 64, 2, 4, 4, 128),      # the winner transposed
    (64, 64, 16, 32, 32, 2, 4, 4, 128),       # small block tile
    (128, 256, 16, 64, 64, 4, 8, 4, 256),     # wide block tile
    (256, 128, 16, 64, 32, 2, 4, 4, 512),     # largest block tile, 512 threads
)

#: the full grid: 23328 tuples, 1434 legal on sm_90 (a sweep compiles each legal one once)
FULL_VALUES: dict[str, list[int]] = {
    "BM": [32, 64, 128, 256],
    "BN": [64, 128, 256],
    "BK": [8, 16, 32],
    "WM": [32, 64, 128],
    "WN": [32, 64, 128],
    "WNITER": [1, 2, 4, 8],
    "TM": [2, 4, 8],
    "TN": [4, 8],
    "NT": [128, 256, 512],
}


# ---- derived quantities (valid once the rules before their use have passed) ---------------------------
def _exact(a: int, b: int) -> int:
    """a / b when it divides exactly; otherwise ValueError, so that rules built on it are skipped once the
    rule guaranteeing it has failed (the Space reports the first broken assumption, not its echoes)."""
    if b <= 0 or a % b:
        raise ValueError(f"{a}/{b} is not whole")
    return a // b


def wmiter(c: Config) -> int:
    m = _exact(c.WM * c.WN, WARPSIZE * c.TM * c.TN * c.WNITER)
    if m < 1:
        raise ValueError("WMITER < 1")
    return m


def smem_bytes(c: Config) -> int:
    """Static shared memory of one block: As (BK, BM) + Bs (BK, BN) floats."""
    return (c.BM * c.BK + c.BK * c.BN) * 4


def accumulators(c: Config) -> int:
    return wmiter(c) * c.TM * c.WNITER * c.TN


def min_registers_per_thread(c: Config) -> int:
    """A lower bound on registers per thread: accumulators + the TM and TN operand fragments + staging.

    The compiler needs more (indices, pointers, loop state); a config that fails even this bound can never
    fit the register file.
    """
    loads = (c.BM * c.BK + c.BK * c.BN) // (4 * c.NT)  # float4 staged per thread per K-slab
    return accumulators(c) + wmiter(c) * c.TM + c.WNITER * c.TN + 4 * loads


def _fmt(c: Config) -> str:
    return f"{c.BM}x{c.BN}x{c.BK} W{c.WM}x{c.WN} WNITER{c.WNITER} T{c.TM}x{c.TN} {c.NT}t"


# ---- the rules: seed 003's cfg_valid, in its order -------------------------------------------------------
def _r_wmiter(c: Config) -> bool:
    denom = WARPSIZE * c.TM * c.TN * c.WNITER
    if denom <= 0 or (c.WM * c.WN) % denom != 0:
        return False
    m = (c.WM * c.WN) // denom
    return not (m < 1 or c.WM % m != 0 or c.WN % c.WNITER != 0)


def _e_wmiter(c: Config) -> str:
    denom = WARPSIZE * c.TM * c.TN * c.WNITER
    if (c.WM * c.WN) % denom:
        return f"WM*WN = {c.WM * c.WN} is not a multiple of 32*TM*TN*WNITER = {denom}"
    m = (c.WM * c.WN) // denom
    if m < 1:
        return f"WMITER = WM*WN/(32*TM*TN*WNITER) = {c.WM * c.WN}/{denom} < 1"
    if c.WM % m:
        return f"WMITER = {m} does not divide WM = {c.WM}"
    return f"WNITER = {c.WNITER} does not divide WN = {c.WN}"


def _r_subtile(c: Config) -> bool:
    wsubm, wsubn = c.WM // wmiter(c), c.WN // c.WNITER
    if wsubm % c.TM != 0 or wsubn % c.TN != 0:
        return False
    return (wsubm // c.TM) * (wsubn // c.TN) == WARPSIZE


def _e_subtile(c: Config) -> str:
    wsubm, wsubn = c.WM // wmiter(c), c.WN // c.WNITER
    if wsubm % c.TM or wsubn % c.TN:
        return f"sub-tile {wsubm}x{wsubn} is not a whole number of {c.TM}x{c.TN} thread tiles"
    return (f"sub-tile {wsubm}x{wsubn} holds ({wsubm}/{c.TM})*({wsubn}/{c.TN}) = "
            f"{(wsubm // c.TM) * (wsubn // c.TN)} thread tiles, not 32 (one per lane)")


def _r_strides(c: Config) -> bool:
    if (c.NT * 4) % c.BK != 0:
        return False
    stride_a = (c.NT * 4) // c.BK
    if stride_a < 1 or c.BM % stride_a != 0:
        return False
    if c.NT % (c.BN // 4) != 0:
        return False
    stride_b = c.NT // (c.BN // 4)
    return not (stride_b < 1 or c.BK % stride_b != 0)


def _e_strides(c: Config) -> str:
    if (c.NT * 4) % c.BK:
        return f"NT*4 = {c.NT * 4} floats per A load step is not a multiple of BK = {c.BK}"
    stride_a = (c.NT * 4) // c.BK
    if c.BM % stride_a:
        return f"A load row stride NT*4/BK = {stride_a} does not divide BM = {c.BM}"
    if c.NT % (c.BN // 4):
        return f"NT = {c.NT} is not a multiple of BN/4 = {c.BN // 4} (float4 columns of the B tile)"
    stride_b = c.NT // (c.BN // 4)
    return f"B load row stride NT/(BN/4) = {stride_b} does not divide BK = {c.BK}"


def _owned(c: Config) -> int:
    return c.NT * wmiter(c) * c.TM * c.WNITER * c.TN


SEED_RULES: list[Rule] = [
    Rule("whole_warps", lambda c, _: c.NT % WARPSIZE == 0,
         lambda c, _: f"NT = {c.NT} is not a multiple of the warp size {WARPSIZE}",
         doc="the block must be a whole number of warps"),
    Rule("warp_tiles_divide", lambda c, _: c.BM % c.WM == 0 and c.BN % c.WN == 0,
         lambda c, _: f"block tile {c.BM}x{c.BN} is not a whole number of {c.WM}x{c.WN} warp tiles",
         doc="the block tile must be tiled evenly by warp tiles"),
    Rule("warps_count", lambda c, _: _exact(c.BM, c.WM) * _exact(c.BN, c.WN) == c.NT // WARPSIZE,
         lambda c, _: (f"({c.BM}/{c.WM})*({c.BN}/{c.WN}) = {(c.BM // c.WM) * (c.BN // c.WN)} warp tiles != "
                       f"NT/32 = {c.NT // WARPSIZE} warps"),
         doc="one warp per warp tile"),
    Rule("wmiter_integral", lambda c, _: _r_wmiter(c), lambda c, _: _e_wmiter(c),
         doc="the warp tile must decompose into whole WMITER x WNITER steps"),
    Rule("subtile_32_threads", lambda c, _: _r_subtile(c), lambda c, _: _e_subtile(c),
         doc="each sub-tile must be covered by exactly 32 threads"),
    Rule("float4_alignment", lambda c, _: c.BK % 4 == 0 and c.BN % 4 == 0 and c.TN % 4 == 0,
         lambda c, _: f"BK = {c.BK}, BN = {c.BN}, TN = {c.TN} must all be multiples of 4 (float4 loads/stores)",
         doc="float4 vectorization requires 4-element alignment everywhere"),
    Rule("load_strides", lambda c, _: _r_strides(c), lambda c, _: _e_strides(c),
         doc="the shared-memory load loops must tile each cache exactly"),
    Rule("output_owned_once", lambda c, _: _owned(c) == c.BM * c.BN,
         lambda c, _: f"NT*WMITER*TM*WNITER*TN = {_owned(c)} outputs owned != BM*BN = {c.BM * c.BN}",
         doc="every output element must be owned by exactly one thread"),
    Rule("static_smem_48k", lambda c, _: smem_bytes(c) <= STATIC_SMEM_CAP_BYTES,
         lambda c, _: f"(BM*BK + BK*BN)*4 = {smem_bytes(c)} bytes > {STATIC_SMEM_CAP_BYTES} (static __shared__ cap)",
         doc="static __shared__ is capped at 48 KB without an opt-in"),
    Rule("accumulators_128", lambda c, _: accumulators(c) <= MAX_ACCUMULATORS,
         lambda c, _: f"WMITER*TM*WNITER*TN = {accumulators(c)} accumulators > {MAX_ACCUMULATORS} (certain spilling)",
         doc="accumulators alone above ~128 registers guarantee spilling"),
]


def _regs_ok(c: Config, lim: Limits | None) -> bool:
    if lim is None or lim.registers_per_block is None:
        return True
    return c.NT * min_registers_per_thread(c) <= lim.registers_per_block


DEVICE_RULES: list[Rule] = [
    Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= c.NT,
         lambda c, lim: f"NT = {c.NT} > the device's {lim.max_invocations_per_workgroup} threads per block",
         needs_limits=True),
    Rule("shared_per_block", lambda c, lim: smem_bytes(c) <= lim.max_workgroup_storage_bytes,
         lambda c, lim: f"{smem_bytes(c)} bytes of shared memory > the device's {lim.max_workgroup_storage_bytes} "
                        "per block", needs_limits=True),
    Rule("registers_per_block", _regs_ok,
         lambda c, lim: (f"NT * registers >= {c.NT} * {min_registers_per_thread(c)} = "
                         f"{c.NT * min_registers_per_thread(c)} > the device's {lim.registers_per_block} per block"),
         needs_limits=True, doc="a lower bound: accumulators + operand fragments + load staging"),
]


@cache
def _source() -> str:
    return resources.files("tilewise.kernels.gemm").joinpath("gemm.cu").read_text()


def name_expression(c: Config) -> str:
    """The NVRTC name expression of one instantiation, e.g. `sgemm_warptile<128, 64, 16, ...>`."""
    return f"{KERNEL}<{', '.join(str(c[p]) for p in PARAMS)}>"


class CudaGemm(KernelTemplate):
    """C (M, N) = alpha * A (M, K) @ B (K, N) + beta * C, fp32, row-major, on the warp-tiling template.

    Args:
        alpha: scale of A @ B.
        beta: scale of the existing C; 0 (the default) never reads C.
    """

    problem: GemmProblem = GEMM
    backend = "cuda"
    peer_name = "cuBLAS"

    def __init__(self, alpha: float = 1.0, beta: float = 0.0) -> None:
        if (float(alpha), float(beta)) != (GEMM.alpha, GEMM.beta):
            self.problem = GemmProblem(alpha, beta)

    @property
    def alpha(self) -> float:
        return self.problem.alpha

    @property
    def beta(self) -> float:
        return self.problem.beta

    # ---- spaces ---------------------------------------------------------------------------------------
    spaces = ("seed", "full")

    def space(self, which: str = "full") -> Space:
        """`seed`: seed 003's 16 hand-picked points; `full`: the whole grid over `FULL_VALUES`."""
        if which == "full":
            return Space("gemm-cuda-full", {k: list(v) for k, v in FULL_VALUES.items()},
                         SEED_RULES + DEVICE_RULES, _fmt)
        if which == "seed":
            values = {p: sorted({pt[i] for pt in SEED_POINTS}) for i, p in enumerate(PARAMS)}
            return Space("gemm-cuda-seed", values, SEED_RULES + DEVICE_RULES, _fmt,
                         points=[dict(zip(PARAMS, pt)) for pt in SEED_POINTS])
        raise ConfigError(f"gemm on cuda has no space {which!r}", f"use one of: {', '.join(self.space_names())}")

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        M, N, K = shape
        problems = []
        if N % 4:
            problems.append(f"float4_columns: N = {N} is not a multiple of 4 (B and C rows are read as float4)")
        if K % 4:
            problems.append(f"float4_columns: K = {K} is not a multiple of 4 (A rows are read as float4)")
        if math.ceil(M / config.BM) > MAX_GRID_Y:
            problems.append(f"grid_y: ceil(M/BM) = {math.ceil(M / config.BM)} blocks > CUDA's {MAX_GRID_Y}")
        return problems

    # ---- source and compile ---------------------------------------------------------------------------
    def source(self, config: Config, shape: Shape | None = None) -> str:
        return f"{_source()}\n// instantiated as {name_expression(config)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return config  # M, N and K are kernel arguments

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        prog = device.compile(_source(), entry=name_expression(config), constants=dict(config),
                              name=f"gemm_cuda[{_fmt(config)}]")
        prog.meta["block"] = (config.NT, 1, 1)
        regs = prog.meta.get("registers")
        limit = getattr(device.info.limits, "registers_per_block", None)
        if regs is not None and limit is not None and regs * config.NT > limit:
            raise LaunchError(f"{prog.name} needs {regs} registers x {config.NT} threads = {regs * config.NT} > "
                              f"{limit} per block", "pick a config with fewer threads or a smaller thread tile")
        return prog

    def verify_shape(self, config: Config, shape: Shape) -> Shape:
        """Verify at `VERIFY_SHAPE` when it is cheaper than `shape` and the config admits it.

        The program does not depend on the shape, and `VERIFY_SHAPE` has partial tiles in M, N and K for
        every config, several blocks in each grid dimension and several K slabs, so it takes every bounds
        guard a real shape can take (offsets are computed in size_t, so size alone adds no code path).
        Smaller shapes are verified as they are.

        Args:
            config: the config to verify.
            shape: the shape it is timed at.

        Returns:
            `VERIFY_SHAPE` or `shape`.
        """
        if self.flops(shape) <= self.flops(VERIFY_SHAPE) or self.shape_problems(config, VERIFY_SHAPE):
            return shape
        return VERIFY_SHAPE

    # ---- data ------------------------------------------------------------------------------------------
    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        """A, B and the output; when beta != 0 the output starts as C (timing reads it too), and C is kept beside
        the buffers so that `poison` restores it before each verification."""
        M, N, _ = self.problem.check_shape(shape)
        bufs = {"a": device.upload(host["a"]), "b": device.upload(host["b"]), "out": device.allocate(M * N * 4)}
        init = self.problem.initial_output(host, shape)
        if init is not None:
            device.write(bufs["out"], init)
        return self.attach_initial(device, host, shape, bufs)

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        M, N, K = self.problem.check_shape(shape)
        grid = (math.ceil(N / config.BN), math.ceil(M / config.BM), 1)
        args: list[Any] = [np.int32(M), np.int32(N), np.int32(K), np.float32(self.alpha), bufs["a"], bufs["b"],
                           np.float32(self.beta), bufs["out"]]
        return [Launch(program, grid, args)]


    # ---- the cuBLAS peer -------------------------------------------------------------------------------
    def peer_program(self, device: Device) -> Program:
        """cuBLAS SGEMM (CuPy matmul, fp32, TF32 off) as a program the device times like any kernel.

        Launch it with `peer_launches`; it writes the same output buffer.
        """
        if os.environ.get("CUPY_TF32", "0") not in ("", "0"):
            raise ConfigError("CUPY_TF32 is set: cuBLAS would use TF32 tensor cores, not fp32",
                              "unset CUPY_TF32 (or set it to 0) before starting Python")
        cp = device._cp  # type: ignore[attr-defined]

        def cublas_sgemm(M: Any, N: Any, K: Any, a: Any, b: Any, out: Any) -> None:
            m, n, k = int(M), int(N), int(K)
            cp.matmul(a.view(cp.float32)[: m * k].reshape(m, k), b.view(cp.float32)[: k * n].reshape(k, n),
                      out=out.view(cp.float32)[: m * n].reshape(m, n))

        return Program("cublas_sgemm", cublas_sgemm, "cublas", meta={"callable": True})

    def peer_launches(self, program: Program, bufs: DeviceBuffers, shape: Shape) -> list[Launch]:
        M, N, K = self.problem.check_shape(shape)
        return [Launch(program, (1, 1, 1), [np.int32(M), np.int32(N), np.int32(K), bufs["a"], bufs["b"], bufs["out"]])]

    # ---- tiles -----------------------------------------------------------------------------------------
    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N, _ = self.problem.check_shape(shape)
        return (math.ceil(M / config.BM) * config.BM * math.ceil(N / config.BN) * config.BN) / (M * N)

    def describe(self, config: Config) -> str:
        return _fmt(config)

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "source": "gemm.cu", "kernel": KERNEL, "alpha": self.alpha, "beta": self.beta}
