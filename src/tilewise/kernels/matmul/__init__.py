"""The classifier's weight matmuls (NF4 / f16 / f32 weights, three epilogues, an optional fused RMSNorm).

`problem.py` is the math; `webgpu.py` the WGSL implementation (kinds `tiled`, `rows`, `splitk`), whose code comes
from `wgsl.py` (shared pieces), `wgsl_tiled.py` and `wgsl_rows.py`. The names most code needs are re-exported here.
"""

from tilewise.kernels.matmul.problem import EPILOGUES, WEIGHT_BYTES, MatmulProblem
from tilewise.kernels.matmul.webgpu import (
    ACC_BUDGET,
    DEFAULT_CUTOFF_ROWS,
    DEFAULT_ONE_ROW,
    DEFAULT_ROWS,
    DEFAULT_SPLITK,
    DEFAULT_TILED,
    MAX_PREFETCH_REGISTERS,
    TILED_ACC_BUDGET,
    VERIFY_ROWS,
    MatmulTemplate,
    NF4MatmulRows,
    NF4MatmulTiled,
    NF4MatmulTiledF16,
    NF4SwigluTiled,
    all_templates,
    rows_space,
    shape_problems,
    source,
    tiled_space,
)
from tilewise.kernels.matmul.wgsl import (
    COLUMN_LAYOUTS,
    KINDS,
    PREFETCH_WORDS,
    SPLITK_WG,
    binding_names,
    grid,
    norm_sum_floats,
    prefetch_registers,
    prefetch_slots,
    splitk_scratch_bytes,
)
from tilewise.kernels.matmul.wgsl_rows import rows_source, splitk_reduce_source
from tilewise.kernels.matmul.wgsl_tiled import tiled_source
from tilewise.quant.nf4 import FORMATS

__all__ = ["ACC_BUDGET", "COLUMN_LAYOUTS", "DEFAULT_CUTOFF_ROWS", "DEFAULT_ONE_ROW", "DEFAULT_ROWS", "DEFAULT_SPLITK",
           "DEFAULT_TILED", "EPILOGUES", "FORMATS", "KINDS", "MAX_PREFETCH_REGISTERS", "PREFETCH_WORDS", "SPLITK_WG",
           "TILED_ACC_BUDGET", "VERIFY_ROWS", "WEIGHT_BYTES", "MatmulProblem", "MatmulTemplate", "NF4MatmulRows",
           "NF4MatmulTiled", "NF4MatmulTiledF16", "NF4SwigluTiled", "all_templates", "binding_names", "grid",
           "norm_sum_floats", "prefetch_registers", "prefetch_slots", "rows_source", "rows_space", "shape_problems",
           "source", "splitk_reduce_source", "splitk_scratch_bytes", "tiled_source", "tiled_space"]
