"""The classifier's weight matmuls on CUDA (`matmul.cu`): tensor cores (mma.sync f16 -> f32) fed by register
prefetch or a cp.async pipeline, split-K and a short-row path.

Problem: `matmul.problem.MatmulProblem` (y = epilogue(norm(x) @ W^T), W (N, K) nf4 / f16 / f32). The kinds (mma,
splitk, pipe, ring, wg, wgt, ws, wgr, rows) and their kernels are described with their spaces in `cuda_space.py`;
the C++ text and the kernels' names are `cuda_source.py`'s, the cuBLAS peer `cuda_peer.py`'s.

Arguments: x, x_row0 (first row of x read), w, absmax, w_up, absmax_up, norm_w, eps, out, M, N, K; every size is an
argument, so one program serves every shape (`program_key` is the config); split-K's main launch takes `partial`
in place of out. A later step with a seam here: swizzled shared layouts instead of padded rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.devices.cuda_tma import f16_rows_map
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.cudasrc import (
    FMT_CODE,
    NULL,
    arg_or,
    compile_cuda,
    offers_f16_out,
    upload_all,
    zeroed,
)
from tilewise.kernels.matmul.cuda_peer import cublas_f16, cublas_f16_launches
from tilewise.kernels.matmul.cuda_rules import (
    mma_rules,
    pipe_rules,
    ring_rules,
    rows_rules,
    splitk_rules,
    wg_rules,
    wgr_rules,
    ws_rules,
)
from tilewise.kernels.matmul.cuda_source import (
    SOURCE_FILES,
    SPLITK_ARGS,
    WGR_ARGS,
    entry_name,
    matmul_source,
    prep_entry_name,
    reduce_entry_name,
)
from tilewise.kernels.matmul.cuda_space import (
    DEFAULT_MMA,
    DEFAULT_PIPE,
    DEFAULT_RING,
    DEFAULT_ROWS,
    DEFAULT_SPLITK,
    DEFAULT_WG,
    DEFAULT_WGR,
    DEFAULT_WS,
    EPI_CODE,
    KINDS,
    KS_KINDS,
    KS_VALUES,
    LEGACY,
    MAX_FRAGMENTS,
    MMA_FROM_ROWS,
    MMA_PARAMS,
    MMA_SEED,
    MMA_VALUES,
    PIPE_PARAMS,
    PIPE_SEED,
    PIPE_SMEM_MAX,
    PIPE_VALUES,
    PREP_KINDS,
    PREP_NT,
    REDUCE_NT,
    RING_PARAMS,
    RING_SEED,
    RING_VALUES,
    ROWS_PARAMS,
    ROWS_SEED,
    ROWS_VALUES,
    SMEM_RESERVED_PER_BLOCK,
    SPLITK_PARAMS,
    SPLITK_SEED,
    SR_KINDS,
    STATIC_SMEM_BYTES,
    WARP,
    WG_BK,
    WG_COMPUTE_CAPABILITY,
    WG_PARAMS,
    WG_SEED,
    WG_SPARE,
    WG_VALUES,
    WGMMA_KINDS,
    WGR_PARAMS,
    WGR_SEED,
    WGR_SPARE,
    WGR_VALUES,
    WS_PARAMS,
    WS_PRODUCER_REGS,
    WS_SEED,
    WS_VALUES,
    mma_held_registers,
    mma_smem_bytes,
    mma_threads,
    pipe_smem_bytes,
    ring_smem_bytes,
    ring_spare_needed,
    ring_spare_registers,
    wg_smem_bytes,
    wg_spare_registers,
    wg_threads,
    wgr_smem_bytes,
    wgr_spare_registers,
    wgr_threads,
    ws_consumer_regs,
    ws_smem_bytes,
    ws_threads,
)
from tilewise.kernels.matmul.problem import EPILOGUES, MatmulProblem
from tilewise.kernels.space import Config, Space

# the spaces (cuda_space.py) and their rules (cuda_rules.py) are part of this module's interface: callers write
# `cuda.DEFAULT_RING`
__all__ = [
    "DEFAULT_MMA", "DEFAULT_PIPE", "DEFAULT_RING", "DEFAULT_ROWS", "DEFAULT_SPLITK", "DEFAULT_WG", "DEFAULT_WGR",
    "DEFAULT_WS", "EPI_CODE", "KINDS", "KS_KINDS", "KS_VALUES", "LEGACY", "MAX_FRAGMENTS", "MMA_FROM_ROWS",
    "MMA_PARAMS", "MMA_SEED", "MMA_VALUES", "PIPE_PARAMS", "PIPE_SEED", "PIPE_SMEM_MAX", "PIPE_VALUES", "PREP_KINDS",
    "PREP_NT", "REDUCE_NT", "RING_PARAMS", "RING_SEED", "RING_VALUES", "ROWS_PARAMS", "ROWS_SEED", "ROWS_VALUES",
    "SMEM_RESERVED_PER_BLOCK", "SOURCE_FILES", "SPLITK_PARAMS", "SPLITK_SEED", "SR_KINDS", "STATIC_SMEM_BYTES", "WARP",
    "WGMMA_KINDS", "WGR_PARAMS", "WGR_SEED", "WGR_SPARE", "WGR_VALUES", "WG_BK", "WG_COMPUTE_CAPABILITY", "WG_PARAMS",
    "WG_SEED", "WG_SPARE", "WG_VALUES", "WS_PARAMS", "WS_PRODUCER_REGS", "WS_SEED", "WS_VALUES", "CudaMatmul",
    "CudaNF4MatmulMma", "CudaNF4MatmulRows", "CudaNF4SwigluMma", "all_variants", "matmul_source", "mma_held_registers",
    "mma_rules", "mma_smem_bytes", "mma_threads", "pipe_rules", "pipe_smem_bytes", "ring_rules", "ring_smem_bytes",
    "ring_spare_needed", "ring_spare_registers", "rows_rules", "splitk_rules", "wg_rules", "wg_smem_bytes",
    "wg_spare_registers", "wg_threads", "wgr_rules", "wgr_smem_bytes", "wgr_spare_registers", "wgr_threads",
    "ws_consumer_regs", "ws_rules", "ws_smem_bytes", "ws_threads",
]

class CudaMatmul(KernelTemplate):
    """One matmul variant (kind, weight format, epilogue, fused norm) on CUDA; the kinds: `cuda_space.py`."""

    backend = "cuda"
    shape_names = MatmulProblem.shape_names
    # a 346-row float64 reference of a 4608x1024 pair costs more than a candidate's compile and run: eight checks
    # share one input set (outputs re-poisoned before each)
    verify_reuse = 8

    def __init__(self, kind: str = "mma", fmt: str = "nf4", epilogue: str = "none", norm: bool = False,
                 eps: float = 1e-5) -> None:
        if kind not in KINDS or fmt not in FMT_CODE or epilogue not in EPI_CODE:
            raise ValueError(f"unknown CUDA matmul kind={kind} fmt={fmt} epilogue={epilogue}")
        self.kind, self.fmt, self.epilogue, self.norm, self.eps = kind, fmt, epilogue, norm, eps
        self.problem = MatmulProblem(fmt, epilogue, norm, eps)
        self.sets = self.problem.sets
        self.name = f"{fmt}_matmul.{kind}.{epilogue}" + (".norm" if norm else "")
        self.dtype = "f16" if kind != "rows" else self.problem.dtype
        #: split-K's partial sums are poisoned and guarded like "out" (`KernelTemplate.scratch_buffers`)
        self.scratch_buffers = (("partial",) if kind in KS_KINDS else ()) + (("xh",) if kind in PREP_KINDS else ())

    @classmethod
    def from_name(cls, name: str, eps: float = 1e-5) -> CudaMatmul:
        """The template a name like `nf4_matmul.rows.swiglu.norm` stands for."""
        parts = name.split(".")
        fmt = parts[0].split("_")[0]
        return cls(parts[1], fmt, parts[2], len(parts) > 3 and parts[3] == "norm", eps)

    # ---- spaces -----------------------------------------------------------------------------------------------
    spaces = ("seed", "full")

    def space(self, which: str = "full") -> Space:
        sets, fmt, norm = self.sets, self.fmt, self.norm
        values, rules, seed = {  # per kind: its values, its rules (made on demand), its seed points
            "rows": (ROWS_VALUES, rows_rules, ROWS_SEED),
            "wg": (WG_VALUES, lambda: wg_rules(sets, fmt, False), WG_SEED),
            "wgt": (WG_VALUES, lambda: wg_rules(sets, fmt, True), WG_SEED),
            "wgr": (WGR_VALUES, lambda: wgr_rules(sets, fmt), WGR_SEED),
            "ws": (WS_VALUES, lambda: ws_rules(sets, fmt), WS_SEED),
            "ring": (RING_VALUES, lambda: ring_rules(sets, fmt), RING_SEED),
            "pipe": (PIPE_VALUES, lambda: pipe_rules(sets, fmt), PIPE_SEED),
            "splitk": ({**MMA_VALUES, "KS": KS_VALUES, "SR": [0, 1, 2]}, lambda: splitk_rules(sets, fmt, norm),
                       SPLITK_SEED),
            "mma": (MMA_VALUES, lambda: mma_rules(sets, fmt, norm), MMA_SEED),
        }[self.kind]
        return Space(f"cuda-matmul-{self.kind}-{which}", {k: list(v) for k, v in values.items()}, rules(),
                     points=seed if which == "seed" else None)

    def config_of(self, values: Mapping[str, Any]) -> Config:
        """As the base, and a config written before a parameter of its kind existed (a stored result, an older
        table) takes that parameter's `LEGACY` value: the kernel it measured."""
        return super().config_of({**LEGACY.get(self.kind, {}), **values})

    def default_config(self) -> Config:
        return self.config_of({"rows": DEFAULT_ROWS, "mma": DEFAULT_MMA, "splitk": DEFAULT_SPLITK,
                               "pipe": DEFAULT_PIPE, "ring": DEFAULT_RING, "wg": DEFAULT_WG, "wgt": DEFAULT_WG,
                               "ws": DEFAULT_WS, "wgr": DEFAULT_WGR}[self.kind])

    def splits(self, config: Config) -> bool:
        """The config sums slices of K through `partial` (split-K, or pipe / ring / wg / wgr with KS > 1), in a
        further launch unless the last block of each tile does it (`serial`)."""
        return self.kind in KS_KINDS and config["KS"] > 1

    #: scratch buffers a kernel expects at zero and leaves at zero (made zeroed once, never poisoned)
    zeroed_scratch = ("counters",)

    def serial(self, config: Config) -> bool:
        """The last block of each tile sums its slices (wgr's and splitk's SR 1): no reduction launch; a zeroed
        `counters` scratch counts the tile's finished blocks."""
        return self.kind in SR_KINDS and self.splits(config) and config["SR"] == 1

    def clustered(self, config: Config) -> bool:
        """A tile's blocks are one cluster that sums its slices in shared memory (wgr's and splitk's SR 2, Hopper):
        no reduction launch, no partial sums, no counters."""
        return self.kind in SR_KINDS and self.splits(config) and config["SR"] == 2

    def sums_in_kernel(self, config: Config) -> bool:
        """The matmul's own launch applies the epilogue (KS 1, SR 1 or SR 2): no reduction launch follows."""
        return not self.splits(config) or self.serial(config) or self.clustered(config)

    def fold_from(self, config: Config) -> dict[str, int] | None:
        """Where this config's launch takes the norm fold's producing side (`cuda_fuse.fold_norm`), as its argument
        positions; None where it cannot: a residual launch that adds its output into the rows in the kernel, without
        a reduction launch or the last block's serial sum (neither stores the fold's rows): wgr with KS 1 or SR 2,
        splitk with SR 2 whose tile the cluster's fold path takes (BN a multiple of 64, its 4-column chunks a whole
        number of passes of the block; `cluster_reduce`)."""
        if self.epilogue != "residual":
            return None
        if self.kind == "wgr" and (config["KS"] == 1 or self.clustered(config)):
            return {k: WGR_ARGS[k] for k in ("m", "n", "final_out", "out_h", "fold_g", "ss_out")}
        if (self.kind == "splitk" and self.clustered(config) and config["BN"] % 64 == 0
                and config["BM"] * config["BN"] // 4 % mma_threads(config) == 0):
            return dict(SPLITK_ARGS)
        return None

    def preps(self) -> bool:
        """The kind reads x as f16 rows made by the `nf4_mm_prep` launch (ring, wg, wgt, ws, wgr)."""
        return self.kind in PREP_KINDS

    def scratch_bytes(self, config: Config, rows: int, n: int, k: int) -> dict[str, int]:
        """The scratch buffers a config's launches need at `rows` rows, by name: split-K's partial sums, the ring
        and wg kinds' f16 copy of x (`xh`, rows x K)."""
        out = ({"partial": self.partial_bytes(config["KS"], rows, n)} if self.splits(config)
               and not self.clustered(config) else {})
        if self.preps():
            out["xh"] = 2 * rows * k
        if self.serial(config):
            out["counters"] = 4 * math.prod(self.grid(config, (rows, n, k))[:2])
        return out

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        m, _, k = shape
        out = []
        if self.kind in KS_KINDS:
            bk = WG_BK if self.kind in (*WGMMA_KINDS, "wgr") else config["BK"]
            if k % (config["KS"] * bk):
                out.append(f"k_slices: K = {k} is not KS = {config['KS']} slices of whole BK = {bk} steps "
                           f"(a multiple of {config['KS'] * bk})")
        elif k % (step := config["BK"] if self.kind == "mma" else 8):
            out.append(f"k_steps: K = {k} is not a multiple of {'BK' if self.kind == 'mma' else 'a word of 8'} "
                       f"= {step}")
        if self.fmt == "nf4" and k % 64:
            out.append(f"nf4_blocks: K = {k} is not a multiple of 64 (one absmax per 64 weights of a row)")
        bm = config[{"rows": "RM", "wgr": "BT"}.get(self.kind, "BM")]
        if math.ceil(m / bm) > 65535:
            out.append(f"grid_y: ceil(M / {bm}) = {math.ceil(m / bm)} blocks > 65535")
        return out

    # ---- source and compile -----------------------------------------------------------------------------------
    def entry(self, config: Config) -> str:
        return entry_name(self.kind, self.fmt, self.epilogue, self.norm, config)

    def prep_entry(self) -> str:
        """The ring and wg kinds' first kernel: x rows to f16 (normed first with the fused norm)."""
        return prep_entry_name(self.norm)

    def reduce_entry(self) -> str:
        """split-K's second kernel: the slices' sum with the epilogue."""
        return reduce_entry_name(self.epilogue)

    def source(self, config: Config, shape: Shape | None = None) -> str:
        return f"{matmul_source()}\n// instantiated as {self.entry(config)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return config

    def threads(self, config: Config) -> int:
        if self.kind in ("wg", "wgt"):
            return wg_threads(config)
        if self.kind == "ws":
            return ws_threads(config)
        if self.kind == "wgr":
            return wgr_threads(config)
        return config["NT"] if self.kind == "rows" else mma_threads(config)

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        src = matmul_source()
        dyn = {"pipe": pipe_smem_bytes, "ring": ring_smem_bytes, "wg": wg_smem_bytes,
               "wgt": functools.partial(wg_smem_bytes, tma=True), "ws": ws_smem_bytes,
               "wgr": wgr_smem_bytes}.get(self.kind)
        smem = dyn(config, self.fmt, self.sets) if dyn else 0
        prog = compile_cuda(device, src, self.entry(config), self.threads(config), f"{self.name}[{config}]",
                            dynamic_shared_bytes=smem)
        if self.kind == "wgr" and self.epilogue != "residual" and self.sums_in_kernel(config):
            # it applies the epilogue itself, into final_out (out with KS 1)
            offers_f16_out(prog, WGR_ARGS["final_out"], WGR_ARGS["out_h"], WGR_ARGS["m"], WGR_ARGS["n"])
        if self.kind == "wgr":  # the norm fold's consuming side (`cuda_fuse.fold_norm`); q/k norm + RoPE (`fuse_rope`)
            prog.meta["fold_into"] = config["KS"] == 1 or self.clustered(config)
            prog.meta["rope_into"] = self.epilogue == "none" and prog.meta["fold_into"]
        fold = self.fold_from(config)
        if fold:
            prog.meta["fold_from"] = fold
        if self.preps():
            prog.meta["prep"] = compile_cuda(device, src, self.prep_entry(), PREP_NT, f"{self.name}.prep")
            prog.meta["prep"].meta["role"] = ("prep", int(self.norm))
        if not self.sums_in_kernel(config):
            prog.meta["reduce"] = compile_cuda(device, src, self.reduce_entry(), REDUCE_NT, f"{self.name}.reduce")
            prog.meta["reduce"].meta["role"] = ("reduce", EPI_CODE[self.epilogue])
        return prog

    # ---- data -------------------------------------------------------------------------------------------------
    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, n, _ = shape
        bufs = upload_all(device, {k: v for k, v in host.items() if k != "residual"})
        bufs["out"] = device.allocate(4 * m * n)
        if self.kind in KS_KINDS:  # for the largest KS: every candidate shares one input set
            bufs["partial"] = device.allocate(self.partial_bytes(max(KS_VALUES), m, n))
        if self.preps():
            bufs["xh"] = device.allocate(2 * m * shape[2])
        if self.kind in SR_KINDS:  # zeroed once, for the most tiles any config makes (wgr: BF 64, BT 8; splitk: 32)
            bufs["counters"] = zeroed(device, 4 * max(math.ceil(n / 64) * math.ceil(m / 8),
                                                     math.ceil(n / 32) * math.ceil(m / 32)))
        if self.kind == "wgr" and self.fmt == "nf4":  # wgr reads a step's scales as one contiguous run
            bufs.update({f"{a}_t": device.upload(absmax_by_step(host[a], n)) for a in ("absmax", "absmax_up")
                         if a in host})
        init = self.problem.initial_output(host, shape)
        if init is not None:
            device.write(bufs["out"], init)
        return self.attach_initial(device, host, shape, bufs)

    def partial_bytes(self, ks: int, m: int, n: int) -> int:
        """Bytes of split-K's partial sums: KS slices of SETS x M x N f32."""
        return 4 * ks * self.sets * m * n

    def grid(self, config: Config, shape: Shape) -> tuple[int, int, int]:
        m, n, _ = shape
        if self.kind == "rows":
            cols = config["NT"] // WARP // config["WK"] * config["CW"]  # output columns a block
            return (math.ceil(n / cols), math.ceil(m / config["RM"]), 1)
        if self.kind == "wgr":
            return (math.ceil(n / config["BF"]), math.ceil(m / config["BT"]), config["KS"])
        return (math.ceil(n / config["BN"]), math.ceil(m / config["BM"]), config.get("KS", 1))

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return self.launches_at(program, bufs, config, shape, 0)

    def launches_at(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape,
                    x_row0: int) -> list[Launch]:
        """The launch reading x from row `x_row0` (the executor's last block reads a window of the rows); split-K:
        the slices into `partial`, then the reduction into out; ring, wg and ws: x to f16 into `xh` first."""
        m, n, k = shape
        weights = [bufs["w"], arg_or(bufs, "absmax", "w"), arg_or(bufs, "w_up", "w"), arg_or(bufs, "absmax_up", "w")]
        if self.kind == "wgr" and self.fmt == "nf4":  # its scales stored (K / 64, N): required, never a fallback
            weights[1] = bufs["absmax_t"]
            if self.sets == 2:
                weights[3] = bufs["absmax_up_t"]
        out = bufs["partial" if self.splits(config) and not self.clustered(config) else "out"]
        dims = [np.int32(m), np.int32(n), np.int32(k)]
        reduce = self._reduce(program, bufs, config, m, n)
        if self.preps():
            prep = Launch(program.meta["prep"], (m, 1, 1), [bufs["x"], np.int32(x_row0), arg_or(bufs, "norm_w", "x"),
                                                            np.float32(self.eps), bufs["xh"], np.int32(k)])
            main = [bufs["xh"], *weights, out, *dims]
            if self.kind == "wgt":  # x by TMA: xh as (m, k) f16 rows in boxes of 64 x 64
                main.append(f16_rows_map(bufs["xh"], m, k, 64))
            elif self.kind == "wgr":  # one box of BT tokens x 64 a step; SR's arguments; no f16 output (`fuse_prep`
                # may set one), no norm fold (`fold_norm` may set it: ss_in, eps, fold_g, ss_out), no RoPE
                # (`fuse_rope` may set it)
                main += [f16_rows_map(bufs["xh"], m, k, config["BT"]), *self._sr_args(bufs, config), NULL, NULL,
                         np.float32(self.eps), NULL, NULL, NULL]
            return [prep, Launch(program, self.grid(config, shape), main), *reduce]
        args: list[Any] = [bufs["x"], np.int32(x_row0), *weights, arg_or(bufs, "norm_w", "x"), np.float32(self.eps),
                           out, *dims]
        if self.kind == "splitk":  # SR's arguments, and no norm fold (`fold_norm` may set it: out_h, fold_g, ss_out)
            args += [*self._sr_args(bufs, config), NULL, NULL, NULL]
        return [Launch(program, self.grid(config, shape), args), *reduce]

    def _sr_args(self, bufs: DeviceBuffers, config: Config) -> list[Any]:
        """An SR kind's final output and tile counters (SR 0 reads neither: out stands in for both)."""
        return [bufs["out"], bufs["counters"] if self.serial(config) else bufs["out"]]

    def _reduce(self, program: Program, bufs: DeviceBuffers, config: Config, m: int, n: int) -> list[Launch]:
        """split-K's sum of the slices with the epilogue (none without slices)."""
        if self.sums_in_kernel(config):
            return []
        return [Launch(program.meta["reduce"], (math.ceil(m * n / REDUCE_NT), 1, 1),
                       [bufs["partial"], np.int32(config["KS"]), bufs["out"], np.int32(m), np.int32(n)])]

    # ---- the cuBLAS peer ---------------------------------------------------------------------------------------
    peer_name = "cuBLAS f16"

    def peer_program(self, device: Device) -> Program:
        """cuBLAS f16 on the same shape (`cuda_peer.cublas_f16`): the dense tensor-core bound this kernel is
        measured against."""
        return cublas_f16(device)

    def peer_launches(self, program: Program, bufs: DeviceBuffers, shape: Shape) -> list[Launch]:
        return cublas_f16_launches(program, shape, self.sets)

    def describe(self, config: Config) -> str:
        if self.kind == "rows":
            return (f"rows nt{config['NT']} rm{config['RM']}" + (f" wk{config['WK']}" if config["WK"] > 1 else "")
                    + (f" cw{config['CW']}" if config["CW"] > 1 else ""))
        if self.kind == "wgr":
            return (f"wgr {config['BF']}x{config['BT']}x{WG_BK} st{config['ST']} ks{config['KS']} "
                    f"mb{config['MB']}" + (f" dec{config['DEC']}" if config["DEC"] else "")
                    + (" sr" if self.serial(config) else "")
                    + (" cluster" if self.clustered(config) else ""))
        if self.kind in WGMMA_KINDS:
            return (f"{self.kind} {config['BM']}x{config['BN']}x{WG_BK} mt{config['MT']} st{config['ST']} "
                    f"ks{config['KS']} mb{config['MB']}" + (f" pw{config['PW']}" if self.kind == "ws" else ""))
        tile = f"{config['BM']}x{config['BN']}x{config['BK']} w{config['WM']}x{config['WN']}"
        if self.kind in ("pipe", "ring"):
            return f"{self.kind} {tile} st{config['ST']} ks{config['KS']} mb{config['MB']}"
        tile += f" p{config['PIPE']}"
        if self.kind == "splitk":
            return (f"splitk {tile} ks{config['KS']}" + (" sr" if self.serial(config) else "")
                    + (" cluster" if self.clustered(config) else ""))
        return f"mma {tile}"

    def tile_waste(self, config: Config, shape: Shape) -> float:
        m, n, _ = shape
        if self.kind == "rows":
            bm, bn = config["RM"], config["NT"] // WARP // config["WK"] * config["CW"]
        elif self.kind == "wgr":
            bm, bn = config["BT"], config["BF"]
        else:
            bm, bn = config["BM"], config["BN"]
        return (math.ceil(m / bm) * bm * math.ceil(n / bn) * bn) / (m * n)

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "source": "+".join(SOURCE_FILES), "kind": self.kind, "fmt": self.fmt,
                "epilogue": self.epilogue, "norm": self.norm}


