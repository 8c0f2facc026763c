"""Seed 000's 1D convolution on CUDA, scheduled with Apache TVM and emitted as CUDA C++ that tilewise's CUDA device
runs: `TvmCudaConv1d` (`conv1d` on `cuda`), the problem's TE definition (`conv1d.problem.conv1d_te`) under seed
000's GPU tiling (`conv1d.tiling`):

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
drops them. The kernel is specialised on the shape (static loop bounds), so `verify_shape` keeps the default. TVM
emits the pointer parameters in name order (A, B, W); the emit, compile and launch path, and the source store used
without TVM, are `tilewise.kernels.tvm.cuda.TvmCudaTemplate`'s.
"""

from __future__ import annotations

from typing import Any

from tilewise.devices.base import Device, Limits
from tilewise.kernels.base import DeviceBuffers, HostInputs, Shape
from tilewise.kernels.conv1d import tiling
from tilewise.kernels.conv1d.problem import CONV1D, conv1d_te
from tilewise.kernels.conv1d.tiling import fmt, reduction_split, seed_points, stage_rule, tile
from tilewise.kernels.space import Config, Rule, Space, named_space
from tilewise.kernels.tvm.cuda import (
    DEFAULT_ARCH,
    MAX_INDEX,
    STAGES,
    TvmCudaTemplate,
    import_tvm,
    loops_below,
    lower_to_cuda,
    region_name,
    registers_per_thread,
)

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
    return tiling.registers(c, private="local")


def shared_bytes(c: Config) -> int:
    """Static __shared__ bytes of one block: the input tile with its RK - 1 halo, plus the RK taps of one step."""
    return tiling.storage_bytes(c, shared="shared")


def register_budget(c: Config, L: Limits | None) -> int:
    """Registers one thread may hold: the block's register file shared by NT threads, at most 255.

    At 1024 threads that is 65536 / 1024 = 64; ptxas for sm_90 compiles NT=1024 with `registers(c)` = 63 into 64
    registers with no spill, and spills at 95 (tests/unit/test_tvm_cuda_nvcc.py). The bound is conservative below
    that (ptxas reuses a window register once its last multiply is done), so refusals only cost the largest windows.
    """
    return registers_per_thread(c["NT"], L)


def _max_threads(L: Limits) -> int:
    return min(L.max_invocations_per_workgroup, L.max_workgroup_size[0])


def _rules() -> list[Rule]:
    return [
        stage_rule(STAGES),
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
    """The named spaces: "seed" (15 points: each staging scope at five tiles, the WebGPU template's seed space with
    TVM's scope names), "full" (the grid), "small"."""
    return named_space(which, PARAMS, RULES, fmt, {"NT": [64], "TPT": [1, 4], "RK": [1, 4], "STAGE": STAGES},
                       seed_points(STAGES), "conv1d (cuda, TVM)")


def padded_length(M: int, N: int, c: Config) -> int:
    """Output positions computed: M + N - 1 rounded up to the block tile."""
    return -(-(M + N - 1) // tile(c)) * tile(c)


def alloc_length(M: int, N: int) -> int:
    """Output buffer length: M + N - 1 rounded up to MAX_TILE (holds every config's padded output)."""
    return -(-(M + N - 1) // MAX_TILE) * MAX_TILE


def kernel_symbol(c: Config) -> str:
    """The PrimFunc's global symbol; TVM names the kernel `<symbol>_kernel`, unique per config."""
    return f"tw_conv1d_nt{c['NT']}_tpt{c['TPT']}_rk{c['RK']}_{c['STAGE']}"


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


class TvmCudaConv1d(TvmCudaTemplate):
    """Full 1D convolution on an NVIDIA GPU: TVM schedules and emits the CUDA C++, the CUDA device runs it."""

    problem = CONV1D
    tensors = (("A", "a"), ("W", "w"), ("B", "out"))
    default_shape = DEFAULT_SHAPE
    label = "conv1d (cuda, TVM)"
    threads_formula = "NT"
    threads_fix = "bind exactly one loop of extent NT to threadIdx.x"

    make_space = tvm_cuda_conv1d_space

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        M, N = shape
        problems = reduction_split(config, N)
        if padded_length(M, N, config) + N - 1 > MAX_INDEX:
            problems.append(f"index_range: Mp + N - 1 = {padded_length(M, N, config) + N - 1} > {MAX_INDEX} "
                            "(int32 indices)")
        return problems

    def emit(self, config: Config, shape: Shape, arch: str) -> str:
        return emit_cuda(config, *shape, arch)

    def block(self, config: Config) -> tuple[int, int, int]:
        return (config["NT"], 1, 1)

    def grid(self, config: Config, shape: Shape) -> tuple[int, int, int]:
        return (padded_length(*shape, config) // tile(config), 1, 1)

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N = self.problem.check_shape(shape)
        return {"a": device.upload(host["a"]), "w": device.upload(host["w"]),
                "out": device.allocate(4 * alloc_length(M, N))}

    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N = self.problem.check_shape(shape)
        return padded_length(M, N, config) / (M + N - 1)

    def describe(self, config: Config) -> str:
        return fmt(config)
