"""The WGSL of one `gemm-f16` config (parameters and rules in `tilewise.kernels.gemm.sgmat`): C (M, N) f32 =
A (M, K) f16 @ B (K, N) f16 with Dawn's subgroup matrices, M, N, K from a uniform.

Two K loops per shader, chosen per workgroup by a workgroup-uniform flag `fast` (the block tile lies inside C, K is
a whole number of K steps, and K and N are multiples of 8 so every fragment row starts 16-byte aligned):

    fast   operands staged "workgroup" are copied unguarded, 4 halves per load; "direct" ones are loaded as
           fragments straight from storage; results are stored straight to C
    edge   both operands are copied into workgroup memory with guards (zeros past M, N and K), fragments come from
           there; each result fragment goes through a per-subgroup scratch tile and is copied out with guards

so no load or store ever touches memory past a tensor. Fragment offsets derive from the workgroup id, the subgroup
id and uniform sizes only (the subgroup-matrix builtins need subgroup-uniform arguments). Subgroups beyond SM * SN
(an adapter whose subgroups are smaller than SG) copy tiles and meet the barriers but own no fragments.
"""

from __future__ import annotations

from tilewise.kernels.space import Config


def frag(c: Config) -> tuple[int, int, int]:
    """(m, n, k) of the config's fragment (`FRAG` is written M x N x K)."""
    m, n, k = (int(x) for x in str(c["FRAG"]).split("x"))
    return m, n, k


def tile(c: Config) -> tuple[int, int, int]:
    """The block tile (BM, BN, BK) one workgroup computes per K step."""
    m, n, k = frag(c)
    return c["SM"] * c["FM"] * m, c["SN"] * c["FN"] * n, c["KF"] * k


def subgroups(c: Config) -> int:
    return int(c["SM"] * c["SN"])


def invocations(c: Config) -> int:
    """The workgroup's x size: SM * SN subgroups of SG invocations."""
    return subgroups(c) * int(c["SG"])


def storage_bytes(c: Config) -> int:
    """Workgroup memory: the A and B tiles (f16; every shader has the edge path) and one f32 fragment per subgroup."""
    m, n, _ = frag(c)
    bm, bn, bk = tile(c)
    return 2 * (bm * bk + bk * bn) + 4 * subgroups(c) * m * n


def fmt(c: Config) -> str:
    """`f16x16x16 2x2sg 4x4fr k32 A:dir B:wg sg32` (fragment, subgroups, fragments per subgroup, K step, staging)."""
    short = {"direct": "dir", "workgroup": "wg"}
    _, _, bk = tile(c)
    return (f"f{c['FRAG']} {c['SM']}x{c['SN']}sg {c['FM']}x{c['FN']}fr k{bk} A:{short[c['SA']]} "
            f"B:{short[c['SB']]} sg{c['SG']}")


def _copy(name: str, src: str, rows: int, cols: int, wg: int, guarded: bool, vec: bool) -> list[str]:
    """A helper that copies a (rows, cols) tile of `src` at (r0, c0) into workgroup array `name` (row-major)."""
    ld = "dims.K" if src == "A" else "dims.N"
    nrows = "dims.M" if src == "A" else "dims.K"
    out = [f"fn copy_{name}_{'edge' if guarded else 'fast'}(tid: u32, r0: u32, c0: u32) {{"]
    if vec:  # fast path: cols, c0 and the leading dimension are multiples of 4 (of 8, in fact)
        q = cols // 4
        out += [f"  for (var i = tid; i < {rows * q}u; i += {wg}u) {{",
                f"    let r = i / {q}u; let c = (i % {q}u) * 4u;",
                f"    let v = {src}4[((r0 + r) * {ld} + c0 + c) / 4u];",
                f"    let o = r * {cols}u + c;",
                f"    {name}[o] = v.x; {name}[o + 1u] = v.y; {name}[o + 2u] = v.z; {name}[o + 3u] = v.w;",
                "  }", "}"]
        return out
    out += [f"  for (var i = tid; i < {rows * cols}u; i += {wg}u) {{",
            f"    let r = i / {cols}u; let c = i % {cols}u;"]
    if guarded:
        out += ["    var v = f16(0.0);",
                f"    if (r0 + r < {nrows} && c0 + c < {ld}) {{ v = {src}[(r0 + r) * {ld} + c0 + c]; }}",
                f"    {name}[i] = v;"]
    else:
        out += [f"    {name}[i] = {src}[(r0 + r) * {ld} + c0 + c];"]
    return [*out, "  }", "}"]


