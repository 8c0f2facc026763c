"""fp32 depthwise-separable 2D convolution for WebGPU, NCHW, fused: depthwise KxK then pointwise 1x1.

    d[b, c, y, x]   = sum_{ky, kx} xin[b, c, y + ky - P, x + kx - P] * dw[c, ky, kx]   (zero padding P)
    out[b, o, y, x] = sum_c pw[o, c] * d[b, c, y, x]
    xin (B, C, H, W), dw (C, K, K), pw (O, C), out (B, O, Ho, Wo) with Ho = H + 2P - K + 1, Wo = W + 2P - K + 1
    (`tilewise.kernels.dwsep_conv2d.problem`)

One workgroup computes BW output pixels of one output row for BO output channels; the depthwise result `d`
never goes to global memory. Variants (the tiling is `tilewise.kernels.dwsep_conv2d.tiling`):

    BW, BO   workgroup tile: BW pixels along a row x BO output channels
    TPX, TO  per-thread tile: TPX consecutive pixels x TO output channels (TPX*TO named accumulators)
    RC       reduction split: input channels are walked in steps of RC (unrolled)
    STAGE    "global"     every invocation computes the depthwise values of its own pixels with every operand
                          read from global memory at every multiply (the unoptimized baseline)
             "private"    the same work, but each input row window (TPX + K - 1 values) and the taps and
                          pointwise weights of a step are loaded into registers once and reused
             "workgroup"  the workgroup computes the RC x BW depthwise values of a step once, cooperatively,
                          into var<workgroup> memory (with the BO x RC pointwise weights), barrier, and all
                          BO/TO channel groups read them: here invocations *do* read the same values, so this
                          is the case where seed 000 says shared memory should pay; the ladder measures it.

NT = (BO/TO) * (BW/TPX) invocations per workgroup. K and P are compiled in (the private window is unrolled
over them); B, C, H, W, O come in a uniform, so one pipeline serves every shape of the same K and P (`program_key`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.dwsep_conv2d import tiling
from tilewise.kernels.dwsep_conv2d.problem import DWSEP
from tilewise.kernels.dwsep_conv2d.tiling import fmt, threads
from tilewise.kernels.space import Config, Rule, Space, named_space

MAX_REGISTERS = 128  # named f32 values per invocation above which spilling is certain
MAX_GRID = 65535  # workgroups per grid dimension (WebGPU's default limit)
STAGES = ("global", "workgroup", "private")
PARAMS: dict[str, list[Any]] = {**tiling.TILE_PARAMS, "STAGE": list(STAGES)}
SMALL = {**tiling.SMALL_TILES, "STAGE": list(STAGES)}  # a quick grid
DEFAULT_KP = (3, 1)  # K, P used when a source is shown without a shape


def registers(c: Config) -> int:
    """Named f32 values that do not depend on K: accumulators plus the step's depthwise values."""
    return c["TO"] * c["TPX"] + c["RC"] * c["TPX"]


def window_registers(c: Config, K: int) -> int:
    """All named f32 values of the private variant at kernel size K."""
    return registers(c) + (c["TPX"] + K - 1) + K + c["TO"]


def storage_bytes(c: Config) -> int:
    """var<workgroup> bytes of the workgroup variant: (RC, BW) depthwise values + (BO, RC) pointwise weights."""
    return 4 * (c["RC"] * c["BW"] + c["BO"] * c["RC"]) if c["STAGE"] == "workgroup" else 0


def _rules() -> list[Rule]:
    def lim(L: Any) -> int:
        return min(L.max_invocations_per_workgroup, L.max_workgroup_size[0])

    return [
        *tiling.tile_split_rules(STAGES),
        Rule("registers", lambda c, L: registers(c) <= MAX_REGISTERS,
             lambda c, L: f"registers = TO*TPX + RC*TPX = {registers(c)} > {MAX_REGISTERS} (certain spill)"),
        Rule("workgroup_storage", lambda c, L: storage_bytes(c) <= L.max_workgroup_storage_bytes,
             lambda c, L: f"workgroup storage = 4*(RC*BW + BO*RC) = {storage_bytes(c)} bytes > "
                          f"max_workgroup_storage_bytes {L.max_workgroup_storage_bytes}", needs_limits=True),
        Rule("invocations", lambda c, L: threads(c) <= lim(L),
             lambda c, L: f"NT = (BO/TO)*(BW/TPX) = ({c.BO}/{c.TO})*({c.BW}/{c.TPX}) = {threads(c)} > "
                          f"max_invocations_per_workgroup {lim(L)}", needs_limits=True),
    ]


RULES = _rules()


