"""The classifier's short conv: `problem.py` (the math), `webgpu.py` (the WGSL kernel)."""
