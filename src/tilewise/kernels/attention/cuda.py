"""Attention on CUDA (`attention.cu`): q/k RMSNorm + RoPE into the KV cache, and flash-style causal GQA attention.

Problems: `attention.problem.AttentionProblem` (shape M, P, HQ, HKV, D; parameter NW, warps per (query, head)
block, each warp taking every NW-th key with an online softmax) and `QKNormRopeProblem` (one block of D threads per
(head, row); D is a template argument). Sizes other than D are kernel arguments.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Program
from tilewise.kernels.attention.problem import AttentionProblem, QKNormRopeProblem, rope_table
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.cudasrc import compile_cuda, cu_source, name_expression, upload_all
from tilewise.kernels.space import Config, Rule, Space

DEFAULT_NW = 4
MAX_GRID_YZ = 65535


def _head_rules(shape: Shape, lo: int, hi: int) -> list[str]:
    _, _, hq, hkv, d = shape
    out = []
    if d % 16 or not lo <= d <= hi:
        out.append(f"head_dim_{lo}_{hi}: D = {d} is not a multiple of 16 in {lo}..{hi}")
    if hq % hkv:
        out.append(f"gqa_groups: HQ = {hq} is not a multiple of HKV = {hkv}")
    return out


class CudaAttention(KernelTemplate):
    """Causal GQA attention of M queries after P cached positions; grid (M, HQ), NW warps per block."""

    backend = "cuda"
    problem = AttentionProblem()

    def space(self, which: str = "full") -> Space:
        """attention.cu's `warps_1_32` (its `head_dim_16_256` is a shape rule: D comes with the shape)."""
        return Space("cuda-attention", {"NW": [1, 2, 4, 8, 16]}, [
            Rule("warps_1_32", lambda c, _: 1 <= c.NW <= 32, lambda c, _: f"NW = {c.NW} warps is not in 1..32"),
            Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= 32 * c.NW,
                 lambda c, lim: f"32*NW = {32 * c.NW} > the device's {lim.max_invocations_per_workgroup}",
                 needs_limits=True)])

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        out = _head_rules(shape, 16, 256)
        if shape[2] > MAX_GRID_YZ:
            out.append(f"grid_y: HQ = {shape[2]} > {MAX_GRID_YZ}")
        return out

    def entry(self, config: Config, d: int) -> str:
        return name_expression("attention", d, config["NW"])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        d = (shape or (1, 0, 1, 1, 64))[4]
        return f"{cu_source('attention', 'attention.cu')}\n// instantiated as {self.entry(config, d)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return (config, shape[4])

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return compile_cuda(device, cu_source("attention", "attention.cu"), self.entry(config, shape[4]),
                            32 * config["NW"], f"attention[{config}]")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        bufs = upload_all(device, host)
        bufs["out"] = device.allocate(4 * int(np.prod(self.problem.output_shape(shape))))
        return bufs

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return self.launches_at(program, bufs, shape, 0)

    def launches_at(self, program: Program, bufs: DeviceBuffers, shape: Shape, first: int) -> list[Launch]:
        """Queries are rows first.. of the chunk (the last block of a decision asks for its last row only)."""
        m, p, hq, hkv, _ = shape
        return [Launch(program, (m, hq, 1), [bufs["q"], bufs["k_cache"], bufs["v_cache"], bufs["out"], np.int32(m),
                                             np.int32(p), np.int32(first), np.int32(hq), np.int32(hkv)])]


class CudaQKNormRope(KernelTemplate):
    """q/k RMSNorm + RoPE of M rows into q and the K/V cache at rows P..; grid (HQ + 2 HKV, M), D threads."""

    backend = "cuda"
    shape_names = QKNormRopeProblem.shape_names

    def __init__(self, theta: float = 1e6, eps: float = 1e-5) -> None:
        self.theta, self.eps = theta, eps
        self.problem = QKNormRopeProblem(theta, eps)

    def space(self, which: str = "full") -> Space:
        return Space("cuda-qknorm-rope", {"NT": [0]}, [])  # NT = D: nothing to tune

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        out = _head_rules(shape, 16, 1024)
        if shape[0] > MAX_GRID_YZ:
            out.append(f"grid_y: M = {shape[0]} rows > {MAX_GRID_YZ}")
        return out

    def source(self, config: Config, shape: Shape | None = None) -> str:
        d = (shape or (1, 0, 1, 1, 64))[4]
        return f"{cu_source('attention', 'attention.cu')}\n// instantiated as {name_expression('qknorm_rope', d)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return shape[4]

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        d = shape[4]
        return compile_cuda(device, cu_source("attention", "attention.cu"), name_expression("qknorm_rope", d), d,
                            f"qknorm_rope[D={d}]")

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
        return [Launch(program, (hq + 2 * hkv, m, 1), [
            bufs["qkv"], bufs["q_norm"], bufs["k_norm"], bufs["cos"], bufs["sin"], bufs["q"], k_cache, v_cache,
            np.int32(m), np.int32(p), np.int32(hq), np.int32(hkv), np.float32(self.eps)])]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        m, p, hq, hkv, d = shape
        q = device.download(bufs["q"], np.float32, (m, hq * d))
        k = device.download(bufs["k_cache"], np.float32, (p + m, hkv * d))[p:]
        v = device.download(bufs["v_cache"], np.float32, (p + m, hkv * d))[p:]
        return np.concatenate([q, k, v], axis=1)
