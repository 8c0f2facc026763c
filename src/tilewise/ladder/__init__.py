"""Optimization ladders (seed 000): each primitive from its unoptimized schedule through one distinct optimization
per rung, plus the tuned best and the numpy/torch reference, all measured with the tuner's `measure`.

A ladder is data: named configs of one kernel template, in order. Running it

1. checks every rung against the template's rules at the shape (a refused rung is reported with the rule's numbers,
   never compiled) and verifies every output value of every rung against the float64 reference;
2. tunes the template at the shape (`tune.tuner.tune`, random search under a count/time budget);
3. times all rungs, the tuned best and, for GPU ladders, each staging counterpart in ONE interleaved measurement,
   so neighbour verdicts (`win` only when faster than the previous rung and the baseline; `regained`, `tie`,
   `loss`, `noisy`; from 95% intervals) come from the same rounds;
4. times the host references (numpy, torch when installed) with the same function on the CPU device;
5. answers seed 000's question per device and shape: for pairs of schedules that differ only in staging scope
   (`workgroup` vs `private`), which one won, by how much, with intervals.

Primitives: `conv1d-cpu` (TVM on the `tvm-llvm` device), `conv1d-gpu`, `gemm-gpu` (the tuner's GEMM template and
its staging parameters) and `dwsep-conv2d-gpu` (WebGPU). All three GPU ladders also run on `--device cuda`
(`VARIANTS`): the same ladder over the TVM-scheduled, TVM-emitted CUDA templates (`kernels/*/tvm_cuda.py`), whose
`shared`/`local` scopes answer the workgroup/private staging question. Without TVM those kernels come from the
pre-emitted source store (`kernels/tvm/sources.py`), and the tuned best chooses only among stored configs.
"""

from tilewise.ladder.run import (
    LadderResult,
    Rung,
    StagingAnswer,
    _search_points,
    _stored_search_points,
    plot,
    run_ladder,
    staging_answer,
    time_references,
    verdict,
    write_json,
)
from tilewise.ladder.specs import (
    DEFAULT_MEASURE,
    LADDERS,
    TUNE_MEASURE,
    VARIANTS,
    LadderSpec,
    RungSpec,
    get_ladder,
    get_ladder_device,
    resolve_ladder_device,
    validate_shape,
)

__all__ = ["DEFAULT_MEASURE", "LADDERS", "TUNE_MEASURE", "VARIANTS", "LadderResult", "LadderSpec", "Rung", "RungSpec",
           "StagingAnswer", "_search_points", "_stored_search_points", "get_ladder", "get_ladder_device", "plot",
           "resolve_ladder_device", "run_ladder", "staging_answer", "time_references", "validate_shape", "verdict",
           "write_json"]
