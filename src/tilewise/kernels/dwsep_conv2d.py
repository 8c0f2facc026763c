"""fp32 depthwise-separable 2D convolution for WebGPU, NCHW, fused: depthwise KxK then pointwise 1x1.

    d[b, c, y, x]   = sum_{ky, kx} xin[b, c, y + ky - P, x + kx - P] * dw[c, ky, kx]   (zero padding P)
    out[b, o, y, x] = sum_c pw[o, c] * d[b, c, y, x]
    xin (B, C, H, W), dw (C, K, K), pw (O, C), out (B, O, Ho, Wo) with Ho = H + 2P - K + 1, Wo = W + 2P - K + 1

One workgroup computes BW output pixels of one output row for BO output channels; the depthwise result `d`
never goes to global memory. Variants:

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
over them); B, C, H, W, O come in a uniform.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.errors import ConfigError
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape, nonzero_uniform
from tilewise.kernels.space import Config, Rule, Space, named_space

MAX_REGISTERS = 128  # named f32 values per invocation above which spilling is certain
MAX_GRID = 65535  # workgroups per grid dimension (WebGPU's default limit)
STAGES = ("global", "workgroup", "private")
PARAMS: dict[str, list[Any]] = {
    "BW": [8, 16, 32, 64],
    "TPX": [1, 2, 4],
    "BO": [4, 8, 16, 32, 64],
    "TO": [1, 2, 4, 8],
    "RC": [1, 2, 4, 8],
    "STAGE": list(STAGES),
}
SMALL = {"BW": [16], "TPX": [1, 4], "BO": [8], "TO": [1, 4], "RC": [1, 4], "STAGE": list(STAGES)}  # a quick grid
DEFAULT_KP = (3, 1)  # K, P used when a source is shown without a shape


def fmt(c: Config) -> str:
    """`32px x 16oc T4x4 RC4 private` (workgroup tile, per-thread pixels x channels, reduction step, staging)."""
    return f"{c['BW']}px x {c['BO']}oc T{c['TPX']}x{c['TO']} RC{c['RC']} {c['STAGE']}"


def threads(c: Config) -> int:
    """Invocations per workgroup (valid once the split rules pass)."""
    return (c["BO"] // c["TO"]) * (c["BW"] // c["TPX"])


def registers(c: Config) -> int:
    """Named f32 values that do not depend on K: accumulators plus the step's depthwise values."""
    return c["TO"] * c["TPX"] + c["RC"] * c["TPX"]


def window_registers(c: Config, K: int) -> int:
    """All named f32 values of the private variant at kernel size K."""
    return registers(c) + (c["TPX"] + K - 1) + K + c["TO"]


def storage_bytes(c: Config) -> int:
    """var<workgroup> bytes of the workgroup variant: (RC, BW) depthwise values + (BO, RC) pointwise weights."""
    return 4 * (c["RC"] * c["BW"] + c["BO"] * c["RC"]) if c["STAGE"] == "workgroup" else 0


def tile_split_rules(stages: tuple[str, ...]) -> list[Rule]:
    """The staging choice (one of the backend's `stages`) and the tile splits: the same rules for the WGSL and the
    TVM-CUDA dwsep templates."""
    return [
        Rule("stage", lambda c, L: c.STAGE in stages,
             lambda c, L: f"STAGE = {c.STAGE!r} is not one of {', '.join(stages)}"),
        Rule("pixel_split", lambda c, L: c.BW % c.TPX == 0,
             lambda c, L: f"BW % TPX = {c.BW} % {c.TPX} = {c.BW % c.TPX} != 0",
             doc="the pixel tile splits into whole per-thread strips"),
        Rule("channel_split", lambda c, L: c.BO % c.TO == 0,
             lambda c, L: f"BO % TO = {c.BO} % {c.TO} = {c.BO % c.TO} != 0",
             doc="the output-channel tile splits into whole per-thread groups"),
    ]


def _rules() -> list[Rule]:
    def lim(L: Any) -> int:
        return min(L.max_invocations_per_workgroup, L.max_workgroup_size[0])

    return [
        *tile_split_rules(STAGES),
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
    seed = [dict(zip(("BW", "TPX", "BO", "TO", "RC"), t), STAGE=s) for s in STAGES for t in tiles]
    return named_space(which, PARAMS, RULES, fmt, SMALL, seed, "dwsep-conv2d")


class DwsepShape(NamedTuple):
    """A checked shape with its output size."""

    B: int
    C: int
    H: int
    W: int
    O: int
    K: int
    P: int
    Ho: int
    Wo: int


def check_shape(shape: Shape) -> DwsepShape:
    """The checked shape (B, C, H, W, O, K, P, Ho, Wo); refuses a kernel larger than the padded input."""
    if len(shape) != 7 or any(int(s) < 0 for s in shape) or any(int(s) < 1 for s in shape[:6]):
        raise ConfigError(f"dwsep-conv2d shape {shape!r} must be B,C,H,W,O,K,P (positive, P >= 0)",
                          "write e.g. --shape 1,32,56,56,64,3,1")
    B, C, H, W, O, K, P = (int(s) for s in shape)
    if K > H + 2 * P or K > W + 2 * P:
        raise ConfigError(f"dwsep-conv2d kernel {K}x{K} is larger than the padded input {H + 2 * P}x{W + 2 * P} "
                          f"(H={H}, W={W}, P={P})", "use a smaller kernel or more padding")
    return DwsepShape(B, C, H, W, O, K, P, H + 2 * P - K + 1, W + 2 * P - K + 1)


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
    if stage == "global":
        for r in range(RC):
            w(f"    let plane_{r} = img + (c0 + {r}u) * dims.H * dims.W;")
            for p in range(TPX):
                w(f"    var d_{r}_{p} = 0.0;")
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
            w(f"    let plane_{r} = img + (c0 + {r}u) * dims.H * dims.W;")
            for p in range(TPX):
                w(f"    var d_{r}_{p} = 0.0;")
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


def reference_dwsep(x: np.ndarray, dw: np.ndarray, pw: np.ndarray, P: int) -> np.ndarray:
    """float64 depthwise-separable convolution: x (B,C,H,W), dw (C,K,K), pw (O,C) -> (B,O,Ho,Wo)."""
    x64 = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (P, P), (P, P)))  # (B, C, H+2P, W+2P)
    K = dw.shape[-1]
    Ho, Wo = x64.shape[2] - K + 1, x64.shape[3] - K + 1
    d = np.zeros((x.shape[0], x.shape[1], Ho, Wo))  # (B, C, Ho, Wo)
    for ky in range(K):
        for kx in range(K):
            d += x64[:, :, ky:ky + Ho, kx:kx + Wo] * dw[None, :, ky, kx, None, None].astype(np.float64)
    return np.einsum("oc,bchw->bohw", pw.astype(np.float64), d)


