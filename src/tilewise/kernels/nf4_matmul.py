"""Weight matmuls of the LFM2 classifier in WGSL: y = x @ W^T with W stored NF4 / f16 / f32 as (out, in) rows.

Variants (all generated from one template so that the three weight formats share one geometry):

- kind `tiled` (many rows): a workgroup owns a BM x BN output tile and walks `in` in steps of BK. Each step
  the workgroup decodes BN x BK weights into workgroup memory once (shared by all BM rows) and stages
  BM x BK activations (shared by all BN columns); each thread then accumulates a TM x TN register tile in
  scalar, fully unrolled accumulators (`a_i_j`, never a loop-indexed local array: 5-45x slower on an
  H200), reading its TN columns as TN/4 vec4 and its TM rows from a k-major activation tile (a broadcast).
  Parameters: BM, BN (tile), BK (K step), TM x TN (per thread; sets*TM*TN accumulators, sets = 2 for swiglu,
  at most TILED_ACC_BUDGET = 128, F16A's f16 partial sums counted as half as many again), and
    `F16S`  stages both tiles in f16 (needs `shader-f16`; own tolerance);
    `F16A`  (with F16S) also multiplies in f16: vec4<f16> FMAs into f16 partial sums over one K step, added
            to the f32 accumulators after each step (own template, own tolerance);
    `PF`    0 or 1: register prefetch. With 1 a thread loads the next K step's raw global words into
            registers (nf4: the u32 word and its absmax, f16: the vec4<u32>, f32: the two vec4<f32> of each
            chunk of 8 weights; the activation vec4s) right after the step's barrier, before its FMAs, and
            decodes / stores them into workgroup memory at the top of the next step, so global latency
            overlaps the FMAs (the fused norm's weights, K floats that stay cached, are read at decode time).
            At most MAX_PREFETCH_REGISTERS = 32 registers held (rule `prefetch_registers`). 0: load, decode
            and store at the top of each step (the kernel before PF existed; also when the key is absent);
    `CL`    "block" or "strided": a thread's columns. "block" (also when absent): thread tx owns the TN
            contiguous columns tx*TN .. tx*TN+TN-1, so at TN=8 neighbouring threads read vec4s 32 bytes apart
            (shared-memory bank conflicts on NVIDIA). "strided": thread tx owns the vec4 column groups tx,
            tx+TX, tx+2*TX, .. (TX = BN/TN; columns 4*(tx + j4*TX) + 0..3), so at every j4 neighbouring threads
            read neighbouring 16 bytes and store neighbouring columns. Needs TN >= 8 (with TN=4 it is "block").
    `DB`    0 or 1: double-buffered tiles (needs PF=1): one barrier per K step instead of two.
    `UK`    0 or 1: with 1 the K step's loop over its BK inputs is unrolled in the source (BK copies of the FMA
            block, kk a constant), so the shader compiler can fold the workgroup-memory addresses into
            immediate offsets; 0 (also when absent) keeps the loop and leaves unrolling to the compiler.
- kind `rows` (few rows, matrix-vector style): a workgroup of WG threads owns NC output columns and RM
  rows; WG/NC lanes split `in` for each column (EL elements per lane step), reduce through workgroup
  memory. No weight staging: with few rows there is nothing to share, and parallelism comes from columns.
- kind `splitk` (many rows, few output columns, long K: the down projections): the tiled kernel over KS
  slices of K (grid z), each writing its partial sums to a scratch buffer; a second launch adds the KS
  partials and applies the epilogue. More workgroups for the same tile: a 64x64 tile of a 346 x 1024 output
  is only 96 workgroups on a GPU with 132 multiprocessors. With a fused RMSNorm each slice also writes its
  rows' sums of squares over its part of K; the reduce adds them and scales by rsqrt(mean(x^2) + eps) before
  the epilogue (sum of squares is additive over K, so the norm survives the split).
- epilogue `none` (y = xW^T), `residual` (out += xW^T, in place on the residual stream: the down / out
  projections), `swiglu` (paired gate/up weights, out = silu(x Wg^T) * (x Wu^T): the FFN's first half).
- weights `nf4` (bitsandbytes layout: blocks of 64 along `in`, float32 absmax per block, element 2i in
  the high nibble of byte i), `f16`, `f32`.

Bindings (group 0, in order): dims (uniform: rows M, first x row r0), x (r0 + M, K) f32 (rows r0..r0+M-1 are
read, so the executor can slice the last rows without a copy), weights [+ absmax] (, up weights
[+ absmax] for swiglu), out (M, N) f32. The model executor reads `binding_names()` for the order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Limits, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.space import Config, Rule, Space, divides
from tilewise.quant.nf4 import NF4_CODES, weight_arrays, weight_values

FORMATS = ("nf4", "f16", "f32")
EPILOGUES = ("none", "residual", "swiglu")
KINDS = ("tiled", "rows", "splitk")
SPLITK_WG = 256  # threads of the split-K reduction kernel
NF4_BLOCK = 64
# bytes one weight costs in each format (absmax included for nf4)
WEIGHT_BYTES = {"nf4": 0.5 + 4 / NF4_BLOCK, "f16": 2.0, "f32": 4.0}
ACC_BUDGET = 64  # scalar accumulators per thread before register spills dominate (seed 000/001 probes)
# the tiled / split-K kernels' own allowance: seed 003's warp-tiled GEMM held 128 accumulators per thread on an
# H200 without spilling (gemm.MAX_ACCUMULATORS); F16A's vec4<f16> partial sums count half a register per value
TILED_ACC_BUDGET = 128
MAX_PREFETCH_REGISTERS = 32  # 32-bit registers holding the next K step (PF=1) on top of the accumulators (gemm.py)
# 32-bit registers one prefetched chunk of 8 weights holds: nf4 u32 word + absmax, f16 vec4<u32>, f32 2 x vec4<f32>
PREFETCH_WORDS = {"nf4": 2, "f16": 4, "f32": 8}
COLUMN_LAYOUTS = ("block", "strided")


# configs used when no dispatch table has been measured for a device (safe on every adapter we know)
DEFAULT_TILED = {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "F16S": False, "PF": 0, "CL": "block", "DB": 0,
                 "UK": 0}
DEFAULT_ROWS = {"WG": 64, "NC": 2, "RM": 4, "EL": 8}
DEFAULT_ONE_ROW = {"WG": 128, "NC": 4, "RM": 1, "EL": 8}  # 1-2 rows: no clamped duplicate rows (H200-tuned)
DEFAULT_SPLITK = 4
DEFAULT_CUTOFF_ROWS = 96  # seed 001: below this the short-row path, from here the tiled one


# ---------------------------------------------------------------------------------------------- WGSL pieces
def _codes_decl() -> str:
    vals = ", ".join(f"{float(c)!r}" for c in NF4_CODES)
    return (f"const NF4_CODES = array<f32, 16>({vals});\n"
            "var<workgroup> codes: array<f32, 16>;\n")


def _weight_decls(fmt: str, slot: int, first_binding: int) -> tuple[str, int]:
    """Declarations of one weight matrix (and its absmax) starting at `first_binding`."""
    b = first_binding
    if fmt == "nf4":
        return (f"@group(0) @binding({b}) var<storage, read> w{slot}: array<u32>;\n"
                f"@group(0) @binding({b + 1}) var<storage, read> am{slot}: array<f32>;\n"), b + 2
    if fmt == "f16":
        return f"@group(0) @binding({b}) var<storage, read> w{slot}: array<vec4<u32>>;\n", b + 1
    return f"@group(0) @binding({b}) var<storage, read> w{slot}: array<vec4<f32>>;\n", b + 1


def _load8_fn(fmt: str, slot: int) -> str:
    """`load8_<slot>(row, c)`: weights row*K + 8c .. 8c+7 as two vec4 (chunk c of 8 along `in`)."""
    if fmt == "nf4":
        # one u32 = 4 bytes = 8 weights; byte j holds element 2j (high nibble) and 2j+1 (low nibble)
        return f"""
