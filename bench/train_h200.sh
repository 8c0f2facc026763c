#!/usr/bin/env bash
# Train the bundled default model on one H200 in one call (about 7 minutes), writing OUT_DIR:
#   model-nf4/{config.json,model.safetensors,tokenizer.json}  the model to ship (src/tilewise/model/default/)
#   model-f16/{config.json,model.safetensors}                  the float model, f16
#   train_log.txt, results.json                                every step's output; data, training, quality numbers
# Usage: bench/train_h200.sh OUT_DIR [extra bench/train_h200.py options]
# Budgets (seconds): data 90, training 200, model play 70; see bench/train_h200.py --help.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bench/train_h200.sh OUT_DIR [options of bench/train_h200.py]" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" bench/train_h200.py "$@"
