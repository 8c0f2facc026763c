"""LFM2 attention on WebGPU: per-head q/k RMSNorm + RoPE into a KV cache, then causal GQA softmax(QK^T)V.

Variants:
- `qknorm_rope`: four invocations per (row, head) over q, k and v heads of the fused qkv projection, sixteen
  (row, head) units per workgroup: RMSNorm q and k per head (eps = norm_eps), rotate by RoPE (half-split pairs
  d, d + D/2, theta from the config; cos/sin come from a float64-built table, so that positions in the thousands
  keep f32 accuracy), write q to `q`, k and v into the cache rows P .. P+M-1 (P = positions already cached).
- `attention`: flash-style, KT threads per query row, BQ query rows of one head per workgroup (BQ * KT
  threads); keys and values are staged in workgroup memory BKV at a time (read by every thread: broadcast)
  and folded in with an online softmax, q and the output held in D/4 scalar vec4 registers (generated,
  unrolled). With KT > 1 the KT threads of a query take every KT-th key of the tile, each with its own
  softmax state, and merge the states through workgroup memory at the end: one thread per query leaves
  most of a big GPU idle at a few hundred rows (346 rows x 16 heads is 5.5k threads), KT = 8 gives 44k.
  GQA: head h reads kv head h / (Hq / Hkv). Queries can start at a row offset (final-row slicing: only the
  last row). KT = 1 is the original one-thread-per-query kernel, unchanged. LZ = 1 rescales a thread's
  softmax sums only when a key raises its running maximum (branch), instead of for every key; LZ = 0 (or
  absent) generates the kernel as before.

The math and the float64 references are `problem.py`.

Bindings (qknorm_rope): dims (m = M, r0 = P), qkv (M, (Hq+2Hkv) D), q_norm (D), k_norm (D), cos (cap, D/2),
sin (cap, D/2), q (M, Hq D), k_cache (cap, Hkv D), v_cache (cap, Hkv D).
Bindings (attention): dims (m = queries, r0 = P, r1 = first query row), q, k_cache, v_cache, out (m, Hq D).
"""

from __future__ import annotations

import math

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.attention.problem import AttentionProblem
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.space import Config, Rule, Space
from tilewise.kernels.wgsl import row_header

ROPE_BINDINGS = ["dims", "qkv", "q_norm", "k_norm", "cos", "sin", "q", "k_cache", "v_cache"]
ATTN_BINDINGS = ["dims", "q", "k_cache", "v_cache", "out"]
DEFAULT_ATTN = {"BQ": 32, "BKV": 16}  # KT absent: 1



ROPE_WG = 64  # invocations per qknorm_rope workgroup