fn load8_{slot}(row: u32, c: u32) -> C8 {{
    let wd = w{slot}[row * (K / 8u) + c];
    let s = am{slot}[row * (K / 64u) + c / 8u];
    let a = vec4<f32>(codes[(wd >> 4u) & 15u], codes[wd & 15u], codes[(wd >> 12u) & 15u], codes[(wd >> 8u) & 15u]);
    let b = vec4<f32>(codes[(wd >> 20u) & 15u], codes[(wd >> 16u) & 15u], codes[(wd >> 28u) & 15u],
                      codes[(wd >> 24u) & 15u]);
    return C8(a * s, b * s);
}}
"""
    if fmt == "f16":
        return f"""
fn load8_{slot}(row: u32, c: u32) -> C8 {{
    let v = w{slot}[row * (K / 8u) + c];
    return C8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),
              vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
}}
"""
    return f"""
fn load8_{slot}(row: u32, c: u32) -> C8 {{
    let base = row * (K / 4u) + 2u * c;
    return C8(w{slot}[base], w{slot}[base + 1u]);
}}
"""


def _dec8_fn(fmt: str) -> str:
    """`dec8(raw...)`: the 8 weights of one prefetched chunk (PF=1 loads the raw words, decodes them later)."""
    if fmt == "nf4":
        return """
