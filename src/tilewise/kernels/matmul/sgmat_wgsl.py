"""The WGSL of one subgroup-matrix matmul config (parameters and rules in `tilewise.kernels.matmul.sgmat`):
y (M, N) f32 = epilogue(norm(x) (M, K) f32 @ W^T), W (N, K) nf4 / f16 / f32, on Dawn's subgroup matrices.

One K loop; every operand goes through workgroup memory, so no subgroup-matrix load or store touches a storage
buffer (Dawn sizes storage bindings from the fragments loaded through them; the executor binds slices of larger
activation buffers and a one-row output):

    per K step   the workgroup copies its (BM, BK) x tile into `Xs` as f16 (rows past M are zeros; a fused norm
                 multiplies by the norm weight first and keeps each slot's f32 sum of squares in a register), and
                 decodes its (BN, BK) weight tile(s) ONCE into `Ws0` (`Ws1`: the up weights) as f16: WL "nk"
                 keeps W's own (BN, BK) row-major layout and loads the right operand `col_major`; WL "kn" stores
                 it transposed (BK, BN) and loads it `row_major`; then each subgroup multiply-accumulates its
                 FM x FN fragments (f32) from workgroup memory; how the tiles are staged (through registers,
                 pipelined, 8 halves a store) is `sgmat_stage`
    epilogue     EP fragments at a time, every subgroup stores its result fragments (and the up fragments) into
                 `Cs`, and the whole workgroup writes them to `out`, guarded by M and N, applying
                 rsqrt(mean(x^2) + eps) (norm) and the epilogue (none, residual: out += y, swiglu: silu(g) * u)
    split-K      with KS > 1, grid z = KS slices of K/KS each; `out` is then the FMA split-K kernel's scratch:
                 the raw sums (KS, sets, M, N), then (norm) each slice's per-row sums of squares (KS, M), and
                 `wgsl_rows.splitk_reduce_source` adds the slices and applies the norm and the epilogue

Fragment offsets derive from the workgroup id, the subgroup id and constants only (the builtins need
subgroup-uniform arguments); subgroups beyond SM * SN (smaller subgroups than SG) stage tiles but own no fragment.
"""

from __future__ import annotations

from tilewise.kernels.gemm.sgmat_wgsl import frag, invocations, subgroups
from tilewise.kernels.matmul.sgmat_stage import mm_tile, slot_loop, tile_buffers, x_slots
from tilewise.kernels.matmul.wgsl import codes_decl, codes_init, load8_fn, store_stmt, weight_decls
from tilewise.kernels.space import Config
from tilewise.kernels.wgsl import ROW_DIMS

WEIGHT_LAYOUTS = ("nk", "kn")


def mm_storage_bytes(c: Config, fmt: str, paired: bool, norm: bool) -> int:
    """Workgroup memory: x and weight tiles (f16), one (or two) f32 result fragments per subgroup, the NF4 codes,
    the norm's per-slot sums of squares."""
    m, n, _ = frag(c)
    bm, bn, bk = mm_tile(c)
    sets = 2 if paired else 1
    pad = int(c.get("PAD", 0))
    w_tile = bn * (bk + pad) if c["WL"] == "nk" else bk * (bn + pad)
    pipe = tile_buffers(c)
    return (pipe * (2 * bm * (bk + pad) + 2 * sets * w_tile) + 4 * sets * subgroups(c) * m * n * int(c.get("EP", 1))
            + (64 if fmt == "nf4" else 0) + (bm * bk if norm else 0))


