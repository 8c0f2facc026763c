"""fp32 depthwise-separable 2D convolution, NCHW, fused (depthwise KxK, then pointwise 1x1): the math once
(`problem`), the block tiling both GPU backends implement (`tiling`), one implementation per backend:
`webgpu.WgslDwsepConv2d` (WGSL generated per config) and `tvm_cuda.TvmCudaDwsepConv2d` (TVM-emitted CUDA).
"""
