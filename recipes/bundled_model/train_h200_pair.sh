#!/usr/bin/env bash
# Two recipes/bundled_model/train_h200.py runs side by side on a machine with two GPUs: run A on GPU 0 and the first
# half of the cores, run B on GPU 1 and the second half. Used to compare two training settings (say --detour 0.3
# against none) in the time one run takes, each with the same data budget per core as a one-GPU run of half the
# machine.
# Usage: recipes/bundled_model/train_h200_pair.sh OUT_DIR "OPTIONS OF RUN A" "OPTIONS OF RUN B"
#   writes OUT_DIR/a and OUT_DIR/b (each as recipes/bundled_model/train_h200.sh writes its OUT_DIR) and
#   OUT_DIR/pair_log.txt.
set -euo pipefail
if [ $# -ne 3 ]; then
    echo "usage: recipes/bundled_model/train_h200_pair.sh OUT_DIR \"OPTIONS OF RUN A\" \"OPTIONS OF RUN B\"" >&2
    exit 2
fi
out="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py="${PYTHON:-python3}"
gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -lt 2 ]; then
    echo "error: this machine has $gpus GPU(s); a pair needs 2." \
        "Run recipes/bundled_model/train_h200.sh once per setting instead." >&2
    exit 2
fi
read -r -a cores < <("$py" -c 'import os; print(*sorted(os.sched_getaffinity(0)))')
half=$(( ${#cores[@]} / 2 ))
if [ "$half" -lt 3 ]; then
    echo "error: ${#cores[@]} cores are too few for two runs (each needs 3 or more)" >&2
    exit 2
fi
list() { local IFS=,; echo "$*"; }
cores_a=$(list "${cores[@]:0:half}")
cores_b=$(list "${cores[@]:half:half}")
mkdir -p "$out/a" "$out/b"
log="$out/pair_log.txt"
echo "pair: run A on GPU 0, cores $cores_a: $2" | tee "$log"
echo "pair: run B on GPU 1, cores $cores_b: $3" | tee -a "$log"
# each run's options are parsed as a shell would (quotes group words, as in --train-args "...")
eval "opts_a=($2)"
eval "opts_b=($3)"
CUDA_VISIBLE_DEVICES=0 taskset -c "$cores_a" "$py" recipes/bundled_model/train_h200.py "$out/a" "${opts_a[@]}" \
    >"$out/a/stdout.txt" 2>&1 &
pid_a=$!
CUDA_VISIBLE_DEVICES=1 taskset -c "$cores_b" "$py" recipes/bundled_model/train_h200.py "$out/b" "${opts_b[@]}" \
    >"$out/b/stdout.txt" 2>&1 &
pid_b=$!
rc_a=0; rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
echo "pair: run A exit $rc_a, run B exit $rc_b" | tee -a "$log"
for r in a b; do
    echo "--- run ${r^^}: summary" | tee -a "$log"
    sed -n '/^summary$/,$p' "$out/$r/train_log.txt" 2>/dev/null | tee -a "$log" || true
done
[ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ]