def dwsep_space(which: str = "full") -> Space:
    """The named spaces: "seed" (15 hand-picked points), "full" (the grid), "small" (a quick grid)."""
    # each staging scope at five tiles: baseline, reduction split, 4x4 per-thread tiles, an 8-channel step
    tiles = ((16, 1, 16, 1, 1), (16, 1, 16, 1, 4), (32, 4, 32, 4, 4), (16, 2, 16, 2, 4), (32, 4, 16, 4, 8))
    return named_space(which, PARAMS, RULES, fmt, SMALL, tiling.seed_points(STAGES, tiles), "dwsep-conv2d")


# ---- WGSL generation ----------------------------------------------------------------------------------------
def generate_wgsl(c: Config, K: int = DEFAULT_KP[0], P: int = DEFAULT_KP[1]) -> str:
    """The WGSL of one config at kernel size K and padding P."""
    BW, TPX, BO, TO, RC, stage = c["BW"], c["TPX"], c["BO"], c["TO"], c["RC"], c["STAGE"]
    NT, PG = threads(c), BW // TPX
    out: list[str] = []
    w = out.append
    w(f"// tilewise dwsep-conv2d: {fmt(c)}, K={K} P={P}, {NT} invocations")
    w("// out (B,O,Ho,Wo) = pw (O,C) @ depthwise(xin (B,C,H,W), dw (C,K,K)), zero padding P, NCHW, fp32.")
    w("struct Dims { B: u32, C: u32, H: u32, W: u32, O: u32, Ho: u32, Wo: u32, pad: u32 }")
    w("@group(0) @binding(0) var<storage, read> xin: array<f32>;  // (B, C, H, W)")
    w("@group(0) @binding(1) var<storage, read> dw: array<f32>;  // (C, K, K)")
    w("@group(0) @binding(2) var<storage, read> pw: array<f32>;  // (O, C)")
    w("@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // (B, O, Ho, Wo)")
    w("@group(0) @binding(4) var<uniform> dims: Dims;")
    if stage == "workgroup":
        w(f"var<workgroup> sd: array<f32, {RC * BW}>;  // (RC, BW): depthwise values of one step")
        w(f"var<workgroup> sp: array<f32, {BO * RC}>;  // (BO, RC): pointwise weights of one step")
    w("")
    w("// zero padding as a guard on every input read")
    w("fn ldx(plane: u32, iy: i32, ix: i32) -> f32 {")
    w("  if (iy >= 0 && iy < i32(dims.H) && ix >= 0 && ix < i32(dims.W)) {")
    w("    return xin[plane + u32(iy) * dims.W + u32(ix)];")
    w("  }")
    w("  return 0.0;")
    w("}")
    w("fn ldpw(o: u32, c: u32) -> f32 {")
    w("  if (o < dims.O) { return pw[o * dims.C + c]; }")
    w("  return 0.0;")
    w("}")
    if stage == "workgroup":
        w("// one depthwise value, operands from global memory")
        w("fn depthwise(plane: u32, c: u32, y: u32, x: u32) -> f32 {")
        w("  var s = 0.0;")
        w(f"  for (var ky = 0u; ky < {K}u; ky++) {{")
        w(f"    for (var kx = 0u; kx < {K}u; kx++) {{")
        w(f"      s = fma(ldx(plane, i32(y + ky) - {P}, i32(x + kx) - {P}), dw[(c * {K}u + ky) * {K}u + kx], s);")
        w("    }")
        w("  }")
        w("  return s;")
        w("}")
    w("")
    w(f"@compute @workgroup_size({NT})")
    w("fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>) {")
    w(f"  let wo0 = wg.x * {BW}u; let b = wg.y / dims.Ho; let ho = wg.y % dims.Ho; let ob0 = wg.z * {BO}u;")
    w(f"  let pg = tid % {PG}u; let og = tid / {PG}u;")
    w(f"  let px = wo0 + pg * {TPX}u;  // first output column of this invocation")
    w(f"  let oc = ob0 + og * {TO}u;  // first output channel of this invocation")
    w("  let img = b * dims.C * dims.H * dims.W;")
    for o in range(TO):
        for p in range(TPX):
            w(f"  var acc_{o}_{p} = 0.0;")
    w(f"  for (var c0 = 0u; c0 < dims.C; c0 += {RC}u) {{")
    def open_channel(r: int) -> None:  # channel c0 + r's input plane and its TPX depthwise sums
        w(f"    let plane_{r} = img + (c0 + {r}u) * dims.H * dims.W;")
        for p in range(TPX):
            w(f"    var d_{r}_{p} = 0.0;")

    if stage == "global":
        for r in range(RC):
            open_channel(r)
            w(f"    for (var ky = 0u; ky < {K}u; ky++) {{")
            w(f"      for (var kx = 0u; kx < {K}u; kx++) {{")
            for p in range(TPX):
                w(f"        d_{r}_{p} = fma(ldx(plane_{r}, i32(ho + ky) - {P}, i32(px + {p}u + kx) - {P}), "
                  f"dw[((c0 + {r}u) * {K}u + ky) * {K}u + kx], d_{r}_{p});")
            w("      }")
            w("    }")
            for o in range(TO):
                for p in range(TPX):
                    w(f"    acc_{o}_{p} = fma(ldpw(oc + {o}u, c0 + {r}u), d_{r}_{p}, acc_{o}_{p});")
    elif stage == "private":
        for r in range(RC):
            open_channel(r)
            for ky in range(K):
                w(f"    {{  // kernel row {ky}: window of {TPX + K - 1} inputs and {K} taps in registers")
                w(f"      let iy = i32(ho) + {ky - P};")
                for q in range(TPX + K - 1):
                    w(f"      let x_{q} = ldx(plane_{r}, iy, i32(px) + {q - P});")
                for kx in range(K):
                    w(f"      let t_{kx} = dw[(c0 + {r}u) * {K * K}u + {ky * K + kx}u];")
                for kx in range(K):
                    for p in range(TPX):
                        w(f"      d_{r}_{p} = fma(x_{p + kx}, t_{kx}, d_{r}_{p});")
                w("    }")
            for o in range(TO):
                w(f"    let p_{r}_{o} = ldpw(oc + {o}u, c0 + {r}u);")
            for o in range(TO):
                for p in range(TPX):
                    w(f"    acc_{o}_{p} = fma(p_{r}_{o}, d_{r}_{p}, acc_{o}_{p});")
    else:
        w(f"    for (var e = tid; e < {RC * BW}u; e += {NT}u) {{  // depthwise values of the step, once per workgroup")
        w(f"      let c = c0 + e / {BW}u; let x = wo0 + e % {BW}u;")
        w("      sd[e] = depthwise(img + c * dims.H * dims.W, c, ho, x);")
        w("    }")
        w(f"    for (var e = tid; e < {BO * RC}u; e += {NT}u) {{ sp[e] = ldpw(ob0 + e / {RC}u, c0 + e % {RC}u); }}")
        w("    workgroupBarrier();")
        for r in range(RC):
            for o in range(TO):
                for p in range(TPX):
                    w(f"    acc_{o}_{p} = fma(sp[(og * {TO}u + {o}u) * {RC}u + {r}u], sd[{r * BW}u + pg * {TPX}u + "
                      f"{p}u], acc_{o}_{p});")
        w("    workgroupBarrier();")
    w("  }")
    for o in range(TO):
        w(f"  if (oc + {o}u < dims.O) {{")
        w(f"    let row_{o} = ((b * dims.O + oc + {o}u) * dims.Ho + ho) * dims.Wo;")
        for p in range(TPX):
            w(f"    if (px + {p}u < dims.Wo) {{ out[row_{o} + px + {p}u] = acc_{o}_{p}; }}")
        w("  }")
    w("}")
    return "\n".join(out) + "\n"


