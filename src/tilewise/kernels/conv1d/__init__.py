"""fp32 full 1D convolution, out (M+N-1) = a (M) * w (N) as `np.convolve(a, w)`: the math once (`problem`), seed 000's
GPU tiling shared by the GPU backends (`tiling`), one implementation per backend: `webgpu.WgslConv1d` (WGSL generated
per config), `tvm_llvm.TvmConv1d` (TVM on the CPU) and `tvm_cuda.TvmCudaConv1d` (TVM-emitted CUDA).
"""
