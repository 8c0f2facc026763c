"""LFM2's short conv on WebGPU: Bx = B * x, depthwise causal conv over time (kernel L = conv_L_cache), y = C * conv.

Variant: an invocation per channel and run of RT consecutive rows, the last L-1 Bx values carried along in a
register window (each B and x read once instead of L times); a workgroup covers WG channels of one run. The
`in_proj` output BCx (M, 3H) holds B, C and x side by side (HF's `chunk(3)` order). Rows before the chunk come from
`state_in` ((L-1, H): Bx of the previous L-1 positions, oldest first; zeros at the start of a prompt), and
the last L-1 Bx rows go to `state_out`, a different buffer, so that a prefix state is never modified
when a decision branches off it (prefix cache). `tilewise tune model` picks WG and RT per model (the table's
`shortconv:HxL` entry).

Bindings: dims (m = M), bcx (M, 3H), state_in (L-1, H), weight (H, L), y (M, H), state_out (L-1, H).
"""

from __future__ import annotations

import math

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.shortconv.problem import ShortConvProblem
from tilewise.kernels.space import Config, Rule, Space
from tilewise.kernels.wgsl import row_header

BINDINGS = ["dims", "bcx", "state_in", "weight", "y", "state_out"]
DEFAULT = {"WG": 128, "RT": 1}


def conv_source(wg: int, h: int, taps: int, rt: int = 1) -> str:
    """WGSL of the gated depthwise causal conv for hidden size `h`, kernel `taps` and `rt` rows an invocation."""
    # the taps summed left to right, oldest first: w0 * Bx(t - L + 1) + ... + w(L-1) * Bx(t)
    terms = " + ".join([f"w[{j}u] * win[{j}u]" for j in range(taps - 1)] + [f"w[{taps - 1}u] * cur"])
    head = row_header([("bcx", "f32"), ("state_in", "f32"), ("weight", "f32")], [("y", "f32"), ("state_out", "f32")])
    return f"""{head}const H: u32 = {h}u;
const L: u32 = {taps}u;
const RT: u32 = {rt}u;

fn bx(t: i32, c: u32) -> f32 {{
    if (t < 0) {{ return state_in[u32(i32(L) - 1 + t) * H + c]; }}
    let base = u32(t) * 3u * H;
    return bcx[base + c] * bcx[base + 2u * H + c];
}}

@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{
    let c = gid.x;
    let t0 = wid.y * RT;
    if (c >= H) {{ return; }}
    var w: array<f32, {taps}>;
    for (var j = 0u; j < L; j = j + 1u) {{ w[j] = weight[c * L + j]; }}
    var win: array<f32, {taps - 1}>;  // Bx of the L-1 rows before the current one, oldest first
    for (var j = 0u; j < L - 1u; j = j + 1u) {{ win[j] = bx(i32(t0) - i32(L) + 1 + i32(j), c); }}
    for (var r = 0u; r < RT; r = r + 1u) {{
        let t = t0 + r;
        if (t >= dims.m) {{ break; }}
        let cur = bx(i32(t), c);
        let acc = {terms};
        for (var j = 0u; j + 1u < L - 1u; j = j + 1u) {{ win[j] = win[j + 1u]; }}
        win[L - 2u] = cur;
        y[t * H + c] = bcx[t * 3u * H + H + c] * acc;
    }}
    if (wid.y == 0u) {{
        for (var i = 0u; i < L - 1u; i = i + 1u) {{
            state_out[i * H + c] = bx(i32(dims.m) - i32(L) + 1 + i32(i), c);
        }}
    }}
}}
"""


class ConvTemplate(KernelTemplate):
    """Gated depthwise causal conv; shape = (M, H, L). Output: y (M, H) followed by the new state."""

    backend = "webgpu"
    problem = ShortConvProblem()
    scratch_buffers = ("state_out",)  # the conv state it hands on: poisoned and guarded like "out"

    def space(self, which: str = "full") -> Space:
        return Space("shortconv", {"WG": [32, 64, 128, 256], "RT": [1, 2, 4, 8, 16]}, [
            Rule("invocations", lambda c, lim: lim.max_invocations_per_workgroup >= c.WG,
                 lambda c, lim: f"WG={c.WG} > max_invocations_per_workgroup {lim.max_invocations_per_workgroup}",
                 needs_limits=True),
            Rule("rows_1_64", lambda c, _: 1 <= c.RT <= 64,
                 lambda c, _: f"RT = {c.RT} rows per invocation is not in 1..64")])

    def default_config(self) -> Config:
        """What the executor runs where no table names one: 128 invocations a workgroup, one row each."""
        return self.config_of(DEFAULT)

    def source(self, config: Config, shape: Shape | None = None) -> str:
        _, h, taps = shape or (1, 64, 3)
        return conv_source(config["WG"], h, taps, config["RT"])

    def program_key(self, config: Config, shape: Shape) -> tuple[object, ...]:
        return (config, *shape[1:])  # the rows come in the dims uniform

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config, shape), "main", name=f"shortconv[{config}]")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, h, taps = shape
        bufs = {k: device.upload(v) for k, v in host.items()}
        bufs["dims"] = device.upload(np.array([m, 0, 0, 0], np.uint32), uniform=True)
        bufs["out"] = device.allocate(4 * m * h)
        bufs["state_out"] = device.allocate(4 * (taps - 1) * h)
        return bufs

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        b = {**bufs, "y": bufs["out"]}
        grid = (math.ceil(shape[1] / config["WG"]), math.ceil(shape[0] / config["RT"]), 1)
        return [Launch(program, grid, [b[k] for k in BINDINGS])]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        m, h, taps = shape
        return np.concatenate([device.download(bufs["out"], np.float32, (m, h)),
                               device.download(bufs["state_out"], np.float32, (taps - 1, h))])

