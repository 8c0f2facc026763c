"""Causal GQA attention on subgroup matrices (Dawn's tensor cores from WGSL): kernel `attention.sgmat`, the same
problem, bindings and launch grid as `attention` (`webgpu.py`), beside which `tilewise tune model --device dawn`
measures it. It needs `--device dawn` on an adapter with f16 -> f32 fragments.

Variants:

    FRAG   fragment M x N x K, one the adapter offers for f16 -> f32 (gemm-f16's rule)
    SG     invocations per subgroup the fragments take; NSG subgroups make the workgroup (NSG * SG a multiple of the
           adapter's max subgroup size, Dawn's rule)
    BQ     query rows of one head per workgroup (a multiple of the fragment's m)
    BKV    keys per step (a multiple of the fragment's n and k)

Per workgroup: q rows scaled by 1/sqrt(D) are staged once as f16; per key step K and V are staged as f16, then

    S = Q K^T      (BQ, BKV) f32 fragments, the subgroups taking them in turn, stored to workgroup memory
    softmax        BQ rows, WG / BQ invocations each: the causal mask, the running maximum and sum (online softmax),
                   P = exp(S - max) rounded to f16
    O += P V       (BQ, D) f32 fragments of this step, stored to workgroup memory; each invocation holds D / (WG/BQ)
                   of its row's output in registers and folds them in with the step's rescale factor

Five barriers per key step. Precision: q, k, v and p are rounded to f16 once each, products accumulate in f32:
the tolerance label is `f16`. The math and the float64 reference are `problem.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from tilewise.devices.base import Device, Program
from tilewise.errors import ShaderCompileError
from tilewise.kernels.attention.webgpu import AttentionTemplate
from tilewise.kernels.base import Shape
from tilewise.kernels.gemm import sgmat as gemm_sg
from tilewise.kernels.gemm.sgmat_wgsl import frag
from tilewise.kernels.space import Config, Rule, Space
from tilewise.kernels.wgsl import row_header

PARAMS = {"FRAG": ["8x8x8", "16x8x8", "16x8x16", "16x16x16"], "SG": [8, 16, 32, 64, 128],
          "NSG": [1, 2, 4, 8, 16], "BQ": [16, 32, 64, 128], "BKV": [16, 32, 64]}
# the fastest measured at a decision's 346 queries first (records: docs/journal/dawn.md); the tuner takes the
# default, then these, then the rest of the space
DEFAULT = {"FRAG": "16x16x16", "SG": 32, "NSG": 8, "BQ": 16, "BKV": 32}
SEEDS: tuple[dict[str, object], ...] = (
    {**DEFAULT, "NSG": 16}, {**DEFAULT, "FRAG": "16x8x16"}, {**DEFAULT, "BKV": 64},
    {**DEFAULT, "NSG": 16, "BQ": 32, "BKV": 64}, {**DEFAULT, "NSG": 4, "BQ": 32},
)
D_SPACE = 64  # the head size the space's storage rule assumes; `config_problems` checks the real one


def threads(c: Config) -> int:
    return int(c["NSG"]) * int(c["SG"])


def storage_bytes(c: Config, d: int) -> int:
    """Workgroup memory: Q, K, V and P in f16; S and this step's P V in f32; two per-invocation reduction arrays."""
    bq, bkv = int(c["BQ"]), int(c["BKV"])
    return 2 * bq * d + 4 * bkv * d + 4 * bq * bkv + 2 * bq * bkv + 4 * bq * d + 8 * threads(c)


def _rules() -> list[Rule]:
    return [
        gemm_sg.rule("fragment_offered"), gemm_sg.rule("fragment_subgroup_size"),
        Rule("workgroup_x", lambda c, L: L.subgroup_size_max is None or threads(c) % L.subgroup_size_max == 0,
             lambda c, L: f"NSG*SG = {threads(c)} invocations is not a multiple of the adapter's max subgroup size "
                          f"{L.subgroup_size_max} (Dawn's rule for subgroup-matrix workgroups)", needs_limits=True),
        Rule("invocations", lambda c, L: threads(c) <= L.max_invocations_per_workgroup,
             lambda c, L: f"NSG*SG = {threads(c)} > max_invocations_per_workgroup {L.max_invocations_per_workgroup}",
             needs_limits=True),
        Rule("rows_split", lambda c, _: c.BQ % frag(c)[0] == 0 and threads(c) % c.BQ == 0,
             lambda c, _: f"BQ={c.BQ} must be a multiple of the fragment's m={frag(c)[0]} and divide the "
                          f"{threads(c)} invocations (each row's softmax takes the same number)"),
        Rule("keys_split", lambda c, _: c.BKV % frag(c)[1] == 0 and c.BKV % frag(c)[2] == 0,
             lambda c, _: f"BKV={c.BKV} must be a multiple of the fragment's n={frag(c)[1]} (S columns) and "
                          f"k={frag(c)[2]} (the K of P V)"),
        Rule("workgroup_storage", lambda c, L: storage_bytes(c, D_SPACE) <= L.max_workgroup_storage_bytes,
             lambda c, L: f"workgroup storage 2*BQ*D + 4*BKV*D + 6*BQ*BKV + 4*BQ*D + 8*NSG*SG = "
                          f"{storage_bytes(c, D_SPACE)} bytes at D={D_SPACE} > {L.max_workgroup_storage_bytes}",
             needs_limits=True),
    ]


