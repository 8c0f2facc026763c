"""fp32 1D convolution for WebGPU: out (M+N-1) = a (M) full-convolved with w (N), as `np.convolve(a, w)`.

    out[i] = sum_k a[i - k] * w[k],  a[j] = 0 outside [0, M)   (`tilewise.kernels.conv1d.problem`)

Variants (seed 000's schedule choices as parameters, `tilewise.kernels.conv1d.tiling`):

    NT      invocations per workgroup; one workgroup computes TILE = NT * TPT consecutive outputs
    TPT     per-thread tile: each invocation owns TPT consecutive outputs (TPT named accumulators)
    RK      reduction split: the N taps are walked in steps of RK taps (k_outer, k_inner); each step is unrolled
    STAGE   where the operands of one step sit:
              "global"     read from global memory at every multiply (the unoptimized baseline)
              "workgroup"  the workgroup copies the TILE + RK - 1 inputs and RK taps of the step into
                           var<workgroup> memory, barrier, then every invocation reads them from there
              "private"    each invocation loads its own window of TPT + RK - 1 inputs and RK taps into
                           registers (TVM's cache_read(..., "local")); no barrier. Each loaded input feeds
                           up to min(TPT, RK) multiplies, so the reuse shared memory would buy across
                           invocations is already bought inside one.

Zero padding is done by a bounds guard on every input read (`ld`), so no padded copy of `a` exists on the GPU.
The WGSL is generated per config: accumulators and the window are named scalars, each step fully unrolled, so every
index is a constant and they can stay in registers (a loop-indexed private array may be placed in memory). M, N and
the output length come in a uniform, so one pipeline serves every shape whose N the reduction split divides
(`program_key` is the config alone).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.conv1d.problem import CONV1D
from tilewise.kernels.conv1d.tiling import (
    fmt,
    reduction_split,
    registers,
    seed_points,
    stage_rule,
    storage_bytes,
    tile,
)
from tilewise.kernels.space import Config, Rule, Space, named_space

MAX_REGISTERS = 128  # named f32 values per invocation above which spilling is certain
GRID_X = 32768  # workgroups per grid row; larger launches wrap into grid.y (the limit is 65535 per dimension)
STAGES = ("global", "workgroup", "private")
PARAMS: dict[str, list[Any]] = {
    "NT": [32, 64, 128, 256],
    "TPT": [1, 2, 4, 8],
    "RK": [1, 2, 4, 8, 16],
    "STAGE": list(STAGES),
}


def _max_threads(L: Any) -> int:
    return min(L.max_invocations_per_workgroup, L.max_workgroup_size[0])


def _rules() -> list[Rule]:
    return [
        stage_rule(STAGES),
        Rule("registers", lambda c, L: registers(c) <= MAX_REGISTERS,
             lambda c, L: f"registers = TPT + (TPT + RK - 1) + RK = {registers(c)} > {MAX_REGISTERS} "
                          "(certain spill)",
             doc="accumulators plus the private window stay in registers"),
        Rule("workgroup_storage", lambda c, L: storage_bytes(c) <= L.max_workgroup_storage_bytes,
             lambda c, L: f"workgroup storage = 4*(NT*TPT + 2*RK - 1) = 4*({c.NT}*{c.TPT} + 2*{c.RK} - 1) = "
                          f"{storage_bytes(c)} bytes > max_workgroup_storage_bytes {L.max_workgroup_storage_bytes}",
             needs_limits=True),
        Rule("invocations", lambda c, L: _max_threads(L) >= c.NT,
             lambda c, L: f"NT = {c.NT} > max_invocations_per_workgroup "
                          f"{_max_threads(L)}", needs_limits=True),
    ]


RULES = _rules()


def conv1d_space(which: str = "full") -> Space:
    """The named conv1d spaces: "seed" (15 hand-picked points: each staging scope at five tiles), "full" (the grid),
    "small" (a quick grid)."""
    return named_space(which, PARAMS, RULES, fmt, {"NT": [64], "TPT": [1, 4], "RK": [1, 4], "STAGE": STAGES},
                       seed_points(STAGES), "conv1d")


# ---- WGSL generation ----------------------------------------------------------------------------------------
def generate_wgsl(c: Config) -> str:
    """The WGSL of one config; every step of the reduction is unrolled into named scalars."""
    NT, TPT, RK, stage = c["NT"], c["TPT"], c["RK"], c["STAGE"]
    TILE = NT * TPT
    out: list[str] = []
    w = out.append
    w(f"// tilewise conv1d: {fmt(c)}")
    w("// out (M+N-1) = a (M) full-convolved with w (N): out[i] = sum_k a[i-k] * w[k], a zero outside [0, M).")
    w(f"// One workgroup: {TILE} consecutive outputs; one invocation: {TPT} consecutive outputs; "
      f"taps in steps of {RK}.")
    w("struct Dims { M: u32, N: u32, OUT: u32, pad: u32 }")
    w("@group(0) @binding(0) var<storage, read> a: array<f32>;  // (M,)")
    w("@group(0) @binding(1) var<storage, read> wt: array<f32>;  // (N,)")
    w("@group(0) @binding(2) var<storage, read_write> out: array<f32>;  // (M+N-1,)")
    w("@group(0) @binding(3) var<uniform> dims: Dims;")
    if stage == "workgroup":
        w(f"var<workgroup> sa: array<f32, {TILE + RK - 1}>;  // inputs of one step: the tile plus RK-1 halo")
        w(f"var<workgroup> sw: array<f32, {RK}>;  // taps of one step")
    w("")
    w("// zero padding as a guard: no padded copy of a is ever written")
    w("fn ld(j: i32) -> f32 {")
    w("  if (j >= 0 && j < i32(dims.M)) { return a[j]; }")
    w("  return 0.0;")
    w("}")
    w("")
    w(f"@compute @workgroup_size({NT})")
    w("fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>,")
    w("        @builtin(num_workgroups) nwg: vec3<u32>) {")
    w(f"  let o0 = (wg.y * nwg.x + wg.x) * {TILE}u;  // first output of this workgroup")
    w(f"  let i0 = i32(o0 + tid * {TPT}u);  // first output of this invocation")
    for j in range(TPT):
        w(f"  var acc_{j} = 0.0;")
    w(f"  for (var k0 = 0u; k0 < dims.N; k0 += {RK}u) {{")
    if stage == "global":
        for r in range(RK):
            for j in range(TPT):
                w(f"    acc_{j} = fma(ld(i0 + {j - r} - i32(k0)), wt[k0 + {r}u], acc_{j});")
    elif stage == "private":
        w(f"    let base = i0 - i32(k0) - {RK - 1};  // window: inputs base .. base + {TPT + RK - 2}")
        for q in range(TPT + RK - 1):
            w(f"    let x_{q} = ld(base + {q});")
        for r in range(RK):
            w(f"    let w_{r} = wt[k0 + {r}u];")
        for r in range(RK):
            for j in range(TPT):
                w(f"    acc_{j} = fma(x_{j - r + RK - 1}, w_{r}, acc_{j});")
    else:
        w(f"    let sbase = i32(o0) - i32(k0) - {RK - 1};")
        w(f"    for (var q = tid; q < {TILE + RK - 1}u; q += {NT}u) {{ sa[q] = ld(sbase + i32(q)); }}")
        w(f"    for (var q = tid; q < {RK}u; q += {NT}u) {{ sw[q] = wt[k0 + q]; }}")
        w("    workgroupBarrier();")
        w(f"    let t0 = tid * {TPT}u;")
        for r in range(RK):
            for j in range(TPT):
                w(f"    acc_{j} = fma(sa[t0 + {j - r + RK - 1}u], sw[{r}], acc_{j});")
        w("    workgroupBarrier();")
    w("  }")
    for j in range(TPT):
        w(f"  if (u32(i0) + {j}u < dims.OUT) {{ out[u32(i0) + {j}u] = acc_{j}; }}")
    w("}")
    return "\n".join(out) + "\n"


def grid_for(workgroups: int) -> tuple[int, int, int]:
    """A 2D grid holding `workgroups` (the kernel linearises wg.y * nwg.x + wg.x and guards the tail)."""
    gx = min(workgroups, GRID_X)
    return (gx, -(-workgroups // gx), 1)


class WgslConv1d(KernelTemplate):
    """fp32 full 1D convolution on WebGPU, generated per config (see the module docstring)."""

    problem = CONV1D
    backend = "webgpu"

    make_space = conv1d_space
    spaces = ("seed", "full", "small")

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        return reduction_split(config, shape[1])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        return generate_wgsl(config)

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return config  # M, N and the output length come in a uniform

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config), "main", name=f"conv1d {fmt(config)}")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N = self.problem.check_shape(shape)
        return {"a": device.upload(host["a"]), "w": device.upload(host["w"]),
                "out": device.allocate(4 * (M + N - 1)),
                "dims": device.upload(np.array([M, N, M + N - 1, 0], dtype=np.uint32), uniform=True)}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        M, N = self.problem.check_shape(shape)
        groups = -(-(M + N - 1) // tile(config))
        return [Launch(program, grid_for(groups), [bufs["a"], bufs["w"], bufs["out"], bufs["dims"]])]

    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N = self.problem.check_shape(shape)
        out = M + N - 1
        return -(-out // tile(config)) * tile(config) / out

    def describe(self, config: Config) -> str:
        return fmt(config)