class WgslDwsepConv2d(KernelTemplate):
    """Fused depthwise-separable conv2d on WebGPU, generated per config (see the module docstring)."""

    name = "dwsep-conv2d"
    backend = "webgpu"
    shape_names = ("B", "C", "H", "W", "O", "K", "P")
    dtype = "f32"

    def space(self, which: str = "full") -> Space:
        return dwsep_space(which)

    def space_names(self) -> tuple[str, ...]:
        return ("seed", "full", "small")

    def shape_problems(self, config: Config, shape: Shape) -> list[str]:
        try:
            d = check_shape(shape)
        except ConfigError as exc:
            return [f"shape: {exc.problem}"]
        B, C, O, K, Ho = d.B, d.C, d.O, d.K, d.Ho
        problems = []
        if C % config["RC"]:
            problems.append(f"reduction_split: C % RC = {C} % {config['RC']} = {C % config['RC']} != 0 "
                            "(each step reads RC channels unguarded)")
        if B * Ho > MAX_GRID:
            problems.append(f"grid_rows: B*Ho = {B}*{Ho} = {B * Ho} > {MAX_GRID} workgroups per dimension")
        if -(-O // config["BO"]) > MAX_GRID:
            problems.append(f"grid_channels: ceil(O/BO) = {-(-O // config['BO'])} > {MAX_GRID}")
        if config["STAGE"] == "private" and window_registers(config, K) > MAX_REGISTERS:
            problems.append(f"window_registers: TO*TPX + RC*TPX + (TPX+K-1) + K + TO = "
                            f"{window_registers(config, K)} > {MAX_REGISTERS} at K={K} (certain spill)")
        return problems

    def source(self, config: Config, shape: Shape | None = None) -> str:
        if shape is None:
            return generate_wgsl(config, *DEFAULT_KP)
        d = check_shape(shape)
        return generate_wgsl(config, d.K, d.P)

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config, shape), "main", name=f"dwsep-conv2d {fmt(config)}")

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        B, C, H, W, O, K = check_shape(shape)[:6]
        return {"x": nonzero_uniform(rng, (B, C, H, W)).astype(np.float32),
                "dw": (nonzero_uniform(rng, (C, K, K)) / K).astype(np.float32),
                "pw": (nonzero_uniform(rng, (O, C)) / np.sqrt(C)).astype(np.float32)}

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        B, C, H, W, O, _, _, Ho, Wo = check_shape(shape)
        return {"x": device.upload(host["x"]), "dw": device.upload(host["dw"]), "pw": device.upload(host["pw"]),
                "out": device.allocate(4 * B * O * Ho * Wo),
                "dims": device.upload(np.array([B, C, H, W, O, Ho, Wo, 0], dtype=np.uint32), uniform=True)}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        d = check_shape(shape)
        grid = (-(-d.Wo // config["BW"]), d.B * d.Ho, -(-d.O // config["BO"]))
        return [Launch(program, grid, [bufs["x"], bufs["dw"], bufs["pw"], bufs["out"], bufs["dims"]])]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        d = check_shape(shape)
        return device.download(bufs["out"], np.float32, (d.B, d.O, d.Ho, d.Wo))

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        return reference_dwsep(host["x"], host["dw"], host["pw"], check_shape(shape).P)

    def flops(self, shape: Shape) -> int:
        d = check_shape(shape)
        return 2 * d.B * d.Ho * d.Wo * d.C * (d.K * d.K + d.O)

    def bytes_moved(self, shape: Shape) -> int:
        d = check_shape(shape)
        return 4 * (d.B * d.C * d.H * d.W + d.C * d.K * d.K + d.O * d.C + d.B * d.O * d.Ho * d.Wo)

    def tile_waste(self, config: Config, shape: Shape) -> float:
        d = check_shape(shape)
        Wo, O = d.Wo, d.O
        bw, bo = config["BW"], config["BO"]
        return (-(-Wo // bw) * bw * -(-O // bo) * bo) / (Wo * O)

    def describe(self, config: Config) -> str:
        return fmt(config)
