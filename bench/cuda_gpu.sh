#!/usr/bin/env bash
# The CUDA executor on a GPU machine, in one call: its GPU tests, the matmul race, a model tune and the decision race.
#   WORK/env.txt            GPU, driver, clocks, Python packages
#   WORK/floor.txt, launch_floor.json  experiments/cuda_launch_floor.py: what one launch in a graph costs when its
#                           kernel does (almost) nothing, with and without programmatic dependent launch
#   WORK/compile.txt, compile_batch.json  bench/compile_batch.py: nf4-matmul configs compiled one by one against
#                           the tuner's batch compile (NVRTC on a thread per CPU)
#   WORK/pytest.txt         PYTEST_FILES (default: the executor, graph and tune tests) + the wgr kernel tests
#                           selected by PYTEST_K: executor vs float64 and HF, graphs and PDL bit-identical to serial
#                           launches, every wgr seed (both decodes) against float64
#   WORK/matmul.txt, matmul_cuda.json  bench/matmul_cuda.py at 346 rows: MATMUL_KINDS (default wgr) split by
#                           MATMUL_SPLIT (default DEC), each group's best raced against cuBLAS f16 (MATMUL_ARGS adds
#                           options, e.g. "--only ffn.gate_up --sample 100")
#   WORK/attention.txt, attention_cuda.json  bench/attention_cuda.py: every attention config (tensor-core ones too,
#                           with and without the key-tile prefetch) raced at PRESET's heads and SEQ queries
#   WORK/tune.txt, tune.json, tables/  `tilewise tune model --device cuda --preset PRESET --seq SEQ --rows 1`
#                           with TUNE_BUDGET (6) candidates per kernel and TUNE_S (150) seconds; its table lands in
#                           WORK/tables (TILEWISE_DISPATCH_DIR), where the decision step finds it (TUNE_ARGS adds
#                           options, e.g. "--climb 12"). PRESET (lfm2-350m)
#                           and SEQ (346) pick the model and prompt length of the tune, decision and profile steps:
#                           PRESET=default SEQ=348 is the bundled model at its game prompts' length
#   WORK/model.txt, model/results.json  bench/model_cuda.py on that table (MODEL_ARGS adds options): tilewise CUDA
#                           (graphs, with and without programmatic dependent launch, alternating), HF bf16 eager and
#                           torch.compile
#   WORK/profile.txt, ncu.csv  every kernel of one decision on that table under Nsight Compute, per op
#                           (bench/profile_cuda.py; skipped where `ncu` is missing)
#   WORK/sections.txt, sections.csv  only with SECTIONS=1: the same decision under Nsight Compute's SpeedOfLight,
#                           Occupancy, LaunchStats and WarpStateStats sections, every metric of the first launch of
#                           each op and kernel (`profile_cuda.py details`; SECTIONS_OPS picks ops, comma-separated)
#   WORK/play.txt, play.json, prompt_encode.json  `tilewise play --device cuda` on the bundled model (its table is there when
#                           PRESET=default): decision latency from board to action, prompt and tokenizer included;
#                           and bench/prompt_encode.py: this host's time to render and encode one prompt
#   WORK/latency.txt, play_latency.json  experiments/play_latency.py: one play decision split into prompt and model,
#                           back to back against after an idle gap, with and without waking the GPU first
#   WORK/l2.txt, l2/        experiments/l2_tune_cuda.py: the model tuned with L2 evicted before every sample (the
#                           tuner's default) and with L2 kept, the picks that differ and a decision race on both
#   OUT_DIR/status.txt      one line per step: name, exit status (124: timed out), seconds
#   OUT_DIR/cuda_gpu.tgz    WORK packed after every step, without the results store (a call returns few files)
# SKIP="pytest matmul" leaves steps out; each step runs under `timeout`, so one failure or hang stops no other.
# Usage: bench/cuda_gpu.sh OUT_DIR
set -uo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bench/cuda_gpu.sh OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
WORK="$(mktemp -d)"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TILEWISE_DISPATCH_DIR="$WORK/tables"
PY="${PYTHON:-python3}"
: > "$OUT/status.txt"

source bench/gpu_steps.sh  # step NAME SECONDS LOGFILE CMD...
after_step() {  # pack the work after every step: a call cut short keeps it
    tar -czf "$OUT/cuda_gpu.tgz" --exclude=store.db -C "$WORK" .
}

