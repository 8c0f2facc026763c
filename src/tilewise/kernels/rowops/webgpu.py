"""Row-wise model ops on WebGPU: RMSNorm, embedding gather, final norm + classifier head, word copy.

Variants:
- `rmsnorm`: one workgroup per row (WG threads, tree reduction of the sum of squares); reads rows
  r0 .. r0+M-1 of the input (dims.r0), so that the executor can slice the last row without a copy.
- `embed`: out[m] = table[ids[m]] with the table in nf4 / f16 / f32 (rows of `hidden`, decoded 8 at a time).
- `head`: final RMSNorm of one row (dims.r0 picks it) then scores = W (L, H) @ h; writes the normed row
  (the state's `hidden`) and the scores into one buffer (H + L), so one read-back returns both. One
  workgroup: the head is 8 x hidden, there is nothing to spread.
- `copy`: dst[r1 + i] = src[r0 + i] for i < dims.m words (prefix cache: branch a state on the GPU); `copy2`
  does two buffer pairs (a layer's K and V) in one launch.

Bindings are listed per op in `BINDINGS`; `dims` is a uniform vec4<u32> (m, r0, r1, r2).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.matmul import wgsl as mm
from tilewise.kernels.rowops.problem import EmbedProblem, HeadProblem, RMSNormProblem
from tilewise.kernels.space import Config, Rule, Space
from tilewise.kernels.wgsl import ROW_DIMS, row_header

BINDINGS = {
    "rmsnorm": ["dims", "x", "weight", "out"],
    "embed_nf4": ["dims", "ids", "w", "absmax", "out"],
    "embed_f16": ["dims", "ids", "w", "out"],
    "embed_f32": ["dims", "ids", "w", "out"],
    "head": ["dims", "x", "norm_weight", "head_weight", "out"],
    "copy": ["dims", "src", "dst"],
    "copy2": ["dims", "src_a", "src_b", "dst_a", "dst_b"],
}


def _reduce(wg: int, var: str = "red") -> str:
    """Tree reduction of `var[0..wg)` into var[0] (every thread reaches every barrier)."""
    return (f"    for (var h = {wg // 2}u; h > 0u; h = h / 2u) {{\n"
            f"        if (li < h) {{ {var}[li] = {var}[li] + {var}[li + h]; }}\n"
            "        workgroupBarrier();\n    }\n")


def rmsnorm_source(wg: int, h: int, eps: float) -> str:
    """WGSL: out[m] = x[r0 + m] * rsqrt(mean(x^2) + eps) * weight, one workgroup per row."""
    return f"""{row_header([("x", "f32"), ("weight", "f32")], [("out", "f32")])}const H: u32 = {h}u;
var<workgroup> red: array<f32, {wg}>;
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let src = (dims.r0 + wid.x) * H;
    var s = 0.0;
    for (var i = li; i < H; i = i + {wg}u) {{ let v = x[src + i]; s = fma(v, v, s); }}
    red[li] = s;
    workgroupBarrier();
{_reduce(wg)}    let rs = inverseSqrt(red[0] / f32(H) + {eps!r});
    for (var i = li; i < H; i = i + {wg}u) {{ out[wid.x * H + i] = x[src + i] * rs * weight[i]; }}
}}
"""


def embed_source(wg: int, fmt: str, h: int) -> str:
    """WGSL: out[m, :] = decode(table[ids[m], :]), 8 values per thread step."""
    decl, nb = mm.weight_decls(fmt, 0, 2)
    codes = mm.codes_decl() if fmt == "nf4" else ""
    return f"""{ROW_DIMS}struct C8 {{ a: vec4<f32>, b: vec4<f32> }}
const K: u32 = {h}u;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
{decl}@group(0) @binding({nb}) var<storage, read_write> out: array<vec4<f32>>;
{codes}{mm.load8_fn(fmt, 0)}
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
{mm.codes_init(fmt)}    if (wid.x >= dims.m) {{ return; }}
    let row = ids[wid.x];
    for (var c = li; c < K / 8u; c = c + {wg}u) {{
        let v = load8_0(row, c);
        out[wid.x * (K / 4u) + 2u * c] = v.a;
        out[wid.x * (K / 4u) + 2u * c + 1u] = v.b;
    }}
}}
"""


def head_source(wg: int, h: int, labels: int, eps: float) -> str:
    """WGSL: hidden = rmsnorm(x[r0]) * norm_weight; scores = head_weight (labels, H) @ hidden."""
    acc = "\n".join(f"        s{j} = fma(hv, head_weight[{j}u * H + i], s{j});" for j in range(labels))
    decl = " ".join(f"var s{j} = 0.0;" for j in range(labels))
    stores = "\n".join(f"    red[li * {labels}u + {j}u] = s{j};" for j in range(labels))
    # out (H + labels): the normed row, then the scores
    head = row_header([("x", "f32"), ("norm_weight", "f32"), ("head_weight", "f32")], [("out", "f32")])
    return f"""{head}const H: u32 = {h}u;
