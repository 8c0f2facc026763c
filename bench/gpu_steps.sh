# gpu_steps.sh - sourced by the one-call GPU scripts (dawn_gpu.sh, cuda_gpu.sh): `step` runs one step under
# `timeout` and appends a line to $OUT/status.txt, so one failure or hang stops no other step.
#   step NAME SECONDS LOGFILE CMD...    a NAME listed in $SKIP is skipped; after each step `after_step` runs (a
#                                       script may define it, e.g. to pack its work so far)
step() {
    local name=$1 limit=$2 log=$3
    shift 3
    case " ${SKIP:-} " in *" $name "*) echo "$name skipped" | tee -a "$OUT/status.txt"; return 0;; esac
    local t0=$SECONDS
    timeout "$limit" "$@" > "$log" 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s $(tail -n 1 "$log" | cut -c1-160)" | tee -a "$OUT/status.txt"
    if declare -F after_step > /dev/null; then after_step; fi
}
