#!/usr/bin/env bash
# The TVM-emitted CUDA kernels on a GPU machine without TVM (python3, CuPy, torch), in one call (under 4 minutes):
#   OUT_DIR/log.txt                      everything below, in order, with each step's exit status and seconds
#   OUT_DIR/env.txt                      GPU, Python packages, whether TVM imports, the source store's size
#   OUT_DIR/pytest.txt                   python3 -m pytest tests/cuda -q -rs
#   OUT_DIR/ladder-conv1d-gpu-cuda.{json,txt}, OUT_DIR/ladder-gemm-gpu-cuda.{json,txt},
#   OUT_DIR/ladder-dwsep-conv2d-gpu-cuda.{json,txt}
#                                        tilewise ladder conv1d-gpu|gemm-gpu|dwsep-conv2d-gpu --device cuda --json ...
#   OUT_DIR/status.txt                   one line per step: name, exit status (124: timed out), seconds
# The kernels come from the pre-emitted source store (TILEWISE_TVM_CUDA_SOURCES, default build/tvm-cuda-sources
# in this checkout), made on a machine with TVM by:
#   PYTHONPATH=src python tools/tvm_cuda_emit.py --arch sm_90 --out build/tvm-cuda-sources
# Each step runs under `timeout`, so one failure or hang does not stop the others.
# Budgets (seconds): environment 15, tests 80, conv1d ladder 45, gemm ladder 50, dwsep-conv2d ladder 45 (at most
# 235 in all; on an H200 the first four took 8, 35, 10 and 13 s before the dwsep-conv2d template existed).
# Usage: bench/tvm_cuda_gpu.sh OUT_DIR
set -uo pipefail
if [ $# -ne 1 ]; then
    echo "usage: bench/tvm_cuda_gpu.sh OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TILEWISE_TVM_CUDA_SOURCES="${TILEWISE_TVM_CUDA_SOURCES:-$PWD/build/tvm-cuda-sources}"
PY="${PYTHON:-python3}"
LOG="$OUT/log.txt"
: > "$LOG"
: > "$OUT/status.txt"
failed=0

# step NAME SECONDS OUTFILE COMMAND...: run COMMAND under timeout, output to OUTFILE and the log
step() {
    local name="$1" limit="$2" outfile="$3"
    shift 3
    echo "== $name (at most ${limit} s): $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout -k 3 "$limit" "$@" > "$outfile" 2>&1
    local rc=$?
    cat "$outfile" >> "$LOG"
    local secs=$((SECONDS - t0))
    [ "$rc" -eq 124 ] && echo "!! $name timed out after ${limit} s" | tee -a "$LOG"
    echo "== $name: exit $rc, ${secs} s" | tee -a "$LOG"
    echo "$name exit=$rc seconds=$secs" >> "$OUT/status.txt"
    [ "$rc" -eq 0 ] || failed=1
    tail -n 25 "$outfile"
}

ENV_PY="$OUT/.env_check.py"
cat > "$ENV_PY" <<'EOF'
import importlib
import os
import platform
from pathlib import Path

print("python", platform.python_version())
for name in ("numpy", "cupy", "torch", "pytest", "tvm"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(name, "not importable:", type(exc).__name__, (str(exc).splitlines() or [""])[0])
store = Path(os.environ["TILEWISE_TVM_CUDA_SOURCES"])
files = list(store.glob("*.cu"))
print(f"store {store}: {len(files)} sources, {sum(f.stat().st_size for f in files) / 1e6:.2f} MB")
from tilewise.devices import get_device

dev = get_device("cuda")
print("device", dev.info.name, "compute capability", dev.info.limits.compute_capability)
EOF
step environment 15 "$OUT/env.txt" bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    || echo "nvidia-smi failed"; exec "$0" "$1"' "$PY" "$ENV_PY"

step tests 80 "$OUT/pytest.txt" "$PY" -m pytest tests/cuda -q -rs -p no:cacheprovider --durations=10

step ladder-conv1d-gpu 45 "$OUT/ladder-conv1d-gpu-cuda.txt" "$PY" -m tilewise ladder conv1d-gpu --device cuda \
    --tune 16 --tune-s 12 --rounds 40 --budget-s 3 --json "$OUT/ladder-conv1d-gpu-cuda.json"

step ladder-gemm-gpu 50 "$OUT/ladder-gemm-gpu-cuda.txt" "$PY" -m tilewise ladder gemm-gpu --device cuda \
    --tune 16 --tune-s 15 --rounds 40 --budget-s 3 --json "$OUT/ladder-gemm-gpu-cuda.json"

step ladder-dwsep-conv2d-gpu 45 "$OUT/ladder-dwsep-conv2d-gpu-cuda.txt" "$PY" -m tilewise ladder dwsep-conv2d-gpu \
    --device cuda --tune 16 --tune-s 15 --rounds 40 --budget-s 3 --json "$OUT/ladder-dwsep-conv2d-gpu-cuda.json"

echo "== done: $(tr '\n' ';' < "$OUT/status.txt")" | tee -a "$LOG"
exit "$failed"
