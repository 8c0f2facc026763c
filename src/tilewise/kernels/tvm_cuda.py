"""Seed 000's 1D convolution on CUDA, scheduled with Apache TVM and emitted as CUDA C++ that tilewise's CUDA device
runs: `TvmCudaConv1d` (`conv1d` on `cuda`; `gemm-tvm` is in `tilewise.kernels.gemm.tvm_cuda`):

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

from tilewise.devices.base import Device, Launch, Limits, Program
from tilewise.errors import ConfigError, ShaderCompileError
from tilewise.kernels import conv1d
from tilewise.kernels.base import DeviceBuffers, HostInputs, Shape
from tilewise.kernels.conv1d import check_shape, fmt, tile
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
