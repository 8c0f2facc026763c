#!/usr/bin/env bash
# Dawn on a GPU machine, in one call: the device, its tests, and gemm-f16 against cuBLAS.
#   OUT_DIR/env.txt          GPU, driver, Python packages, `tilewise devices`
#   OUT_DIR/devices.json     tilewise devices --json (subgroup_matrix_configs of every Dawn adapter)
#   OUT_DIR/pytest.txt       python3 -m pytest tests/dawn (device, compile and numerics tests on the real adapter;
#                            PYTEST_S seconds, default 180)
#   OUT_DIR/compile-*.txt, compile-*/compile_batch.json  bench/compile_batch.py: gemm-f16 and nf4-matmul configs
#                            compiled one by one against the tuner's batch compile
#   OUT_DIR/gemm_dawn.{json,txt}  bench/gemm_dawn.py (tuned gemm-f16 vs torch.matmul f16/f32 per shape)
#   OUT_DIR/bench-{dawn,webgpu}.{txt,json}  with DECISION_PRESET=P: tilewise bench on both WebGPU runtimes
#   OUT_DIR/sgmat-numerics.txt  tests/dawn/test_matmul_sgmat_*.py with -s (one line per case: config, shape, errors)
#   OUT_DIR/tune-model.{txt,json}, bench-tuned.{txt,json}  with MODEL_TUNE=1: `tilewise tune model --device dawn
#                            --preset lfm2-350m --seq 346 --budget 8` (MODEL_TUNE_BUDGET; 8 reaches the split-K,
#                            padded and pipelined sgmat seeds; FMA and subgroup-matrix matmuls compete; the
#                            table lands in OUT_DIR/dispatch), then `tilewise bench --device dawn` on that table
#   OUT_DIR/decision/{results.json,summary.md}, decision.txt  with DECISION=1: bench/decision_webgpu.py --device dawn
#                            (tune, decision p50/p90/p99, HF eager and torch.compile, deciding in turn, AGREEMENT=200
#                            game prompts against HF float64)
#   OUT_DIR/gemm_unchecked.{json,txt}  with UNCHECKED_GEMM=1: bench/gemm_dawn.py --unchecked (both robustness modes
#                            in one race) on UNCHECKED_ONLY (default "square 4096,lfm2 w1|w3")
#   OUT_DIR/attention_dawn.{json,txt}  with ATTN=1: bench/attention_dawn.py (every legal FMA and subgroup-matrix
#                            attention config verified, the best of each raced against torch's fused attention)
#   OUT_DIR/dawn_wait.{json,txt}  with WAIT=1: bench/dawn_wait.py (the blocking against the spinning map wait) on the
#                            table TILEWISE_DISPATCH_DIR holds; with TILEWISE_DAWN_UNCHECKED=1 set, on the unchecked
#                            device and its table
#   OUT_DIR/parts/sgmat_parts.json, parts.txt  with PARTS=1: experiments/sgmat_parts_dawn.py on lfm2-350m's gate/up,
#                            down and in_proj at 346 rows: PARTS_SAMPLE seeds and sampled configs (the packed-store
#                            twins among them), PARTS_NEIGHBORS rounds of hill-climbing, then the parts of the best
#   SKIP="pytest gemm_dawn"  leaves those steps out (a short call for one part)
#   OUT_DIR/status.txt       one line per step: name, exit status (124: timed out), seconds
# Each step runs under `timeout`, so one failure or hang does not stop the others.
# Usage: bench/dawn_gpu.sh OUT_DIR [gemm_dawn.py options]
set -uo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bench/dawn_gpu.sh OUT_DIR [gemm_dawn.py options]" >&2
    exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
shift
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
: > "$OUT/status.txt"

source bench/gpu_steps.sh  # step NAME SECONDS LOGFILE CMD...

step env 60 "$OUT/env.txt" bash -c "nvidia-smi --query-gpu=name,driver_version --format=csv; $PY -c 'import torch, wgpudawn; print(torch.__version__, wgpudawn.__version__)'; $PY -m tilewise devices --wide"
step devices 60 "$OUT/devices.log" "$PY" -m tilewise devices --json "$OUT/devices.json"
step pytest "${PYTEST_S:-180}" "$OUT/pytest.txt" "$PY" -m pytest -q -p no:cacheprovider -rs tests/dawn tests/unit/test_space_gemm_f16.py
for k in gemm-f16 nf4-matmul; do  # one by one against the tuner's batch compile (pipelines built on Dawn's threads)
    step "compile-$k" 90 "$OUT/compile-$k.txt" "$PY" bench/compile_batch.py --out "$OUT/compile-$k" --device dawn \
        --kernel "$k" --shape 346,4608,1024 --configs 32 --rounds 2
