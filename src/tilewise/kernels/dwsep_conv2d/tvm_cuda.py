"""Seed 000's fourth primitive on CUDA: the depthwise-separable 2D convolution scheduled with Apache TVM and emitted
as CUDA C++ that tilewise's CUDA device runs (`dwsep-conv2d` on `cuda`), the problem of
`tilewise.kernels.dwsep_conv2d.problem` under the block tiling of `tilewise.kernels.dwsep_conv2d.tiling`:

    d[b, c, y, x]   = sum_{ky, kx} xin[b, c, y + ky - P, x + kx - P] * dw[c, ky, kx]   (zero padding P)
    out[b, o, y, x] = sum_c pw[o, c] * d[b, c, y, x]
    xin (B, C, H, W), dw (C, K, K), pw (O, C), out (B, O, Ho, Wo) with Ho = H + 2P - K + 1, Wo = W + 2P - K + 1

The TE definition has three stages: `Xpad` (the zero padding, always inlined into whatever reads it: a bounds select
on every read of X), `D` (the depthwise result) and `Out` (the pointwise reduction over input channels). The
schedule is the WebGPU template's tiling, each choice a parameter of `schedule`:

    BW, BO   block tile: one block computes BW consecutive pixels of one output row for BO output channels; Out's
             loops are split x -> (block, thread, j) and o -> (block, thread, j), b and y fused, bound to
             blockIdx.x (pixel tiles), blockIdx.y (B * Ho rows) and blockIdx.z (channel tiles)
    TPX, TO  per-thread tile: each thread owns TPX pixels x TO channels, accumulated in a `local` cache_write
             (registers, loops unrolled); threadIdx.x walks pixel strips, threadIdx.y channel groups
    RC       reduction split over input channels c -> (c_o, c_i): the depthwise values and staged operands of RC
             channels are produced once per c_o step; c_i is unrolled
    STAGE    where the depthwise result and the operands of one step sit:
               "global"  D is computed at c_o per thread into `local` (RC x TPX values; the fused kernel has no
                         other place for it), every input, tap and pointwise weight read from global memory at
                         every multiply (the unoptimized baseline)
               "shared"  set_scope(D, "shared") at c_o: the block computes the RC x BW depthwise values of a step
                         once, cooperatively (all threads stride over them), and cache_read(PW, "shared") the
                         BO x RC pointwise weights, between __syncthreads; every channel group reads them. Here
                         threads *do* read the same values, the case where seed 000 says shared memory pays
               "local"   D per thread as in "global", plus cache_read(Xpad, "local") (per input channel, a K x
                         (TPX + K - 1) window), cache_read(DW, "local") (K x K taps) and cache_read(PW, "local")
                         (TO x RC weights): registers, no barrier

The depthwise stage is always fused into the pointwise loop nest (compute_at at c_o): D never goes to global memory.
An unfused schedule (D as a root stage) would lower to two kernels and need a global workspace argument, which the
one-kernel launch of these templates does not carry.

Partial tiles are TVM's: a split that does not divide Wo or O puts a predicate (`T.where`) on every block below it,
so the kernel writes exactly (B, O, Ho, Wo). C % RC == 0 is required (the reduction has no guard). The kernel is
specialised on the shape (static loop bounds).

TVM is imported lazily; without it the sources come from the pre-emitted store (`tilewise.kernels.tvm.sources`,
`TILEWISE_TVM_CUDA_SOURCES`): the emit, compile and launch path is `tilewise.kernels.tvm.cuda.TvmCudaTemplate`'s, as
for the conv1d and gemm-tvm templates.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tilewise.devices.base import Device, Limits, Program
from tilewise.errors import TilewiseError
from tilewise.kernels.base import DeviceBuffers, HostInputs, Shape
from tilewise.kernels.dwsep_conv2d import tiling
from tilewise.kernels.dwsep_conv2d.problem import DWSEP
from tilewise.kernels.dwsep_conv2d.tiling import fmt, threads
from tilewise.kernels.space import Config, Rule, Space, named_space
from tilewise.kernels.tvm.cuda import (
    DEFAULT_ARCH,
    MAX_INDEX,
    MAX_REGISTERS,
    STAGES,
    TvmCudaTemplate,
    arch_of,
    import_tvm,
    loops_below,
    lower_to_cuda,
    region_name,
    registers_per_thread,
)

PARAMS: dict[str, list[Any]] = {**tiling.TILE_PARAMS, "STAGE": list(STAGES)}
MAX_GRID_YZ = 65535  # CUDA caps grid.y (B * Ho rows) and grid.z (channel tiles)
DEFAULT_SHAPE = (1, 64, 56, 56, 128, 3, 1)  # what `source(config)` shows when no shape is given


def registers(c: Config) -> int:
    """f32 values one thread keeps live that do not depend on K: TO*TPX accumulators, the RC*TPX depthwise values
    of a step (global, local) and the TO*RC pointwise weights (local)."""
    n = c["TO"] * c["TPX"]
    if c["STAGE"] != "shared":
        n += c["RC"] * c["TPX"]
    if c["STAGE"] == "local":
        n += c["TO"] * c["RC"]
    return n


def window_registers(c: Config, K: int) -> int:
    """All f32 values one thread keeps live at kernel size K: `registers(c)`, plus the local variant's input
    window of one channel (K x (TPX + K - 1)) and its K x K taps."""
    extra = K * (c["TPX"] + K - 1) + K * K if c["STAGE"] == "local" else 0
    return registers(c) + extra


def shared_bytes(c: Config) -> int:
    """Static __shared__ bytes of the shared variant: (RC, BW) depthwise values + (BO, RC) pointwise weights."""
    return 4 * (c["RC"] * c["BW"] + c["BO"] * c["RC"]) if c["STAGE"] == "shared" else 0


def register_budget(c: Config, L: Limits | None) -> int:
    """Registers one thread may hold: the block's register file shared by its threads, at most 255."""
    return registers_per_thread(threads(c), L)


