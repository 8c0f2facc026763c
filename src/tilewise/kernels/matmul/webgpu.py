"""Weight matmuls of the LFM2 classifier on WebGPU: y = x @ W^T with W stored NF4 / f16 / f32 as (out, in) rows.

Variants (all generated from one template so that the three weight formats share one geometry):

- kind `tiled` (many rows): a workgroup owns a BM x BN output tile and walks `in` in steps of BK. Each step
  the workgroup decodes BN x BK weights into workgroup memory once (shared by all BM rows) and stages
  BM x BK activations (shared by all BN columns); each thread then accumulates a TM x TN register tile in
  scalar, fully unrolled accumulators (`a_i_j`, never a loop-indexed local array, which shader compilers
  keep in slow local memory), reading its TN columns as TN/4 vec4 and its TM rows from a k-major activation
  tile (a broadcast).
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

The math (inputs, float64 reference, flop and byte counts) is `problem.MatmulProblem`; the code generators
are `wgsl_tiled.py` (tiled, split-K) and `wgsl_rows.py` (short rows, the split-K reduction).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.errors import ConfigError, ShaderCompileError
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.matmul.problem import EPILOGUES, MatmulProblem
from tilewise.kernels.matmul.wgsl import (
    COLUMN_LAYOUTS,
    KINDS,
    PREFETCH_WORDS,
    SPLITK_WG,
    binding_names,
    grid,
    norm_sum_floats,
    prefetch_registers,
    prefetch_slots,
    splitk_scratch_bytes,
)
from tilewise.kernels.matmul.wgsl_rows import rows_source, splitk_reduce_source
from tilewise.kernels.matmul.wgsl_tiled import tiled_source
from tilewise.kernels.space import Config, Rule, Space, divides
from tilewise.quant.nf4 import FORMATS, KERNEL_BLOCKSIZE

ACC_BUDGET = 64  # scalar accumulators per thread of the short-row kernel before register spills dominate
# the tiled / split-K kernels' own allowance: seed 003's warp-tiled GEMM holds 128 accumulators per thread without
# spilling; F16A's vec4<f16> partial sums count half a register per value
TILED_ACC_BUDGET = 128
MAX_PREFETCH_REGISTERS = 32  # 32-bit registers holding the next K step (PF=1) on top of the accumulators
# rows every matmul candidate is verified at: a partial last row tile for every BM and RM of the spaces, and one
# program serves every row count (M comes in a uniform), so one check covers all the rows it is timed at
VERIFY_ROWS = 97

# configs used when no dispatch table has been measured for a device (safe on every adapter we know)
DEFAULT_TILED = {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "F16S": False, "PF": 0, "CL": "block", "DB": 0,
                 "UK": 0}
DEFAULT_ROWS = {"WG": 64, "NC": 2, "RM": 4, "EL": 8}
DEFAULT_ONE_ROW = {"WG": 128, "NC": 4, "RM": 1, "EL": 8}  # 1-2 rows: RM=1 clamps no duplicate rows
DEFAULT_SPLITK = 4
DEFAULT_CUTOFF_ROWS = 96  # seed 001: below this the short-row path, from here the tiled one


def source(kind: str, cfg: Config | dict[str, Any], fmt: str, epilogue: str, n: int, k: int,
           norm_eps: float | None = None) -> str:
    """WGSL of one matmul variant; `norm_eps` fuses an RMSNorm of x (weights `norm_w`) into it."""
    if kind not in KINDS or fmt not in FORMATS or epilogue not in EPILOGUES:
        raise ValueError(f"unknown matmul variant kind={kind} fmt={fmt} epilogue={epilogue}")
    if kind == "splitk":
        return tiled_source({**dict(cfg), "KS": cfg["KS"]}, fmt, epilogue, n, k, norm_eps)
    return (tiled_source if kind == "tiled" else rows_source)(cfg, fmt, epilogue, n, k, norm_eps)


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
    # in whole waves at some shapes
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
    if k % KERNEL_BLOCKSIZE:
        out.append(f"K={k} is not a multiple of {KERNEL_BLOCKSIZE} (one NF4 absmax block per 64 inputs of a row)")
    if kind == "tiled" and k % cfg["BK"]:
        out.append(f"K={k} is not a multiple of BK={cfg['BK']}")
    if kind == "splitk" and k % (cfg["KS"] * cfg["BK"]):
        out.append(f"K={k} is not a multiple of KS*BK = {cfg['KS']}*{cfg['BK']}: the K slices must be whole steps")
    if kind == "rows" and (k // 8) % (cfg["EL"] // 8):
        out.append(f"K/8={k // 8} is not a multiple of EL/8={cfg['EL'] // 8}")
    return out


class MatmulTemplate(KernelTemplate):
    """One matmul variant (kind x weight format x epilogue, optionally with a fused norm and f16 staging or
    arithmetic) as the tuner and the executor see it; shape = (M, N, K)."""

    backend = "webgpu"
    shape_names = ("M", "N", "K")
    # quantizing a 4608x1024 pair of NF4 weights costs more than compiling a candidate: eight checks share inputs
    verify_reuse = 8

    def __init__(self, kind: str = "tiled", fmt: str = "nf4", epilogue: str = "none",
                 features: Iterable[str] | None = (), f16_staging: bool = False, f16_arith: bool = False,
                 norm: bool = False, eps: float = 1e-5) -> None:
        if kind not in KINDS or fmt not in FORMATS or epilogue not in EPILOGUES:
            raise ValueError(f"unknown matmul variant kind={kind} fmt={fmt} epilogue={epilogue}")
        if (f16_staging or f16_arith) and kind == "rows":
            raise ValueError("f16 staging / arithmetic are parameters of the tiled and split-K kernels only")
        if f16_arith and not f16_staging:
            raise ValueError("f16 arithmetic reads f16 tiles: pass f16_staging=True too")
        self.problem = MatmulProblem(fmt, epilogue, norm, eps)
        self.norm, self.eps = norm, eps
        self.kind, self.fmt, self.epilogue = kind, fmt, epilogue
        self.features = None if features is None else frozenset(features)
        self.f16_staging = f16_staging
        self.f16_arith = f16_arith
        self.scratch_buffers = ("part",) if kind == "splitk" else ()  # poisoned and guarded like "out"
        self.name = f"{fmt}_matmul.{kind}.{epilogue}" + (".norm" if norm else "") + (
            ".f16s" if f16_staging else "") + (".f16a" if f16_arith else "")
        # the reference multiplies the exact stored weights, so only f16 staging loosens the tolerance
        self.dtype = "f16" if f16_staging else self.problem.dtype

    @classmethod
    def from_name(cls, name: str, features: Iterable[str] | None = (), eps: float = 1e-5) -> MatmulTemplate:
        """The template called `name` (`nf4_matmul.tiled.swiglu.norm.f16s.f16a`), as a dispatch table names it."""
        parts = name.split(".")
        fmt = parts[0].removesuffix("_matmul")
        flags = set(parts[3:])
        if len(parts) >= 3 and parts[0].endswith("_matmul") and parts[1] == "sgmat":  # subgroup matrices (Dawn)
            from tilewise.kernels.matmul.sgmat import from_parts

            return from_parts(fmt, parts[2], flags, features, eps)
        if len(parts) < 3 or not parts[0].endswith("_matmul") or flags - {"norm", "f16s", "f16a"}:
            raise ConfigError(f"{name!r} is not a matmul kernel name", "expected e.g. nf4_matmul.tiled.none")
        try:
            return cls(parts[1], fmt, parts[2], features, "f16s" in flags, "f16a" in flags, "norm" in flags, eps)
        except ValueError as exc:
            raise ConfigError(f"{name!r} is not a matmul kernel name ({exc})",
                              "expected e.g. nf4_matmul.tiled.none") from exc

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
        extra: dict[str, Any] = {"F16A": True} if self.f16_arith else {}
        if self.kind == "splitk":
            extra["KS"] = DEFAULT_SPLITK
        return self.space().config({**DEFAULT_TILED, "F16S": self.f16_staging, **extra})

    def config_of(self, values: dict[str, Any]) -> Config:
        """A config from a dispatch table's values; parameters it leaves out take the default config's value."""
        return self.default_config().replace(**values)

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        return shape_problems(self.kind, config, shape[1], shape[2])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        _, n, k = shape or (1, 64, 64)
        return source(self.kind, config, self.fmt, self.epilogue, n, k, self.eps if self.norm else None)

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return (config, shape[1], shape[2])  # M comes in the dims uniform

    def verify_shape(self, config: Config, shape: Shape) -> Shape:
        return (VERIFY_ROWS, shape[1], shape[2])

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        if config.get("F16S", False) and "shader-f16" not in getattr(device, "enabled_features", ()):
            raise ShaderCompileError(f"{self.name}[{config}] stages in f16, but {device.info.name} has no shader-f16",
                                     "use the f32 template on this adapter")
        prog = device.compile(self.source(config, shape), "main", name=f"{self.name}[{config}]")
        if self.kind == "splitk":
            eps = self.eps if self.norm else None
            prog.meta["reduce"] = device.compile(splitk_reduce_source(self.epilogue, shape[1], config["KS"], eps,
                                                                      shape[2]),
                                                 "main", name=f"{self.name}.reduce[KS={config['KS']}]")
        return prog

    def binding_names(self) -> list[str]:
        """Buffer names of the main launch, in binding order (the executor's buffers carry these names)."""
        return binding_names(self.fmt, self.epilogue, self.norm)

    def scratch_bytes(self, config: Config, m: int, n: int) -> int:
        """Bytes of the split-K partial sums at m rows (0 for the other kinds)."""
        return splitk_scratch_bytes(config, self.epilogue, m, n, self.norm) if self.kind == "splitk" else 0

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, n, _ = shape
        bufs: DeviceBuffers = {"dims": device.upload(np.array([m, 0, 0, 0], np.uint32), uniform=True),
                               "out": device.allocate(4 * m * n)}
        for key in self.binding_names()[1:]:
            if key != "out":
                bufs[key] = device.upload(host[key])
        if self.kind == "splitk":
            # sized for the largest KS of the space, so every candidate can share one input set
            bufs["part"] = device.allocate(splitk_scratch_bytes({"KS": max(self.space().params["KS"])},
                                                                self.epilogue, m, n, self.norm))
        return self.attach_initial(device, host, shape, bufs)

    def rebind(self, device: Device, bufs: DeviceBuffers, have: Shape, shape: Shape) -> DeviceBuffers | None:
        """Buffers uploaded for more rows serve fewer rows of the same N and K (M comes in the dims uniform)."""
        if tuple(have[1:]) != tuple(shape[1:]) or shape[0] > have[0]:
            return None
        return {**bufs, "dims": device.upload(np.array([shape[0], 0, 0, 0], np.uint32), uniform=True)}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        """The launch (split-K: the slices, then the reduction into `out`) on buffers named as `binding_names`
        (plus `part`, the split-K scratch); `dims` carries M and the first row of x."""
        m, n, _ = shape
        if self.kind == "splitk":
            order = [bufs["part" if name == "out" else name] for name in self.binding_names()]
            return [Launch(program, grid(self.kind, config, m, n), order),
                    Launch(program.meta["reduce"], (math.ceil(m * n / SPLITK_WG), 1, 1),
                           [bufs["dims"], bufs["part"], bufs["out"]])]
        return [Launch(program, grid(self.kind, config, m, n), [bufs[name] for name in self.binding_names()])]

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
