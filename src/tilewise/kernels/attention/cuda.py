"""Attention on CUDA (`attention.cu`, the tensor-core kernel in `attention_mma.cu`): q/k RMSNorm + RoPE into the KV
cache, and flash-style causal GQA attention.

Problems: `attention.problem.AttentionProblem` (shape M, P, HQ, HKV, D; parameters QT, queries per block, NW,
warps per block, TC, tensor cores, KW, warps splitting each key tile, and PF, the next key tile prefetched: with
TC 0, QT 1 has each warp take every NW-th key of the block's query with an online softmax, and QT > 1 has the
block's QT queries share each 32-key tile staged in shared memory, a warp per query at a time; TC 1
(`attention_mma`, QT = 16 NW / KW) gives each group of KW warps 16 queries on f16 mma.sync over 64-key tiles, each
warp 64 / KW keys of a tile, verified at the f16 tolerance; PF 1 loads the next tile's K and V into registers while
this tile's math runs) and `QKNormRopeProblem` (one block of D threads per (head, row); D is a template argument).
Sizes other than D are kernel arguments.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Program, capability
from tilewise.kernels.attention.problem import AttentionProblem, QKNormRopeProblem, rope_table
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.cudasrc import NULL, compile_cuda, model_source, name_expression, offers_f16_out, upload_all
from tilewise.kernels.space import Config, Rule, Space

DEFAULT_NW = 4
#: the family's CUDA files, compiled as one text in this order (attention_mma.cu uses attention.cu's definitions)
SOURCE_FILES = ("attention.cu", "attention_mma.cu")
#: QT 1: the per-query kernel (`attention`); QT > 1: `attention_tiled`, QT queries sharing each staged key tile;
#: TC 1: `attention_mma`, 16 queries to each group of KW warps on tensor cores. The default is the first of these
#: the device and the head size allow (`default_attention`): on an H200 at 346 queries the tensor-core tile of 64
#: queries ran 0.0252 ms, the per-query kernel 0.0784 (bench/results/2026-12-04-h200-pdl-ray)
DEFAULTS = ({"QT": 64, "NW": 4, "TC": 1, "KW": 1, "PF": 0}, {"QT": 32, "NW": 2, "TC": 1, "KW": 1, "PF": 0},
            {"QT": 1, "NW": DEFAULT_NW, "TC": 0, "KW": 1, "PF": 0})
SEED_PARAMS = ("QT", "NW", "TC", "KW", "PF")
#: (QT, NW, TC, KW, PF) tried first by `tune model --budget N`: the tensor-core tiles (those whose warps split the key
#: tiles among them after the first three; the prefetching ones beside the split that won on the H200, 32 x 8 x 4,
#: and 64 x 8 x 2 with the prefetch, the fastest of every config in the race at lfm2-350m's 16 heads on an H100),
#: the tiled kernel's middle tiles, then the per-query kernel's
SEED = ((32, 2, 1, 1, 0), (64, 4, 1, 1, 0), (16, 1, 1, 1, 0), (32, 8, 1, 4, 0), (32, 8, 1, 4, 1), (64, 8, 1, 2, 1),
        (64, 4, 1, 1, 1), (16, 4, 1, 4, 1), (16, 4, 1, 4, 0), (32, 4, 1, 2, 0), (16, 2, 1, 2, 0), (32, 4, 1, 2, 1),
        (32, 4, 0, 1, 0), (32, 8, 0, 1, 0), (64, 8, 0, 1, 0), (16, 4, 0, 1, 0), (64, 16, 0, 1, 0), (16, 2, 0, 1, 0),
        (32, 16, 0, 1, 0), (8, 2, 0, 1, 0), (1, 4, 0, 1, 0), (1, 8, 0, 1, 0), (1, 2, 0, 1, 0))
#: KW and PF of configs written before the key split and the prefetch existed: the kernel they measured
LEGACY = {"KW": 1, "PF": 0}
MAX_GRID_YZ = 65535
#: qknorm_rope's warps per block (ROPE_WARPS in attention.cu), one (row, head) each
ROPE_WARPS = 8
STATIC_SMEM_BYTES = 48 * 1024
#: the tensor-core kernel's key tile (ATTN_MMA_TK in attention_mma.cu)
MMA_TK = 64
#: the most floats a thread of PF 1 holds for the next tile's K and V (ATTN_PF_FLOATS in attention_mma.cu)
PF_FLOATS = 64


def prefetch_floats(d: int, nw: int) -> int:
    """Floats a thread of `attention_mma` with PF 1 holds: its share of a K and a V tile of 64 keys of D f32."""
    return 2 * MMA_TK * d // (32 * nw)


def mma_smem_bytes(d: int, nw: int, kw: int = 1) -> int:
    """Static shared memory of `attention_mma` (`mma_attention_smem_bytes`): 16 NW / KW queries and a K and a V tile
    of 64 keys, f16, rows padded by 8 halves; with KW > 1 the (max, sum, D outputs) of 16 rows of each warp but the
    first of each group, f32, for the merge."""
    merge = 4 * (nw - nw // kw) * 16 * (d + 2) if kw > 1 else 0
    return 2 * (16 * (nw // kw) + 2 * MMA_TK) * (d + 8) + merge


def tiled_smem_bytes(d: int, qt: int) -> int:
    """Static shared memory of `attention_tiled` (`tiled_smem_bytes` in attention.cu): the block's queries, a padded
    K tile and a V tile of 32 keys."""
    return 4 * (qt * d + 32 * (d + 4) + 32 * (-(-d // 32)) * 32)


def _head_rules(shape: Shape, lo: int, hi: int) -> list[str]:
    _, _, hq, hkv, d = shape
    out = []
    if d % 16 or not lo <= d <= hi:
        out.append(f"head_dim_{lo}_{hi}: D = {d} is not a multiple of 16 in {lo}..{hi}")
    if hq % hkv:
        out.append(f"gqa_groups: HQ = {hq} is not a multiple of HKV = {hkv}")
    return out


def default_attention(limits: Any, shape: Shape) -> dict[str, int]:
    """The config an untuned device runs at `shape` (M, P, HQ, HKV, D): the first of `DEFAULTS` that its rules and the
    shape allow (the per-query kernel runs every head size up to 256)."""
    tpl = CudaAttention()
    space = tpl.space()
    for values in DEFAULTS:
        cfg = tpl.config_of(values)
        if space.is_legal(cfg, limits) and not tpl.config_problems(cfg, shape):
            return dict(values)
    return dict(DEFAULTS[-1])


class CudaAttention(KernelTemplate):
    """Causal GQA attention of M queries after P cached positions, NW warps per block: QT 1, grid (M, HQ), one query
    a block; QT > 1, grid (ceil(M / QT), HQ), QT queries a block sharing staged key tiles; TC 1, the same grid with
    16 queries to each group of KW warps on tensor cores, the group's warps splitting each key tile."""

    backend = "cuda"
    problem = AttentionProblem()

    def space(self, which: str = "full") -> Space:
        """attention.cu's `warps_1_32`, the tiled kernel's `tiled_first_failure` rules and the tensor-core kernel's
        (`head_dim_*` and `smem_48k` are shape rules: D comes with the shape)."""
        tiled = lambda c: c.QT > 1 and not c.TC  # noqa: E731
        points = [dict(zip(SEED_PARAMS, v)) for v in SEED] if which == "seed" else None
        return Space(f"cuda-attention-{which}", {"QT": [1, 8, 16, 32, 64], "NW": [1, 2, 4, 8, 16], "TC": [0, 1],
                                                  "KW": [1, 2, 4], "PF": [0, 1]}, [
            Rule("warps_1_32", lambda c, _: 1 <= c.NW <= 32, lambda c, _: f"NW = {c.NW} warps is not in 1..32"),
            Rule("queries_per_warp_whole", lambda c, _: not tiled(c) or (c.QT >= c.NW and c.QT % c.NW == 0),
                 lambda c, _: f"QT = {c.QT} queries are not a whole number of queries for each of NW = {c.NW} warps"),
            Rule("queries_per_warp_8", lambda c, _: not tiled(c) or c.QT // c.NW <= 8,
                 lambda c, _: f"QT / NW = {c.QT // c.NW} queries per warp > 8 (each holds its output in registers)"),
            Rule("key_warps_need_tc", lambda c, _: c.TC or c.KW == 1,
                 lambda c, _: f"KW = {c.KW} splits key tiles among warps on tensor cores only (TC 1); TC 0 takes KW 1"),
            Rule("prefetch_needs_tc", lambda c, _: c.TC or c.PF == 0,
                 lambda c, _: f"PF = {c.PF} prefetches key tiles on tensor cores only (TC 1); TC 0 takes PF 0"),
            Rule("key_warps_divide_warps", lambda c, _: c.NW % c.KW == 0,
                 lambda c, _: f"NW = {c.NW} warps do not form whole groups of KW = {c.KW}"),
            Rule("mma_queries_16_per_warp", lambda c, _: not c.TC or c.NW % c.KW or c.QT == 16 * c.NW // c.KW,
                 lambda c, _: f"TC 1 gives each group of KW warps 16 queries (one m16 tile), so QT must be "
                              f"16 * NW / KW = {16 * c.NW // c.KW}, not {c.QT}"),
            Rule("mma_warps_1_8", lambda c, _: not c.TC or c.NW <= 8,
                 lambda c, _: f"TC 1 takes 1..8 warps, not NW = {c.NW}"),
            Rule("mma_compute_capability_8", lambda c, lim: not c.TC or capability(lim.compute_capability) >= (8, 0),
                 lambda c, lim: f"TC 1 uses f16 mma.sync, which needs compute capability 8.0; the device has "
                                f"{lim.compute_capability}", needs_limits=True),
            Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= 32 * c.NW,
                 lambda c, lim: f"32*NW = {32 * c.NW} > the device's {lim.max_invocations_per_workgroup}",
                 needs_limits=True)], points=points)

    def dtype_of(self, config: Config) -> str:
        """Tensor-core configs round q, k, v and the probabilities to f16: the f16 tolerance."""
        return "f16" if config["TC"] else self.dtype

    def config_of(self, values: Mapping[str, Any]) -> Config:
        """As the base, and a config written before the key split or the prefetch (no KW, no PF) takes their
        `LEGACY` values: the kernel it measured."""
        return super().config_of({**LEGACY, **values} if "QT" in values else dict(values))

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        d = shape[4]
        out = _head_rules(shape, 16, 128 if config["TC"] else 256)
        if shape[2] > MAX_GRID_YZ:
            out.append(f"grid_y: HQ = {shape[2]} > {MAX_GRID_YZ}")
        if config["TC"]:
            if (smem := mma_smem_bytes(d, config["NW"], config["KW"])) > STATIC_SMEM_BYTES:
                out.append(f"smem_48k: {config['QT']} queries of D = {d}, K and V tiles of {MMA_TK} keys and the "
                           f"merge of KW = {config['KW']} take {smem} bytes of shared memory > {STATIC_SMEM_BYTES}")
            if config["PF"] and (held := prefetch_floats(d, config["NW"])) > PF_FLOATS:
                out.append(f"prefetch_registers: PF 1 holds the next K and V tile of D = {d} in {held} floats a "
                           f"thread with NW = {config['NW']} warps, > {PF_FLOATS}; use PF 0 or more warps")
        elif config["QT"] > 1 and (smem := tiled_smem_bytes(d, config["QT"])) > STATIC_SMEM_BYTES:
            out.append(f"smem_48k: QT = {config['QT']} queries of D = {d} and a key tile take {smem} bytes of "
                       f"shared memory > {STATIC_SMEM_BYTES}")
        return out

    def entry(self, config: Config, d: int) -> str:
        if config["TC"]:
            return name_expression("attention_mma", d, config["NW"], config["KW"], config["PF"])
        if config["QT"] > 1:
            return name_expression("attention_tiled", d, config["QT"], config["NW"])
        return name_expression("attention", d, config["NW"])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        d = (shape or (1, 0, 1, 1, 64))[4]
        return f"{model_source('attention', *SOURCE_FILES)}\n// instantiated as {self.entry(config, d)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return (config, shape[4])

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        prog = compile_cuda(device, model_source("attention", *SOURCE_FILES), self.entry(config, shape[4]),
                            32 * config["NW"], f"attention[{config}]")
        prog.meta["QT"] = int(config["QT"])  # the launch's grid covers the queries in blocks of QT
        return offers_f16_out(prog, 3, 9, 4, 7, shape[4])  # out (M, HQ D) as f16 rows for the out projection

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        bufs = upload_all(device, host)
        bufs["out"] = device.allocate(4 * int(np.prod(self.problem.output_shape(shape))))
        return bufs

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return self.launches_at(program, bufs, shape, 0)

    def launches_at(self, program: Program, bufs: DeviceBuffers, shape: Shape, first: int) -> list[Launch]:
        """Queries are rows first.. of the chunk (the last block of a decision asks for its last row only)."""
        m, p, hq, hkv, _ = shape
        qt = program.meta.get("QT", 1)
        return [Launch(program, (-(-m // qt), hq, 1), [bufs["q"], bufs["k_cache"], bufs["v_cache"], bufs["out"],
                                                        np.int32(m), np.int32(p), np.int32(first), np.int32(hq),
                                                        np.int32(hkv), NULL])]


class CudaQKNormRope(KernelTemplate):
    """q/k RMSNorm + RoPE of M rows into q and the K/V cache at rows P..; one warp per (row, head), ROPE_WARPS
    warps a block."""

    backend = "cuda"
    shape_names = QKNormRopeProblem.shape_names

    def __init__(self, theta: float = 1e6, eps: float = 1e-5) -> None:
        self.theta, self.eps = theta, eps
        self.problem = QKNormRopeProblem(theta, eps)

    def space(self, which: str = "full") -> Space:
        return Space("cuda-qknorm-rope", {"NT": [0]}, [])  # NT = D: nothing to tune

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        return _head_rules(shape, 16, 1024)

    def source(self, config: Config, shape: Shape | None = None) -> str:
        d = (shape or (1, 0, 1, 1, 64))[4]
        return f"{model_source('attention', *SOURCE_FILES)}\n// instantiated as {name_expression('qknorm_rope', d)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return shape[4]

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        d = shape[4]
        return compile_cuda(device, model_source("attention", *SOURCE_FILES), name_expression("qknorm_rope", d),
                            32 * ROPE_WARPS, f"qknorm_rope[D={d}]")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, p, hq, hkv, d = shape
        cos, sin = rope_table(p + m, d, self.theta)
        bufs = upload_all(device, {**host, "cos": cos, "sin": sin})
        bufs["q"] = device.allocate(4 * m * hq * d)
        bufs["k_cache"] = device.allocate(4 * (p + m) * hkv * d)
        bufs["v_cache"] = device.allocate(4 * (p + m) * hkv * d)
        return bufs

    def poison(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> None:
        for k in ("q", "k_cache", "v_cache"):
            device.write(bufs[k], np.full(bufs[k].nbytes // 4, np.nan, np.float32))

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return self.launches_into(program, bufs, shape, bufs["k_cache"], bufs["v_cache"])

    def launches_into(self, program: Program, bufs: dict[str, Buffer], shape: Shape, k_cache: Buffer,
                      v_cache: Buffer) -> list[Launch]:
        m, p, hq, hkv, _ = shape
        return [Launch(program, (math.ceil(m * (hq + 2 * hkv) / ROPE_WARPS), 1, 1), [
            bufs["qkv"], bufs["q_norm"], bufs["k_norm"], bufs["cos"], bufs["sin"], bufs["q"], k_cache, v_cache,
            np.int32(m), np.int32(p), np.int32(hq), np.int32(hkv), np.float32(self.eps)])]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        m, p, hq, hkv, d = shape
        q = device.download(bufs["q"], np.float32, (m, hq * d))
        k = device.download(bufs["k_cache"], np.float32, (p + m, hkv * d))[p:]
        v = device.download(bufs["v_cache"], np.float32, (p + m, hkv * d))[p:]
        return np.concatenate([q, k, v], axis=1)