done
step gemm_dawn "${GEMM_DAWN_S:-300}" "$OUT/gemm_dawn.txt" "$PY" bench/gemm_dawn.py --out "$OUT/gemm_dawn.json" --skip-numerics "$@"
step sgmat-numerics "${SGMAT_TEST_S:-420}" "$OUT/sgmat-numerics.txt" "$PY" -m pytest -q -s -p no:cacheprovider -rs \
    tests/dawn/test_matmul_sgmat_compile.py tests/dawn/test_matmul_sgmat_numerics.py tests/unit/test_matmul_sgmat_space.py
if [ "${UNCHECKED_GEMM:-0}" = 1 ]; then  # the cost of Dawn's bounds checks on gemm-f16, in one race
    step gemm-unchecked "${UNCHECKED_S:-200}" "$OUT/gemm_unchecked.txt" env TILEWISE_DAWN_UNCHECKED=0 "$PY" \
        bench/gemm_dawn.py --out "$OUT/gemm_unchecked.json" --skip-numerics --unchecked \
        --sample "${UNCHECKED_SAMPLE:-8}" --rounds 20 --only "${UNCHECKED_ONLY:-square 4096,lfm2 w1|w3}"
fi
if [ "${ATTN:-0}" = 1 ]; then  # attention: the FMA kernel against attention.sgmat and torch's fused attention
    step attention-dawn "${ATTN_S:-240}" "$OUT/attention_dawn.txt" "$PY" bench/attention_dawn.py --out "$OUT" \
        --preset "${ATTN_PRESET:-lfm2-350m}" --rows 346 --rounds 20
fi
if [ "${PARTS:-0}" = 1 ]; then  # the matmuls' best configs at 346 rows, VS twins raced, and where their time goes
    step parts "${PARTS_S:-300}" "$OUT/parts.txt" "$PY" experiments/sgmat_parts_dawn.py --out "$OUT/parts" \
        --sample "${PARTS_SAMPLE:-12}" --neighbors "${PARTS_NEIGHBORS:-2}" --parts-only "${PARTS_ONLY:-ffn.gate_up}"
fi
if [ "${WAIT:-0}" = 1 ]; then  # how the host waits for a decision: block against spin, alternating rounds
    step dawn-wait "${WAIT_S:-120}" "$OUT/dawn_wait.txt" "$PY" bench/dawn_wait.py --out "$OUT" --preset lfm2-350m \
        --device dawn --rounds 8 --per-round 20
fi
if [ "${MODEL_TUNE:-0}" = 1 ]; then  # the model's matmuls tuned on Dawn (subgroup matrices compete), then a decision
    export TILEWISE_DISPATCH_DIR="$OUT/dispatch"  # the table this run writes is the one the bench loads
    step tune-model "${MODEL_TUNE_S:-1500}" "$OUT/tune-model.txt" "$PY" -m tilewise --debug tune model --device dawn \
        --preset lfm2-350m --seq 346 --budget "${MODEL_TUNE_BUDGET:-8}" --json "$OUT/tune-model.json"
    ls -l "$OUT/dispatch" >> "$OUT/tune-model.txt" 2>&1
    step bench-tuned "${BENCH_TUNED_S:-300}" "$OUT/bench-tuned.txt" "$PY" -m tilewise --debug bench --device dawn \
        --preset lfm2-350m --decisions 50 --json "$OUT/bench-tuned.json"
fi
if [ -n "${DECISION_PRESET:-}" ]; then  # the classifier's decision on both WebGPU runtimes (FMA kernels, default tables)
    for dev in dawn webgpu; do
        step "bench-$dev" 90 "$OUT/bench-$dev.txt" "$PY" -m tilewise bench --device "$dev" --preset "$DECISION_PRESET" \
            --decisions 40 --no-reference --json "$OUT/bench-$dev.json"
    done
fi
if [ "${DECISION:-0}" = 1 ]; then  # the decision on Dawn, tuned, against HF eager/torch.compile and float64 agreement
    step decision "${DECISION_S:-590}" "$OUT/decision.txt" "$PY" bench/decision_webgpu.py --out "$OUT/decision" \
        --device dawn --presets "${DECISION_PRESETS:-lfm2-350m}" --weights nf4 --agreement "${AGREEMENT:-200}" \
        --alternate --submit-first "" --budget-s "${DECISION_BUDGET_S:-560}"
fi
cat "$OUT/status.txt"