def sgmat_attention_space() -> Space:
    return Space("attention.sgmat", {k: list(v) for k, v in PARAMS.items()}, _rules(),
                 fmt=lambda c: f"f{c.FRAG} {c.NSG}x{c.SG}sg bq{c.BQ} bkv{c.BKV}")


def sgmat_attention_source(c: Config, hq: int, hkv: int, d: int) -> str:
    """The WGSL of one config for (HQ, HKV, D); queries and cached positions come in the dims uniform."""
    m, n, k = frag(c)
    BQ, BKV, NSG, WG = int(c["BQ"]), int(c["BKV"]), int(c["NSG"]), threads(c)
    TPR = WG // BQ  # invocations per query row
    d4, OC = d // 4, d // TPR  # vec4s per row; output columns an invocation holds
    st, pt = (BQ // m) * (BKV // n), (BQ // m) * (d // n)  # S fragments, P V fragments
    head = row_header([("q", "vec4<f32>"), ("k_cache", "vec4<f32>"), ("v_cache", "vec4<f32>")],
                      [("out", "f32")])
    L = [f"""enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
// tilewise attention.sgmat: f{c['FRAG']} {NSG}x{c['SG']}sg bq{BQ} bkv{BKV}
{head}const HQ: u32 = {hq}u;
const HKV: u32 = {hkv}u;
const D: u32 = {d}u;
const D4: u32 = {d4}u;
var<workgroup> Qs: array<f16, {BQ * d}>;  // (BQ, D) q * 1/sqrt(D)
var<workgroup> Ks: array<f16, {BKV * d}>;  // (BKV, D) this step's keys
var<workgroup> Vs: array<f16, {BKV * d}>;  // (BKV, D) this step's values
var<workgroup> Ss: array<f32, {BQ * BKV}>;  // (BQ, BKV) scores
var<workgroup> Ps: array<f16, {BQ * BKV}>;  // (BQ, BKV) exp(S - max)
var<workgroup> PV: array<f32, {BQ * d}>;  // (BQ, D) this step's P V
var<workgroup> redm: array<f32, {WG}>;
var<workgroup> reds: array<f32, {WG}>;
alias Left = subgroup_matrix_left<f16, {k}, {m}>;
alias Right = subgroup_matrix_right<f16, {n}, {k}>;
alias Acc = subgroup_matrix_result<f32, {n}, {m}>;

@compute @workgroup_size({WG})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_id) sg: u32) {{
    let nq = dims.m;
    let h = wid.y;
    let hk = h / (HQ / HKV);
    let nkeys = dims.r0 + dims.r1 + min(wid.x * {BQ}u + {BQ}u, nq);  // keys any row of this workgroup sees
    let owner = sg < {NSG}u;  // subgroups past NSG (smaller subgroups than SG) own no fragments
    let s = min(sg, {NSG - 1}u);
    for (var t = li; t < {BQ * d4}u; t = t + {WG}u) {{
        let r = t / D4;
        let row = dims.r1 + min(wid.x * {BQ}u + r, nq - 1u);
        let v = vec4<f16>(q[(row * HQ + h) * D4 + t % D4] * {1.0 / math.sqrt(d)!r});
        let o = r * D + (t % D4) * 4u;
        Qs[o] = v.x; Qs[o + 1u] = v.y; Qs[o + 2u] = v.z; Qs[o + 3u] = v.w;
    }}
    let r = li / {TPR}u;  // this invocation's query row in the tile, and its share of the row
    let tq = li % {TPR}u;
    let pos = dims.r0 + dims.r1 + min(wid.x * {BQ}u + r, nq - 1u);
    var mx = -3.0e38;
    var l = 0.0;"""]
    L.append("    " + " ".join(f"var o{i} = 0.0;" for i in range(OC)))
    L.append(f"""    for (var kt = 0u; kt < nkeys; kt = kt + {BKV}u) {{
        for (var t = li; t < {BKV * d4}u; t = t + {WG}u) {{
            let key = kt + t / D4;
            var kv = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (key < nkeys) {{
                kv = k_cache[(key * HKV + hk) * D4 + t % D4];
                vv = v_cache[(key * HKV + hk) * D4 + t % D4];
            }}
            let kh = vec4<f16>(kv);
            let vh = vec4<f16>(vv);
            let o = (t / D4) * D + (t % D4) * 4u;
            Ks[o] = kh.x; Ks[o + 1u] = kh.y; Ks[o + 2u] = kh.z; Ks[o + 3u] = kh.w;
            Vs[o] = vh.x; Vs[o + 1u] = vh.y; Vs[o + 2u] = vh.z; Vs[o + 3u] = vh.w;
        }}
        workgroupBarrier();
        if (owner) {{
            for (var f = s; f < {st}u; f = f + {NSG}u) {{  // S fragment f: rows q0.., keys j0..
                let q0 = (f / {BKV // n}u) * {m}u;
                let j0 = (f % {BKV // n}u) * {n}u;
                var acc = Acc();
                for (var kk = 0u; kk < D; kk = kk + {k}u) {{
                    let a = subgroupMatrixLoad<Left, row_major>(&Qs, q0 * D + kk, D);
                    let b = subgroupMatrixLoad<Right, col_major>(&Ks, j0 * D + kk, D);
                    acc = subgroupMatrixMultiplyAccumulate(a, b, acc);
                }}
                subgroupMatrixStore<row_major>(&Ss, q0 * {BKV}u + j0, acc, {BKV}u);
            }}
        }}
        workgroupBarrier();
        var pm = -3.0e38;  // this invocation's share of the row: keys tq, tq + TPR, ...
        for (var j = tq; j < {BKV}u; j = j + {TPR}u) {{
            if (kt + j <= pos) {{ pm = max(pm, Ss[r * {BKV}u + j]); }}
        }}
        redm[li] = pm;
        workgroupBarrier();
        var mn = mx;
        for (var u = 0u; u < {TPR}u; u = u + 1u) {{ mn = max(mn, redm[r * {TPR}u + u]); }}
        let alpha = exp(mx - mn);
        var ps = 0.0;
        for (var j = tq; j < {BKV}u; j = j + {TPR}u) {{
            var p = 0.0;
            if (kt + j <= pos) {{ p = exp(Ss[r * {BKV}u + j] - mn); }}
            let ph = f16(p);
            Ps[r * {BKV}u + j] = ph;
            ps = ps + f32(ph);
        }}
        reds[li] = ps;
        mx = mn;
        workgroupBarrier();
        var sum = 0.0;
        for (var u = 0u; u < {TPR}u; u = u + 1u) {{ sum = sum + reds[r * {TPR}u + u]; }}
        l = l * alpha + sum;
        if (owner) {{
            for (var f = s; f < {pt}u; f = f + {NSG}u) {{  // P V fragment f: rows q0.., columns c0..
                let q0 = (f / {d // n}u) * {m}u;
                let c0 = (f % {d // n}u) * {n}u;
                var acc = Acc();
                for (var kk = 0u; kk < {BKV}u; kk = kk + {k}u) {{
                    let a = subgroupMatrixLoad<Left, row_major>(&Ps, q0 * {BKV}u + kk, {BKV}u);
                    let b = subgroupMatrixLoad<Right, row_major>(&Vs, kk * D + c0, D);
                    acc = subgroupMatrixMultiplyAccumulate(a, b, acc);
                }}
                subgroupMatrixStore<row_major>(&PV, q0 * D + c0, acc, D);
            }}
        }}
        workgroupBarrier();""")
    for i in range(OC):
        L.append(f"        o{i} = o{i} * alpha + PV[r * D + tq + {i * TPR}u];")
    L.append("    }")
    L.append(f"    let i = wid.x * {BQ}u + r;\n    if (i < nq) {{\n        let ob = (i * HQ + h) * D;\n"
             "        let il = 1.0 / l;")
    for i in range(OC):
        L.append(f"        out[ob + tq + {i * TPR}u] = o{i} * il;")
    L.append("    }\n}")
    return "\n".join(L) + "\n"


class SgmatAttention(AttentionTemplate):
    """`AttentionTemplate` with the subgroup-matrix kernel (see the module docstring); same bindings and grid."""

    prefer_runtime = "dawn"

    def __init__(self, features: Iterable[str] | None = ()) -> None:
        self.features = None if features is None else frozenset(features)
        self.name = "attention.sgmat"
        self.dtype = "f16"

    def space(self, which: str = "full") -> Space:
        return sgmat_attention_space()

    def default_config(self) -> Config:
        return self.space().config(DEFAULT)

    def config_of(self, values: dict[str, object]) -> Config:
        return self.space().config(dict(values))

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        d = shape[4]
        _, n, k = frag(config)
        tpr = threads(config) // int(config["BQ"])
        out = super().config_problems(config, shape)
        if d % k or d % n or d % tpr:
            out.append(f"head_dim {d} is not a multiple of the fragment's k={k} and n={n} and of the {tpr} "
                       "invocations per row")
        return out

    def source(self, config: Config, shape: Shape | None = None) -> str:
        _, _, hq, hkv, d = shape or (1, 0, 4, 2, 64)
        return sgmat_attention_source(config, hq, hkv, d)

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        gemm_sg.require_subgroup_matrices(device, self.name)
        if storage_bytes(config, shape[4]) > device.info.limits.max_workgroup_storage_bytes:
            raise ShaderCompileError(f"{self.name}: {storage_bytes(config, shape[4])} bytes of workgroup storage at "
                                     f"D={shape[4]}", "pick a smaller BQ or BKV")
        return device.compile(self.source(config, shape), "main", name=f"{self.name}[{config}]")