var<workgroup> sq: array<f32, {wg}>;
var<workgroup> red: array<f32, {wg * labels}>;
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32) {{
    let src = dims.r0 * H;
    var s = 0.0;
    for (var i = li; i < H; i = i + {wg}u) {{ let v = x[src + i]; s = fma(v, v, s); }}
    sq[li] = s;
    workgroupBarrier();
{_reduce(wg, "sq")}    let rs = inverseSqrt(sq[0] / f32(H) + {eps!r});
    {decl}
    for (var i = li; i < H; i = i + {wg}u) {{
        let hv = x[src + i] * rs * norm_weight[i];
        out[i] = hv;
{acc}
    }}
{stores}
    workgroupBarrier();
    for (var h = {wg // 2}u; h > 0u; h = h / 2u) {{
        if (li < h) {{
            for (var j = 0u; j < {labels}u; j = j + 1u) {{
                red[li * {labels}u + j] = red[li * {labels}u + j] + red[(li + h) * {labels}u + j];
            }}
        }}
        workgroupBarrier();
    }}
    if (li < {labels}u) {{ out[H + li] = red[li]; }}
}}
"""


def copy_source(wg: int = 256) -> str:
    """WGSL: dst[r1 + i] = src[r0 + i] for i < m (grid-stride loop: any size fits the grid limit)."""
    return f"""{row_header([("src", "u32")], [("dst", "u32")])}@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    for (var i = gid.x; i < dims.m; i = i + nw.x * {wg}u) {{ dst[dims.r1 + i] = src[dims.r0 + i]; }}
}}
"""


def copy2_source(wg: int = 256) -> str:
    """WGSL: the copy of `copy_source` on two buffer pairs at once (K and V of one layer: one launch, not two)."""
    head = row_header([("src_a", "u32"), ("src_b", "u32")], [("dst_a", "u32"), ("dst_b", "u32")])
    return f"""{head}@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    for (var i = gid.x; i < dims.m; i = i + nw.x * {wg}u) {{
        dst_a[dims.r1 + i] = src_a[dims.r0 + i];
        dst_b[dims.r1 + i] = src_b[dims.r0 + i];
    }}
}}
"""


def copy_grid(words: int, wg: int = 256, cap: int = 4096) -> tuple[int, int, int]:
    return (max(1, min(cap, math.ceil(words / wg))), 1, 1)


def _pow2_space(name: str, values: list[int], limit_rule: bool = True) -> Space:
    rules = [Rule("pow2", lambda c, _: c.WG & (c.WG - 1) == 0,
                  lambda c, _: f"WG={c.WG} is not a power of two (tree reduction)")]
    if limit_rule:
        rules.append(Rule("invocations", lambda c, lim: lim.max_invocations_per_workgroup >= c.WG,
                          lambda c, lim: f"WG={c.WG} > max_invocations_per_workgroup "
                                         f"{lim.max_invocations_per_workgroup}", needs_limits=True))
    return Space(name, {"WG": values}, rules)


class _Template(KernelTemplate):
    """Shared host plumbing: inputs by name, output `out`, bindings from a list."""

    backend = "webgpu"
    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config, shape), "main", name=f"{self.name}[{config}]")

    def program_key(self, config: Config, shape: Shape) -> tuple[object, ...]:
        return (config, *shape[1:])  # the rows come in the dims uniform

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        bufs = {k: device.upload(v) for k, v in host.items()}
        bufs["dims"] = device.upload(self.dims(shape), uniform=True)
        bufs["out"] = device.allocate(4 * int(np.prod(self.problem.output_shape(shape))))
        return bufs

    def dims(self, shape: Shape) -> np.ndarray:
        return np.array([shape[0], 0, 0, 0], np.uint32)



class RMSNormTemplate(_Template):
    """RMSNorm over rows; shape = (M, H)."""

    name = "rmsnorm"
    shape_names = RMSNormProblem.shape_names

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps
        self.problem = RMSNormProblem(eps)

    def space(self, which: str = "full") -> Space:
        return _pow2_space("rmsnorm", [32, 64, 128, 256])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        return rmsnorm_source(config["WG"], (shape or (1, 64))[1], self.eps)

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return [Launch(program, (shape[0], 1, 1), [bufs[k] for k in BINDINGS["rmsnorm"]])]

class EmbedTemplate(_Template):
    """Embedding gather; shape = (M, H, V)."""

    shape_names = EmbedProblem.shape_names

    def __init__(self, fmt: str = "nf4") -> None:
        self.fmt = fmt
        self.name = f"embed.{fmt}"
        self.problem = EmbedProblem(fmt)
        self.dtype = self.problem.dtype

    def space(self, which: str = "full") -> Space:
        return _pow2_space("embed", [32, 64, 128, 256])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        return embed_source(config["WG"], self.fmt, (shape or (1, 64, 64))[1])

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        return [f"H={shape[1]} is not a multiple of 64"] if shape[1] % 64 else []

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return [Launch(program, (shape[0], 1, 1), [bufs[k] for k in BINDINGS[f"embed_{self.fmt}"]])]


class HeadTemplate(_Template):
    """Final RMSNorm of the last row + Linear(H, labels); shape = (M, H, L). Output: normed row + L scores."""

    name = "head"
    shape_names = HeadProblem.shape_names

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps
        self.problem = HeadProblem(eps)

    def space(self, which: str = "full") -> Space:
        return _pow2_space("head", [32, 64, 128, 256])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        _, h, labels = shape or (1, 64, 8)
        return head_source(config["WG"], h, labels, self.eps)

    def dims(self, shape: Shape) -> np.ndarray:
        return np.array([1, shape[0] - 1, 0, 0], np.uint32)

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return [Launch(program, (1, 1, 1), [bufs[k] for k in BINDINGS["head"]])]


def default_wg(op: str) -> dict[str, Any]:
    return {"WG": 64 if op == "head" else 128}
