"""fp32 GEMM on CUDA, scheduled with Apache TVM (seed 000's GPU GEMM schedule, each choice a parameter) and emitted as
CUDA C++ that tilewise's CUDA device runs: `gemm-tvm` on `cuda`. C (M, N) = A (M, K) @ B (K, N), row-major
(`tilewise.kernels.gemm.problem`, alpha = 1, beta = 0).

Variants:

    TY, TX   threads per block along rows / columns (threadIdx.y, threadIdx.x)
    TM, TN   per-thread tile: each thread owns a TM x TN patch of C, accumulated in a `local` cache_write
    KB       reduction split k -> (k_o, k_i); the staged operands are refreshed once per k_o
    STAGE    "global" (no cache_read), "shared" (the block copies its (TY*TM, KB) slab of A and (KB, TX*TN) of B
             into __shared__ arrays, cooperatively, between barriers) or "local" (seed 000's
             cache_read(A, "local"): each thread loads its own (TM, KB) and (KB, TN) operands into registers)

The splits must divide the shape (M by TY*TM, N by TX*TN, K by KB): the kernel has no bounds guard. The emit,
compile and launch path (and the source store used without TVM) is `tilewise.kernels.tvm.cuda.TvmCudaTemplate`.
"""

from __future__ import annotations

from typing import Any

from tilewise.devices.base import Device, Limits
from tilewise.kernels.base import DeviceBuffers, HostInputs, Shape
from tilewise.kernels.gemm.problem import GEMM
from tilewise.kernels.space import Config, Rule, Space, named_space
from tilewise.kernels.tvm.cuda import (
    MAX_INDEX,
    STAGES,
    TvmCudaTemplate,
    import_tvm,
    loops_below,
    lower_to_cuda,
    region_name,
    registers_per_thread,
)

GEMM_STAGES = STAGES
GEMM_PARAMS: dict[str, list[Any]] = {
    "TY": [4, 8, 16, 32],
    "TX": [4, 8, 16, 32],
    "TM": [1, 2, 4, 8],
    "TN": [1, 2, 4, 8],
    "KB": [1, 4, 8, 16, 32],
    "STAGE": list(GEMM_STAGES),
}
GEMM_DEFAULT_SHAPE = (1024, 1024, 1024)
MAX_GRID_Y = 65535


def gemm_fmt(c: Config) -> str:
    """`16x16t T4x4 KB8 local` (a block computes a (TY*TM) x (TX*TN) tile of C)."""
    return f"{c['TY']}x{c['TX']}t T{c['TM']}x{c['TN']} KB{c['KB']} {c['STAGE']}"


def gemm_registers(c: Config) -> int:
    """f32 values one thread keeps live: the TM x TN accumulators, plus its local A (TM, KB) and B (KB, TN)."""
    if c["STAGE"] == "local":
        return c["TM"] * c["TN"] + c["KB"] * (c["TM"] + c["TN"])
    return c["TM"] * c["TN"]


def gemm_shared_bytes(c: Config) -> int:
    """Static __shared__ bytes of one block: A's (TY*TM, KB) slab plus B's (KB, TX*TN) slab."""
    return 4 * c["KB"] * (c["TY"] * c["TM"] + c["TX"] * c["TN"]) if c["STAGE"] == "shared" else 0


def _gemm_register_budget(c: Config, L: Limits | None) -> int:
    return registers_per_thread(c["TY"] * c["TX"], L)


def _gemm_rules() -> list[Rule]:
    return [
        Rule("stage", lambda c, L: c.STAGE in GEMM_STAGES,
             lambda c, L: f"STAGE = {c.STAGE!r} is not one of {', '.join(GEMM_STAGES)}"),
        Rule("registers", lambda c, L: gemm_registers(c) <= _gemm_register_budget(c, L),
             lambda c, L: f"registers = TM*TN + KB*(TM + TN) = {gemm_registers(c)} > {_gemm_register_budget(c, L)} "
                          f"per thread (min(255, registers per block / {c.TY * c.TX} threads)): would spill",
             doc="accumulators plus the local operands stay in registers"),
        Rule("threads_per_block", lambda c, L: _max_threads_2d(L) >= c.TY * c.TX and L.max_workgroup_size[1] >= c.TY,
             lambda c, L: f"TY*TX = {c.TY}*{c.TX} = {c.TY * c.TX} threads per block (TY = {c.TY}) > the device's "
                          f"limit {_max_threads_2d(L)} (y at most {L.max_workgroup_size[1]})", needs_limits=True),
        Rule("shared_memory", lambda c, L: gemm_shared_bytes(c) <= L.max_workgroup_storage_bytes,
             lambda c, L: f"__shared__ = 4*KB*(TY*TM + TX*TN) = 4*{c.KB}*({c.TY}*{c.TM} + {c.TX}*{c.TN}) = "
                          f"{gemm_shared_bytes(c)} bytes > {L.max_workgroup_storage_bytes} per block",
             needs_limits=True),
    ]


def _max_threads_2d(L: Limits) -> int:
    """Threads per block (x * y), CUDA's maxThreadsPerBlock."""
    return L.max_invocations_per_workgroup


GEMM_RULES = _gemm_rules()


def tvm_cuda_gemm_space(which: str = "full") -> Space:
    """The named spaces: "seed" (12 points: three staging scopes at four tiles), "full" (the grid), "small"."""
    # seed 000: a 16x16 thread block, from one output per thread to its 4x4 patch, per staging scope
    seed = [{"TY": 16, "TX": 16, "TM": tm, "TN": tn, "KB": kb, "STAGE": s} for s in GEMM_STAGES
            for tm, tn, kb in ((1, 1, 1), (1, 1, 8), (4, 4, 8), (4, 4, 16))]
    small = {"TY": [8], "TX": [16], "TM": [1, 4], "TN": [4], "KB": [8], "STAGE": GEMM_STAGES}
    return named_space(which, GEMM_PARAMS, GEMM_RULES, gemm_fmt, small, seed, "gemm-tvm (cuda)")


