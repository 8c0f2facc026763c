"""WGSL shared by the matmul kernels: weight declarations and decoding per format, the common header, epilogue
stores, prefetch sizing, bindings and launch grids.

Bindings (group 0, in order): dims (uniform: rows M, first x row r0), x (r0 + M, K) f32 (rows r0..r0+M-1 are
read, so the executor can slice the last rows without a copy), [norm_w (K,) for a fused norm,] weights [+ absmax]
(, up weights [+ absmax] for swiglu), out (M, N) f32 (the split-K scratch for a split-K slice launch).
"""

from __future__ import annotations

import math
from typing import Any

from tilewise.kernels.space import Config
from tilewise.kernels.wgsl import ROW_DIMS
from tilewise.quant.nf4 import NF4_CODES

KINDS = ("tiled", "rows", "splitk")
SPLITK_WG = 256  # threads of the split-K reduction kernel
# 32-bit registers one prefetched chunk of 8 weights holds: nf4 u32 word + absmax, f16 vec4<u32>, f32 2 x vec4<f32>
PREFETCH_WORDS = {"nf4": 2, "f16": 4, "f32": 8}
COLUMN_LAYOUTS = ("block", "strided")


def codes_decl() -> str:
    vals = ", ".join(f"{float(c)!r}" for c in NF4_CODES)
    return (f"const NF4_CODES = array<f32, 16>({vals});\n"
            "var<workgroup> codes: array<f32, 16>;\n")


def weight_decls(fmt: str, slot: int, first_binding: int) -> tuple[str, int]:
    """Declarations of one weight matrix (and its absmax) starting at `first_binding`."""
    b = first_binding
    if fmt == "nf4":
        return (f"@group(0) @binding({b}) var<storage, read> w{slot}: array<u32>;\n"
                f"@group(0) @binding({b + 1}) var<storage, read> am{slot}: array<f32>;\n"), b + 2
    if fmt == "f16":
        return f"@group(0) @binding({b}) var<storage, read> w{slot}: array<vec4<u32>>;\n", b + 1
    return f"@group(0) @binding({b}) var<storage, read> w{slot}: array<vec4<f32>>;\n", b + 1


def load8_fn(fmt: str, slot: int) -> str:
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


def dec8_fn(fmt: str) -> str:
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


def header(fmt: str, epilogue: str, n: int, k: int, f16: bool, norm: bool = False) -> tuple[str, list[str]]:
    """Common declarations; returns (text, binding names in order)."""
    names = ["dims", "x", "norm_w"] if norm else ["dims", "x"]
    text = "enable f16;\n" if f16 else ""
    text += f"const N: u32 = {n}u;\nconst K: u32 = {k}u;\n"
    text += "struct C8 { a: vec4<f32>, b: vec4<f32> }\n" + ROW_DIMS
    text += "@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;\n"
    if norm:
        # RMSNorm fused in: weights are scaled by the norm weight g[k] as they are decoded, the row's sum of
        # squares is accumulated next to the products, and the epilogue multiplies by rsqrt(mean(x^2) + eps)
        text += "@group(0) @binding(2) var<storage, read> norm_w: array<vec4<f32>>;\n"
        text += "fn gnorm(v: C8, c: u32) -> C8 { return C8(v.a * norm_w[2u * c], v.b * norm_w[2u * c + 1u]); }\n"
    decl, nb = weight_decls(fmt, 0, 3 if norm else 2)
    text += decl
    names += ["w", "absmax"] if fmt == "nf4" else ["w"]
    if epilogue == "swiglu":
        decl, nb = weight_decls(fmt, 1, nb)
        text += decl
        names += ["w_up", "absmax_up"] if fmt == "nf4" else ["w_up"]
    text += f"@group(0) @binding({nb}) var<storage, read_write> out: array<f32>;\n"
    names.append("out")
    if fmt == "nf4":
        text += codes_decl()
    text += load8_fn(fmt, 0)
    if epilogue == "swiglu":
        text += load8_fn(fmt, 1)
    return text, names


def codes_init(fmt: str) -> str:
    if fmt != "nf4":
        return ""
    return "    if (li < 16u) { codes[li] = NF4_CODES[li]; }\n    workgroupBarrier();\n"


def store_stmt(epilogue: str, idx: str, acc: str, up: str | None = None) -> str:
    if epilogue == "residual":
        return f"out[{idx}] = out[{idx}] + {acc};"
    if epilogue == "swiglu":
        return f"out[{idx}] = ({acc} / (1.0 + exp(-{acc}))) * {up};"
    return f"out[{idx}] = {acc};"


def splitk_scratch_bytes(cfg: Config | dict[str, Any], epilogue: str, m: int, n: int, norm: bool = False) -> int:
    """Bytes of the partial-sum buffer a split-K launch needs for M rows (plus the sums of squares of a norm)."""
    ks = int(cfg["KS"])
    return 4 * ks * ((2 if epilogue == "swiglu" else 1) * m * n + (m if norm else 0))


def binding_names(fmt: str, epilogue: str, norm: bool = False) -> list[str]:
    """Buffer names in binding order for (weights format, epilogue, fused norm)."""
    return header(fmt, epilogue, 8, 64, False, norm)[1]


def grid(kind: str, cfg: Config | dict[str, Any], m: int, n: int) -> tuple[int, int, int]:
    """Workgroups for M rows and N output columns."""
    if kind == "tiled":
        return (math.ceil(n / cfg["BN"]), math.ceil(m / cfg["BM"]), 1)
    if kind == "splitk":
        return (math.ceil(n / cfg["BN"]), math.ceil(m / cfg["BM"]), int(cfg["KS"]))
    return (math.ceil(n / cfg["NC"]), math.ceil(m / cfg["RM"]), 1)
