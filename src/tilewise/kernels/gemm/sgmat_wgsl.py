"""The WGSL of one `gemm-f16` config (parameters and rules in `tilewise.kernels.gemm.sgmat`): C (M, N) f32 =
A (M, K) f16 @ B (K, N) f16 with Dawn's subgroup matrices, M, N, K from a uniform.

Two K loops per shader, chosen per workgroup by a workgroup-uniform flag `fast` (the block tile lies inside C, K is
a whole number of K steps, and K and N are multiples of 8 so every fragment row starts 16-byte aligned):

    fast   operands staged "workgroup" are copied unguarded, 4 halves per load; "direct" ones are loaded as
           fragments straight from storage; results are stored straight to C
    edge   both operands are copied into workgroup memory with guards (zeros past M, N and K), fragments come from
           there; each result fragment goes through a per-subgroup scratch tile and is copied out with guards

so no load or store ever touches memory past a tensor. Interior tiles of `PIPE` = 2 configs double-buffer their
staged operands: each invocation loads its share of the next K step into registers (8 halves a load, `vec4<u32>`)
before the current step's multiplies, stores it into the other half of the workgroup tile after them, and one barrier
ends the step; `PIPE` = 3 issues each step's loads two steps ahead (two register sets, the same two halves of
workgroup memory). `PAD` halves of padding per staged row (interior tiles) move rows across banks. `SPLITK` > 1 runs
grid z over whole-K-step slices of K, each storing its sums to slice z of a (SPLITK, M, N) f32 partial buffer; a
second module (`reduce_wgsl`) adds the slices into C. Fragment offsets derive from the workgroup id, the subgroup
id and uniform sizes only (the subgroup-matrix builtins need subgroup-uniform arguments). Subgroups beyond SM * SN
(an adapter whose subgroups are smaller than SG) copy tiles and meet the barriers but own no fragments.
"""

from __future__ import annotations

from tilewise.kernels.space import Config

LEGACY = {"PIPE": 1, "PAD": 0, "SPLITK": 1, "VS": 0}  # the values that generate the WGSL of configs made before them


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


def staged(c: Config) -> tuple[bool, bool]:
    """Whether interior tiles stage A and B through workgroup memory."""
    return c["SA"] == "workgroup", c["SB"] == "workgroup"


def strides(c: Config) -> tuple[int, int]:
    """Row strides (halves) of the A and B workgroup tiles on interior tiles: padded where staged."""
    _, bn, bk = tile(c)
    sa, sb = staged(c)
    return bk + (c["PAD"] if sa else 0), bn + (c["PAD"] if sb else 0)


def tile_halves(c: Config) -> tuple[int, int]:
    """Halves of the As and Bs workgroup arrays: the edge loop's unpadded tile, or PIPE padded interior tiles."""
    bm, bn, bk = tile(c)
    lda, ldb = strides(c)
    sa, sb = staged(c)
    bufs = min(int(c["PIPE"]), 2)  # PIPE 3 alternates between PIPE 2's two halves
    return (max(bm * bk, bufs * bm * lda) if sa else bm * bk,
            max(bk * bn, bufs * bk * ldb) if sb else bk * bn)


def storage_bytes(c: Config) -> int:
    """Workgroup memory: the A and B tiles (f16; every shader has the edge path) and one f32 fragment per subgroup."""
    m, n, _ = frag(c)
    return 2 * sum(tile_halves(c)) + 4 * subgroups(c) * m * n