def generate_wgsl(c: Config) -> str:
    """The WGSL of one config (readable; fragments unrolled into named variables)."""
    m, n, k = frag(c)
    BM, BN, BK = tile(c)
    FM, FN, KF, SN = c["FM"], c["FN"], c["KF"], c["SN"]
    NSG, WG = subgroups(c), invocations(c)
    sa, sb = c["SA"] == "workgroup", c["SB"] == "workgroup"
    out: list[str] = []
    w = out.append
    w("enable f16;")
    w("enable subgroups;")
    w("enable chromium_experimental_subgroup_matrix;")
    w(f"// tilewise gemm-f16: {fmt(c)}")
    w(f"// C (M, N) f32 = A (M, K) f16 @ B (K, N) f16, row-major; block tile {BM}x{BN}x{BK}, fragments {m}x{n}x{k}")
    w("struct Dims { M: u32, N: u32, K: u32, pad: u32 }")
    w("@group(0) @binding(0) var<storage, read> A: array<f16>;  // (M, K)")
    w("@group(0) @binding(1) var<storage, read> B: array<f16>;  // (K, N)")
    w("@group(0) @binding(2) var<storage, read_write> C: array<f32>;  // (M, N)")
    w("@group(0) @binding(3) var<uniform> dims: Dims;")
    binding = 4
    if sa:
        w(f"@group(0) @binding({binding}) var<storage, read> A4: array<vec4<f16>>;  // A again, 4 halves a load")
        binding += 1
    if sb:
        w(f"@group(0) @binding({binding}) var<storage, read> B4: array<vec4<f16>>;  // B again")
    w(f"var<workgroup> As: array<f16, {BM * BK}>;  // (BM, BK)")
    w(f"var<workgroup> Bs: array<f16, {BK * BN}>;  // (BK, BN)")
    w(f"var<workgroup> Cs: array<f32, {NSG * m * n}>;  // one ({m}, {n}) result fragment per subgroup (edge tiles)")
    w(f"alias Left = subgroup_matrix_left<f16, {k}, {m}>;")
    w(f"alias Right = subgroup_matrix_right<f16, {n}, {k}>;")
    w(f"alias Acc = subgroup_matrix_result<f32, {n}, {m}>;")
    w("")
    out += _copy("As", "A", BM, BK, WG, True, False)
    out += _copy("Bs", "B", BK, BN, WG, True, False)
    if sa:
        out += _copy("As", "A", BM, BK, WG, False, True)
    if sb:
        out += _copy("Bs", "B", BK, BN, WG, False, True)
    w("")
    w(f"@compute @workgroup_size({WG})")
    w("fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>,")
    w("        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32,")
    w("        @builtin(subgroup_size) sg_size: u32) {")
    w("  let M = dims.M; let N = dims.N; let K = dims.K;")
    w(f"  let bm0 = wg.y * {BM}u; let bn0 = wg.x * {BN}u;")
    w(f"  let owner = sg < {NSG}u;  // subgroups past SM*SN (smaller subgroups than SG) own no fragments")
    w(f"  let s = min(sg, {NSG - 1}u);")
    w(f"  let r0 = (s / {SN}u) * {FM * m}u; let c0 = (s % {SN}u) * {FN * n}u;  // the subgroup's corner in the tile")
    for i in range(FM):
        for j in range(FN):
            w(f"  var acc_{i}_{j} = Acc();")
    w(f"  let fast = bm0 + {BM}u <= M && bn0 + {BN}u <= N && K % {BK}u == 0u && K % 8u == 0u && N % 8u == 0u;")

    def k_step(fast: bool) -> None:
        stage_a, stage_b = (sa, sb) if fast else (True, True)
        kind = "fast" if fast else "edge"
        if stage_a:
            w(f"      copy_As_{kind}(tid, bm0, k0);")
        if stage_b:
            w(f"      copy_Bs_{kind}(tid, k0, bn0);")
        if stage_a or stage_b:
            w("      workgroupBarrier();")
        w("      if (owner) {")
        for kf in range(KF):
            for i in range(FM):
                if stage_a:
                    off, ptr, ld = f"(r0 + {i * m}u) * {BK}u + {kf * k}u", "&As", f"{BK}u"
                else:
                    off, ptr, ld = f"(bm0 + r0 + {i * m}u) * K + k0 + {kf * k}u", "&A", "K"
                w(f"        let a{kf}_{i} = subgroupMatrixLoad<Left, row_major>({ptr}, {off}, {ld});")
            for j in range(FN):
                if stage_b:
                    off, ptr, ld = f"{kf * k * BN}u + c0 + {j * n}u", "&Bs", f"{BN}u"
                else:
                    off, ptr, ld = f"(k0 + {kf * k}u) * N + bn0 + c0 + {j * n}u", "&B", "N"
                w(f"        let b{kf}_{j} = subgroupMatrixLoad<Right, row_major>({ptr}, {off}, {ld});")
            for i in range(FM):
                for j in range(FN):
                    w(f"        acc_{i}_{j} = subgroupMatrixMultiplyAccumulate(a{kf}_{i}, b{kf}_{j}, acc_{i}_{j});")
        w("      }")
        if stage_a or stage_b:
            w("      workgroupBarrier();  // the tiles are overwritten by the next step")

    w("  if (fast) {")
    w(f"    for (var k0 = 0u; k0 < K; k0 += {BK}u) {{")
    k_step(True)
    w("    }")
    w("    if (owner) {")
    for i in range(FM):
        for j in range(FN):
            w(f"      subgroupMatrixStore<row_major>(&C, (bm0 + r0 + {i * m}u) * N + bn0 + c0 + {j * n}u, "
              f"acc_{i}_{j}, N);")
    w("    }")
    w("  } else {")
    w(f"    for (var k0 = 0u; k0 < K; k0 += {BK}u) {{")
    k_step(False)
    w("    }")
    for i in range(FM):
        for j in range(FN):
            w(f"    if (owner) {{ subgroupMatrixStore<row_major>(&Cs, s * {m * n}u, acc_{i}_{j}, {n}u); }}")
            w("    workgroupBarrier();")
            w("    if (owner) {")
            w(f"      for (var e = lane; e < {m * n}u; e += sg_size) {{")
            w(f"        let gr = bm0 + r0 + {i * m}u + e / {n}u; let gc = bn0 + c0 + {j * n}u + e % {n}u;")
            w(f"        if (gr < M && gc < N) {{ C[gr * N + gc] = Cs[s * {m * n}u + e]; }}")
            w("      }")
            w("    }")
            w("    workgroupBarrier();")
    w("  }")
    w("}")
    return "\n".join(out) + "\n"
