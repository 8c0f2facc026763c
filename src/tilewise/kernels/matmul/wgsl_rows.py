"""WGSL of the short-row matmul kernel (kind `rows`) and of the split-K reduction."""

from __future__ import annotations

from typing import Any

from tilewise.kernels.matmul.wgsl import SPLITK_WG, codes_init, header, store_stmt
from tilewise.kernels.space import Config
from tilewise.kernels.wgsl import row_header


def rows_source(cfg: Config | dict[str, Any], fmt: str, epilogue: str, n: int, k: int,
                norm_eps: float | None = None) -> str:
    """WGSL of the short-row (matrix-vector style) kernel for one config and (N, K)."""
    WG, NC, RM, EL = (cfg[p] for p in ("WG", "NC", "RM", "EL"))
    TPC = WG // NC
    CH = EL // 8
    paired = epilogue == "swiglu"
    norm = norm_eps is not None
    sets = 2 if paired else 1
    nv = (sets + (1 if norm else 0)) * RM  # partial sums per thread (products, then sums of squares)
    head, _ = header(fmt, epilogue, n, k, False, norm)
    L = [head]
    L.append(f"const TPC: u32 = {TPC}u;\nconst NV: u32 = {nv}u;\n")
    L.append(f"var<workgroup> red: array<f32, {WG * nv}>;  // (NC, NV, TPC) partial sums\n")
    L.append(f"@compute @workgroup_size({WG})\n"
             "fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {\n")
    L.append(codes_init(fmt))
    L.append(f"    let M = dims.m;\n    let c = li / TPC;\n    let l = li % TPC;\n"
             f"    let n = wid.x * {NC}u + c;\n    let nn = min(n, N - 1u);\n    let m0 = wid.y * {RM}u;\n")
    for i in range(RM):
        # clamp instead of branching inside the K loop; the epilogue skips rows >= M
        L.append(f"    let x{i} = (dims.r0 + min(m0 + {i}u, M - 1u)) * (K / 4u);\n")
    for s in range(2 if paired else 1):
        L.append("    " + " ".join(f"var a{s}_{i} = 0.0;" for i in range(RM)) + "\n")
    if norm:
        L.append("    " + " ".join(f"var q{i} = 0.0;" for i in range(RM)) + "\n")
    L.append(f"    for (var c0 = l * {CH}u; c0 < K / 8u; c0 = c0 + {TPC * CH}u) {{\n")
    for q in range(CH):
        L.append(f"        let cc{q} = c0 + {q}u;\n")
        for s in range(2 if paired else 1):
            load = f"load8_{s}(nn, cc{q})"
            L.append(f"        let v{s}_{q} = {f'gnorm({load}, cc{q})' if norm else load};\n")
        for i in range(RM):
            L.append(f"        let xa{i}_{q} = x[x{i} + 2u * cc{q}];\n"
                     f"        let xb{i}_{q} = x[x{i} + 2u * cc{q} + 1u];\n")
            for s in range(2 if paired else 1):
                L.append(f"        a{s}_{i} = a{s}_{i} + dot(xa{i}_{q}, v{s}_{q}.a) + dot(xb{i}_{q}, v{s}_{q}.b);\n")
            if norm:
                L.append(f"        q{i} = q{i} + dot(xa{i}_{q}, xa{i}_{q}) + dot(xb{i}_{q}, xb{i}_{q});\n")
    L.append("    }\n")
    for s in range(2 if paired else 1):
        for i in range(RM):
            L.append(f"    red[(c * NV + {s * RM + i}u) * TPC + l] = a{s}_{i};\n")
    if norm:
        for i in range(RM):
            L.append(f"    red[(c * NV + {sets * RM + i}u) * TPC + l] = q{i};\n")
    L.append("    workgroupBarrier();\n")
    L.append("    for (var h = TPC / 2u; h > 0u; h = h / 2u) {\n        if (l < h) {\n")
    L.append("            for (var v = 0u; v < NV; v = v + 1u) {\n"
             "                let r = (c * NV + v) * TPC + l;\n"
             "                red[r] = red[r] + red[r + h];\n"
             "            }\n        }\n        workgroupBarrier();\n    }\n")
    L.append("    if (l == 0u && n < N) {\n")
    for i in range(RM):
        acc = f"red[(c * NV + {i}u) * TPC]"
        up = f"red[(c * NV + {RM + i}u) * TPC]" if paired else None
        if norm:
            ss = f"red[(c * NV + {sets * RM + i}u) * TPC]"
            L.append(f"        let rs{i} = inverseSqrt({ss} / f32(K) + {norm_eps!r});\n")
            acc = f"({acc} * rs{i})"
            up = f"({up} * rs{i})" if paired else None
        L.append(f"        if (m0 + {i}u < M) {{ {store_stmt(epilogue, f'(m0 + {i}u) * N + n', acc, up)} }}\n")
    L.append("    }\n}\n")
    return "".join(L)


def splitk_reduce_source(epilogue: str, n: int, ks: int, norm_eps: float | None = None, k: int = 0) -> str:
    """WGSL: out = epilogue(sum over the KS partial sums in `part` (KS, sets, M, N)); one thread per output.

    With `norm_eps` (a fused RMSNorm over `k` inputs) the slices' sums of squares (KS, M) follow the partial sums;
    the row's total gives rsqrt(mean(x^2) + eps), which scales the sums before the epilogue.
    """
    sets = 2 if epilogue == "swiglu" else 1
    sums = "\n".join(f"    let s{s_} = " + " + ".join(f"part[{z * sets + s_}u * MN + i]" for z in range(ks)) + ";"
                     for s_ in range(sets))
    if norm_eps is not None:
        if k <= 0:
            raise ValueError("a split-K reduce with a fused norm needs K (the inputs per row)")
        ss = " + ".join(f"part[{ks * sets}u * MN + {z}u * dims.m + row]" for z in range(ks))
        scale = "\n".join(f"    let n{s_} = s{s_} * rs;" for s_ in range(sets))
        sums += f"\n    let row = i / N;\n    let rs = inverseSqrt(({ss}) / {float(k)!r} + {norm_eps!r});\n{scale}"
        final = ("n0", "n1" if sets == 2 else None)
    else:
        final = ("s0", "s1" if sets == 2 else None)
    return f"""{row_header([("part", "f32")], [("out", "f32")])}const N: u32 = {n}u;
@compute @workgroup_size({SPLITK_WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let MN = dims.m * N;
    let i = gid.x;
    if (i >= MN) {{ return; }}
{sums}
    {store_stmt(epilogue, "i", *final)}
}}
"""