def rope_threads(d: int) -> int:
    """Invocations per (row, head) of `qknorm_rope`: 4, or fewer where D / 8 is not a multiple of 4, so that each
    invocation holds both halves of the RoPE pairs it rotates (vec4 q and q + D/8)."""
    if d % 8:
        raise ValueError(f"head dim {d} is not a multiple of 8 (qknorm_rope reads vec4s and rotates half-split pairs)")
    return next(t for t in (4, 2, 1) if (d // 8) % t == 0)


def qknorm_rope_grid(m: int, hq: int, hkv: int, d: int) -> tuple[int, int, int]:
    """Workgroups of `qknorm_rope` for M rows: one unit per (row, head), ROPE_WG / rope_threads(d) units each."""
    units = m * (hq + 2 * hkv)
    per = ROPE_WG // rope_threads(d)
    return (-(-units // per), 1, 1)


def qknorm_rope_source(hq: int, hkv: int, d: int, eps: float) -> str:
    """T = rope_threads(d) invocations per (row, head) unit, ROPE_WG / T units per workgroup: invocation j of a unit
    holds vec4s j, j + T, ... of the head (D / 4T of them), so a head's sum of squares takes one exchange through
    workgroup memory and RoPE's pairs (vec4 q, q + D/8) never leave an invocation. One barrier per workgroup where a
    workgroup per (row, head) with a tree reduction took seven, over 11k workgroups at 346 rows."""
    T = rope_threads(d)
    per = d // (4 * T)  # vec4s per invocation
    half4 = d // 8  # vec4s in half a head
    head = row_header([("qkv", "vec4<f32>"), ("q_norm", "vec4<f32>"), ("k_norm", "vec4<f32>"),
                       ("cos_t", "vec4<f32>"), ("sin_t", "vec4<f32>")],
                      [("q", "vec4<f32>"), ("k_cache", "vec4<f32>"), ("v_cache", "vec4<f32>")])
    L = [f"""{head}const HQ: u32 = {hq}u;
const HKV: u32 = {hkv}u;
const H: u32 = {hq + 2 * hkv}u;
const D4: u32 = {d // 4}u;
const T: u32 = {T}u;  // invocations per (row, head)
var<workgroup> red: array<f32, {ROPE_WG}>;
@compute @workgroup_size({ROPE_WG})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let unit = wid.x * {ROPE_WG // T}u + li / T;
    let j = li % T;
    let m = unit / H;
    let hh = unit % H;
    let ok = m < dims.m;  // no return before the barrier: it must be reached by every invocation
    let pos = dims.r0 + m;
    let base = (m * H + hh) * D4;
    var ss = 0.0;"""]
    for i in range(per):
        L.append(f"    var v{i} = vec4<f32>(0.0);")
        L.append(f"    if (ok) {{ v{i} = qkv[base + j + {T * i}u]; }}")
        L.append(f"    ss = ss + dot(v{i}, v{i});")
    L.append("""    red[li] = ss;
    workgroupBarrier();
    if (!ok) { return; }
    if (hh >= HQ + HKV) {
        let vb = pos * HKV * D4 + (hh - HQ - HKV) * D4;""")
    for i in range(per):
        L.append(f"        v_cache[vb + j + {T * i}u] = v{i};")
    L.append("        return;")
    L.append("    }")
    L.append("    var tot = 0.0;")
    L.append("    for (var t = 0u; t < T; t = t + 1u) { tot = tot + red[(li / T) * T + t]; }")
    L.append(f"    let rs = inverseSqrt(tot / {float(d)!r} + {eps!r});")
    L.append("    let isq = hh < HQ;")
    L.append("    let ob = select(pos * HKV * D4 + (hh - HQ) * D4, m * HQ * D4 + hh * D4, isq);")
    for i in range(per // 2):  # pairs (i, i + per/2): vec4s a and a + D/8 of the head
        i2 = i + per // 2
        L.append("    {")
        L.append(f"        let a = j + {T * i}u;  // < D/8: the first half's vec4, paired with a + {half4}")
        L.append("        let wn0 = select(k_norm[a], q_norm[a], isq);")
        L.append(f"        let wn1 = select(k_norm[a + {half4}u], q_norm[a + {half4}u], isq);")
        L.append(f"        let n0 = v{i} * rs * wn0;")
        L.append(f"        let n1 = v{i2} * rs * wn1;")
        L.append(f"        let c = cos_t[pos * {half4}u + a];")
        L.append(f"        let s = sin_t[pos * {half4}u + a];")
        L.append("        let o0 = n0 * c - n1 * s;")
        L.append("        let o1 = n1 * c + n0 * s;")
        L.append(f"        if (isq) {{ q[ob + a] = o0; q[ob + a + {half4}u] = o1; }}")
        L.append(f"        else {{ k_cache[ob + a] = o0; k_cache[ob + a + {half4}u] = o1; }}")
        L.append("    }")
    L.append("}")
    return "\n".join(L) + "\n"


def attention_source(cfg: Config | dict, hq: int, hkv: int, d: int) -> str:
    BQ, BKV, KT = cfg["BQ"], cfg["BKV"], cfg.get("KT", 1)
    d4 = d // 4
    scale = 1.0 / math.sqrt(d)
    split = KT > 1
    head = row_header([("q", "vec4<f32>"), ("k_cache", "vec4<f32>"), ("v_cache", "vec4<f32>")], [("out", "vec4<f32>")])
    L = [f"""{head}const HQ: u32 = {hq}u;
const HKV: u32 = {hkv}u;
const D4: u32 = {d4}u;
const BQ: u32 = {BQ}u;
const BKV: u32 = {BKV}u;
var<workgroup> Ks: array<vec4<f32>, {BKV * d4}>;  // (BKV, D) keys of this step
var<workgroup> Vs: array<vec4<f32>, {BKV * d4}>;  // (BKV, D) values of this step
"""]
    if split:
        L.append(f"""const KT: u32 = {KT}u;
var<workgroup> Ms: array<f32, {BQ * KT}>;  // (KT, BQ) running maxima of the key slices
var<workgroup> Ls: array<f32, {BQ * KT}>;  // (KT, BQ) their softmax denominators
var<workgroup> Os: array<vec4<f32>, {BQ * d4}>;  // (BQ, D) output sums of the slices merged so far
@compute @workgroup_size({BQ * KT})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let nq = dims.m;
    let h = wid.y;
    let hk = h / (HQ / HKV);
    let qi = li % BQ;
    let kslot = li / BQ;
    let i = wid.x * BQ + qi;
""")
    else:
        L.append(f"""@compute @workgroup_size({BQ})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let nq = dims.m;
    let h = wid.y;
    let hk = h / (HQ / HKV);
    let i = wid.x * BQ + li;
""")
    L.append("""    let row = dims.r1 + min(i, nq - 1u);
    let pos = dims.r0 + row;
    let nkeys = dims.r0 + dims.r1 + min(wid.x * BQ + BQ, nq);
    let qb = (row * HQ + h) * D4;
""")
    for j in range(d4):
        L.append(f"    let q{j} = q[qb + {j}u] * {scale!r};\n")
    L.append("    " + " ".join(f"var o{j} = vec4<f32>(0.0);" for j in range(d4)) + "\n")
    L.append("    var mx = -3.0e38;\n    var l = 0.0;\n")
    threads = "BQ * KT" if split else "BQ"
    L.append("    for (var kt = 0u; kt < nkeys; kt = kt + BKV) {\n"
             f"        for (var t = li; t < BKV * D4; t = t + {threads}) {{\n"
             "            let key = kt + t / D4;\n"
             "            var kv = vec4<f32>(0.0);\n            var vv = vec4<f32>(0.0);\n"
             "            if (key < nkeys) {\n"
             "                kv = k_cache[(key * HKV + hk) * D4 + t % D4];\n"
             "                vv = v_cache[(key * HKV + hk) * D4 + t % D4];\n"
             "            }\n            Ks[t] = kv;\n            Vs[t] = vv;\n        }\n"
             "        workgroupBarrier();\n"
             "        let kend = min(BKV, nkeys - kt);\n"
             + ("        for (var jj = kslot; jj < kend; jj = jj + KT) {\n" if split else
                "        for (var jj = 0u; jj < kend; jj = jj + 1u) {\n"))
    L.append("            let s = " + " + ".join(f"dot(q{j}, Ks[jj * D4 + {j}u])" for j in range(d4)) + ";\n")
    if cfg.get("LZ", 0):
        # lazy rescale: the sums are rescaled only when a key raises the maximum (rare after the first keys of
        # a row), instead of D/4 vec4 products and one exp per key
        L.append("            if (kt + jj <= pos) {\n"
                 "                if (s > mx) {\n                    let cr = exp(mx - s);\n"
                 "                    l = l * cr;\n                    mx = s;\n")
        for j in range(d4):
            L.append(f"                    o{j} = o{j} * cr;\n")
        L.append("                }\n                let p = exp(s - mx);\n                l = l + p;\n")
        for j in range(d4):
            L.append(f"                o{j} = o{j} + p * Vs[jj * D4 + {j}u];\n")
    else:
        L.append("            if (kt + jj <= pos) {\n"
                 "                let mn = max(mx, s);\n                let cr = exp(mx - mn);\n"
                 "                let p = exp(s - mn);\n                l = l * cr + p;\n                mx = mn;\n")
        for j in range(d4):
            L.append(f"                o{j} = o{j} * cr + p * Vs[jj * D4 + {j}u];\n")
    L.append("            }\n        }\n        workgroupBarrier();\n    }\n")
    if not split:
        L.append("    if (i < nq) {\n        let ob = (i * HQ + h) * D4;\n        let il = 1.0 / l;\n")
        for j in range(d4):
            L.append(f"        out[ob + {j}u] = o{j} * il;\n")
        L.append("    }\n}\n")
        return "".join(L)
    # merge the KT slices of each query: a common maximum, the summed denominators, then the output sums
    # slot by slot (KT - 1 barriers), the last slot adding its own and writing the row
    L.append("""    Ms[li] = mx;
    workgroupBarrier();
    var gm = Ms[qi];
    for (var r = 1u; r < KT; r = r + 1u) { gm = max(gm, Ms[r * BQ + qi]); }
    let f = exp(mx - gm);
    Ls[li] = l * f;
    workgroupBarrier();
    var gl = 0.0;
    for (var r = 0u; r < KT; r = r + 1u) { gl = gl + Ls[r * BQ + qi]; }
    let ob = qi * D4;
    for (var r = 0u; r < KT - 1u; r = r + 1u) {
        if (kslot == r) {
""")
    for j in range(d4):
        L.append(f"            if (r == 0u) {{ Os[ob + {j}u] = o{j} * f; }} "
                 f"else {{ Os[ob + {j}u] = Os[ob + {j}u] + o{j} * f; }}\n")
    L.append("        }\n        workgroupBarrier();\n    }\n")
    L.append("    if (kslot == KT - 1u && i < nq) {\n        let gb = (i * HQ + h) * D4;\n        let il = 1.0 / gl;\n")
    for j in range(d4):
        L.append(f"        out[gb + {j}u] = (Os[ob + {j}u] + o{j} * f) * il;\n")
    L.append("    }\n}\n")
    return "".join(L)


def attention_storage_bytes(cfg: Config | dict, d: int) -> int:
    """Workgroup memory of a config: the K and V tiles, plus the merge arrays when KT > 1."""
    kt = cfg.get("KT", 1)
    return 2 * cfg["BKV"] * d * 4 + (cfg["BQ"] * d * 4 + 2 * cfg["BQ"] * kt * 4 if kt > 1 else 0)


def attention_space(d: int = 64) -> Space:
    return Space("attention", {"BQ": [16, 32, 64, 128], "BKV": [8, 16, 32, 64], "KT": [1, 2, 4, 8], "LZ": [0, 1]}, [
        Rule("invocations", lambda c, lim: lim.max_invocations_per_workgroup >= c.BQ * c.KT,
             lambda c, lim: f"BQ*KT={c.BQ * c.KT} threads > max_invocations_per_workgroup "
                            f"{lim.max_invocations_per_workgroup}", needs_limits=True),
        Rule("slices_fill_tile", lambda c, _: c.KT <= c.BKV,
             lambda c, _: f"KT={c.KT} key slices > BKV={c.BKV} keys per tile: some threads would never see a key"),
        Rule("workgroup_storage", lambda c, lim: attention_storage_bytes(c, d) <= lim.max_workgroup_storage_bytes,
             lambda c, lim: f"K and V tiles (2*BKV*D*4) plus the KT-slice merge (BQ*D*4 + 2*BQ*KT*4) = "
                            f"{attention_storage_bytes(c, d)} bytes > max_workgroup_storage_bytes "
                            f"{lim.max_workgroup_storage_bytes}", needs_limits=True),
    ], fmt=lambda c: f"bq{c.BQ} bkv{c.BKV} kt{c.KT}" + (" lazy" if c.LZ else ""))


def attention_grid(cfg: Config | dict, nq: int, hq: int) -> tuple[int, int, int]:
    return (math.ceil(nq / cfg["BQ"]), hq, 1)



class AttentionTemplate(KernelTemplate):
    """Causal GQA attention over a KV cache; shape = (Mq, P, Hq, Hkv, D): Mq new query rows after P cached."""

    backend = "webgpu"
    problem = AttentionProblem()

    def space(self, which: str = "full") -> Space:
        return attention_space()

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        _, _, hq, hkv, d = shape
        out = []
        if d % 4:
            out.append(f"head_dim {d} is not a multiple of 4 (vec4 registers)")
        if hq % hkv:
            out.append(f"{hq} heads are not a multiple of {hkv} kv heads")
        return out

    def source(self, config: Config, shape: Shape | None = None) -> str:
        _, _, hq, hkv, d = shape or (1, 0, 4, 2, 16)
        return attention_source(config, hq, hkv, d)

    def config_of(self, values: dict[str, object]) -> Config:
        """A config from a dispatch table's values; KT and LZ default to 1 and 0 (the kernel before they existed)."""
        return self.space().config({"KT": 1, "LZ": 0, **values})

    def program_key(self, config: Config, shape: Shape) -> tuple[object, ...]:
        return (config, *shape[2:])  # queries and cached positions come in the dims uniform

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return device.compile(self.source(config, shape), "main", name=f"attention[{config}]")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, p, hq, _, d = shape
        bufs = {k: device.upload(v) for k, v in host.items()}
        bufs["dims"] = device.upload(np.array([m, p, 0, 0], np.uint32), uniform=True)
        bufs["out"] = device.allocate(4 * m * hq * d)
        return bufs

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return [Launch(program, attention_grid(config, shape[0], shape[2]), [bufs[k] for k in ATTN_BINDINGS])]


