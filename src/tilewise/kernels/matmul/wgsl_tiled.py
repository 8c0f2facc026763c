"""WGSL of the tiled matmul kernel (kind `tiled`, and `splitk`: the same kernel over KS slices of K).

See `kernels/matmul/webgpu.py` for what each parameter does; this module writes the code for one config.
"""

from __future__ import annotations

from typing import Any

from tilewise.kernels.matmul.wgsl import (
    COLUMN_LAYOUTS,
    codes_init,
    dec8_fn,
    header,
    norm_sum_floats,
    prefetch_slots,
    store_stmt,
)
from tilewise.kernels.space import Config


def tiled_source(cfg: Config | dict[str, Any], fmt: str, epilogue: str, n: int, k: int,
                 norm_eps: float | None = None) -> str:
    """WGSL of the tiled kernel for one config and (N, K).

    Layout: a thread owns TN columns, read from workgroup memory as TN/4 vec4: with CL="block" the TN contiguous
    columns tx*TN.., with CL="strided" the vec4 column groups tx, tx+TX, tx+2*TX, .. (TX = BN/TN threads per
    row), so that neighbouring threads read neighbouring 16 bytes at every j4; and TM contiguous rows
    (activations stored k-major, so a thread's TM values of one k are TM/4 vec4 read by every thread of its row
    group at once: a broadcast). With PF=1 the next K step's raw global words sit in registers during the
    current step's FMAs and are decoded into workgroup memory at the top of the next step.
    """
    BM, BN, BK, TM, TN, F16S = (cfg[p] for p in ("BM", "BN", "BK", "TM", "TN", "F16S"))
    F16A = bool(cfg.get("F16A", False))  # f16 FMAs on the staged tiles, partial sums per K step added in f32
    if F16A and not F16S:
        raise ValueError("F16A (f16 arithmetic) reads f16 tiles: it needs F16S")
    PF = int(cfg.get("PF", 0))  # register prefetch of the next K step
    CL = str(cfg.get("CL", "block"))  # column layout of a thread's TN columns
    if PF not in (0, 1) or CL not in COLUMN_LAYOUTS:
        raise ValueError(f"PF={PF} CL={CL!r}: PF is 0 or 1, CL one of {COLUMN_LAYOUTS}")
    KS = int(cfg.get("KS", 1))  # split-K: this launch covers K / KS of `in` per grid z; `out` is the scratch
    DB = int(cfg.get("DB", 0))  # double-buffered tiles: one barrier per K step instead of two (needs PF=1)
    UK = int(cfg.get("UK", 0))  # 1: the kk loop of a K step unrolled in the source
    if UK not in (0, 1):
        raise ValueError(f"UK={UK}: UK is 0 (kk loop) or 1 (unrolled)")
    if DB not in (0, 1) or (DB and not PF):
        raise ValueError(f"DB={DB} PF={PF}: DB is 0 or 1, and DB=1 stages from the prefetch registers (PF=1)")
    norm = norm_eps is not None
    TX, TY = BN // TN, BM // TM
    NT = TX * TY
    paired = epilogue == "swiglu"
    sets = 2 if paired else 1
    head, _ = header(fmt, epilogue, n, k, F16S, norm)
    st = "f16" if F16S else "f32"
    L = [head]
    if PF:
        L.append(dec8_fn(fmt))
    L.append(f"const BM: u32 = {BM}u;\nconst BN: u32 = {BN}u;\nconst BK: u32 = {BK}u;\n")
    nbuf = 2 if DB else 1  # DB: tiles (2, BK, BN) and (2, BK, BM); step s computes on half s % 2
    for s_ in range(sets):
        L.append(f"var<workgroup> Ws{s_}: array<vec4<{st}>, {nbuf * BK * BN // 4}>;  // (BK, BN) decoded weights\n")
    L.append(f"var<workgroup> Xs: array<vec4<{st}>, {nbuf * BK * BM // 4}>;  // (BK, BM) activations, k-major\n")
    # the fused norm's sums of squares: PF=1 keeps them in registers per activation slot and adds a row's
    # BK/4 slots once after the loop (rss is (BK/4, BM) partials, then (BM,) totals at the front); PF=0 adds
    # each K step's tile into a running (BM,) sum
    if norm:
        what = "(BK/4, BM) slot sums, then (BM,) totals" if PF else "(BM,) each row's running sum of squares"
        L.append(f"var<workgroup> rss: array<f32, {norm_sum_floats(cfg)}>;  // {what}\n")
    L.append(f"@compute @workgroup_size({NT})\n"
             "fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {\n")
    L.append(codes_init(fmt))
    L.append(f"    let M = dims.m;\n    let n0 = wid.x * BN;\n    let m0 = wid.y * BM;\n"
             f"    let tx = li % {TX}u;\n    let ty = li / {TX}u;\n")
    for s_ in range(sets):
        for i in range(TM):
            L.append("    " + " ".join(f"var a{s_}_{i}_{j} = 0.0;" for j in range(TN)) + "\n")
    if norm and not PF:
        # row r's sum of squares is kept by thread r % NT alone (no race, no reduction), one load per k
        L.append(f"    for (var r = li; r < BM; r = r + {NT}u) {{ rss[r] = 0.0; }}\n")
    wchunks = BN * BK // 8
    xvecs = BM * BK // 4

    def cast(e: str) -> str:
        return f"f16({e})" if F16S else e

    def store_w(s_: int, v: str, cl: str, nl: str, ind: str, wb: str = "") -> None:
        """The 8 decoded weights `v` of chunk `cl` of local column `nl` into Ws<s_> (k-major), from offset `wb`."""
        for e in range(8):
            comp = ("a", "b")[e // 4] + "." + "xyzw"[e % 4]
            L.append(f"{ind}Ws{s_}[{wb}({cl} * 8u + {e}u) * (BN / 4u) + {nl} / 4u][{nl} % 4u] = "
                     f"{cast(f'{v}.{comp}')};\n")

    # PF=1: thread li stages the same slots every K step (weight chunk li + l*NT, activation vec4 li + l*NT);
    # a slot past the tile (when NT does not divide it) is skipped by a per-thread guard
    wslots, xslots = prefetch_slots(cfg)

    def guard(l: int, total: int, var: str) -> str:
        return f"{var}{l} < {total}u" if (l + 1) * NT > total else ""

    def pf_load(kv: str, ind: str) -> None:
        """Raw global words of the K step starting at `kv` into the prefetch registers."""
        for l in range(wslots):
            g = guard(l, wchunks, "wt")
            ind2 = ind + "    " if g else ind
            if g:
                L.append(f"{ind}if ({g}) {{\n")
            ch = f"{kv} / 8u + wc{l}"  # chunk of 8 along `in`
            for s_ in range(sets):
                if fmt == "nf4":
                    L.append(f"{ind2}pw{s_}_{l} = w{s_}[wr{l} * (K / 8u) + {ch}];\n"
                             f"{ind2}ps{s_}_{l} = am{s_}[wr{l} * (K / 64u) + ({ch}) / 8u];\n")
                elif fmt == "f16":
                    L.append(f"{ind2}pw{s_}_{l} = w{s_}[wr{l} * (K / 8u) + {ch}];\n")
                else:
                    L.append(f"{ind2}pw{s_}_{l} = C8(w{s_}[wr{l} * (K / 4u) + 2u * ({ch})], "
                             f"w{s_}[wr{l} * (K / 4u) + 2u * ({ch}) + 1u]);\n")
            if g:
                L.append(f"{ind}}}\n")
        for l in range(xslots):
            g = guard(l, xvecs, "xt")
            # rows past M keep their zeros (a slot's row is the same every step)
            cond = f"{g} && m0 + xm{l} < M" if g else f"m0 + xm{l} < M"
            L.append(f"{ind}if ({cond}) {{ px{l} = x[(dims.r0 + m0 + xm{l}) * (K / 4u) + {kv} / 4u + xq{l}]; }}\n")

    def pf_store(ind: str, kv: str = "k0", half: str = "") -> None:
        """The prefetch registers of the step starting at `kv`, decoded (and norm-scaled), into Ws / Xs (or
        into the tile half `half` when double-buffered)."""
        wb = f"{half} * {BK * BN // 4}u + " if half else ""
        xb = f"{half} * {BK * BM // 4}u + " if half else ""
        for l in range(wslots):
            g = guard(l, wchunks, "wt")
            ind2 = ind + "    " if g else ind
            if g:
                L.append(f"{ind}if ({g}) {{\n")
            for s_ in range(sets):
                raw = {"nf4": f"dec8(pw{s_}_{l}, ps{s_}_{l})", "f16": f"dec8(pw{s_}_{l})", "f32": f"pw{s_}_{l}"}[fmt]
                L.append(f"{ind2}let v{s_}_{l} = {f'gnorm({raw}, {kv} / 8u + wc{l})' if norm else raw};\n")
                store_w(s_, f"v{s_}_{l}", f"wc{l}", f"wn{l}", ind2, wb)
            if g:
                L.append(f"{ind}}}\n")
        for l in range(xslots):
            g = guard(l, xvecs, "xt")
            ind2 = ind + "    " if g else ind
            if g:
                L.append(f"{ind}if ({g}) {{\n")
            for e in range(4):
                L.append(f"{ind2}Xs[{xb}(xq{l} * 4u + {e}u) * (BM / 4u) + xm{l} / 4u][xm{l} % 4u] = "
                         f"{cast(f'px{l}.' + 'xyzw'[e])};\n")
            if norm:
                L.append(f"{ind2}ss{l} = ss{l} + dot(px{l}, px{l});\n")
            if g:
                L.append(f"{ind}}}\n")

    if KS > 1:
        kbeg, kend = "kz", f"kz + {k // KS}u"
        L.append(f"    let kz = wid.z * {k // KS}u;\n")
    else:
        kbeg, kend = "0u", "K"
    if PF:
        raw_t = {"nf4": "u32", "f16": "vec4<u32>", "f32": "C8"}[fmt]
        for l in range(wslots):
            L.append(f"    let wt{l} = li + {l * NT}u;\n    let wc{l} = wt{l} % {BK // 8}u;\n"
                     f"    let wn{l} = wt{l} / {BK // 8}u;\n    let wr{l} = min(n0 + wn{l}, N - 1u);\n")
            for s_ in range(sets):
                L.append(f"    var pw{s_}_{l}: {raw_t};\n" + (f"    var ps{s_}_{l}: f32;\n" if fmt == "nf4" else ""))
        for l in range(xslots):
            L.append(f"    let xt{l} = li + {l * NT}u;\n    let xm{l} = xt{l} % BM;\n    let xq{l} = xt{l} / BM;\n"
                     f"    var px{l} = vec4<f32>(0.0);\n" + (f"    var ss{l} = 0.0;\n" if norm else ""))
        L.append("    // the first K step's words, before the loop\n")
        pf_load(kbeg, "    ")
        if DB:
            pf_store("    ", kbeg, "0u")
            L.append("    workgroupBarrier();\n")
    if KS > 1:
        L.append(f"    for (var k0 = kz; k0 < {kend}; k0 = k0 + BK) {{\n")
    else:
        L.append("    for (var k0 = 0u; k0 < K; k0 = k0 + BK) {\n")
    if F16A:
        for s_ in range(sets):
            for i in range(TM):
                L.append("        " + " ".join(f"var h{s_}_{i}_{j4} = vec4<f16>(0.0h);" for j4 in range(TN // 4))
                         + "\n")
    if DB:
        # this step's tiles were stored before the barrier that ended the previous step; the next step's
        # words load now (their latency overlaps the FMAs) and go into the other half after them
        L.append(f"        let cur = ((k0 - {kbeg}) / BK) % 2u;\n        let nk = k0 + BK;\n"
                 f"        if (nk < {kend}) {{\n")
        pf_load("nk", "            ")
        L.append("        }\n")
    elif PF:
        # the registers loaded during the previous step -> workgroup memory; then the next step's loads are
        # issued, and their latency overlaps this step's FMAs
        pf_store("        ")
        L.append("        workgroupBarrier();\n")
        L.append(f"        if (k0 + BK < {kend}) {{\n            let nk = k0 + BK;\n")
        pf_load("nk", "            ")
        L.append("        }\n")
    else:
        # weights: BN*BK/8 chunks of 8 along k; neighbouring threads read neighbouring chunks of one row
        L.append(f"        for (var t = li; t < {wchunks}u; t = t + {NT}u) {{\n"
                 f"            let cl = t % {BK // 8}u;\n            let nl = t / {BK // 8}u;\n"
                 "            let row = min(n0 + nl, N - 1u);\n")
        for s_ in range(sets):
            load = f"load8_{s_}(row, k0 / 8u + cl)"
            L.append(f"            let v{s_} = {f'gnorm({load}, k0 / 8u + cl)' if norm else load};\n")
            store_w(s_, f"v{s_}", "cl", "nl", "            ")
        L.append("        }\n")
        # activations: neighbouring threads take neighbouring rows, so the k-major stores do not collide
        L.append(f"        for (var t = li; t < {xvecs}u; t = t + {NT}u) {{\n"
                 "            let ml = t % BM;\n            let q = t / BM;\n"
                 "            var v = vec4<f32>(0.0);\n"
                 "            if (m0 + ml < M) { v = x[(dims.r0 + m0 + ml) * (K / 4u) + k0 / 4u + q]; }\n")
        for e in range(4):
            L.append(f"            Xs[(q * 4u + {e}u) * (BM / 4u) + ml / 4u][ml % 4u] = {cast('v.' + 'xyzw'[e])};\n")
        L.append("        }\n        workgroupBarrier();\n")
    if norm and not PF:
        L.append(f"        for (var r = li; r < BM; r = r + {NT}u) {{\n            var q = rss[r];\n"
                 "            for (var kk = 0u; kk < BK; kk = kk + 1u) {\n"
                 "                let v = f32(Xs[kk * (BM / 4u) + r / 4u][r % 4u]);\n"
                 "                q = fma(v, v, q);\n"
                 "            }\n            rss[r] = q;\n        }\n")
    # the K step's FMAs: a loop over kk, or with UK=1 BK copies of its body with kk a constant (the compiler then
    # folds the workgroup-memory addresses into immediate offsets instead of computing them every kk)
    kk_open = [f"        {{\n            let kk = {kk}u;\n" for kk in range(BK)] if UK else [
        "        for (var kk = 0u; kk < BK; kk = kk + 1u) {\n"]
    body_start = len(L)
    xcur = f"cur * {BK * BM // 4}u + " if DB else ""
    wcur = f"cur * {BK * BN // 4}u + " if DB else ""
    conv4 = "" if F16A else "vec4<f32>"
    conv1 = "" if F16A else "f32"
    if TM % 4 == 0:
        for i4 in range(TM // 4):
            L.append(f"            let xv{i4} = {conv4}(Xs[{xcur}kk * (BM / 4u) + ty * {TM // 4}u + {i4}u]);\n")
        xs = [f"xv{i // 4}.{'xyzw'[i % 4]}" for i in range(TM)]
    else:
        for i in range(TM):
            L.append(f"            let xr{i} = ty * {TM}u + {i}u;\n"
                     f"            let xv{i} = {conv1}(Xs[{xcur}kk * (BM / 4u) + xr{i} / 4u][xr{i} % 4u]);\n")
        xs = [f"xv{i}" for i in range(TM)]
    strided = CL == "strided"
    for s_ in range(sets):
        for j4 in range(TN // 4):
            col4 = f"tx + {j4 * TX}u" if strided else f"tx * {TN // 4}u + {j4}u"  # the thread's j4-th vec4
            L.append(f"            let w{s_}_{j4} = {conv4}(Ws{s_}[{wcur}kk * (BN / 4u) + {col4}]);\n")
        for i in range(TM):
            if F16A:  # one vec4<f16> FMA per 4 columns
                L.append("            " + " ".join(
                    f"h{s_}_{i}_{j4} = fma(vec4<f16>({xs[i]}), w{s_}_{j4}, h{s_}_{i}_{j4});" for j4 in range(TN // 4))
                    + "\n")
            else:
                L.append("            " + " ".join(
                    f"a{s_}_{i}_{j} = fma({xs[i]}, w{s_}_{j // 4}.{'xyzw'[j % 4]}, a{s_}_{i}_{j});" for j in range(TN))
                    + "\n")
    body = L[body_start:]
    del L[body_start:]
    for opening in kk_open:
        L.append(opening)
        L.extend(body)
        L.append("        }\n")
    if F16A:  # the K step's f16 partial sums join the f32 accumulators
        for s_ in range(sets):
            for i in range(TM):
                L.append("        " + " ".join(
                    f"a{s_}_{i}_{j} = a{s_}_{i}_{j} + f32(h{s_}_{i}_{j // 4}.{'xyzw'[j % 4]});" for j in range(TN))
                    + "\n")
    if DB:  # the next step's registers into the other half: nobody reads it until after the barrier
        L.append("        if (nk < " + kend + ") {\n")
        pf_store("            ", "nk", "(1u - cur)")
        L.append("        }\n")
    L.append("        workgroupBarrier();\n    }\n")
    if norm and PF:
        # a thread's activation slots are the same (row, k quarter) every K step, so their sums of squares
        # stayed in registers; each row's BK/4 slot sums are added once (thread r alone writes entry r)
        for l in range(xslots):
            g = guard(l, xvecs, "xt")
            st_ = f"rss[xq{l} * BM + xm{l}] = ss{l};"
            L.append(f"    if ({g}) {{ {st_} }}\n" if g else f"    {st_}\n")
        L.append(f"    workgroupBarrier();\n    for (var r = li; r < BM; r = r + {NT}u) {{\n        var q = 0.0;\n"
                 f"        for (var c = 0u; c < {BK // 4}u; c = c + 1u) {{ q = q + rss[c * BM + r]; }}\n"
                 "        rss[r] = q;\n    }\n    workgroupBarrier();\n")
    if strided:  # output column of accumulator j: vec4 group tx + (j/4)*TX, lane j%4
        for j4 in range(TN // 4):
            L.append(f"    let cs{j4} = n0 + 4u * (tx + {j4 * TX}u);\n")

        def col(j: int) -> str:
            return f"cs{j // 4} + {j % 4}u"
    else:
        L.append(f"    let c0 = n0 + tx * {TN}u;\n")

        def col(j: int) -> str:
            return f"c0 + {j}u"
    if norm and KS > 1:
        # this slice's sums of squares follow the partial sums in the scratch, (KS, M) after (KS, sets, M, N); one
        # column of workgroups writes them, each row by the thread that accumulated it; the reduce applies rsqrt
        L.append(f"    if (wid.x == 0u) {{\n        for (var r = li; r < BM; r = r + {NT}u) {{\n"
                 f"            if (m0 + r < M) {{ out[{KS * sets}u * M * N + wid.z * M + m0 + r] = rss[r]; }}\n"
                 "        }\n    }\n")
    elif norm:
        for i in range(TM):
            L.append(f"    let rs{i} = inverseSqrt(rss[ty * {TM}u + {i}u] / f32(K) + {norm_eps!r});\n")
            L.append("    " + " ".join(f"a{s_}_{i}_{j} = a{s_}_{i}_{j} * rs{i};" for s_ in range(sets)
                                        for j in range(TN)) + "\n")
    for i in range(TM):
        L.append(f"    let r{i} = m0 + ty * {TM}u + {i}u;\n    if (r{i} < M) {{\n")
        for j in range(TN):
            if KS > 1:  # partial sums of this K slice: scratch (KS, sets, M, N)
                store = " ".join(f"out[((wid.z * {sets}u + {s_}u) * M + r{i}) * N + {col(j)}] = a{s_}_{i}_{j};"
                                 for s_ in range(sets))
            else:
                up = f"a1_{i}_{j}" if paired else None
                store = store_stmt(epilogue, f"r{i} * N + {col(j)}", f"a0_{i}_{j}", up)
            L.append(f"        if ({col(j)} < N) {{ {store} }}\n")
        L.append("    }\n")
    L.append("}\n")
    return "".join(L)
