"""LFM2's short conv on CUDA (`shortconv.cu`): a thread per channel and run of RT rows, the taps L a template
argument.

Problem: `shortconv.problem.ShortConvProblem`, shape (M, H, L). `state_out` is another buffer than `state_in`, so a
cached prefix state is never written. Parameters: NT (threads per block), RT (consecutive rows per thread; every RT
gives the same bits). `tilewise tune model --device cuda` picks them per model (the table's `shortconv:HxL` entry).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.cudasrc import NULL, compile_cuda, model_source, name_expression, offers_f16_out, upload_all
from tilewise.kernels.shortconv.problem import ShortConvProblem
from tilewise.kernels.space import Config, Rule, Space

DEFAULT = {"NT": 128, "RT": 1}


class CudaShortConv(KernelTemplate):
    """Gated depthwise causal conv; output y (M, H) followed by the new state (L-1, H)."""

    backend = "cuda"
    problem = ShortConvProblem()
    scratch_buffers = ("state_out",)  # the conv state it hands on: poisoned and guarded like "out"

    def space(self, which: str = "full") -> Space:
        """shortconv.cu's `whole_warps` and `rows_1_64` (its `taps_2_8` is a shape rule: L comes with the shape)."""
        return Space("cuda-shortconv", {"NT": [32, 64, 128, 256, 512], "RT": [1, 2, 4, 8, 16]}, [
            Rule("whole_warps", lambda c, _: c.NT % 32 == 0 and 32 <= c.NT <= 1024,
                 lambda c, _: f"NT = {c.NT} is not a whole number of warps in 32..1024"),
            Rule("rows_1_64", lambda c, _: 1 <= c.RT <= 64,
                 lambda c, _: f"RT = {c.RT} rows per thread is not in 1..64"),
            Rule("threads_per_block", lambda c, lim: lim.max_invocations_per_workgroup >= c.NT,
                 lambda c, lim: f"NT = {c.NT} > the device's {lim.max_invocations_per_workgroup}",
                 needs_limits=True)])

    def default_config(self) -> Config:
        """What the executor runs where no table names a tile: 128 threads, one row each."""
        return self.config_of(DEFAULT)

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        return [] if 2 <= shape[2] <= 8 else [f"taps_2_8: L = {shape[2]} taps is not in 2..8"]

    def entry(self, config: Config, taps: int) -> str:
        return name_expression("shortconv", config["NT"], taps, config["RT"])

    def source(self, config: Config, shape: Shape | None = None) -> str:
        taps = (shape or (1, 64, 3))[2]
        return f"{model_source('shortconv', 'shortconv.cu')}\n// instantiated as {self.entry(config, taps)}\n"

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return (config, shape[2])

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        prog = compile_cuda(device, model_source("shortconv", "shortconv.cu"), self.entry(config, shape[2]),
                            config["NT"], f"shortconv[{config}]")
        return offers_f16_out(prog, 3, 7, 5, 6)  # y (M, H) as f16 rows for the out projection's prologue

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        m, h, taps = shape
        bufs = upload_all(device, host)
        bufs["out"] = device.allocate(4 * m * h)
        bufs["state_out"] = device.allocate(4 * (taps - 1) * h)
        return bufs

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        m, h, _ = shape
        return [Launch(program, (math.ceil(h / config["NT"]), math.ceil(m / config["RT"]), 1), [
            bufs["bcx"], bufs["state_in"], bufs["weight"], bufs["out"], bufs["state_out"], np.int32(m), np.int32(h),
            NULL])]

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        m, h, taps = shape
        return np.concatenate([device.download(bufs["out"], np.float32, (m, h)),
                               device.download(bufs["state_out"], np.float32, (taps - 1, h))])
