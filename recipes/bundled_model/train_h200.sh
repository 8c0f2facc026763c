#!/usr/bin/env bash
# Train the bundled default model on one H200 in one call (about 8.5 minutes, at most --total-budget-s 540),
# writing OUT_DIR:
#   model-nf4/{config.json,model.safetensors,tokenizer.json}  the model to ship (src/tilewise/model/default/)
#   model-f16/{config.json,model.safetensors}                  the float model, f16
#   train_log.txt, results.json                                every step's output; data, training, DAgger, quality
# Usage: recipes/bundled_model/train_h200.sh OUT_DIR [extra recipes/bundled_model/train_h200.py options]
# Budgets (seconds): data 35, training 140, then 2 DAgger rounds of collection 30 + training 70, model play 60;
# see recipes/bundled_model/train_h200.py --help.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: recipes/bundled_model/train_h200.sh OUT_DIR [options of recipes/bundled_model/train_h200.py]" >&2
    exit 2
fi
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" recipes/bundled_model/train_h200.py "$@"