def prefetch_loads(c: Config) -> tuple[int, int]:
    """`vec4<u32>` registers per invocation holding one loaded K step of A and B (PIPE 2 and 3, staged operands;
    PIPE 3 holds two such steps)."""
    if c["PIPE"] == 1:
        return 0, 0
    bm, bn, bk = tile(c)
    sa, sb = staged(c)
    wg = invocations(c)
    return (-(-bm * bk // (8 * wg)) if sa else 0), (-(-bk * bn // (8 * wg)) if sb else 0)


def fmt(c: Config) -> str:
    """`f16x16x16 2x2sg 4x4fr k32 A:dir B:wg sg32` (fragment, subgroups, fragments per subgroup, K step, staging),
    then ` pipe2`, ` pad8`, ` splitk4` where those differ from the single-buffered, unpadded, unsplit kernel."""
    short = {"direct": "dir", "workgroup": "wg"}
    _, _, bk = tile(c)
    extra = "".join(f" {label}{c[k]}" for k, label in (("PIPE", "pipe"), ("PAD", "pad"), ("SPLITK", "splitk"),
                                                          ("VS", "vs")) if c.get(k, LEGACY[k]) != LEGACY[k])
    return (f"f{c['FRAG']} {c['SM']}x{c['SN']}sg {c['FM']}x{c['FN']}fr k{bk} A:{short[c['SA']]} "
            f"B:{short[c['SB']]} sg{c['SG']}{extra}")


def _copy(name: str, src: str, rows: int, cols: int, wg: int, guarded: bool, vec: bool,
          stride: int | None = None, packed: bool = False) -> list[str]:
    """A helper that copies a (rows, cols) tile of `src` at (r0, c0) into workgroup array `name` (row-major, rows
    `stride` halves apart on the fast path; default `cols`). `packed`: `name` holds 8 halves an element (VS = 1);
    the fast path copies `vec4<u32>`s as they are, the edge path packs 8 guarded halves into each."""
    ld = "dims.K" if src == "A" else "dims.N"
    nrows = "dims.M" if src == "A" else "dims.K"
    out = [f"fn copy_{name}_{'edge' if guarded else 'fast'}(tid: u32, r0: u32, c0: u32) {{"]
    if packed:
        q = cols // 8
        out += [f"  for (var i = tid; i < {rows * q}u; i += {wg}u) {{",
                f"    let r = i / {q}u; let c = (i % {q}u) * 8u;"]
        if vec:
            out += [f"    {name}[(r * {stride or cols}u + c) / 8u] = {src}8[((r0 + r) * {ld} + c0 + c) / 8u];"]
        else:
            out += [f"    let inside = r0 + r < {nrows};"]
            for e in range(8):  # zeros past the tensor's rows and columns
                out.append(f"    var h{e} = f16(0.0); if (inside && c0 + c + {e}u < {ld}) {{ h{e} = "
                           f"{src}[(r0 + r) * {ld} + c0 + c + {e}u]; }}")
            out.append(f"    {name}[i] = vec4<u32>(" + ", ".join(f"bitcast<u32>(vec2<f16>(h{2 * w}, h{2 * w + 1}))"
                                                            for w in range(4)) + ");")
        return [*out, "  }", "}"]
    if vec:  # fast path: cols, c0 and the leading dimension are multiples of 4 (of 8, in fact)
        q = cols // 4
        out += [f"  for (var i = tid; i < {rows * q}u; i += {wg}u) {{",
                f"    let r = i / {q}u; let c = (i % {q}u) * 4u;",
                f"    let v = {src}4[((r0 + r) * {ld} + c0 + c) / 4u];",
                f"    let o = r * {stride or cols}u + c;",
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


def _pipe_copies(name: str, src: str, rows: int, cols: int, wg: int, stride: int, loads: int,
                 packed: bool = False) -> list[str]:
    """PIPE = 2 helpers: `load_<src>8` reads this invocation's share of a (rows, cols) tile of `src` at (r0, c0),
    8 halves per `vec4<u32>` load, into registers; `store_<name>` writes them into workgroup array `name` at
    `base` (rows `stride` halves apart). Interior tiles only: cols, c0 and the leading dimension are multiples of 8."""
    ld = "dims.K" if src == "A" else "dims.N"
    q, total = cols // 8, rows * cols // 8
    regs = f"array<vec4<u32>, {loads}>"
    out = [f"fn load_{src}8(tid: u32, r0: u32, c0: u32) -> {regs} {{", f"  var v: {regs};"]
    store = [f"fn store_{name}(tid: u32, base: u32, v: {regs}) {{"]
    for u in range(loads):
        guard = f"if (tid + {u * wg}u < {total}u) " if (u + 1) * wg > total else ""
        index = f"let i = tid + {u * wg}u; let r = i / {q}u; let c = (i % {q}u) * 8u;"
        out.append(f"  {guard}{{ {index} v[{u}] = {src}8[((r0 + r) * {ld} + c0 + c) / 8u]; }}")
        store.append(f"  {guard}{{")
        if packed:  # `name` holds 8 halves an element: the register as it was loaded
            store.append(f"    {index} {name}[(base + r * {stride}u + c) / 8u] = v[{u}];")
            store.append("  }")
            continue
        store.append(f"    {index} let o = base + r * {stride}u + c;")
        for w in range(4):
            store.append(f"    let h{w} = bitcast<vec2<f16>>(v[{u}].{'xyzw'[w]}); "
                         f"{name}[o + {2 * w}u] = h{w}.x; {name}[o + {2 * w + 1}u] = h{w}.y;")
        store.append("  }")
    return [*out, "  return v;", "}", *store, "}"]


def generate_wgsl(c: Config) -> str:
    """The WGSL of one config (readable; fragments unrolled into named variables)."""
    m, n, k = frag(c)
    BM, BN, BK = tile(c)
    FM, FN, KF, SN = c["FM"], c["FN"], c["KF"], c["SN"]
    NSG, WG = subgroups(c), invocations(c)
    sa, sb = staged(c)
    pipe, pipe3, split = c["PIPE"] >= 2, c["PIPE"] == 3, c["SPLITK"] > 1
    LDA, LDB = strides(c)
    HA, HB = tile_halves(c)
    NA, NB = prefetch_loads(c)
    VS = bool(c.get("VS", 0))
    U = 8 if VS else 1  # halves per element of As and Bs (VS = 1: vec4<u32>; offsets and strides in elements)
    k_lo, k_hi, cz = ("kb", "ke", "cz + ") if split else ("0u", "K", "")
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
    if split:
        w(f"@group(0) @binding(2) var<storage, read_write> C: array<f32>;  // ({c['SPLITK']}, M, N) partial sums")
    else:
        w("@group(0) @binding(2) var<storage, read_write> C: array<f32>;  // (M, N)")
    w("@group(0) @binding(3) var<uniform> dims: Dims;")
    binding = 4
    vec_a = "A8: array<vec4<u32>>;  // A again, 8 halves a load" if pipe or VS else \
        "A4: array<vec4<f16>>;  // A again, 4 halves a load"
    vec_b = "B8: array<vec4<u32>>;  // B again" if pipe or VS else "B4: array<vec4<f16>>;  // B again"
    if sa:
        w(f"@group(0) @binding({binding}) var<storage, read> {vec_a}")
        binding += 1
    if sb:
        w(f"@group(0) @binding({binding}) var<storage, read> {vec_b}")
    et, per = ("vec4<u32>", ", 8 halves an element") if VS else ("f16", "")
    if HA == BM * BK:
        w(f"var<workgroup> As: array<{et}, {BM * BK // U}>;  // (BM, BK){per}")
    else:
        w(f"var<workgroup> As: array<{et}, {HA // U}>;  // (BM, BK) on edge tiles, {c['PIPE']} x (BM, {LDA}) inside"
          + per)
    if HB == BK * BN:
        w(f"var<workgroup> Bs: array<{et}, {BK * BN // U}>;  // (BK, BN){per}")
    else:
        w(f"var<workgroup> Bs: array<{et}, {HB // U}>;  // (BK, BN) on edge tiles, {c['PIPE']} x (BK, {LDB}) inside"
          + per)
    w(f"var<workgroup> Cs: array<f32, {NSG * m * n}>;  // one ({m}, {n}) result fragment per subgroup (edge tiles)")
    w(f"alias Left = subgroup_matrix_left<f16, {k}, {m}>;")
    w(f"alias Right = subgroup_matrix_right<f16, {n}, {k}>;")
    w(f"alias Acc = subgroup_matrix_result<f32, {n}, {m}>;")
    w("")
    out += _copy("As", "A", BM, BK, WG, True, False, packed=VS)
    out += _copy("Bs", "B", BK, BN, WG, True, False, packed=VS)
    if sa:
        out += _pipe_copies("As", "A", BM, BK, WG, LDA, NA, VS) if pipe else \
            _copy("As", "A", BM, BK, WG, False, True, LDA, VS)
    if sb:
        out += _pipe_copies("Bs", "B", BK, BN, WG, LDB, NB, VS) if pipe else \
            _copy("Bs", "B", BK, BN, WG, False, True, LDB, VS)
    w("")
    w(f"@compute @workgroup_size({WG})")
    w("fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>,")
    w("        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32,")
    w("        @builtin(subgroup_size) sg_size: u32) {")
    w("  let M = dims.M; let N = dims.N; let K = dims.K;")
    w(f"  let bm0 = wg.y * {BM}u; let bn0 = wg.x * {BN}u;")
    if split:
        w(f"  let kch = ((K + {c['SPLITK'] * BK - 1}u) / {c['SPLITK'] * BK}u) * {BK}u;  // K per slice, whole K steps")
        w("  let kb = wg.z * kch; let ke = min(K, kb + kch);  // this slice (empty past K: it stores zeros)")
        w("  let cz = wg.z * M * N;  // this slice's partial sums")
    w(f"  let owner = sg < {NSG}u;  // subgroups past SM*SN (smaller subgroups than SG) own no fragments")
    w(f"  let s = min(sg, {NSG - 1}u);")
    w(f"  let r0 = (s / {SN}u) * {FM * m}u; let c0 = (s % {SN}u) * {FN * n}u;  // the subgroup's corner in the tile")
    for i in range(FM):
        for j in range(FN):
            w(f"  var acc_{i}_{j} = Acc();")
    w(f"  let fast = bm0 + {BM}u <= M && bn0 + {BN}u <= N && K % {BK}u == 0u && K % 8u == 0u && N % 8u == 0u;")

    def multiply(stage_a: bool, stage_b: bool, lda: int, ldb: int, base_a: str, base_b: str) -> None:
        w("      if (owner) {")
        for kf in range(KF):
            for i in range(FM):
                if stage_a:
                    off, ptr, ld = f"{base_a}(r0 + {i * m}u) * {lda // U}u + {kf * k // U}u", "&As", f"{lda // U}u"
                else:
                    off, ptr, ld = f"(bm0 + r0 + {i * m}u) * K + k0 + {kf * k}u", "&A", "K"
                w(f"        let a{kf}_{i} = subgroupMatrixLoad<Left, row_major>({ptr}, {off}, {ld});")
            for j in range(FN):
                if stage_b and VS:
                    off, ptr, ld = f"{base_b}{kf * k * ldb // U}u + (c0 + {j * n}u) / 8u", "&Bs", f"{ldb // U}u"
                elif stage_b:
                    off, ptr, ld = f"{base_b}{kf * k * ldb}u + c0 + {j * n}u", "&Bs", f"{ldb}u"
                else:
                    off, ptr, ld = f"(k0 + {kf * k}u) * N + bn0 + c0 + {j * n}u", "&B", "N"
                w(f"        let b{kf}_{j} = subgroupMatrixLoad<Right, row_major>({ptr}, {off}, {ld});")
            for i in range(FM):
                for j in range(FN):
                    w(f"        acc_{i}_{j} = subgroupMatrixMultiplyAccumulate(a{kf}_{i}, b{kf}_{j}, acc_{i}_{j});")
        w("      }")

    def k_step(fast: bool) -> None:
        stage_a, stage_b = (sa, sb) if fast else (True, True)
        kind = "fast" if fast else "edge"
        if stage_a:
            w(f"      copy_As_{kind}(tid, bm0, k0);")
        if stage_b:
            w(f"      copy_Bs_{kind}(tid, k0, bn0);")
        if stage_a or stage_b:
            w("      workgroupBarrier();")
        multiply(stage_a, stage_b, LDA if fast else BK, LDB if fast else BN, "", "")
        if stage_a or stage_b:
            w("      workgroupBarrier();  // the tiles are overwritten by the next step")

    def pipelined_loop() -> None:
        """Step t multiplies half t % 2 while its loads of step t + 1 are in flight; the stores into the other
        half follow the multiplies, and the one barrier makes them visible and frees half t % 2 for step t + 2."""
        w(f"    if ({k_lo} < {k_hi}) {{  // the first K step into half 0")
        if sa:
            w(f"      store_As(tid, 0u, load_A8(tid, bm0, {k_lo}));")
        if sb:
            w(f"      store_Bs(tid, 0u, load_B8(tid, {k_lo}, bn0));")
        w("    }")
        w("    workgroupBarrier();")
        def prefetch(ind: str, suffix: str, cond: str, k_expr: str) -> None:
            """Register arrays na<suffix> / nb<suffix>, loaded with the K step at `k_expr` where `cond` holds."""
            if sa:
                w(f"{ind}var na{suffix} = array<vec4<u32>, {NA}>();")
                w(f"{ind}if ({cond}) {{ na{suffix} = load_A8(tid, bm0, {k_expr}); }}")
            if sb:
                w(f"{ind}var nb{suffix} = array<vec4<u32>, {NB}>();")
                w(f"{ind}if ({cond}) {{ nb{suffix} = load_B8(tid, {k_expr}, bn0); }}")

        if pipe3:  # step 1 in flight before the loop; each step then loads step + 2
            prefetch("    ", "", f"{k_lo} + {BK}u < {k_hi}", f"{k_lo} + {BK}u")
        w("    var ph = 0u;  // the half holding this step")
        w(f"    for (var k0 = {k_lo}; k0 < {k_hi}; k0 += {BK}u) {{")
        w(f"      let more = k0 + {BK}u < {k_hi};")
        if pipe3:  # na / nb hold step + 1 (loaded a step ago); na2 / nb2 take step + 2
            w(f"      let more2 = k0 + {2 * BK}u < {k_hi};")
            prefetch("      ", "2", "more2", f"k0 + {2 * BK}u")
        else:
            prefetch("      ", "", "more", f"k0 + {BK}u")
        multiply(sa, sb, LDA, LDB, f"ph * {BM * LDA // U}u + ", f"ph * {BK * LDB // U}u + ")
        w("      if (more) {")
        if sa:
            w(f"        store_As(tid, (1u - ph) * {BM * LDA}u, na);")
        if sb:
            w(f"        store_Bs(tid, (1u - ph) * {BK * LDB}u, nb);")
        w("      }")
        w("      workgroupBarrier();")
        if pipe3:
            w("      " + " ".join(f"{r} = {r}2;" for r, on in (("na", sa), ("nb", sb)) if on))
        w("      ph = 1u - ph;")
        w("    }")

    w("  if (fast) {")
    if pipe:
        pipelined_loop()
    else:
        w(f"    for (var k0 = {k_lo}; k0 < {k_hi}; k0 += {BK}u) {{")
        k_step(True)
        w("    }")
    w("    if (owner) {")
    for i in range(FM):
        for j in range(FN):
            w(f"      subgroupMatrixStore<row_major>(&C, {cz}(bm0 + r0 + {i * m}u) * N + bn0 + c0 + {j * n}u, "
              f"acc_{i}_{j}, N);")
    w("    }")
    w("  } else {")
    w(f"    for (var k0 = {k_lo}; k0 < {k_hi}; k0 += {BK}u) {{")
    k_step(False)
    w("    }")
    for i in range(FM):
        for j in range(FN):
            w(f"    if (owner) {{ subgroupMatrixStore<row_major>(&Cs, s * {m * n}u, acc_{i}_{j}, {n}u); }}")
            w("    workgroupBarrier();")
            w("    if (owner) {")
            w(f"      for (var e = lane; e < {m * n}u; e += sg_size) {{")
            w(f"        let gr = bm0 + r0 + {i * m}u + e / {n}u; let gc = bn0 + c0 + {j * n}u + e % {n}u;")
            w(f"        if (gr < M && gc < N) {{ C[{cz}gr * N + gc] = Cs[s * {m * n}u + e]; }}")
            w("      }")
            w("    }")
            w("    workgroupBarrier();")
    w("  }")
    w("}")
    return "\n".join(out) + "\n"


REDUCE_WG = 256  # invocations per workgroup of the split-K reduction (one output element each)


def reduce_wgsl(c: Config) -> str:
    """The second pass of a `SPLITK` > 1 config: C[i] = sum over the slices z of partial[z, i] (in slice order)."""
    parts = c["SPLITK"]
    terms = " + ".join(["P[i]", *(f"P[{z}u * mn + i]" for z in range(1, parts))])
    return "\n".join([
        f"// tilewise gemm-f16 split-K reduction: C (M, N) = the sum of {parts} partial (M, N) slices",
        "struct Dims { M: u32, N: u32, K: u32, pad: u32 }",
        "@group(0) @binding(0) var<uniform> dims: Dims;",
        f"@group(0) @binding(1) var<storage, read> P: array<f32>;  // ({parts}, M, N)",
        "@group(0) @binding(2) var<storage, read_write> C: array<f32>;  // (M, N)",
        f"@compute @workgroup_size({REDUCE_WG})",
        "fn main(@builtin(global_invocation_id) g: vec3<u32>) {",
        "  let mn = dims.M * dims.N;",
        "  let i = g.x;",
        f"  if (i < mn) {{ C[i] = {terms}; }}",
        "}",
    ]) + "\n"