def _rules() -> list[Rule]:
    return [
        *tiling.tile_split_rules(STAGES),
        Rule("registers", lambda c, L: registers(c) <= register_budget(c, L),
             lambda c, L: f"registers = TO*TPX{' + RC*TPX' if c.STAGE != 'shared' else ''}"
                          f"{' + TO*RC' if c.STAGE == 'local' else ''} = {registers(c)} > {register_budget(c, L)} "
                          f"per thread (min(255, registers per block / {threads(c)} threads)): would spill",
             doc="accumulators, depthwise values and local weights stay in registers"),
        Rule("threads_per_block",
             lambda c, L: threads(c) <= L.max_invocations_per_workgroup and L.max_workgroup_size[0] >= c.BW // c.TPX
             and L.max_workgroup_size[1] >= c.BO // c.TO,
             lambda c, L: f"(BO/TO)*(BW/TPX) = ({c.BO}/{c.TO})*({c.BW}/{c.TPX}) = {threads(c)} threads per block > "
                          f"the device's limit {L.max_invocations_per_workgroup} (x at most {L.max_workgroup_size[0]}, "
                          f"y at most {L.max_workgroup_size[1]})", needs_limits=True),
        Rule("shared_memory", lambda c, L: shared_bytes(c) <= L.max_workgroup_storage_bytes,
             lambda c, L: f"__shared__ = 4*(RC*BW + BO*RC) = 4*({c.RC}*{c.BW} + {c.BO}*{c.RC}) = {shared_bytes(c)} "
                          f"bytes > {L.max_workgroup_storage_bytes} per block", needs_limits=True,
             doc="static shared memory of one block"),
    ]


RULES = _rules()


def tvm_cuda_dwsep_space(which: str = "full") -> Space:
    """The named spaces: "seed" (12 points: each staging scope at four tiles), "full" (the grid), "small"."""
    # each scope at: the baseline tile, a reduction split, 4x4 per-thread tiles, an 8-channel step
    tiles = ((16, 1, 16, 1, 1), (16, 1, 16, 1, 4), (32, 4, 32, 4, 4), (32, 4, 16, 4, 8))
    small = {**tiling.SMALL_TILES, "STAGE": STAGES}
    return named_space(which, PARAMS, RULES, fmt, small, tiling.seed_points(STAGES, tiles), "dwsep-conv2d (cuda, TVM)")


def kernel_symbol(c: Config) -> str:
    """The PrimFunc's global symbol; TVM names the kernel `<symbol>_kernel`, unique per config."""
    return f"tw_dwsep_bw{c['BW']}_tpx{c['TPX']}_bo{c['BO']}_to{c['TO']}_rc{c['RC']}_{c['STAGE']}"