class WgslDwsepConv2d(KernelTemplate):
    """Fused depthwise-separable conv2d on WebGPU, generated per config (see the module docstring)."""

    problem = DWSEP
    backend = "webgpu"

    make_space = dwsep_space
    spaces = ("seed", "full", "small")

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        d = self.problem.dims(shape)
        problems = tiling.split_problems(config, d, MAX_GRID, "workgroups per dimension", "")
        if config["STAGE"] == "private" and window_registers(config, d.K) > MAX_REGISTERS:
            problems.append(f"window_registers: TO*TPX + RC*TPX + (TPX+K-1) + K + TO = "
                            f"{window_registers(config, d.K)} > {MAX_REGISTERS} at K={d.K} (certain spill)")
        return problems

    def source(self, config: Config, shape: Shape | None = None) -> str:
        if shape is None:
            return generate_wgsl(config, *DEFAULT_KP)
        d = self.problem.dims(shape)
        return generate_wgsl(config, d.K, d.P)

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        d = self.problem.dims(shape)
        return (config, d.K, d.P)  # K and P are compiled in; B, C, H, W and O come in a uniform

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config, shape), "main", name=f"dwsep-conv2d {fmt(config)}")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        B, C, H, W, O, _, _, Ho, Wo = self.problem.dims(shape)
        return {"x": device.upload(host["x"]), "dw": device.upload(host["dw"]), "pw": device.upload(host["pw"]),
                "out": device.allocate(4 * B * O * Ho * Wo),
                "dims": device.upload(np.array([B, C, H, W, O, Ho, Wo, 0], dtype=np.uint32), uniform=True)}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return [Launch(program, tiling.grid(config, self.problem.dims(shape)),
                       [bufs["x"], bufs["dw"], bufs["pw"], bufs["out"], bufs["dims"]])]

    def tile_waste(self, config: Config, shape: Shape) -> float:
        return tiling.tile_waste(config, self.problem.dims(shape))

    def describe(self, config: Config) -> str:
        return fmt(config)
