"""Seed 000's GPU primitives on CUDA, scheduled with Apache TVM and emitted as CUDA C++ that tilewise's CUDA device
runs: `TvmCudaConv1d` (`conv1d` on `cuda`) and `TvmCudaGemm` (`gemm-tvm` on `cuda`; its variants are stated above
`GEMM_PARAMS`). The 1D convolution:

    Apad (Mp + N - 1) = a (M) with N-1 zeros on the left (and on the right up to the padded output)
    out[n] = sum_k Apad[n + N - 1 - k] * w[k]        n < Mp = M + N - 1 rounded up to the block tile
                                                       (= np.convolve(a, w) on its first M + N - 1 values)

Variants (seed 000's GPU schedule, each choice a parameter of `schedule`):

    NT     threads per block: the output axis is split n -> (block, thread, j), block bound to blockIdx.x and
           thread to threadIdx.x; one block computes TILE = NT * TPT consecutive outputs
    TPT    per-thread tile: each thread owns TPT consecutive outputs, accumulated in a `local` cache_write
           (registers; the j loop is unrolled so every index is a constant)
    RK     reduction split k -> (k_o, k_i): the staged operands are refreshed once per k_o; k_i is unrolled
    STAGE  where the operands of one k_o step sit (seed 000's `cache_read(A, "local")` question):
             "global"  no cache_read: every multiply reads global memory (the unoptimized baseline)
             "shared"  cache_read(Apad, "shared") and cache_read(W, "shared") at k_o: the block copies its
                       TILE + RK - 1 inputs and RK taps into __shared__ arrays between two __syncthreads
             "local"   cache_read(..., "local") at k_o: each thread loads its own window of TPT + RK - 1 inputs
                       and RK taps into a per-thread array; no barrier, and each loaded input feeds up to
                       min(TPT, RK) multiplies

The zero padding Apad is inlined into whichever stage reads it (a bounds select on every read of `a`), so no
padded copy exists on the GPU. The output is computed over Mp positions so the output split needs no predicate;
the extra positions read only padding, the output buffer is allocated for every config's Mp, and `read_output`
drops them. The kernel is specialised on the shape (static loop bounds), so `verify_shape` keeps the default.

TVM (imported lazily; `pip install 'tilewise[tvm]'`) lowers the schedule for a `{"kind": "cuda", "arch": "sm_XX"}`
target and emits an `extern "C" __global__` kernel whose pointer parameters come in name order (A, B, W), not in
the order of the function's arguments; `parse_kernel` reads the order, the kernel name and `__launch_bounds__`
from the emitted signature. The device compiles the emitted source without TVM's include preamble (the kernel
uses only int and float; the preamble's NVRTC branch includes CCCL headers that NVRTC finds only with extra
include paths); `source` shows the source exactly as TVM emitted it.

A machine without TVM runs these templates from a store of pre-emitted sources (`tilewise.kernels.tvm.sources`,
`TILEWISE_TVM_CUDA_SOURCES=DIR`, filled by `tools/tvm_cuda_emit.py` where TVM is installed): `compile` and `source`
emit with TVM when it imports (and write the store when the variable is set), else read the store.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Limits, Program
from tilewise.errors import ConfigError, ShaderCompileError
from tilewise.kernels import conv1d
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.conv1d import check_shape, fmt, nonzero_uniform, tile
from tilewise.kernels.space import Config, Rule, Space, named_space
from tilewise.kernels.tvm import sources as tvm_sources
from tilewise.kernels.tvm.cuda import (
    DEFAULT_ARCH,
    MAX_INDEX,
    MAX_REGISTERS,
    arch_of,
    device_source,
    import_tvm,
    loops_below,
    lower_to_cuda,
    parse_kernel,
    region_name,
)

STAGES = ("global", "shared", "local")
PARAMS: dict[str, list[Any]] = {
    "NT": [32, 64, 128, 256, 512, 1024],
    "TPT": [1, 2, 4, 8, 16],
    "RK": [1, 2, 4, 8, 16, 32, 64],
    "STAGE": list(STAGES),
}
MAX_TILE = max(PARAMS["NT"]) * max(PARAMS["TPT"])  # every TILE of the grid divides it (powers of two)
DEFAULT_SHAPE = (16384, 64)  # what `source(config)` shows when no shape is given


def registers(c: Config) -> int:
    """f32 values one thread keeps live: TPT accumulators, plus the local window and taps."""
    return conv1d.registers(c, private="local")


def shared_bytes(c: Config) -> int:
    """Static __shared__ bytes of one block: the input tile with its RK - 1 halo, plus the RK taps of one step."""
    return conv1d.storage_bytes(c, shared="shared")


def register_budget(c: Config, L: Limits | None) -> int:
    """Registers one thread may hold: the block's register file shared by NT threads, at most 255.

    At 1024 threads that is 65536 / 1024 = 64; `nvcc -Xptxas -v` on sm_90 (NT=1024) showed `registers(c)` = 63
    compiling to 64 registers with no spill, and 95 spilling 156 bytes. The bound is conservative below that
    (ptxas reuses a window register once its last multiply is done), so refusals only cost the largest windows.
    """
    per_block = getattr(L, "registers_per_block", None) if L is not None else None
    return MAX_REGISTERS if per_block is None else min(MAX_REGISTERS, per_block // c["NT"])


def _max_threads(L: Limits) -> int:
    return min(L.max_invocations_per_workgroup, L.max_workgroup_size[0])


def _rules() -> list[Rule]:
    return [
        Rule("stage", lambda c, L: c.STAGE in STAGES,
             lambda c, L: f"STAGE = {c.STAGE!r} is not one of {', '.join(STAGES)}"),
        Rule("registers", lambda c, L: registers(c) <= register_budget(c, L),
             lambda c, L: f"registers = TPT + (TPT + RK - 1) + RK = {c.TPT} + {c.TPT + c.RK - 1} + {c.RK} = "
                          f"{registers(c)} > {register_budget(c, L)} per thread (min(255, registers per block / "
                          f"NT {c.NT})): the local window and accumulators would spill",
             doc="accumulators plus the local window stay in registers"),
        Rule("threads_per_block", lambda c, L: _max_threads(L) >= c.NT,
             lambda c, L: f"NT = {c.NT} threads per block > the device's limit {_max_threads(L)}",
             needs_limits=True),
        Rule("shared_memory", lambda c, L: shared_bytes(c) <= L.max_workgroup_storage_bytes,
             lambda c, L: f"__shared__ = 4*(NT*TPT + 2*RK - 1) = 4*({c.NT}*{c.TPT} + 2*{c.RK} - 1) = "
                          f"{shared_bytes(c)} bytes > {L.max_workgroup_storage_bytes} per block",
             needs_limits=True, doc="static shared memory of one block"),
    ]


RULES = _rules()


def tvm_cuda_conv1d_space(which: str = "full") -> Space:
    """The named spaces: "seed" (15 points: each staging scope at five tiles), "full" (the grid), "small"."""
    # seed 000's question as 15 points, the WebGPU template's seed space with TVM's scope names
    seed = [{"NT": 64, "TPT": t, "RK": r, "STAGE": s} for s in STAGES
            for t, r in ((1, 1), (1, 8), (4, 8), (8, 8), (4, 16))]
    return named_space(which, PARAMS, RULES, fmt, {"NT": [64], "TPT": [1, 4], "RK": [1, 4], "STAGE": STAGES}, seed,
                       "conv1d (cuda, TVM)")


def padded_length(M: int, N: int, c: Config) -> int:
    """Output positions computed: M + N - 1 rounded up to the block tile."""
    return -(-(M + N - 1) // tile(c)) * tile(c)


def alloc_length(M: int, N: int) -> int:
    """Output buffer length: M + N - 1 rounded up to MAX_TILE (holds every config's padded output)."""
    return -(-(M + N - 1) // MAX_TILE) * MAX_TILE


def kernel_symbol(c: Config) -> str:
    """The PrimFunc's global symbol; TVM names the kernel `<symbol>_kernel`, unique per config."""
    return f"tw_conv1d_nt{c['NT']}_tpt{c['TPT']}_rk{c['RK']}_{c['STAGE']}"


def refuse_illegal(c: Config, shape: Shape, limits: Limits | None) -> tuple[int, int]:
    """(M, N) when the config is legal at this shape; otherwise a ConfigError naming every broken rule.

    Runs before TVM is imported, so an illegal config costs no scheduling.
    """
    M, N = check_shape(shape)
    reasons = tvm_cuda_conv1d_space("full").why_illegal(c, limits) + _shape_problems(c, M, N)
    if reasons:
        raise ConfigError(f"conv1d (cuda, TVM) config {fmt(c)} is illegal at shape {M},{N}: " + "; ".join(reasons),
                          "pick a legal config (tilewise tune conv1d --device cuda --dry-run lists the rules)")
    return M, N


def _shape_problems(c: Config, M: int, N: int) -> list[str]:
    problems = []
    if N % c["RK"]:
        problems.append(f"reduction_split: N % RK = {N} % {c['RK']} = {N % c['RK']} != 0 "
                        "(each step reads RK taps unguarded)")
    if padded_length(M, N, c) + N - 1 > MAX_INDEX:
        problems.append(f"index_range: Mp + N - 1 = {padded_length(M, N, c) + N - 1} > {MAX_INDEX} (int32 indices)")
    return problems


def schedule(c: Config, M: int, N: int) -> Any:
    """The scheduled TIR module of one config at input length M and kernel length N (see the module docstring).

    Args:
        c: a legal config of this template's space.
        M: input length.
        N: kernel length (N <= M, N % RK == 0).

    Returns:
        `tvm.IRModule` holding one PrimFunc `kernel_symbol(c)(A (M,), W (N,), B (Mp,))`.
    """
    tvm = import_tvm()
    from tvm import te

    from tilewise.kernels.conv1d_tvm import conv1d_te

    NT, TPT, RK = c["NT"], c["TPT"], c["RK"]
    A, W, B = conv1d_te(tvm, M, N, padded_length(M, N, c))
    symbol = kernel_symbol(c)
    func = te.create_prim_func([A, W, B]).with_attr("global_symbol", symbol)
    sch = tvm.s_tir.Schedule(tvm.IRModule({symbol: func}))
    sch.work_on(symbol)
    blk = sch.get_sblock("B")
    n, kk = sch.get_loops(blk)
    n_b, n_t, n_j = sch.split(n, factors=[None, NT, TPT])
    k_o, k_i = sch.split(kk, factors=[None, RK])
    sch.reorder(n_b, n_t, k_o, k_i, n_j)
    sch.bind(n_b, "blockIdx.x")
    sch.bind(n_t, "threadIdx.x")
    acc = sch.cache_write(blk, 0, "local")  # the TPT accumulators, written back once per thread
    sch.reverse_compute_at(acc, n_t)
    init = sch.decompose_reduction(blk, k_o)  # zero the accumulators once, before the k_o loop
    if c["STAGE"] in ("shared", "local"):
        reads = [region_name(r) for r in sch.get(blk).reads]  # the update block reads B_local, Apad and W
        staged = [sch.cache_read(blk, reads.index(name), c["STAGE"]) for name in ("Apad", "W")]
        for s in staged:
            sch.compute_at(s, k_o)
            for copy in loops_below(sch, s, 3):  # below n_b, n_t, k_o: the copy of TILE + RK - 1 (or RK)
                if c["STAGE"] == "shared":
                    # the block copies cooperatively: NT threads stride over the elements
                    _, lane = sch.split(copy, factors=[None, NT])
                    sch.bind(lane, "threadIdx.x")
                else:
                    sch.unroll(copy)  # constant indices keep the per-thread window in registers
    sch.compute_inline(sch.get_sblock("Apad"))
    for loop in loops_below(sch, init, 2) + loops_below(sch, acc, 2) + [k_i, n_j]:
        sch.unroll(loop)
    return sch.mod


def emit_cuda(c: Config, M: int, N: int, arch: str = DEFAULT_ARCH) -> str:
    """The CUDA C++ TVM emits for one config (no GPU and no CUDA toolkit needed).

    Args:
        c: a legal config.
        M: input length.
        N: kernel length.
        arch: the CUDA target architecture, e.g. `sm_90`.

    Returns:
        The source text of the module TVM built, exactly as emitted.
    """
    return lower_to_cuda(schedule(c, M, N), arch, f"conv1d {fmt(c)}")


class TvmCudaConv1d(conv1d.Conv1dTemplate):
    """Full 1D convolution on an NVIDIA GPU: TVM schedules and emits the CUDA C++, the CUDA device runs it."""

    backend = "cuda"

    def space(self, which: str = "full") -> Space:
        return tvm_cuda_conv1d_space(which)

    def config_shape_problems(self, config: Config, M: int, N: int) -> list[str]:
        return _shape_problems(config, M, N)

    def source(self, config: Config, shape: Shape | None = None, arch: str = DEFAULT_ARCH) -> str:
        """TVM's CUDA C++ for one config at `shape` (default 16384,64) for `arch`, as emitted (stored, without TVM).

        Raises:
            ConfigError: the config breaks a rule (checked against the `arch` profile when tilewise has one).
        """
        from tilewise.devices.profiles import PROFILES

        M, N = refuse_illegal(config, shape or DEFAULT_SHAPE, PROFILES.get(arch))
        return self._emitted(config, M, N, arch)

    def emit_tvm(self, config: Config, shape: Shape, arch: str = DEFAULT_ARCH) -> str:
        """TVM's CUDA C++ for one legal config (refused against the `arch` profile first); never the store."""
        from tilewise.devices.profiles import PROFILES

        M, N = refuse_illegal(config, shape, PROFILES.get(arch))
        return emit_cuda(config, M, N, arch)

    def _emitted(self, config: Config, M: int, N: int, arch: str) -> str:
        """TVM's emission, or the stored one without TVM (`tvm_sources.emitted_source`)."""
        key = tvm_sources.SourceKey.make(self.name, config, (M, N), arch)
        return tvm_sources.emitted_source(key, lambda: emit_cuda(config, M, N, arch))

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        limits = device.info.limits
        M, N = refuse_illegal(config, shape, limits)
        emitted = self._emitted(config, M, N, arch_of(limits.compute_capability))
        sig = parse_kernel(emitted)
        if sorted(sig.arg_order) != ["A", "B", "W"]:
            raise ShaderCompileError(f"kernel {sig.name} takes {sig.arg_order}, expected the tensors A, B and W",
                                     "the schedule must keep A, W and B as the only kernel parameters")
        if sig.launch_bounds is not None and sig.launch_bounds != config["NT"]:
            raise ShaderCompileError(f"kernel {sig.name} is bounded to {sig.launch_bounds} threads, config has "
                                     f"NT = {config['NT']}", "bind exactly one loop of extent NT to threadIdx.x")
        prog = device.compile(device_source(emitted), entry=sig.name, constants=dict(config),
                              name=f"conv1d-tvm-cuda[{fmt(config)}]")
        prog.meta.update(block=(config["NT"], 1, 1), arg_order=sig.arg_order, shape=(M, N),
                         grid=(padded_length(M, N, config) // tile(config), 1, 1))
        return prog

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N = check_shape(shape)
        return {"a": device.upload(host["a"]), "w": device.upload(host["w"]),
                "out": device.allocate(4 * alloc_length(M, N))}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        if tuple(program.meta["shape"]) != tuple(shape):
            raise ConfigError(f"{program.name} was compiled for shape {program.meta['shape']}, launched at {shape}",
                              "compile the config at the shape it runs (the kernel's loop bounds are static)")
        by_name = {"A": bufs["a"], "W": bufs["w"], "B": bufs["out"]}
        return [Launch(program, program.meta["grid"], [by_name[t] for t in program.meta["arg_order"]])]

    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N = check_shape(shape)
        return padded_length(M, N, config) / (M + N - 1)

    def describe(self, config: Config) -> str:
        return fmt(config)


# ---- GEMM ------------------------------------------------------------------------------------------------------
# C (M, N) = A (M, K) @ B (K, N), row-major fp32, seed 000's GPU GEMM schedule with each choice a parameter:
#
#   TY, TX   threads per block along rows / columns (threadIdx.y, threadIdx.x)
#   TM, TN   per-thread tile: each thread owns a TM x TN patch of C, accumulated in a `local` cache_write
#   KB       reduction split k -> (k_o, k_i); the staged operands are refreshed once per k_o
#   STAGE    "global" (no cache_read), "shared" (the block copies its (TY*TM, KB) slab of A and (KB, TX*TN) of B
#            into __shared__ arrays, cooperatively, between barriers) or "local" (seed 000's
#            cache_read(A, "local"): each thread loads its own (TM, KB) and (KB, TN) operands into registers)
#
# The splits must divide the shape (M by TY*TM, N by TX*TN, K by KB): the kernel has no bounds guard.
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
    per_block = getattr(L, "registers_per_block", None) if L is not None else None
    threads = c["TY"] * c["TX"]
    return MAX_REGISTERS if per_block is None else min(MAX_REGISTERS, per_block // threads)


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


def gemm_check_shape(shape: Shape) -> tuple[int, int, int]:
    """(M, N, K) of a GEMM shape."""
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ConfigError(f"gemm shape {shape!r} must be three positive integers M,N,K",
                          "write e.g. --shape 1024,1024,1024")
    M, N, K = (int(s) for s in shape)
    return M, N, K


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
    """The scheduled TIR module of one GEMM config (see the comment above `GEMM_PARAMS`).

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


class TvmCudaGemm(KernelTemplate):
    """fp32 GEMM on an NVIDIA GPU: TVM schedules and emits the CUDA C++, the CUDA device runs it."""

    name = "gemm-tvm"
    backend = "cuda"
    shape_names = ("M", "N", "K")
    dtype = "f32"

    def space(self, which: str = "full") -> Space:
        return tvm_cuda_gemm_space(which)

    def space_names(self) -> tuple[str, ...]:
        return ("seed", "full", "small")

    def shape_problems(self, config: Config, shape: Shape) -> list[str]:
        try:
            M, N, K = gemm_check_shape(shape)
        except ConfigError as exc:
            return [f"shape: {exc.problem}"]
        return _gemm_shape_problems(config, M, N, K)

    def _refuse_illegal(self, c: Config, shape: Shape, limits: Limits | None) -> tuple[int, int, int]:
        M, N, K = gemm_check_shape(shape)
        reasons = tvm_cuda_gemm_space("full").why_illegal(c, limits) + _gemm_shape_problems(c, M, N, K)
        if reasons:
            raise ConfigError(f"gemm-tvm config {gemm_fmt(c)} is illegal at shape {M},{N},{K}: " + "; ".join(reasons),
                              "pick a legal config (tilewise tune gemm-tvm --device cuda --dry-run lists the rules)")
        return M, N, K

    def source(self, config: Config, shape: Shape | None = None, arch: str = DEFAULT_ARCH) -> str:
        """TVM's CUDA C++ for one config at `shape` (default 1024^3) for `arch`, as emitted (stored, without TVM).

        Raises:
            ConfigError: the config breaks a rule (checked against the `arch` profile when tilewise has one).
        """
        from tilewise.devices.profiles import PROFILES

        M, N, K = self._refuse_illegal(config, shape or GEMM_DEFAULT_SHAPE, PROFILES.get(arch))
        return self._emitted(config, M, N, K, arch)

    def emit_tvm(self, config: Config, shape: Shape, arch: str = DEFAULT_ARCH) -> str:
        """TVM's CUDA C++ for one legal config (refused against the `arch` profile first); never the store."""
        from tilewise.devices.profiles import PROFILES

        M, N, K = self._refuse_illegal(config, shape, PROFILES.get(arch))
        return lower_to_cuda(gemm_schedule(config, M, N, K), arch, f"gemm {gemm_fmt(config)}")

    def _emitted(self, config: Config, M: int, N: int, K: int, arch: str) -> str:
        """TVM's emission, or the stored one without TVM (`tvm_sources.emitted_source`)."""
        key = tvm_sources.SourceKey.make(self.name, config, (M, N, K), arch)
        return tvm_sources.emitted_source(
            key, lambda: lower_to_cuda(gemm_schedule(config, M, N, K), arch, f"gemm {gemm_fmt(config)}"))

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        limits = device.info.limits
        M, N, K = self._refuse_illegal(config, shape, limits)
        emitted = self._emitted(config, M, N, K, arch_of(limits.compute_capability))
        sig = parse_kernel(emitted)
        threads = config["TY"] * config["TX"]
        if sorted(sig.arg_order) != ["A", "B", "C"]:
            raise ShaderCompileError(f"kernel {sig.name} takes {sig.arg_order}, expected the tensors A, B and C",
                                     "the schedule must keep A, B and C as the only kernel parameters")
        if sig.launch_bounds is not None and sig.launch_bounds != threads:
            raise ShaderCompileError(f"kernel {sig.name} is bounded to {sig.launch_bounds} threads, config has "
                                     f"TY*TX = {threads}", "bind exactly TY x TX threads")
        prog = device.compile(device_source(emitted), entry=sig.name, constants=dict(config),
                              name=f"gemm-tvm-cuda[{gemm_fmt(config)}]")
        grid = (N // (config["TX"] * config["TN"]), M // (config["TY"] * config["TM"]), 1)
        prog.meta.update(block=(config["TX"], config["TY"], 1), arg_order=sig.arg_order, shape=(M, N, K), grid=grid)
        return prog

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        M, N, K = gemm_check_shape(shape)
        return {"a": nonzero_uniform(rng, (M, K)).astype(np.float32),
                "b": nonzero_uniform(rng, (K, N)).astype(np.float32)}

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N, _ = gemm_check_shape(shape)
        return {"a": device.upload(host["a"]), "b": device.upload(host["b"]), "out": device.allocate(4 * M * N)}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        if tuple(program.meta["shape"]) != tuple(shape):
            raise ConfigError(f"{program.name} was compiled for shape {program.meta['shape']}, launched at {shape}",
                              "compile the config at the shape it runs (the kernel's loop bounds are static)")
        by_name = {"A": bufs["a"], "B": bufs["b"], "C": bufs["out"]}
        return [Launch(program, program.meta["grid"], [by_name[t] for t in program.meta["arg_order"]])]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        M, N, _ = gemm_check_shape(shape)
        return device.download(bufs["out"], np.float32, (M, N))

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        return host["a"].astype(np.float64) @ host["b"].astype(np.float64)

    def flops(self, shape: Shape) -> int:
        M, N, K = gemm_check_shape(shape)
        return 2 * M * N * K

    def bytes_moved(self, shape: Shape) -> int:
        M, N, K = gemm_check_shape(shape)
        return 4 * (M * K + K * N + M * N)

    def describe(self, config: Config) -> str:
        return gemm_fmt(config)