def schedule(c: Config, shape: Shape) -> Any:
    """The scheduled TIR module of one config at one shape (see the module docstring).

    Args:
        c: a legal config of this template's space.
        shape: (B, C, H, W, O, K, P) with C % RC == 0.

    Returns:
        `tvm.IRModule` holding one PrimFunc `kernel_symbol(c)(X, DW, PW, Out)`.
    """
    tvm = import_tvm()
    from tvm import te

    B, C, H, W, O, K, P, Ho, Wo = DWSEP.dims(shape)
    BW, TPX, BO, TO, RC, stage = c["BW"], c["TPX"], c["BO"], c["TO"], c["RC"], c["STAGE"]
    tir = tvm.tirx
    X = te.placeholder((B, C, H, W), name="X", dtype="float32")  # (B, C, H, W)
    DW = te.placeholder((C, K, K), name="DW", dtype="float32")  # (C, K, K)
    PW = te.placeholder((O, C), name="PW", dtype="float32")  # (O, C)
    zero = tir.const(0.0, "float32")
    Xpad = te.compute((B, C, H + 2 * P, W + 2 * P),  # (B, C, H+2P, W+2P)
                      lambda b, ch, y, x: tir.if_then_else(tir.all(y >= P, y < H + P, x >= P, x < W + P),
                                                           X[b, ch, y - P, x - P], zero), name="Xpad")
    ky = te.reduce_axis((0, K), name="ky")
    kx = te.reduce_axis((0, K), name="kx")
    D = te.compute((B, C, Ho, Wo),  # (B, C, Ho, Wo)
                   lambda b, ch, y, x: te.sum(Xpad[b, ch, y + ky, x + kx] * DW[ch, ky, kx], axis=[ky, kx]), name="D")
    rc = te.reduce_axis((0, C), name="rc")
    Out = te.compute((B, O, Ho, Wo), lambda b, o, y, x: te.sum(PW[o, rc] * D[b, rc, y, x], axis=rc),  # (B, O, Ho, Wo)
                     name="Out")
    symbol = kernel_symbol(c)
    func = te.create_prim_func([X, DW, PW, Out]).with_attr("global_symbol", symbol)
    sch = tvm.s_tir.Schedule(tvm.IRModule({symbol: func}))
    sch.work_on(symbol)

    blk = sch.get_sblock("Out")
    b, o, y, x, cc = sch.get_loops(blk)
    sch.reorder(y, o)
    by = sch.fuse(b, y)
    o_b, o_t, o_j = sch.split(o, factors=[None, BO // TO, TO])
    x_b, x_t, x_j = sch.split(x, factors=[None, BW // TPX, TPX])
    c_o, c_i = sch.split(cc, factors=[None, RC])
    sch.reorder(x_b, by, o_b, o_t, x_t, c_o, c_i, o_j, x_j)
    sch.bind(x_b, "blockIdx.x")
    sch.bind(by, "blockIdx.y")
    sch.bind(o_b, "blockIdx.z")
    sch.bind(o_t, "threadIdx.y")
    sch.bind(x_t, "threadIdx.x")
    acc = sch.cache_write(blk, 0, "local")  # the TO x TPX accumulators, written back once per thread
    sch.reverse_compute_at(acc, x_t)
    init = sch.decompose_reduction(blk, c_o)  # zero the accumulators once, before the c_o loop
    depth = 6  # x_b, by, o_b, o_t, x_t, c_o

    d = sch.get_sblock("D")
    sch.set_scope(d, 0, "shared" if stage == "shared" else "local")
    if stage in ("shared", "local"):
        reads = [region_name(r) for r in sch.get(blk).reads]  # Out_local, PW, D
        pw = sch.cache_read(blk, reads.index("PW"), stage)
        sch.compute_at(pw, c_o)
    if stage == "shared":
        # the block computes the RC x BW depthwise values of a step cooperatively (its threads stride over them),
        # each value accumulated in a register and written to shared memory once (an accumulation in shared
        # memory would need a barrier inside the bounds predicate, which TVM refuses to insert)
        wb = sch.cache_write(d, 0, "local")
        sch.compute_at(wb, c_o)
        lanes = None
        for s in (wb, pw):
            copy = loops_below(sch, s, depth)
            if not copy:
                continue
            flat = sch.fuse(*copy) if len(copy) > 1 else copy[0]
            _, ty, tx = sch.split(flat, factors=[None, BO // TO, BW // TPX])
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
            if s is wb:
                lanes = tx
        sch.compute_at(d, lanes if lanes is not None else c_o)  # one thread's values, in registers
        for loop in loops_below(sch, d, len(sch.get_loops(wb))):
            sch.unroll(loop)
    else:
        sch.compute_at(d, c_o)
        d_loops = loops_below(sch, d, depth)  # (channel if RC > 1, pixel if TPX > 1, ky, kx)
        if stage == "local":
            # per input channel: the K x (TPX + K - 1) input window and the K x K taps in registers
            d_reads = [region_name(r) for r in sch.get(d).reads]  # Xpad, DW
            at, at_depth = (d_loops[0], depth + 1) if RC > 1 else (c_o, depth)
            staged = [(pw, depth)]
            for name in ("Xpad", "DW"):
                s = sch.cache_read(d, d_reads.index(name), "local")
                sch.compute_at(s, at)
                staged.append((s, at_depth))
            for s, below in staged:
                for loop in loops_below(sch, s, below):
                    sch.unroll(loop)
        for loop in loops_below(sch, d, depth):
            sch.unroll(loop)  # constant indices keep the depthwise values in registers
    sch.compute_inline(sch.get_sblock("Xpad"))
    for loop in loops_below(sch, init, 5) + loops_below(sch, acc, 5) + [c_i, o_j, x_j]:
        sch.unroll(loop)
    return sch.mod


def emit_cuda(c: Config, shape: Shape, arch: str = DEFAULT_ARCH) -> str:
    """The CUDA C++ TVM emits for one config at one shape, exactly as emitted (no GPU and no toolkit needed)."""
    return lower_to_cuda(schedule(c, shape), arch, f"dwsep-conv2d {fmt(c)}")


class TvmCudaDwsepConv2d(TvmCudaTemplate):
    """Fused depthwise-separable conv2d on an NVIDIA GPU: TVM schedules and emits the CUDA C++, the CUDA device runs
    it."""

    problem = DWSEP
    tensors = (("X", "x"), ("DW", "dw"), ("PW", "pw"), ("Out", "out"))
    default_shape = DEFAULT_SHAPE
    label = "dwsep-conv2d (cuda, TVM)"
    threads_formula = "(BO/TO)*(BW/TPX)"
    threads_fix = "bind exactly BW/TPX x BO/TO threads"

    make_space = tvm_cuda_dwsep_space

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        d = self.problem.dims(shape)
        problems = tiling.split_problems(config, d, MAX_GRID_YZ, "blocks (grid.y)", " blocks (grid.z)")
        if config["STAGE"] == "local" and window_registers(config, d.K) > MAX_REGISTERS:
            problems.append(f"window_registers: TO*TPX + RC*TPX + TO*RC + K*(TPX+K-1) + K*K = "
                            f"{window_registers(config, d.K)} > {MAX_REGISTERS} at K={d.K} (would spill)")
        largest = max(d.B * d.C * d.H * d.W, d.B * d.O * d.Ho * d.Wo, d.O * d.C)
        if largest > MAX_INDEX:
            problems.append(f"index_range: largest tensor has {largest} elements > {MAX_INDEX} (int32 indices)")
        return problems

    def emit(self, config: Config, shape: Shape, arch: str) -> str:
        return emit_cuda(config, shape, arch)

    def block(self, config: Config) -> tuple[int, int, int]:
        return (config["BW"] // config["TPX"], config["BO"] // config["TO"], 1)

    def grid(self, config: Config, shape: Shape) -> tuple[int, int, int]:
        return tiling.grid(config, self.problem.dims(shape))

    def precompile(self, device: Device, configs: Sequence[Config], shape: Shape, workers: int | None = None,
                   ) -> dict[Config, Program | TilewiseError]:
        """A tuner batch at once: the sources are emitted (or read from the store) one after another, then the
        device compiles them on a thread pool (NVRTC releases the GIL); later `compile` calls hit its cache.

        Returns:
            config -> Program, or the error emitting or compiling it raised.
        """
        arch = arch_of(device.info.limits.compute_capability)
        out: dict[Config, Program | TilewiseError] = {}
        ready: list[tuple[Config, Shape, str]] = []
        for c in configs:
            try:
                shp = self.refuse_illegal(c, shape, device.info.limits)
                ready.append((c, shp, self.emitted(c, shp, arch)))
            except TilewiseError as exc:
                out[c] = exc

        def one(item: tuple[Config, Shape, str]) -> Program | TilewiseError:
            try:
                return self.build(device, *item)
            except TilewiseError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 4) as pool:
            out.update(zip((c for c, _, _ in ready), pool.map(one, ready)))
        return out

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        d = self.problem.dims(shape)
        return {"x": device.upload(host["x"]), "dw": device.upload(host["dw"]), "pw": device.upload(host["pw"]),
                "out": device.allocate(4 * d.B * d.O * d.Ho * d.Wo)}

    def tile_waste(self, config: Config, shape: Shape) -> float:
        return tiling.tile_waste(config, self.problem.dims(shape))

    def describe(self, config: Config) -> str:
        return fmt(config)
