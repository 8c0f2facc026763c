"""fp32 GEMM, C (M, N) = alpha * A (M, K) @ B (K, N) + beta * C: the math once (`problem`), one implementation per
backend: `webgpu.WgslGemm` (`gemm` on webgpu, WGSL generated per config), `cuda.CudaGemm` (`gemm` on cuda, seed 003's
warp-tiled kernel in `gemm.cu`) and `tvm_cuda.TvmCudaGemm` (`gemm-tvm` on cuda, seed 000's schedule emitted by TVM).
"""
