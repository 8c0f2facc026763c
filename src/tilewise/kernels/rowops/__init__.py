"""Row-wise ops of the classifier (RMSNorm, embedding gather, final norm + head, word copies): `problem.py` (the
math), `webgpu.py` (the WGSL kernels)."""