def mm_fmt(c: Config) -> str:
    """`f16x16x16 2x2sg 2x2fr k32 W:nk sg32 pipe2 pad8 splitk4 vs ep2` (fragment, subgroups, fragments per subgroup,
    K step, W layout, subgroup size, pipelining, row padding, K slices, packed stores and epilogue batch where set)."""
    ks, pad, pipe = int(c.get("KS", 1)), int(c.get("PAD", 0)), int(c.get("PIPE", 1))
    return (f"f{c['FRAG']} {c['SM']}x{c['SN']}sg {c['FM']}x{c['FN']}fr k{c['BK']} W:{c['WL']} sg{c['SG']}"
            + (f" pipe{pipe}" if pipe > 1 else "") + (f" pad{pad}" if pad else "") + (f" splitk{ks}" if ks > 1 else "")
            + (" vs" if int(c.get("VS", 0)) else "") + (f" ep{c['EP']}" if int(c.get("EP", 1)) > 1 else ""))


def sgmat_matmul_source(c: Config, fmt: str, epilogue: str, n_out: int, k_in: int,
                        norm_eps: float | None = None) -> str:
    """The WGSL of one config for (N, K) = (`n_out`, `k_in`); `norm_eps` fuses an RMSNorm of x."""
    m, n, k = frag(c)
    BM, BN, BK = mm_tile(c)
    FM, FN, SN = int(c["FM"]), int(c["FN"]), int(c["SN"])
    NSG, WG = subgroups(c), invocations(c)
    wl = str(c["WL"])
    if wl not in WEIGHT_LAYOUTS or BK % k or BK % 8:
        raise ValueError(f"WL={wl!r} BK={BK}: WL is one of {WEIGHT_LAYOUTS}, BK a multiple of 8 and of k={k}")
    norm = norm_eps is not None
    sets = 2 if epilogue == "swiglu" else 1
    mn, XV, WC = m * n, BM * BK // 4, BN * BK // 8
    KS = int(c.get("KS", 1))
    PAD = int(c.get("PAD", 0))
    PIPE = int(c.get("PIPE", 1))
    VS = int(c.get("VS", 0))
    U = 8 if VS else 1  # halves per element of the staged arrays (VS = 1: `vec4<u32>`, offsets in those units)
    if VS and PAD % 8:
        raise ValueError(f"VS=1 needs PAD a multiple of 8 (got {PAD}): staged rows are whole vec4<u32>s")
    LX = BK + PAD  # halves between staged x rows (and W rows of layout nk); PAD moves rows across banks
    LW = (BK if wl == "nk" else BN) + PAD
    if k_in % (KS * BK):
        raise ValueError(f"K={k_in} is not a multiple of KS*BK = {KS}*{BK}")
    L: list[str] = []
    w = L.append
    w("enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;")
    w(f"// tilewise {fmt}_matmul.sgmat.{epilogue}{'.norm' if norm else ''}: {mm_fmt(c)}; block tile {BM}x{BN}x{BK}")
    w(f"const N: u32 = {n_out}u;\nconst K: u32 = {k_in}u;")
    w("struct C8 { a: vec4<f32>, b: vec4<f32> }")
    w(ROW_DIMS.rstrip("\n"))
    w("@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;  // (r0 + M, K)")
    nb = 2
    if norm:
        w("@group(0) @binding(2) var<storage, read> norm_w: array<vec4<f32>>;  // (K,)")
        nb = 3
    for s in range(sets):
        decl, nb = weight_decls(fmt, s, nb)
        w(decl.rstrip("\n"))
    w(f"@group(0) @binding({nb}) var<storage, read_write> out: array<f32>;  // " +
      ("(M, N)" if KS == 1 else f"the split-K scratch: ({KS}, {sets}, M, N) sums" + (f", ({KS}, M) sums of squares"
                                                                                  if norm else "")))
    if fmt == "nf4":
        w(codes_decl().rstrip("\n"))
    for s in range(sets):
        w(load8_fn(fmt, s).strip("\n"))
    XB, WB = BM * LX, (BN if wl == "nk" else BK) * LW  # halves of one staged x / W tile
    two = ", two of them (PIPE=2: the next step is stored into one while the other is multiplied)" if PIPE == 2 else ""
    if PIPE == 3:
        two = ", two of them (PIPE=3: a step is stored into one while the other is multiplied, loaded two steps ahead)"
    NBUF = tile_buffers(c)
    et = "vec4<u32>" if VS else "f16"  # VS = 1: 8 halves a store (an element), offsets and strides in elements
    w(f"var<workgroup> Xs: array<{et}, {NBUF * XB // U}>;  // (BM, BK) x tile" + (f", rows {LX} apart" if PAD else "")
      + two + (", 8 halves an element" if VS else ""))
    for s in range(sets):
        what = "(BN, BK), as W" if wl == "nk" else "(BK, BN), W transposed"
        w(f"var<workgroup> Ws{s}: array<{et}, {NBUF * WB // U}>;  // {what}" + (f", rows {LW} apart" if PAD else "")
          + two)
    if VS:
        w("fn pack8(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> {  // 8 values as f16, in order, in one vec4<u32>")
        w("    return vec4<u32>(bitcast<vec2<u32>>(vec4<f16>(a)), bitcast<vec2<u32>>(vec4<f16>(b)));\n}")
        if wl == "kn":
            w("fn pack2(a: f32, b: f32) -> u32 { return bitcast<u32>(vec2<f16>(vec2<f32>(a, b))); }")
    EP = int(c.get("EP", 1))  # result fragments per subgroup (and set) through Cs between two barriers
    CE = EP * NSG * mn  # floats of Cs per set
    w(f"var<workgroup> Cs: array<f32, {sets * CE}>;  // " + (f"{EP} ({m}, {n}) fragments" if EP > 1 else
                                                             f"one ({m}, {n}) fragment") + " per subgroup (per set)")
    if norm:
        w(f"var<workgroup> rss: array<f32, {XV}>;  // per-slot sums of squares, then row totals at r * {BK // 4}")
    w(f"alias Left = subgroup_matrix_left<f16, {k}, {m}>;")
    w(f"alias Right = subgroup_matrix_right<f16, {n}, {k}>;")
    w(f"alias Acc = subgroup_matrix_result<f32, {n}, {m}>;")
    w("")
    w(f"@compute @workgroup_size({WG})")
    w("fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,")
    w("        @builtin(subgroup_id) sg: u32) {")
    if fmt == "nf4":
        w(codes_init(fmt).rstrip("\n"))
    w(f"    let M = dims.m;\n    let m0 = wid.y * {BM}u;\n    let n0 = wid.x * {BN}u;")
    w(f"    let owner = sg < {NSG}u;  // subgroups past SM*SN (smaller subgroups than SG) own no fragments")
    w(f"    let s = min(sg, {NSG - 1}u);")
    w(f"    let r0 = (s / {SN}u) * {FM * m}u;\n    let c0 = (s % {SN}u) * {FN * n}u;  // the subgroup's corner")
    for s in range(sets):
        for i in range(FM):
            w("    " + " ".join(f"var acc{s}_{i}_{j} = Acc();" for j in range(FN)))
    nxs = x_slots(c)
    if norm and not VS:  # slot l of this invocation is the same (row, k quarter) every K step: its sum stays in a
        for sl in range(nxs):  # register
            w(f"    let xi{sl} = li + {sl * WG}u; let xr{sl} = xi{sl} / {BK // 4}u; let xq{sl} = xi{sl} % {BK // 4}u;"
              f" var ss{sl} = 0.0;")

    def mma(ind: str, xo: str, wo: str) -> None:
        """The step's multiply-accumulates from the staged tiles (`xo`, `wo`: a buffer's offset term, or "")."""
        w(f"{ind}if (owner) {{")
        for kf in range(BK // k):
            for i in range(FM):
                w(f"{ind}    let a{kf}_{i} = subgroupMatrixLoad<Left, row_major>(&Xs, {xo}(r0 + {i * m}u) * "
                  f"{LX // U}u + {kf * k // U}u, {LX // U}u);")
            for s in range(sets):
                for j in range(FN):
                    if wl == "nk":
                        load = (f"subgroupMatrixLoad<Right, col_major>(&Ws{s}, {wo}(c0 + {j * n}u) * {LW // U}u + "
                                f"{kf * k // U}u, {LW // U}u)")
                    elif VS:
                        load = (f"subgroupMatrixLoad<Right, row_major>(&Ws{s}, {wo}{kf * k * LW // U}u + (c0 + "
                                f"{j * n}u) / 8u, {LW // U}u)")
                    else:
                        load = (f"subgroupMatrixLoad<Right, row_major>(&Ws{s}, {wo}{kf * k * LW}u + c0 + {j * n}u, "
                                f"{LW}u)")
                    w(f"{ind}    let b{s}_{kf}_{j} = {load};")
            for s in range(sets):
                for i in range(FM):
                    for j in range(FN):
                        w(f"{ind}    acc{s}_{i}_{j} = subgroupMatrixMultiplyAccumulate(a{kf}_{i}, b{s}_{kf}_{j}, "
                          f"acc{s}_{i}_{j});")
        w(f"{ind}}}")

    kbeg, kend = ("0u", "K") if KS == 1 else ("kz", f"kz + {k_in // KS}u")  # this launch's K range
    if KS > 1:
        w(f"    let kz = wid.z * {k_in // KS}u;  // this launch's slice of K")
    if PIPE > 1 or VS:
        slot_loop(w, mma, c, norm, sets, k_in, kbeg, kend, XB, WB, LX, LW)
    else:
        w(f"    for (var k0 = {kbeg}; k0 < {kend}; k0 = k0 + {BK}u) {{")

        def x_store(ind: str, r: str, q: str, v: str) -> None:
            w(f"{ind}let h = vec4<f16>({v});")
            w(f"{ind}let o = {r} * {LX}u + {q} * 4u;")
            w(f"{ind}Xs[o] = h.x; Xs[o + 1u] = h.y; Xs[o + 2u] = h.z; Xs[o + 3u] = h.w;")

        if norm:
            for sl in range(nxs):
                guarded = (sl + 1) * WG > XV
                ind = "            " if guarded else "        "
                if guarded:
                    w(f"        if (xi{sl} < {XV}u) {{")
                w(f"{ind}var v{sl} = vec4<f32>(0.0);")
                w(f"{ind}if (m0 + xr{sl} < M) {{ v{sl} = x[(dims.r0 + m0 + xr{sl}) * {k_in // 4}u + k0 / 4u + "
                  f"xq{sl}]; }}")
                w(f"{ind}ss{sl} = ss{sl} + dot(v{sl}, v{sl});")
                w(f"{ind}{{")
                x_store(ind + "    ", f"xr{sl}", f"xq{sl}", f"v{sl} * norm_w[k0 / 4u + xq{sl}]")
                w(f"{ind}}}")
                if guarded:
                    w("        }")
        else:
            w(f"        for (var i = li; i < {XV}u; i = i + {WG}u) {{")
            w(f"            let r = i / {BK // 4}u; let q = i % {BK // 4}u;")
            w("            var v = vec4<f32>(0.0);")
            w(f"            if (m0 + r < M) {{ v = x[(dims.r0 + m0 + r) * {k_in // 4}u + k0 / 4u + q]; }}")
            x_store("            ", "r", "q", "v")
            w("        }")
        # weights: one chunk of 8 along K per step of an invocation, decoded once for the whole workgroup; columns
        # past N read row N-1 (finite values in output columns that are never stored)
        w(f"        for (var i = li; i < {WC}u; i = i + {WG}u) {{")
        w(f"            let nl = i / {BK // 8}u; let cl = i % {BK // 8}u;")
        w("            let row = min(n0 + nl, N - 1u);")
        for s in range(sets):
            w(f"            let v{s} = load8_{s}(row, k0 / 8u + cl);")
            for e in range(8):
                comp = ("a", "b")[e // 4] + "." + "xyzw"[e % 4]
                idx = f"nl * {LW}u + cl * 8u + {e}u" if wl == "nk" else f"(cl * 8u + {e}u) * {LW}u + nl"
                w(f"            Ws{s}[{idx}] = f16(v{s}.{comp});")
        w("        }")
        w("        workgroupBarrier();")
        mma("        ", "", "")
        w("        workgroupBarrier();  // the tiles are overwritten by the next step")
        w("    }")
    if norm:  # each row's BK/4 slot sums are added once (one invocation per row), total at rss[r * BK/4]
        for sl in range(nxs):  # VS = 1: a slot's two vec4s keep their own sums, at the two places VS = 0 uses
            st = f"rss[2u * xi{sl}] = ss{sl}; rss[2u * xi{sl} + 1u] = tt{sl};" if VS else f"rss[xi{sl}] = ss{sl};"
            w(f"    if (xi{sl} < {XV // (2 if VS else 1)}u) {{ {st} }}" if (sl + 1) * WG > XV // (2 if VS else 1)
              else f"    {st}")
        w("    workgroupBarrier();")
        w(f"    for (var r = li; r < {BM}u; r = r + {WG}u) {{")
        w(f"        var q = 0.0;\n        for (var cq = 0u; cq < {BK // 4}u; cq = cq + 1u) {{ q = q + rss[r * "
          f"{BK // 4}u + cq]; }}\n        rss[r * {BK // 4}u] = q;")
        if KS > 1:  # this slice's sums of squares, after the (KS, sets, M, N) sums
            w(f"        if (m0 + r < M) {{ out[{KS * sets}u * M * N + wid.z * M + m0 + r] = q; }}")
        w("    }")
        w("    workgroupBarrier();")
    for i in range(FM):
        for j in range(0, FN, EP):  # fragments j .. j + EP - 1 of row i, through Cs at once
            w("    if (owner) {")
            for s in range(sets):
                for jj in range(EP):
                    w(f"        subgroupMatrixStore<row_major>(&Cs, {s * CE + jj * NSG * mn}u + s * {mn}u, "
                      f"acc{s}_{i}_{j + jj}, {n}u);")
            w("    }")
            w("    workgroupBarrier();")
            w(f"    for (var e = li; e < {CE}u; e = e + {WG}u) {{")
            if EP == 1:
                w(f"        let t = e / {mn}u; let fe = e % {mn}u;")
                col = f"{j * n}u"
            else:
                w(f"        let jj = e / {NSG * mn}u; let t = (e / {mn}u) % {NSG}u; let fe = e % {mn}u;")
                col = f"({j}u + jj) * {n}u"
            w(f"        let lr = (t / {SN}u) * {FM * m}u + {i * m}u + fe / {n}u;")
            w(f"        let gr = m0 + lr; let gc = n0 + (t % {SN}u) * {FN * n}u + {col} + fe % {n}u;")
            w("        if (gr < M && gc < N) {")
            if KS > 1:  # raw sums of this slice; the reduce scales and applies the epilogue
                for s in range(sets):
                    w(f"            out[(wid.z * {sets}u + {s}u) * M * N + gr * N + gc] = Cs[{s * CE}u + e];")
                w("        }")
                w("    }")
                w("    workgroupBarrier();")
                continue
            w("            var y = Cs[e];")
            if sets == 2:
                w(f"            var u = Cs[{CE}u + e];")
            if norm:
                w(f"            let rs = inverseSqrt(rss[lr * {BK // 4}u] / f32(K) + {norm_eps!r});")
                w("            y = y * rs;" + (" u = u * rs;" if sets == 2 else ""))
            w("            " + store_stmt(epilogue, "gr * N + gc", "y", "u" if sets == 2 else None))
            w("        }")
            w("    }")
            w("    workgroupBarrier();")
    w("}")
    return "\n".join(L) + "\n"
