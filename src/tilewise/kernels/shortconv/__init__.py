"""The classifier's short conv: `problem.py` (the math), `webgpu.py` (the WGSL kernel)."""

from tilewise.kernels.shortconv.problem import ShortConvProblem, conv_ref
from tilewise.kernels.shortconv.webgpu import BINDINGS, ConvTemplate, conv_source

__all__ = ["BINDINGS", "ConvTemplate", "ShortConvProblem", "conv_ref", "conv_source"]
