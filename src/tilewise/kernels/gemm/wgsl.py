"""The WGSL of one `gemm` config on WebGPU (the parameters are stated in `tilewise.kernels.gemm.webgpu`, whose rules
are every assumption this generator makes): C (M, N) = A (M, K) @ B (K, N), fp32, row-major, M, N, K from a uniform.

The per-invocation tile is fully unrolled: accumulators are named scalars (or vec4s) `acc_{wm}_{i}_{wn}_{j}`, so
every index is a constant and they can stay in registers (a loop-indexed local array may be placed in memory).
"""

from __future__ import annotations

from tilewise.errors import ConfigError
from tilewise.kernels.space import Config

WARP = 32  # invocations per logical warp


def fmt(c: Config) -> str:
    """`128x64x16 W64x32 WN2 T4x4 128t wg vec4`: staging in workgroup memory (wg) or registers (priv), written per
    operand when A and B differ (`A:priv B:wg`), so the name fits a table cell."""
    short = {"workgroup": "wg", "private": "priv"}
    stage = short[c["SA"]] if c["SA"] == c["SB"] else f"A:{short[c['SA']]} B:{short[c['SB']]}"
    return (f"{c['BM']}x{c['BN']}x{c['BK']} W{c['WM']}x{c['WN']} WN{c['WNITER']} T{c['TM']}x{c['TN']} "
            f"{c['NT']}t {stage} vec{c['VEC']}" + ("", " pf", " pf2")[c["PF"]])


def wmiter(c: Config) -> int:
    """Steps down the warp tile: WM*WN / (32*TM*TN*WNITER) (a whole number once rule warp_steps passes)."""
    return (c["WM"] * c["WN"]) // (WARP * c["TM"] * c["TN"] * c["WNITER"])


