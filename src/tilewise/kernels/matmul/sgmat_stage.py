"""The K loop of the subgroup-matrix matmul (`sgmat_wgsl`) that stages x and W through per-invocation registers,
and the geometry both share: the block tile, the staging slots, the registers they hold and the buffers they fill.

Variants: `PIPE` 1 (load, store, barrier, multiply, barrier; with packed stores only), 2 (the next step loaded
during this one's multiplies) and 3 (two steps ahead, two register sets); `VS` 0 (halves stored one at a time) and
1 (8 halves a `vec4<u32>` store). Every combination stages the same f16 values in the same K order.
"""

from __future__ import annotations

from tilewise.kernels.gemm.sgmat_wgsl import frag, invocations
from tilewise.kernels.space import Config


def mm_tile(c: Config) -> tuple[int, int, int]:
    """The block tile (BM, BN, BK) one workgroup computes per K step."""
    m, n, _ = frag(c)
    return c["SM"] * c["FM"] * m, c["SN"] * c["FN"] * n, int(c["BK"])


def x_width(c: Config) -> int:
    """Halves of x one staging slot covers: a vec4 (4), or 8 with packed stores (VS = 1: one `vec4<u32>`)."""
    return 8 if int(c.get("VS", 0)) else 4


def x_slots(c: Config) -> int:
    """Slots of the x tile one invocation stages per K step (`x_width` halves each)."""
    bm, _, bk = mm_tile(c)
    return -(-(bm * bk // x_width(c)) // invocations(c))


def norm_registers(c: Config) -> int:
    """The fused norm's f32 sum-of-squares registers per invocation: one per vec4 of x it stages."""
    return x_slots(c) * x_width(c) // 4


def w_units(c: Config) -> int:
    """Units of the weight tile (per set) staged per K step: chunks of 8 along K (one word of NF4), or with packed
    stores in the kn layout blocks of 8 columns x 8 K (eight `vec4<u32>` rows of the transposed tile)."""
    _, bn, bk = mm_tile(c)
    return bn * bk // (64 if int(c.get("VS", 0)) and c["WL"] == "kn" else 8)


def tile_buffers(c: Config) -> int:
    """Buffers of each staged tile in workgroup memory: 1 (PIPE 1), else 2 (PIPE 2 and 3 alternate between them)."""
    return 1 if int(c.get("PIPE", 1)) == 1 else 2


def pipe_slots(c: Config) -> tuple[int, int]:
    """(x slots, W unit slots) one invocation stages per K step: with PIPE 2 and 3 they wait in registers."""
    return x_slots(c), -(-w_units(c) // invocations(c))


def pipe_registers(c: Config, sets: int) -> int:
    """32-bit registers per invocation holding loaded steps between their loads and their stores: per step x vec4s
    and decoded W chunks as f32, or with packed stores (VS = 1) as f16 pairs, 4 words per 8 halves; PIPE 3 holds
    two steps."""
    xs, wcs = pipe_slots(c)
    if int(c.get("VS", 0)):
        step = 4 * xs + (32 if c["WL"] == "kn" else 4) * sets * wcs
    else:
        step = 4 * xs + 8 * sets * wcs
    return step * (2 if int(c.get("PIPE", 1)) == 3 else 1)


def slot_loop(w, mma, c: Config, norm: bool, sets: int, k_in: int, kbeg: str, kend: str, XB: int, WB: int,
              LX: int, LW: int) -> None:
    """The K loop staging through per-invocation slots held in registers between loads and stores.

    PIPE=2: step 0 staged first; then each step loads the next one's x and W into registers (decoded), multiplies
    from one buffer and stores the registers into the other, with one barrier per step. PIPE=3: two sets of
    registers, so a step's loads are issued two steps ahead: at step t the loads of t + 2 go into one set, the
    buffer of t is multiplied and the other set (step t + 1, loaded during step t - 1) is stored into the other
    buffer; the loop takes two steps per iteration so that the register names stay fixed. PIPE=1 (only with VS = 1):
    load, store, barrier, multiply, barrier. VS = 1 packs 8 halves into each register `vec4<u32>` and stores it
    whole: an x slot is 8 consecutive k of a row (two vec4 loads, two sums of squares for the norm), a W unit of
    layout nk one chunk of 8 along K, of layout kn 8 columns x 8 k (eight words loaded, eight transposed rows
    stored); the values and their rounding are those of VS = 0."""
    BM, _, BK = mm_tile(c)
    WG, wl = invocations(c), str(c["WL"])
    VS = int(c.get("VS", 0))
    U, xw = (8, 8) if VS else (1, 4)
    XV, WU = BM * BK // xw, w_units(c)
    nxs, nwc = pipe_slots(c)
    kn8 = bool(VS) and wl == "kn"
    if not norm or VS:  # the VS = 0 norm declares the slots (it keeps their sums of squares)
        for sl in range(nxs):
            w(f"    let xi{sl} = li + {sl * WG}u; let xr{sl} = xi{sl} / {BK // xw}u; let xq{sl} = xi{sl} % "
              f"{BK // xw}u;" + (f" var ss{sl} = 0.0; var tt{sl} = 0.0;" if norm else ""))
    for i in range(nwc):
        w(f"    let wi{i} = li + {i * WG}u; let nl{i} = wi{i} / {BK // 8}u; let cl{i} = wi{i} % {BK // 8}u;" +
          ("" if kn8 else f" let row{i} = min(n0 + nl{i}, N - 1u);"))
    PIPE = int(c.get("PIPE", 1))
    for r in ("", "b") if PIPE == 3 else ("",):  # register sets (PIPE 3: two)
        if VS:
            w("    " + " ".join(f"var px{sl}{r} = vec4<u32>();" for sl in range(nxs)))
            w("    " + " ".join(f"var pw{s}_{i}{f'_{e}' if kn8 else ''}{r} = vec4<u32>();" for s in range(sets)
                              for i in range(nwc) for e in range(8 if kn8 else 1)))
        else:
            w("    " + " ".join(f"var px{sl}{r} = vec4<f32>(0.0);" for sl in range(nxs)))
            w("    " + " ".join(f"var pw{s}_{i}{r} = C8(vec4<f32>(0.0), vec4<f32>(0.0));" for s in range(sets)
                              for i in range(nwc)))

    def opening(ind: str, var: str, i: int, total: int) -> None:  # slot i's block, guarded where it can be past the end
        w(f"{ind}if ({var}{i} < {total}u) {{" if (i + 1) * WG > total else f"{ind}{{")

    def x_row(kk: str, sl: int, q: str) -> str:
        return f"x[(dims.r0 + m0 + xr{sl}) * {k_in // 4}u + {kk} / 4u + {q}]"

    def load(ind: str, kk: str, r: str = "") -> None:  # step `kk` of x (normed) and W (decoded) into set r
        for sl in range(nxs):
            opening(ind, "xi", sl, XV)
            if VS:  # two vec4s: quarters 2q and 2q + 1 of the row's K step
                w(f"{ind}    var v = vec4<f32>(0.0); var v2 = vec4<f32>(0.0);")
                w(f"{ind}    if (m0 + xr{sl} < M) {{ v = {x_row(kk, sl, f'2u * xq{sl}')}; "
                  f"v2 = {x_row(kk, sl, f'2u * xq{sl} + 1u')}; }}")
                if norm:
                    w(f"{ind}    ss{sl} = ss{sl} + dot(v, v); tt{sl} = tt{sl} + dot(v2, v2);")
                    w(f"{ind}    v = v * norm_w[{kk} / 4u + 2u * xq{sl}]; "
                      f"v2 = v2 * norm_w[{kk} / 4u + 2u * xq{sl} + 1u];")
                w(f"{ind}    px{sl}{r} = pack8(v, v2);")
            else:
                w(f"{ind}    var v = vec4<f32>(0.0);")
                w(f"{ind}    if (m0 + xr{sl} < M) {{ v = {x_row(kk, sl, f'xq{sl}')}; }}")
                if norm:
                    w(f"{ind}    ss{sl} = ss{sl} + dot(v, v);")
                    w(f"{ind}    px{sl}{r} = v * norm_w[{kk} / 4u + xq{sl}];")
                else:
                    w(f"{ind}    px{sl}{r} = v;")
            w(f"{ind}}}")
        for i in range(nwc):
            opening(ind, "wi", i, WU)
            for s in range(sets):
                if kn8:  # nl is a group of 8 columns; rows past N read row N-1 (columns never stored)
                    for j in range(8):
                        w(f"{ind}    let v{s}_{j} = load8_{s}(min(n0 + nl{i} * 8u + {j}u, N - 1u), {kk} / 8u + "
                          f"cl{i});")
                    for e in range(8):
                        comp = f"{'ab'[e // 4]}.{'xyzw'[e % 4]}"
                        pairs = ", ".join(f"pack2(v{s}_{j}.{comp}, v{s}_{j + 1}.{comp})" for j in range(0, 8, 2))
                        w(f"{ind}    pw{s}_{i}_{e}{r} = vec4<u32>({pairs});")
                elif VS:
                    w(f"{ind}    let v{s} = load8_{s}(row{i}, {kk} / 8u + cl{i}); "
                      f"pw{s}_{i}{r} = pack8(v{s}.a, v{s}.b);")
                else:
                    w(f"{ind}    pw{s}_{i}{r} = load8_{s}(row{i}, {kk} / 8u + cl{i});")
            w(f"{ind}}}")

    def store(ind: str, buf: str, r: str = "") -> None:  # register set r into buffer `buf` of the staged tiles
        for sl in range(nxs):
            opening(ind, "xi", sl, XV)
            if VS:
                w(f"{ind}    Xs[{buf} * {XB // U}u + xr{sl} * {LX // U}u + xq{sl}] = px{sl}{r};")
            else:
                w(f"{ind}    let h = vec4<f16>(px{sl}{r});")
                w(f"{ind}    let o = {buf} * {XB}u + xr{sl} * {LX}u + xq{sl} * 4u;")
                w(f"{ind}    Xs[o] = h.x; Xs[o + 1u] = h.y; Xs[o + 2u] = h.z; Xs[o + 3u] = h.w;")
            w(f"{ind}}}")
        for i in range(nwc):
            opening(ind, "wi", i, WU)
            for s in range(sets):
                if kn8:
                    for e in range(8):
                        w(f"{ind}    Ws{s}[{buf} * {WB // U}u + (cl{i} * 8u + {e}u) * {LW // U}u + nl{i}] = "
                          f"pw{s}_{i}_{e}{r};")
                elif VS:
                    w(f"{ind}    Ws{s}[{buf} * {WB // U}u + nl{i} * {LW // U}u + cl{i}] = pw{s}_{i}{r};")
                else:
                    for e in range(8):
                        comp = ("a", "b")[e // 4] + "." + "xyzw"[e % 4]
                        idx = (f"nl{i} * {LW}u + cl{i} * 8u + {e}u" if wl == "nk" else
                               f"(cl{i} * 8u + {e}u) * {LW}u + nl{i}")
                        w(f"{ind}    Ws{s}[{buf} * {WB}u + {idx}] = f16(pw{s}_{i}{r}.{comp});")
            w(f"{ind}}}")

    if int(c.get("PIPE", 1)) == 1:
        w(f"    for (var k0 = {kbeg}; k0 < {kend}; k0 = k0 + {BK}u) {{")
        load("        ", "k0")
        store("        ", "0u")
        w("        workgroupBarrier();")
        mma("        ", "", "")
        w("        workgroupBarrier();  // the tiles are overwritten by the next step")
        w("    }")
        return
    if PIPE == 3:
        _pipe3_loop(w, mma, load, store, BK, kbeg, kend, XB // U, WB // U)
        return
    load("    ", kbeg)
    store("    ", "0u")
    w("    workgroupBarrier();")
    w(f"    for (var k0 = {kbeg}; k0 < {kend}; k0 = k0 + {BK}u) {{")
    w(f"        let cur = ((k0 - {kbeg}) / {BK}u) & 1u;  // the buffer this step multiplies from")
    w(f"        let more = k0 + {BK}u < {kend};")
    w("        if (more) {")
    load("            ", f"(k0 + {BK}u)")
    w("        }")
    mma("        ", f"cur * {XB // U}u + ", f"cur * {WB // U}u + ")
    w("        if (more) {")
    store("            ", "(1u - cur)")
    w("        }")
    w("        workgroupBarrier();  // the stored step is complete, the multiplied buffer free again")
    w("    }")


def _pipe3_loop(w, mma, load, store, BK: int, kbeg: str, kend: str, xb: int, wb: int) -> None:
    """PIPE=3's K loop, two steps an iteration: step A multiplies buffer 0 (register set "" is loading step + 2,
    set "b" holds step + 1 and is stored into buffer 1 after the multiplies), step B the mirror image. Each buffer is
    stored only after the barrier that ends the multiplies reading it; the loads of a step land during two steps'
    multiplies. `xb`, `wb`: a buffer's offset in elements of the staged arrays."""
    w("    // PIPE=3: step kbeg staged into buffer 0, step kbeg + BK loading into set b")
    load("    ", kbeg)
    store("    ", "0u")
    w(f"    if ({kbeg} + {BK}u < {kend}) {{")
    load("        ", f"({kbeg} + {BK}u)", "b")
    w("    }")
    w("    workgroupBarrier();")
    w(f"    for (var k0 = {kbeg}; k0 < {kend}; k0 = k0 + {2 * BK}u) {{")
    w(f"        let has1 = k0 + {BK}u < {kend}; let has2 = k0 + {2 * BK}u < {kend}; "
      f"let has3 = k0 + {3 * BK}u < {kend};")
    w("        if (has2) {")
    load("            ", f"(k0 + {2 * BK}u)")
    w("        }")
    mma("        ", "", "")
    w("        if (has1) {")
    store("            ", "1u", "b")
    w("        }")
    w("        workgroupBarrier();")
    w("        if (has1) {")
    w("            if (has3) {")
    load("                ", f"(k0 + {3 * BK}u)", "b")
    w("            }")
    mma("            ", f"{xb}u + ", f"{wb}u + ")
    w("            if (has2) {")
    store("                ", "0u")
    w("            }")
    w("            workgroupBarrier();")
    w("        }")
    w("    }")