def _gemm_shape_problems(c: Config, M: int, N: int, K: int) -> list[str]:
    problems = []
    bm, bn = c["TY"] * c["TM"], c["TX"] * c["TN"]
    if M % bm:
        problems.append(f"row_split: M % (TY*TM) = {M} % {bm} = {M % bm} != 0 (no bounds guard)")
    if N % bn:
        problems.append(f"col_split: N % (TX*TN) = {N} % {bn} = {N % bn} != 0 (no bounds guard)")
    if K % c["KB"]:
        problems.append(f"reduction_split: K % KB = {K} % {c['KB']} = {K % c['KB']} != 0 (no bounds guard)")
    if M // bm > MAX_GRID_Y:
        problems.append(f"grid_y: M / (TY*TM) = {M // bm} blocks > {MAX_GRID_Y}")
    if max(M * K, K * N, M * N) > MAX_INDEX:
        problems.append(f"index_range: largest operand has {max(M * K, K * N, M * N)} elements > {MAX_INDEX} "
                        "(int32 indices)")
    return problems


def gemm_symbol(c: Config) -> str:
    return f"tw_gemm_{c['TY']}x{c['TX']}_t{c['TM']}x{c['TN']}_kb{c['KB']}_{c['STAGE']}"


def gemm_schedule(c: Config, M: int, N: int, K: int) -> Any:
    """The scheduled TIR module of one GEMM config (see the module docstring).

    Args:
        c: a legal config whose splits divide the shape.
        M: rows of A and C.
        N: columns of B and C.
        K: the reduction length.

    Returns:
        `tvm.IRModule` holding one PrimFunc `gemm_symbol(c)(A (M, K), B (K, N), C (M, N))`.
    """
    tvm = import_tvm()
    from tvm import te

    TY, TX, TM, TN, KB = c["TY"], c["TX"], c["TM"], c["TN"], c["KB"]
    A = te.placeholder((M, K), name="A", dtype="float32")  # (M, K)
    B = te.placeholder((K, N), name="B", dtype="float32")  # (K, N)
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")  # (M, N)
    symbol = gemm_symbol(c)
    sch = tvm.s_tir.Schedule(tvm.IRModule({symbol: te.create_prim_func([A, B, C]).with_attr("global_symbol", symbol)}))
    sch.work_on(symbol)
    blk = sch.get_sblock("C")
    i, j, kk = sch.get_loops(blk)
    i_b, i_t, i_i = sch.split(i, factors=[None, TY, TM])
    j_b, j_t, j_i = sch.split(j, factors=[None, TX, TN])
    k_o, k_i = sch.split(kk, factors=[None, KB])
    sch.reorder(i_b, j_b, i_t, j_t, k_o, k_i, i_i, j_i)
    sch.bind(i_b, "blockIdx.y")
    sch.bind(j_b, "blockIdx.x")
    sch.bind(i_t, "threadIdx.y")
    sch.bind(j_t, "threadIdx.x")
    acc = sch.cache_write(blk, 0, "local")  # the TM x TN accumulators
    sch.reverse_compute_at(acc, j_t)
    init = sch.decompose_reduction(blk, k_o)
    if c["STAGE"] in ("shared", "local"):
        reads = [region_name(r) for r in sch.get(blk).reads]  # C_local, A, B
        for name in ("A", "B"):
            s = sch.cache_read(blk, reads.index(name), c["STAGE"])
            sch.compute_at(s, k_o)
            copy = loops_below(sch, s, 5)  # below i_b, j_b, i_t, j_t, k_o
            if not copy:
                continue
            if c["STAGE"] == "shared":
                # TY*TX threads stride over the slab together
                flat = sch.fuse(*copy) if len(copy) > 1 else copy[0]
                _, ty, tx = sch.split(flat, factors=[None, TY, TX])
                sch.bind(ty, "threadIdx.y")
                sch.bind(tx, "threadIdx.x")
            else:
                for loop in copy:
                    sch.unroll(loop)
    for loop in loops_below(sch, init, 4) + loops_below(sch, acc, 4) + [k_i, i_i, j_i]:
        sch.unroll(loop)
    return sch.mod


class TvmCudaGemm(TvmCudaTemplate):
    """fp32 GEMM on an NVIDIA GPU: TVM schedules and emits the CUDA C++, the CUDA device runs it."""

    problem = GEMM
    name = "gemm-tvm"
    tensors = (("A", "a"), ("B", "b"), ("C", "out"))
    default_shape = GEMM_DEFAULT_SHAPE
    label = "gemm-tvm"
    threads_formula = "TY*TX"
    threads_fix = "bind exactly TY x TX threads"

    make_space = tvm_cuda_gemm_space

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        return _gemm_shape_problems(config, *shape)

    def emit(self, config: Config, shape: Shape, arch: str) -> str:
        return lower_to_cuda(gemm_schedule(config, *shape), arch, f"gemm {gemm_fmt(config)}")

    def block(self, config: Config) -> tuple[int, int, int]:
        return (config["TX"], config["TY"], 1)

    def grid(self, config: Config, shape: Shape) -> tuple[int, int, int]:
        M, N, _ = shape
        return (N // (config["TX"] * config["TN"]), M // (config["TY"] * config["TM"]), 1)

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N, _ = self.problem.check_shape(shape)
        return {"a": device.upload(host["a"]), "b": device.upload(host["b"]), "out": device.allocate(4 * M * N)}

    def describe(self, config: Config) -> str:
        return gemm_fmt(config)