def derived(c: Config) -> dict[str, int]:
    """WMITER, WSUBM, WSUBN and the lane layout of one legal config."""
    steps = wmiter(c)
    if steps < 1:
        raise ConfigError(f"{fmt(c)}: WMITER = WM*WN/(32*TM*TN*WNITER) = 0",
                          "this config breaks rule warp_steps; check `tilewise tune gemm --dry-run`")
    wsubm, wsubn = c["WM"] // steps, c["WN"] // c["WNITER"]
    return {"WMITER": steps, "WSUBM": wsubm, "WSUBN": wsubn, "LANE_COLS": max(1, wsubn // c["TN"]),
            "WARPS_N": max(1, c["BN"] // c["WN"])}


def generate_wgsl(c: Config) -> str:
    """The WGSL of one config: readable, every per-invocation loop unrolled into named accumulators."""
    d = derived(c)
    BM, BN, BK, TM, TN, NT, V = c["BM"], c["BN"], c["BK"], c["TM"], c["TN"], c["NT"], c["VEC"]
    WMITER, WNITER, WSUBM, WSUBN = d["WMITER"], c["WNITER"], d["WSUBM"], d["WSUBN"]
    sa, sb = c["SA"] == "workgroup", c["SB"] == "workgroup"
    vt = "vec4<f32>" if V == 4 else "f32"
    as_vec = sa and V == 4 and TM % 4 == 0  # read the transposed A tile 4 rows at a time
    # private A with vec4 loads reads 4 consecutive k at once, so the inner loop steps k by 4
    kstep = 4 if (not sa and V == 4) else 1
    out: list[str] = []
    w = out.append
    w(f"// tilewise gemm: {fmt(c)}")
    w(f"// C (M, N) = A (M, K) @ B (K, N), fp32, row-major. WMITER={WMITER} WSUBM={WSUBM} WSUBN={WSUBN}; "
      f"{WMITER * TM * WNITER * TN} accumulators per invocation.")
    w("struct Dims { M: u32, N: u32, K: u32, pad: u32 }")
    w(f"@group(0) @binding(0) var<storage, read> A: array<{vt}>;  // (M, K/{V})")
    w(f"@group(0) @binding(1) var<storage, read> B: array<{vt}>;  // (K, N/{V})")
    w(f"@group(0) @binding(2) var<storage, read_write> C: array<{vt}>;  // (M, N/{V})")
    w("@group(0) @binding(3) var<uniform> dims: Dims;")
    nbuf = 2 if c["PF"] == 2 else 1
    lead = f"{nbuf}, " if nbuf > 1 else ""
    if sa:
        if as_vec:
            w(f"var<workgroup> As: array<vec4<f32>, {nbuf * BK * BM // 4}>;  // ({lead}BK, BM/4): A tile, transposed")
        else:
            w(f"var<workgroup> As: array<f32, {nbuf * BK * BM}>;  // ({lead}BK, BM): A tile, transposed")
    if sb:
        w(f"var<workgroup> Bs: array<{vt}, {nbuf * BK * BN // V}>;  // ({lead}BK, BN/{V})")
    w("")
    w(f"@compute @workgroup_size({NT})")
    w("fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>) {")
    w("  let M = dims.M; let N = dims.N; let K = dims.K;")
    w(f"  let KV = K / {V}u; let NV = N / {V}u;")
    w(f"  let bm0 = wg.y * {BM}u; let bn0 = wg.x * {BN}u;")
    w(f"  let warp = tid / {WARP}u; let lane = tid % {WARP}u;")
    wn_, lc = d["WARPS_N"], d["LANE_COLS"]
    w(f"  let mrow = (warp / {wn_}u) * {c['WM']}u + (lane / {lc}u) * {TM}u;  // first row (in tile)")
    w(f"  let ncol = (warp % {wn_}u) * {c['WN']}u + (lane % {lc}u) * {TN}u;  // first col (in tile)")
    # accumulators: acc_{wm}_{i}_{wn}_{j} (j counts vec4s when VEC=4)
    tnv = TN // V
    accs = [(wm, i, wn, j) for wm in range(WMITER) for i in range(TM) for wn in range(WNITER) for j in range(tnv)]
    zero = "vec4<f32>()" if V == 4 else "0.0"
    for a in accs:
        w(f"  var acc_{a[0]}_{a[1]}_{a[2]}_{a[3]}: {vt} = {zero};")
    if not sa:
        for wm in range(WMITER):
            for i in range(TM):
                w(f"  let ga_{wm}_{i} = bm0 + mrow + {wm * WSUBM + i}u;  // global row of A operand")
    if not sb:
        for wn in range(WNITER):
            for j in range(tnv):
                w(f"  let gb_{wn}_{j} = bn0 + ncol + {wn * WSUBN + j * V}u;  // global col of B operand")
    pf = c["PF"] >= 1
    db = c["PF"] == 2  # two workgroup buffers: fill one while computing from the other, one barrier per K step
    comps = ["x", "y", "z", "w"] if V == 4 else [""]
    loads_a = BM * BK // V // NT if sa else 0
    loads_b = BK * BN // V // NT if sb else 0

    def store_a(r: str, kq: str, v: str, ind: str, base: str = "") -> None:
        for q, comp in enumerate(comps):
            val = f"{v}.{comp}" if V == 4 else v
            if as_vec:
                w(f"{ind}As[({base}({kq} + {q}u) * {BM}u + {r}) / 4u][{r} % 4u] = {val};")
            else:
                w(f"{ind}As[{base}({kq} + {q}u) * {BM}u + {r}] = {val};")

    def store_prefetched(ind: str, abase: str = "", bbase: str = "") -> None:
        for l in range(loads_a):
            store_a(f"ra_{l}", f"ka_{l}", f"pa_{l}", ind, abase)
        for l in range(loads_b):
            w(f"{ind}Bs[{bbase}rb_{l} * {BN // V}u + nb_{l} / {V}u] = pb_{l};")

    def load_next(ind: str) -> None:
        w(f"{ind}let nk = bk0 + {BK}u;")
        for l in range(loads_a):
            w(f"{ind}pa_{l} = {zero};")
            w(f"{ind}if (bm0 + ra_{l} < M && nk + ka_{l} < K) {{ "
              f"pa_{l} = A[(bm0 + ra_{l}) * KV + (nk + ka_{l}) / {V}u]; }}")
        for l in range(loads_b):
            w(f"{ind}pb_{l} = {zero};")
            w(f"{ind}if (nk + rb_{l} < K && bn0 + nb_{l} < N) {{ "
              f"pb_{l} = B[(nk + rb_{l}) * NV + (bn0 + nb_{l}) / {V}u]; }}")

    if pf:
        # register prefetch: slot l of this invocation's share of the tiles, fixed across K steps
        for l in range(loads_a):
            w(f"  let ra_{l} = (tid + {l * NT}u) / {BK // V}u; let ka_{l} = ((tid + {l * NT}u) % {BK // V}u) * {V}u;")
            w(f"  var pa_{l}: {vt} = {zero};")
            w(f"  if (bm0 + ra_{l} < M && ka_{l} < K) {{ pa_{l} = A[(bm0 + ra_{l}) * KV + ka_{l} / {V}u]; }}")
        for l in range(loads_b):
            w(f"  let rb_{l} = (tid + {l * NT}u) / {BN // V}u; let nb_{l} = ((tid + {l * NT}u) % {BN // V}u) * {V}u;")
            w(f"  var pb_{l}: {vt} = {zero};")
            w(f"  if (rb_{l} < K && bn0 + nb_{l} < N) {{ pb_{l} = B[rb_{l} * NV + (bn0 + nb_{l}) / {V}u]; }}")
    if db:
        w("  // the first K tile goes to buffer 0 before the loop")
        store_prefetched("  ")
        w("  workgroupBarrier();")
    w(f"  for (var bk0 = 0u; bk0 < K; bk0 += {BK}u) {{")
    abase = bbase = ""
    if db:
        w(f"    let cur = (bk0 / {BK}u) & 1u;  // buffer holding this K tile; the other one receives the next")
        w(f"    let a_off = cur * {BK * BM}u; let b_off = cur * {BK * BN // V}u;")
        w(f"    let a_nxt = (1u - cur) * {BK * BM}u; let b_nxt = (1u - cur) * {BK * BN // V}u;")
        abase, bbase = "a_off + ", "b_off + "
        load_next("    ")
    elif pf:
        w("    // prefetched registers -> workgroup tiles, then start loading the next K tile")
        store_prefetched("    ")
        w("    workgroupBarrier();")
        load_next("    ")
    else:
        if sa:
            w(f"    for (var l = 0u; l < {loads_a}u; l++) {{  // A tile -> As (transposed), {loads_a} {vt} each")
            w(f"      let e = tid + l * {NT}u; let r = e / {BK // V}u; let kq = (e % {BK // V}u) * {V}u;")
            w(f"      var v: {vt} = {zero};")
            w("      if (bm0 + r < M && bk0 + kq < K) { v = A[(bm0 + r) * KV + (bk0 + kq) / " + f"{V}u]; }}")
            store_a("r", "kq", "v", "      ")
            w("    }")
        if sb:
            w(f"    for (var l = 0u; l < {loads_b}u; l++) {{  // B tile -> Bs, {loads_b} {vt} per invocation")
            w(f"      let e = tid + l * {NT}u; let r = e / {BN // V}u; let nq = (e % {BN // V}u) * {V}u;")
            w(f"      var v: {vt} = {zero};")
            w("      if (bk0 + r < K && bn0 + nq < N) { v = B[(bk0 + r) * NV + (bn0 + nq) / " + f"{V}u]; }}")
            w(f"      Bs[r * {BN // V}u + nq / {V}u] = v;")
            w("    }")
        if sa or sb:
            w("    workgroupBarrier();")
    w(f"    for (var k = 0u; k < {BK}u; k += {kstep}u) {{")
    # A operands for this k (or 4 k's)
    a_names: dict[tuple[int, int, int], str] = {}  # (wm, i, sub-k) -> scalar expression
    for wm in range(WMITER):
        if sa and as_vec:
            for i4 in range(TM // 4):
                w(f"      let av_{wm}_{i4} = As[({abase}k * {BM}u + mrow + {wm * WSUBM + 4 * i4}u) / 4u];")
                for q, comp in enumerate("xyzw"):
                    a_names[(wm, 4 * i4 + q, 0)] = f"av_{wm}_{i4}.{comp}"
        elif sa:
            for i in range(TM):
                w(f"      let a_{wm}_{i} = As[{abase}k * {BM}u + mrow + {wm * WSUBM + i}u];")
                a_names[(wm, i, 0)] = f"a_{wm}_{i}"
        else:
            for i in range(TM):
                g = f"ga_{wm}_{i}"
                if kstep == 4:
                    w(f"      var a_{wm}_{i} = vec4<f32>();")
                    w(f"      if ({g} < M && bk0 + k < K) {{ a_{wm}_{i} = A[{g} * KV + (bk0 + k) / 4u]; }}")
                    for q, comp in enumerate("xyzw"):
                        a_names[(wm, i, q)] = f"a_{wm}_{i}.{comp}"
                else:
                    w(f"      var a_{wm}_{i} = 0.0;")
                    w(f"      if ({g} < M && bk0 + k < K) {{ a_{wm}_{i} = A[{g} * KV + bk0 + k]; }}")
                    a_names[(wm, i, 0)] = f"a_{wm}_{i}"
    for sub in range(kstep):
        kexpr = f"k + {sub}u" if kstep > 1 else "k"
        b_names: dict[tuple[int, int], str] = {}
        for wn in range(WNITER):
            for j in range(tnv):
                if sb:
                    off = wn * WSUBN + j * V
                    w(f"      let b_{sub}_{wn}_{j} = Bs[{bbase}({kexpr}) * {BN // V}u + (ncol + {off}u) / {V}u];")
                else:
                    g = f"gb_{wn}_{j}"
                    w(f"      var b_{sub}_{wn}_{j}: {vt} = {zero};")
                    w(f"      if ({g} < N && bk0 + {kexpr} < K) {{ "
                      f"b_{sub}_{wn}_{j} = B[(bk0 + {kexpr}) * NV + {g} / {V}u]; }}")
                b_names[(wn, j)] = f"b_{sub}_{wn}_{j}"
        for wm, i, wn, j in accs:
            a = a_names[(wm, i, sub if kstep == 4 else 0)]
            acc = f"acc_{wm}_{i}_{wn}_{j}"
            av = f"vec4<f32>({a})" if V == 4 else a
            w(f"      {acc} = fma({av}, {b_names[(wn, j)]}, {acc});")
    w("    }")
    if db:
        store_prefetched("    ", "a_nxt + ", "b_nxt + ")
    if sa or sb:
        w("    workgroupBarrier();")
    w("  }")
    for wm in range(WMITER):
        for i in range(TM):
            w(f"  let cm_{wm}_{i} = bm0 + mrow + {wm * WSUBM + i}u;")
            w(f"  if (cm_{wm}_{i} < M) {{")
            for wn in range(WNITER):
                for j in range(tnv):
                    col = f"bn0 + ncol + {wn * WSUBN + j * V}u"
                    w(f"    if ({col} < N) {{ C[cm_{wm}_{i} * NV + ({col}) / {V}u] = acc_{wm}_{i}_{wn}_{j}; }}")
            w("  }")
    w("}")
    return "\n".join(out) + "\n"