fn dec8(wd: u32, s: f32) -> C8 {
    let a = vec4<f32>(codes[(wd >> 4u) & 15u], codes[wd & 15u], codes[(wd >> 12u) & 15u], codes[(wd >> 8u) & 15u]);
    let b = vec4<f32>(codes[(wd >> 20u) & 15u], codes[(wd >> 16u) & 15u], codes[(wd >> 28u) & 15u],
                      codes[(wd >> 24u) & 15u]);
    return C8(a * s, b * s);
}
"""
    if fmt == "f16":
        return """
fn dec8(v: vec4<u32>) -> C8 {
    return C8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),
              vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
}
"""
    return ""  # f32: the raw chunk already is a C8


def prefetch_slots(cfg: Config | dict[str, Any]) -> tuple[int, int]:
    """(weight chunks, activation vec4s) one thread stages per K step: ceil(BN*BK/8 / threads), ceil(BM*BK/4 / ...)."""
    nt = (cfg["BN"] // cfg["TN"]) * (cfg["BM"] // cfg["TM"])
    return math.ceil(cfg["BN"] * cfg["BK"] // 8 / nt), math.ceil(cfg["BM"] * cfg["BK"] // 4 / nt)


def norm_sum_floats(cfg: Config | dict[str, Any]) -> int:
    """f32 words of workgroup memory the fused norm's sums of squares take (`rss` in `tiled_source`): PF=1
    keeps (BK/4, BM) slot sums, PF=0 one running (BM,) sum."""
    return cfg["BM"] * cfg["BK"] // 4 if cfg.get("PF", 0) else cfg["BM"]


def prefetch_registers(cfg: Config | dict[str, Any], fmt: str, paired: bool) -> int:
    """32-bit registers PF=1 holds for the next K step: the raw weight words (per set) and the activation vec4s."""
    ws, xs = prefetch_slots(cfg)
    return (2 if paired else 1) * ws * PREFETCH_WORDS[fmt] + 4 * xs


def _header(fmt: str, epilogue: str, n: int, k: int, f16: bool, norm: bool = False) -> tuple[str, list[str]]:
    """Common declarations; returns (text, binding names in order)."""
    names = ["dims", "x", "norm_w"] if norm else ["dims", "x"]
    text = "enable f16;\n" if f16 else ""
    text += f"const N: u32 = {n}u;\nconst K: u32 = {k}u;\n"
    text += "struct Dims { m: u32, r0: u32, r1: u32, r2: u32 }\nstruct C8 { a: vec4<f32>, b: vec4<f32> }\n"
    text += "@group(0) @binding(0) var<uniform> dims: Dims;\n"
    text += "@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;\n"
    if norm:
        # RMSNorm fused in: weights are scaled by the norm weight g[k] as they are decoded, the row's sum of
        # squares is accumulated next to the products, and the epilogue multiplies by rsqrt(mean(x^2) + eps)
        text += "@group(0) @binding(2) var<storage, read> norm_w: array<vec4<f32>>;\n"
        text += "fn gnorm(v: C8, c: u32) -> C8 { return C8(v.a * norm_w[2u * c], v.b * norm_w[2u * c + 1u]); }\n"
    decl, nb = _weight_decls(fmt, 0, 3 if norm else 2)
    text += decl
    names += ["w", "absmax"] if fmt == "nf4" else ["w"]
    if epilogue == "swiglu":
        decl, nb = _weight_decls(fmt, 1, nb)
        text += decl
        names += ["w_up", "absmax_up"] if fmt == "nf4" else ["w_up"]
    text += f"@group(0) @binding({nb}) var<storage, read_write> out: array<f32>;\n"
    names.append("out")
    if fmt == "nf4":
        text += _codes_decl()
    text += _load8_fn(fmt, 0)
    if epilogue == "swiglu":
        text += _load8_fn(fmt, 1)
    return text, names


def _codes_init(fmt: str) -> str:
    if fmt != "nf4":
        return ""
    return "    if (li < 16u) { codes[li] = NF4_CODES[li]; }\n    workgroupBarrier();\n"


def _store(epilogue: str, idx: str, acc: str, up: str | None = None) -> str:
    if epilogue == "residual":
        return f"out[{idx}] = out[{idx}] + {acc};"
    if epilogue == "swiglu":
        return f"out[{idx}] = ({acc} / (1.0 + exp(-{acc}))) * {up};"
    return f"out[{idx}] = {acc};"


# ---------------------------------------------------------------------------------------------- generators
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
    head, _ = _header(fmt, epilogue, n, k, F16S, norm)
    st = "f16" if F16S else "f32"
    L = [head]
    if PF:
        L.append(_dec8_fn(fmt))
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
    L.append(_codes_init(fmt))
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
                store = _store(epilogue, f"r{i} * N + {col(j)}", f"a0_{i}_{j}", up)
            L.append(f"        if ({col(j)} < N) {{ {store} }}\n")
        L.append("    }\n")
    L.append("}\n")
    return "".join(L)


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
    head, _ = _header(fmt, epilogue, n, k, False, norm)
    L = [head]
    L.append(f"const TPC: u32 = {TPC}u;\nconst NV: u32 = {nv}u;\n")
    L.append(f"var<workgroup> red: array<f32, {WG * nv}>;  // (NC, NV, TPC) partial sums\n")
    L.append(f"@compute @workgroup_size({WG})\n"
             "fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {\n")
    L.append(_codes_init(fmt))
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
        L.append(f"        if (m0 + {i}u < M) {{ {_store(epilogue, f'(m0 + {i}u) * N + n', acc, up)} }}\n")
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
    return f"""struct Dims {{ m: u32, r0: u32, r1: u32, r2: u32 }}
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
const N: u32 = {n}u;
@compute @workgroup_size({SPLITK_WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let MN = dims.m * N;
    let i = gid.x;
    if (i >= MN) {{ return; }}
{sums}
    {_store(epilogue, "i", *final)}
}}
"""


def splitk_scratch_bytes(cfg: Config | dict[str, Any], epilogue: str, m: int, n: int, norm: bool = False) -> int:
    """Bytes of the partial-sum buffer a split-K launch needs for M rows (plus the sums of squares of a norm)."""
    ks = int(cfg["KS"])
    return 4 * ks * ((2 if epilogue == "swiglu" else 1) * m * n + (m if norm else 0))


def binding_names(fmt: str, epilogue: str, norm: bool = False) -> list[str]:
    """Buffer names in binding order for (weights format, epilogue, fused norm)."""
    return _header(fmt, epilogue, 8, 64, False, norm)[1]


def grid(kind: str, cfg: Config | dict[str, Any], m: int, n: int) -> tuple[int, int, int]:
    """Workgroups for M rows and N output columns."""
    if kind == "tiled":
        return (math.ceil(n / cfg["BN"]), math.ceil(m / cfg["BM"]), 1)
    if kind == "splitk":
        return (math.ceil(n / cfg["BN"]), math.ceil(m / cfg["BM"]), int(cfg["KS"]))
    return (math.ceil(n / cfg["NC"]), math.ceil(m / cfg["RM"]), 1)


def source(kind: str, cfg: Config | dict[str, Any], fmt: str, epilogue: str, n: int, k: int,
           norm_eps: float | None = None) -> str:
    """WGSL of one matmul variant; `norm_eps` fuses an RMSNorm of x (weights `norm_w`) into it."""
    if kind not in KINDS or fmt not in FORMATS or epilogue not in EPILOGUES:
        raise ValueError(f"unknown matmul variant kind={kind} fmt={fmt} epilogue={epilogue}")
    if kind == "splitk":
        return tiled_source({**dict(cfg), "KS": cfg["KS"]}, fmt, epilogue, n, k, norm_eps)
    return (tiled_source if kind == "tiled" else rows_source)(cfg, fmt, epilogue, n, k, norm_eps)


# ---------------------------------------------------------------------------------------------- spaces
def tiled_space(paired: bool = False, features: Iterable[str] | None = (), norm: bool = False,
                fmt: str = "nf4") -> Space:
    """Tile rows x cols, K step, per-thread tile, f16 staging, prefetch, column layout; rules say which
    assumption a config breaks.

    `features` are the adapter's; None means unknown (then `compile` refuses f16 on a device without it).
    `fmt` (the weight format) sizes the prefetch registers of a raw weight chunk.
    """
    feats = None if features is None else frozenset(features)
    sets = 2 if paired else 1
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}")

    def acc_regs(c: Config) -> float:  # F16A: vec4<f16> partial sums, 2 registers per 4 values, on top
        return sets * c.TM * c.TN * (1.5 if c.get("F16A", False) else 1)

    def pf_explain(c: Config) -> str:
        ws, xs = prefetch_slots(c)
        return (f"prefetch registers = {sets}*ceil(BN*BK/8/threads)*{PREFETCH_WORDS[fmt]} ({fmt} words per 8 weights)"
                f" + 4*ceil(BM*BK/4/threads) = {sets}*{ws}*{PREFETCH_WORDS[fmt]} + 4*{xs} = "
                f"{prefetch_registers(c, fmt, paired)} > {MAX_PREFETCH_REGISTERS}")

    def threads(c: Config) -> int:
        return (c.BN // c.TN) * (c.BM // c.TM)

    def storage(c: Config) -> int:
        elem = 2 if c.F16S else 4
        nbuf = 2 if c.get("DB", 0) else 1
        return nbuf * (sets * c.BK * c.BN + c.BM * c.BK) * elem + 64 + (norm_sum_floats(c) * 4 if norm else 0)

    rules = [
        Rule("thread_rows", lambda c, _: divides(c.TM, c.BM),
             lambda c, _: f"TM={c.TM} does not divide BM={c.BM}: rows would be dropped"),
        Rule("thread_cols", lambda c, _: divides(c.TN, c.BN),
             lambda c, _: f"TN={c.TN} does not divide BN={c.BN}: columns would be dropped"),
        Rule("vec4_cols", lambda c, _: c.TN % 4 == 0,
             lambda c, _: f"TN={c.TN} is not a multiple of 4: a thread reads its columns as vec4"),
        Rule("strided_cols", lambda c, _: c.get("CL", "block") == "block" or c.TN >= 8,
             lambda c, _: f"CL=strided with TN={c.TN}: one vec4 per thread is the block layout (same kernel as "
                          "CL=block)"),
        Rule("chunks_of_8", lambda c, _: c.BK % 8 == 0,
             lambda c, _: f"BK={c.BK} is not a multiple of 8: weights decode 8 at a time (one NF4 word)"),
        Rule("min_threads", lambda c, _: threads(c) >= 32,
             lambda c, _: f"threads = (BN/TN)*(BM/TM) = {threads(c)} < 32: less than one subgroup of work"),
        Rule("accumulators", lambda c, _: acc_regs(c) <= TILED_ACC_BUDGET,
             lambda c, _: f"{sets}*TM*TN{'*1.5 (F16A partial sums)' if c.get('F16A', False) else ''} = "
                          f"{sets}*{c.TM}*{c.TN}{'*1.5' if c.get('F16A', False) else ''} = {acc_regs(c):g} "
                          f"accumulator registers > {TILED_ACC_BUDGET}: they spill out of registers"),
        Rule("prefetch_registers", lambda c, _: c.get("PF", 0) == 0
             or prefetch_registers(c, fmt, paired) <= MAX_PREFETCH_REGISTERS,
             lambda c, _: pf_explain(c)),
        Rule("double_buffer", lambda c, _: not c.get("DB", 0) or c.get("PF", 0),
             lambda c, _: "DB=1 (double-buffered tiles) stores the prefetch registers of the next step: it needs PF=1"),
        Rule("f16_staging", lambda c, _: not c.F16S or feats is None or "shader-f16" in feats,
             lambda c, _: "F16S=True needs the adapter feature shader-f16, which this device lacks"),
        Rule("f16_arith", lambda c, _: not c.get("F16A", False) or c.F16S,
             lambda c, _: "F16A=True (f16 FMAs) reads f16 tiles: it needs F16S=True"),
        Rule("invocations", lambda c, lim: threads(c) <= lim.max_invocations_per_workgroup,
             lambda c, lim: f"threads = {threads(c)} > max_invocations_per_workgroup "
                            f"{lim.max_invocations_per_workgroup}", needs_limits=True),
        Rule("workgroup_x", lambda c, lim: threads(c) <= lim.max_workgroup_size[0],
             lambda c, lim: f"workgroup size {threads(c)} > max_workgroup_size_x {lim.max_workgroup_size[0]}",
             needs_limits=True),
        Rule("workgroup_storage", lambda c, lim: storage(c) <= lim.max_workgroup_storage_bytes,
             lambda c, lim: f"workgroup storage = {'2*' if c.get('DB', 0) else ''}({sets}*BK*BN + BM*BK)*"
                            f"{2 if c.F16S else 4} + 64"
                            f"{(' + 4*BM*BK/4' if c.get('PF', 0) else ' + 4*BM') if norm else ''} = "
                            f"{storage(c)} bytes > max_workgroup_storage_bytes {lim.max_workgroup_storage_bytes}",
             needs_limits=True),
    ]
    # any multiple of TM / TN runs (the grid and guards handle a partial last tile); besides powers of two the
    # space lists 48 / 96 rows and 48 / 72 / 96 / 192 columns, which waste fewer padded rows or fill a large GPU
    # in whole waves at some shapes (measured: bench/matmul_tiles_webgpu.py)
    params = {"BM": [16, 32, 48, 64, 96, 128], "BN": [16, 32, 48, 64, 72, 96, 128, 192, 256],
              "BK": [8, 16, 32, 64], "TM": [1, 2, 4, 8], "TN": [4, 8], "F16S": [False, True], "PF": [0, 1],
              "CL": list(COLUMN_LAYOUTS), "DB": [0, 1], "UK": [0, 1]}
    return Space("nf4_matmul.tiled" + (".paired" if paired else ""), params, rules,
                 fmt=lambda c: f"{c.BM}x{c.BN} K{c.BK} {c.TM}x{c.TN}{' f16s' if c.F16S else ''}"
                               f"{' f16a' if c.get('F16A', False) else ''}{' pf' if c.get('PF', 0) else ''}"
                               f"{' strided' if c.get('CL', 'block') == 'strided' else ''}"
                               f"{' db' if c.get('DB', 0) else ''}{' uk' if c.get('UK', 0) else ''}")


def rows_space(paired: bool = False, norm: bool = False) -> Space:
    """Threads per workgroup, columns per workgroup, rows per workgroup, elements per lane step."""
    sets = (2 if paired else 1) + (1 if norm else 0)  # reduced values per row: products (+ sums of squares)
    rules = [
        Rule("columns_split", lambda c, _: divides(c.NC, c.WG),
             lambda c, _: f"NC={c.NC} does not divide WG={c.WG}: lanes per column must be whole"),
        Rule("pow2_lanes", lambda c, _: (c.WG // c.NC) & (c.WG // c.NC - 1) == 0,
             lambda c, _: f"lanes per column WG/NC = {c.WG // c.NC} is not a power of two (tree reduction)"),
        Rule("accumulators", lambda c, _: sets * c.RM * (1 + c.EL // 8) <= ACC_BUDGET,
             lambda c, _: f"{sets}*RM*(1+EL/8) = {sets * c.RM * (1 + c.EL // 8)} live values > {ACC_BUDGET}"),
        Rule("invocations", lambda c, lim: lim.max_invocations_per_workgroup >= c.WG,
             lambda c, lim: f"WG={c.WG} > max_invocations_per_workgroup {lim.max_invocations_per_workgroup}",
             needs_limits=True),
        Rule("workgroup_storage", lambda c, lim: 4 * c.WG * sets * c.RM + 64 <= lim.max_workgroup_storage_bytes,
             lambda c, lim: f"reduction storage 4*WG*{sets}*RM + 64 = {4 * c.WG * sets * c.RM + 64} bytes > "
                            f"{lim.max_workgroup_storage_bytes}", needs_limits=True),
    ]
    params = {"WG": [32, 64, 128, 256], "NC": [1, 2, 4, 8], "RM": [1, 2, 4, 8], "EL": [8, 16, 32]}
    return Space("nf4_matmul.rows" + (".paired" if paired else ""), params, rules,
                 fmt=lambda c: f"wg{c.WG} nc{c.NC} rm{c.RM} el{c.EL}")


def shape_problems(kind: str, cfg: Config | dict[str, Any], n: int, k: int) -> list[str]:
    """Reasons (N, K) cannot run on this config; empty when fine."""
    out = []
    if k % NF4_BLOCK:
        out.append(f"K={k} is not a multiple of {NF4_BLOCK} (one NF4 absmax block per 64 inputs of a row)")
    if kind == "tiled" and k % cfg["BK"]:
        out.append(f"K={k} is not a multiple of BK={cfg['BK']}")
    if kind == "splitk" and k % (cfg["KS"] * cfg["BK"]):
        out.append(f"K={k} is not a multiple of KS*BK = {cfg['KS']}*{cfg['BK']}: the K slices must be whole steps")
    if kind == "rows" and (k // 8) % (cfg["EL"] // 8):
        out.append(f"K/8={k // 8} is not a multiple of EL/8={cfg['EL'] // 8}")
    return out


class MatmulTemplate(KernelTemplate):
    """One matmul variant (kind x weight format x epilogue) as the tuner sees it; shape = (M, N, K)."""

    backend = "webgpu"
    shape_names = ("M", "N", "K")

    def __init__(self, kind: str = "tiled", fmt: str = "nf4", epilogue: str = "none",
                 features: Iterable[str] | None = (), f16_staging: bool = False, f16_arith: bool = False,
                 norm: bool = False, eps: float = 1e-5) -> None:
        if kind not in KINDS or fmt not in FORMATS or epilogue not in EPILOGUES:
            raise ValueError(f"unknown matmul variant kind={kind} fmt={fmt} epilogue={epilogue}")
        if (f16_staging or f16_arith) and kind == "rows":
            raise ValueError("f16 staging / arithmetic are parameters of the tiled and split-K kernels only")
        if f16_arith and not f16_staging:
            raise ValueError("f16 arithmetic reads f16 tiles: pass f16_staging=True too")
        self.norm, self.eps = norm, eps
        self.kind, self.fmt, self.epilogue = kind, fmt, epilogue
        self.features = None if features is None else frozenset(features)
        self.f16_staging = f16_staging
        self.f16_arith = f16_arith
        self.name = f"{fmt}_matmul.{kind}.{epilogue}" + (".norm" if norm else "") + (
            ".f16s" if f16_staging else "") + (".f16a" if f16_arith else "")
        # the reference multiplies the exact stored weights, so only f16 staging loosens the tolerance
        self.dtype = "f16" if f16_staging else ("nf4" if fmt == "nf4" else "f32")

    def space(self, which: str = "full") -> Space:
        paired = self.epilogue == "swiglu"
        if self.kind == "rows":
            return rows_space(paired, self.norm)
        sp = tiled_space(paired, self.features, self.norm, self.fmt)
        if self.kind == "splitk":
            # paired weights double the scratch: KS 8 at 512 rows of a 4608-wide FFN would need 151 MB
            ks_values = [2, 4] if paired else [2, 4, 8]
            sp.params["KS"] = ks_values
            sp.name = sp.name.replace("tiled", "splitk")
            # the harness sizes one scratch for the largest KS listed (so candidates share inputs): a
            # hand-written KS beyond it would write past that scratch
            sp.rules.append(Rule("scratch_ks", lambda c, _: c.KS in ks_values,
                                 lambda c, _: f"KS={c.KS} is not one of {ks_values}: the partial-sum scratch "
                                              f"holds at most KS={max(ks_values)} slices of "
                                              f"{'2 (paired) ' if paired else ''}M x N"))
        sp.params["F16S"] = [self.f16_staging]  # f16 staging is its own template: its own tolerance
        if self.f16_arith:
            sp.params["F16A"] = [True]
        return sp

    def default_config(self) -> Config:
        if self.kind == "rows":
            return self.space().config(DEFAULT_ROWS)
        extra = {"F16A": True} if self.f16_arith else {}
        if self.kind == "splitk":
            extra["KS"] = DEFAULT_SPLITK
        return self.space().config({**DEFAULT_TILED, "F16S": self.f16_staging, **extra})

    def shape_problems(self, config: Config, shape: Shape) -> list[str]:
        return shape_problems(self.kind, config, shape[1], shape[2])

    def source(self, config: Config, shape: Shape = (1, 64, 64)) -> str:
        return source(self.kind, config, self.fmt, self.epilogue, shape[1], shape[2],
                      self.eps if self.norm else None)

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        if config.get("F16S", False) and "shader-f16" not in getattr(device, "enabled_features", ()):
            from tilewise.errors import ShaderCompileError

            raise ShaderCompileError(f"{self.name}[{config}] stages in f16, but {device.info.name} has no shader-f16",
                                     "use the f32 template on this adapter")
        prog = device.compile(self.source(config, shape), "main", name=f"{self.name}[{config}]")
        if self.kind == "splitk":
            eps = self.eps if self.norm else None
            prog.meta["reduce"] = device.compile(splitk_reduce_source(self.epilogue, shape[1], config["KS"], eps,
                                                                      shape[2]),
                                                 "main", name=f"{self.name}.reduce[KS={config['KS']}]")
        return prog

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, n, k = shape
        host: HostInputs = {"x": rng.standard_normal((m, k)).astype(np.float32)}
        for suffix in ("", "_up") if self.epilogue == "swiglu" else ("",):
            w = (rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
            for key, arr in weight_arrays(w, self.fmt).items():
                host[key + suffix] = arr
        if self.epilogue == "residual":
            host["residual"] = rng.standard_normal((m, n)).astype(np.float32)
        if self.norm:
            host["norm_w"] = (1 + 0.3 * rng.standard_normal(k)).astype(np.float32)
        return host

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, n, _ = shape
        bufs: DeviceBuffers = {"dims": device.upload(np.array([m, 0, 0, 0], np.uint32), uniform=True)}
        for key, arr in host.items():
            bufs["_residual" if key == "residual" else key] = device.upload(arr)
        bufs["out"] = device.allocate(4 * m * n)
        if self.kind == "splitk":
            # sized for the largest KS of the space, so every candidate can share one input set
            bufs["part"] = device.allocate(splitk_scratch_bytes({"KS": max(self.space().params["KS"])},
                                                                self.epilogue, m, n, self.norm))
        return bufs

    def poison(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> None:
        # the residual epilogue reads `out`: poisoning it would poison the answer, so it is rewritten instead
        # (each check and timing starts from the residual; unwritten elements still fail: they keep the
        # residual, which differs from residual + x @ W^T)
        if self.epilogue == "residual" and "_residual" in bufs:
            device.write(bufs["out"], device.download(bufs["_residual"]))
            return
        super().poison(device, bufs, shape)

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        m, n, _ = shape
        if self.kind == "splitk":
            order = [bufs["part" if name == "out" else name]
                     for name in binding_names(self.fmt, self.epilogue, self.norm)]
            return [Launch(program, grid(self.kind, config, m, n), order),
                    Launch(program.meta["reduce"], (math.ceil(m * n / SPLITK_WG), 1, 1),
                           [bufs["dims"], bufs["part"], bufs["out"]])]
        order = [bufs[name] for name in binding_names(self.fmt, self.epilogue, self.norm)]
        return [Launch(program, grid(self.kind, config, m, n), order)]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        m, n, _ = shape
        return device.download(bufs["out"], np.float32, (m, n))

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        _, n, k = shape
        x = host["x"].astype(np.float64)
        if self.norm:
            x = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * host["norm_w"].astype(np.float64)
        y = x @ weight_values({"w": host["w"], "absmax": host.get("absmax")}, self.fmt, n, k).T
        if self.epilogue == "swiglu":
            u = x @ weight_values({"w": host["w_up"], "absmax": host.get("absmax_up")}, self.fmt, n, k).T
            return y / (1.0 + np.exp(-y)) * u
        if self.epilogue == "residual":
            return host["residual"].astype(np.float64) + y
        return y

    def flops(self, shape: Shape) -> int:
        m, n, k = shape
        return 2 * m * n * k * (2 if self.epilogue == "swiglu" else 1)

    def bytes_moved(self, shape: Shape) -> int:
        m, n, k = shape
        sets = 2 if self.epilogue == "swiglu" else 1
        out_rw = 2 if self.epilogue == "residual" else 1
        return int(4 * m * k + sets * n * k * WEIGHT_BYTES[self.fmt] + out_rw * 4 * m * n  # (scratch not counted)
                   + (4 * k if self.norm else 0))

    def tile_waste(self, config: Config, shape: Shape) -> float:
        m, n, _ = shape
        gx, gy, _ = grid(self.kind, config, m, n)
        bm, bn = (config["RM"], config["NC"]) if self.kind == "rows" else (config["BM"], config["BN"])
        return gx * gy * bm * bn / (m * n)


def all_templates(features: Iterable[str] = ()) -> list[MatmulTemplate]:
    """Every matmul variant (for a registry)."""
    out = [MatmulTemplate(k, f, e, features) for k in KINDS for f in FORMATS for e in EPILOGUES]
    if "shader-f16" in frozenset(features):
        out += [MatmulTemplate(k, f, e, features, True, a) for k in ("tiled", "splitk") for f in FORMATS
                for e in EPILOGUES for a in (False, True)]
    return out


def check_limits(limits: Limits, name: str, nbytes: int) -> None:
    """Refuse a weight that does not fit one storage binding, naming the tensor and the limit."""
    from tilewise.errors import ConfigError

    if nbytes > limits.max_storage_binding_bytes:
        raise ConfigError(f"tensor {name} needs {nbytes} bytes in one storage binding, more than this adapter's "
                          f"max_storage_binding_bytes {limits.max_storage_binding_bytes}",
                          "use a smaller model or weight format (nf4), or an adapter with larger limits")


# no-argument classes for `tilewise.kernels.registry` (`tilewise tune nf4-matmul --shape M,N,K`, `tilewise sweep`)
class NF4MatmulTiled(MatmulTemplate):
    """Tiled NF4 matmul, plain epilogue."""

    def __init__(self) -> None:
        super().__init__("tiled", "nf4", "none", None)


class NF4MatmulRows(MatmulTemplate):
    """Short-row NF4 matmul, plain epilogue."""

    def __init__(self) -> None:
        super().__init__("rows", "nf4", "none", None)


class NF4SwigluTiled(MatmulTemplate):
    """Tiled paired gate/up NF4 matmul with SwiGLU (shape M, N = ffn, K = hidden)."""

    def __init__(self) -> None:
        super().__init__("tiled", "nf4", "swiglu", None)


class NF4MatmulTiledF16(MatmulTemplate):
    """Tiled NF4 matmul with f16 staging and f16 arithmetic (f16 tolerance; needs shader-f16)."""

    def __init__(self) -> None:
        super().__init__("tiled", "nf4", "none", None, f16_staging=True, f16_arith=True)
