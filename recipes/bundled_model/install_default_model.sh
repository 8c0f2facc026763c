#!/usr/bin/env bash
# Install the model a recipes/bundled_model/train_h200.sh run produced as the bundled default, with its record and
# model card.
# Usage: recipes/bundled_model/install_default_model.sh OUT_DIR [RUN_NAME [LINEAGE [CARD_OPTIONS...]]]
#   copies OUT_DIR/model-nf4/{config.json,model.safetensors,tokenizer.json} to src/tilewise/model/default/,
#   OUT_DIR/{train_log.txt,results.json} to bench/results/RUN_NAME_{log.txt,results.json} (default RUN_NAME:
#   train_h200), writes src/tilewise/model/default/MODEL_CARD.md from them (LINEAGE: a sentence on the weights the
#   run started from, when it continued a model with --init; CARD_OPTIONS go to
#   recipes/bundled_model/write_model_card.py, e.g. --play-quality FILE --cpu-latency FILE), and checks the model
#   loads.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: recipes/bundled_model/install_default_model.sh OUT_DIR [RUN_NAME [LINEAGE [CARD_OPTIONS...]]]" >&2
    exit 2
fi
src_dir="$1"
name="${2:-train_h200}"
cd "$(dirname "$0")/../.."
for f in model-nf4/config.json model-nf4/model.safetensors model-nf4/tokenizer.json train_log.txt results.json; do
    if [ ! -f "$src_dir/$f" ]; then
        echo "error: $src_dir/$f is missing; pass the OUT_DIR of a finished recipes/bundled_model/train_h200.sh run" >&2
        exit 2
    fi
done
dst=src/tilewise/model/default
mkdir -p "$dst" bench/results
cp "$src_dir"/model-nf4/config.json "$src_dir"/model-nf4/model.safetensors "$src_dir"/model-nf4/tokenizer.json "$dst"/
chmod 644 "$dst"/*
cp "$src_dir/train_log.txt" "bench/results/${name}_log.txt"
cp "$src_dir/results.json" "bench/results/${name}_results.json"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"${PYTHON:-python3}" recipes/bundled_model/write_model_card.py "bench/results/${name}_results.json" --model "$dst" \
    --lineage "${3:-}" "${@:4}"
"${PYTHON:-python3}" -c "
import tilewise
m = tilewise.load('default', device='cpu')
print('default model loads:', m)
"
