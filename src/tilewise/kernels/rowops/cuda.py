"""Row-wise ops on CUDA (`rowops.cu`): RMSNorm, the embedding gather, the final norm + head, and a word copy.

Problems: `rowops.problem` (RMSNormProblem, EmbedProblem, HeadProblem). One parameter, NT (threads per block, a
power of two for the tree reductions); sizes are kernel arguments, so a program serves every shape.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.cudasrc import (
    FMT_CODE,
    NULL,
    arg_or,
    compile_cuda,
    model_source,
    name_expression,
    upload_all,
)
from tilewise.kernels.rowops.problem import EmbedProblem, HeadProblem, RMSNormProblem
from tilewise.kernels.space import Config, Rule, Space

NT_VALUES = [32, 64, 128, 256, 512, 1024]
COPY_NT = 256


def nt_space(name: str) -> Space:
    """rowops.cu's `rowops_first_failure`, rule for rule, plus the device's thread limit."""
    return Space(name, {"NT": list(NT_VALUES)}, [
        Rule("threads_32_1024", lambda c, _: 32 <= c.NT <= 1024, lambda c, _: f"NT = {c.NT} is not in 32..1024"),
        Rule("pow2", lambda c, _: c.NT & (c.NT - 1) == 0, lambda c, _: f"NT = {c.NT} is not a power of two "
             "(tree reductions)"),
        Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= c.NT,
             lambda c, lim: f"NT = {c.NT} > the device's {lim.max_invocations_per_workgroup}", needs_limits=True),
    ])


class _RowTemplate(KernelTemplate):
    backend = "cuda"
    kernel = ""

    def space(self, which: str = "full") -> Space:
        return nt_space(f"cuda-{self.kernel}")

    def entry(self, config: Config) -> str:
        return name_expression(self.kernel, config["NT"])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        return f"{model_source('rowops', 'rowops.cu')}\n// instantiated as {self.entry(config)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return config

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        return compile_cuda(device, model_source("rowops", "rowops.cu"), self.entry(config), config["NT"],
                            f"{self.name}[{config}]")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        bufs = upload_all(device, host)
        bufs["out"] = device.allocate(4 * int(np.prod(self.problem.output_shape(shape))))
        return bufs


class CudaRMSNorm(_RowTemplate):
    """RMSNorm over rows; shape (M, H); grid (M)."""

    name = "rmsnorm"
    kernel = "rmsnorm"
    shape_names = RMSNormProblem.shape_names

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps
        self.problem = RMSNormProblem(eps)

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        m, h = shape
        return [Launch(program, (m, 1, 1), [bufs["x"], bufs["weight"], bufs["out"], np.int32(m), np.int32(h),
                                            np.float32(self.eps)])]


class CudaEmbed(_RowTemplate):
    """Embedding gather from nf4 / f16 / f32 rows; shape (M, H, V); grid (ceil(H / NT), M). ids are int32."""

    kernel = "embed"
    shape_names = EmbedProblem.shape_names

    def __init__(self, fmt: str = "nf4") -> None:
        self.fmt = fmt
        self.name = f"embed.{fmt}"
        self.problem = EmbedProblem(fmt)
        self.dtype = self.problem.dtype

    def entry(self, config: Config) -> str:
        return name_expression("embed", FMT_CODE[self.fmt], config["NT"])

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        return [f"nf4_blocks: H = {shape[1]} is not a multiple of 64"] if self.fmt == "nf4" and shape[1] % 64 else []

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        bufs = super().upload(device, {**host, "ids": host["ids"].astype(np.int32)}, shape)
        return bufs

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        m, h, _ = shape
        return [Launch(program, (math.ceil(h / config["NT"]), m, 1), [
            bufs["ids"], bufs["w"], arg_or(bufs, "absmax", "w"), bufs["out"], np.int32(m), np.int32(h)])]


class CudaHead(_RowTemplate):
    """Final RMSNorm of the last row + Linear(H, L); shape (M, H, L); one block. Output: the normed row + L scores."""

    name = "head"
    kernel = "head"
    shape_names = HeadProblem.shape_names

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps
        self.problem = HeadProblem(eps)

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return self.launches_row(program, bufs, shape, shape[0] - 1)

    def launches_row(self, program: Program, bufs: DeviceBuffers, shape: Shape, row: int) -> list[Launch]:
        """The head of row `row` of x."""
        _, h, labels = shape
        return [Launch(program, (1, 1, 1), [bufs["x"], np.int32(row), bufs["norm_weight"], bufs["head_weight"],
                                            bufs["out"], np.int32(h), np.int32(labels), np.float32(self.eps)])]


def copy_program(device: Device) -> Program:
    """The word copy (`copy_words<256>`), used for K/V prefix rows and the last residual row."""
    return compile_cuda(device, model_source("rowops", "rowops.cu"), name_expression("copy_words", COPY_NT), COPY_NT,
                        "copy_words")


#: buffer pairs one `copy_pairs` launch copies
COPY_PAIRS = 8


def copy_pairs_program(device: Device) -> Program:
    """The paired copy (`copy_pairs<256>`): up to `COPY_PAIRS` buffers' first words in one launch."""
    return compile_cuda(device, model_source("rowops", "rowops.cu"), name_expression("copy_pairs", COPY_NT), COPY_NT,
                        "copy_pairs")


def copy_pairs_launches(program: Program, pairs: list[tuple[Buffer, Buffer]], words: int) -> list[Launch]:
    """Launches that copy words 0..words-1 of each (src, dst) pair, `COPY_PAIRS` pairs a launch (unused slots null)."""
    out = []
    for i in range(0, len(pairs), COPY_PAIRS):
        chunk = pairs[i:i + COPY_PAIRS]
        args: list[Any] = [a for sd in chunk for a in sd] + [NULL] * (2 * (COPY_PAIRS - len(chunk)))
        out.append(Launch(program, (math.ceil(words / COPY_NT), len(chunk), 1), [*args, np.int32(words)]))
    return out


def copy_launch(program: Program, src: Buffer, src_word: int, dst: Buffer, dst_word: int, words: int) -> Launch:
    return Launch(program, (math.ceil(words / COPY_NT), 1, 1), [src, np.int32(src_word), dst, np.int32(dst_word),
                                                                np.int32(words)])
