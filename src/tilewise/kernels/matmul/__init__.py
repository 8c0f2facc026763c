"""The classifier's weight matmuls (NF4 / f16 / f32 weights, three epilogues, an optional fused RMSNorm).

`problem.py` is the math; `webgpu.py` the WGSL implementation (kinds `tiled`, `rows`, `splitk`), whose code comes
from `wgsl.py` (shared pieces), `wgsl_tiled.py` and `wgsl_rows.py`.
"""
