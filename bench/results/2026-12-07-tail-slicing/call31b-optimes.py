"""Call 31b: each launch of a decision alone (`forward(timed=True)`), the old plan (last block only) and the new
(the tail sliced), medians of decisions 3-7, run from the repository root on the device's table. (The text as run,
its imports tidied.)"""
import json
import statistics
import sys

sys.path.insert(0, "src")
sys.path.insert(0, "experiments")
import tail_slicing as ts
from tilewise.devices import get_device
from tilewise.model import runtime
from tilewise.model.bench import PREFIX_TOKENS, prompts
from tilewise.model.runtime import open_checkpoint

dev = get_device("cuda")
ck = open_checkpoint("lfm2-350m", weights="nf4")
_, full = prompts(ck.config.vocab_size, 346, 10, PREFIX_TOKENS, seed=4)
out = {}
for mode in ("last", "tail"):
    ex = runtime.EXECUTORS["cuda"](ck, dev, quiet=True)
    module = sys.modules[type(ex).__module__]
    real = module.block_rows
    if mode == "last":
        module.block_rows = ts.last_block_only
    runs = []
    for i in range(7):
        ex.forward(full[i], 0, None, True, timed=True)
        runs.append(list(ex.last_op_times))
    module.block_rows = real
    labels = [label for label, _ in runs[0]]
    med = [statistics.median(r[k][1] for r in runs[2:]) for k in range(len(labels))]
    out[mode] = list(zip(labels, med))
    print(mode, len(labels), "launches, sum of medians", round(sum(med) * 1e3, 1), "us")
    for label, t in out[mode][-22:]:
        print(f"  {label:40s} {t * 1e3:8.2f} us")
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