step env 60 "$WORK/env.txt" bash -c "date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm \
    --format=csv; $PY -c 'import torch, cupy, transformers; print(torch.__version__, cupy.__version__, \
    transformers.__version__)'; $PY -m tilewise devices --wide"
step floor 60 "$WORK/floor.txt" "$PY" experiments/cuda_launch_floor.py --out "$WORK"
step compile 90 "$WORK/compile.txt" "$PY" bench/compile_batch.py --out "$WORK" --device cuda --kernel nf4-matmul \
    --shape 346,4608,1024 --configs 32 --rounds 2
step pytest "${PYTEST_S:-200}" "$WORK/pytest.txt" "$PY" -m pytest -q -p no:cacheprovider -rs \
    ${PYTEST_FILES:-tests/cuda/test_model_cuda.py tests/cuda/test_model_cuda_graph.py tests/cuda/test_model_cuda_tune.py} \
    tests/cuda/test_model_kernels_cuda.py -k "${PYTEST_K:-not test_model_kernels_cuda or (wgr and not default_config)}"
step matmul "${MATMUL_S:-120}" "$WORK/matmul.txt" "$PY" bench/matmul_cuda.py --out "$WORK" --sample 0 --race-top 2 \
    --rounds 20 --kinds "${MATMUL_KINDS:-wgr}" --split-by "${MATMUL_SPLIT:-DEC}" ${MATMUL_ARGS:-}
PRESET="${PRESET:-lfm2-350m}"
SEQ="${SEQ:-346}"
step attention "${ATTN_S:-90}" "$WORK/attention.txt" "$PY" bench/attention_cuda.py --out "$WORK" --rounds 20 \
    --preset "$PRESET" --rows "$SEQ"
step tune "$(( ${TUNE_S:-150} + 60 ))" "$WORK/tune.txt" "$PY" -m tilewise tune model --device cuda --preset "$PRESET" \
    --seq "$SEQ" --rows 1 --budget "${TUNE_BUDGET:-6}" --budget-s "${TUNE_S:-150}" --store "$WORK/store.db" \
    --json "$WORK/tune.json" ${TUNE_ARGS:-}
step model "${MODEL_S:-150}" "$WORK/model.txt" "$PY" bench/model_cuda.py --out "$WORK/model" --presets "$PRESET" \
    --seq "$SEQ" --no-tests --no-cli --webgpu "" --decisions 30 --section-s 6 ${MODEL_ARGS:-}
if command -v ncu > /dev/null; then
    step profile "${PROFILE_S:-150}" "$WORK/profile.txt" bash -c "ncu --profile-from-start off --cache-control none \
        --clock-control none --csv --metrics gpu__time_duration.sum,gpc__cycles_elapsed.max $PY bench/profile_cuda.py \
        run --preset '$PRESET' --seq '$SEQ' --labels '$WORK/labels.json' > '$WORK/ncu.csv' && $PY bench/profile_cuda.py table '$WORK/ncu.csv' \
        '$WORK/labels.json'"
fi
if command -v ncu > /dev/null && [ -n "${SECTIONS:-}" ]; then
    step sections "${SECTIONS_S:-240}" "$WORK/sections.txt" bash -c "ncu --profile-from-start off --cache-control none \
        --clock-control none --csv --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats $PY bench/profile_cuda.py run --preset '$PRESET' --seq '$SEQ' \
        --labels '$WORK/sections_labels.json' > '$WORK/sections.csv' && $PY bench/profile_cuda.py details \
        '$WORK/sections.csv' '$WORK/sections_labels.json' --ops '${SECTIONS_OPS:-}'"
fi
step prompt 60 "$WORK/prompt.txt" "$PY" bench/prompt_encode.py --out "$WORK"
step play "${PLAY_S:-90}" "$WORK/play.txt" "$PY" -m tilewise play --device cuda --steps 200 --no-watch --json "$WORK/play.json"
step latency "${LATENCY_S:-60}" "$WORK/latency.txt" "$PY" experiments/play_latency.py --device cuda --decisions 60 \
    --rounds 5 --gaps-us 300,1000 --out "$WORK"
step l2 "${L2_S:-240}" "$WORK/l2.txt" "$PY" experiments/l2_tune_cuda.py --out "$WORK/l2" --preset "$PRESET" \
    --seq "$SEQ" --budget "${TUNE_BUDGET:-6}"
