"""Attention of the classifier: `problem.py` (the math and float64 references), `webgpu.py` (the WGSL kernels)."""