def absmax_by_step(absmax: np.ndarray, n: int) -> np.ndarray:
    """nf4's absmax (N * K / 64,), one row of scales per output row, as (K / 64, N): a K step's scales of N rows
    contiguous (what the wgr kind reads)."""
    return np.ascontiguousarray(np.asarray(absmax, np.float32).reshape(n, -1).T)


def all_variants(eps: float = 1e-5) -> list[CudaMatmul]:
    """Every (kind, format, epilogue, norm) the executor can launch (the compile checks instantiate these)."""
    return [CudaMatmul(k, f, e, nm, eps) for k in KINDS for f in FMT_CODE for e in EPILOGUES for nm in (False, True)]


# no-argument classes for `tilewise.kernels.registry` (`tilewise tune nf4-matmul --device cuda --shape M,N,K`)
class CudaNF4MatmulMma(CudaMatmul):
    """Tensor-core NF4 matmul, plain epilogue."""

    def __init__(self) -> None:
        super().__init__("mma", "nf4", "none", False)


class CudaNF4MatmulRows(CudaMatmul):
    """Short-row NF4 matmul, plain epilogue."""

    def __init__(self) -> None:
        super().__init__("rows", "nf4", "none", False)


class CudaNF4SwigluMma(CudaMatmul):
    """Tensor-core paired gate/up NF4 matmul with SwiGLU and the fused RMSNorm (the FFN's first half)."""

    def __init__(self) -> None:
        super().__init__("mma", "nf4", "swiglu", True)
