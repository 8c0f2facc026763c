"""How the host waits for a decision's result on Dawn, raced: the blocking wait against the spinning one.

A decision on the WebGPU executor ends in one buffer map. `map_wait = "block"` maps through wgpu-py's `map_sync`
(wgpudawn blocks in `wgpuInstanceWaitAny`); `"spin"` calls `map_async` and then Dawn's non-blocking
`wgpuInstanceProcessEvents` until the map resolves. The same model and prompts run in rounds that alternate the two
modes (`--per-round` decisions each, `model.bench.race_modes`), so both see the same GPU state; per mode it prints
p50 / p90 / p99, the share of decisions slower than 1.5x that mode's p50, and the GPU time of one decision's
launches (timestamps), and checks that both modes return the same scores. Writes `dawn_wait.json` (date, device,
command, every sample) into `--out`.

    PYTHONPATH=src python3 bench/dawn_wait.py --out OUT_DIR [--preset lfm2-350m] [--device dawn]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.devices.webgpu_adapters import MAP_WAITS  # noqa: E402
from tilewise.model.bench import PREFIX_TOKENS, percentiles, prompts, race_modes  # noqa: E402
from tilewise.model.runtime import from_checkpoint, open_checkpoint  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for dawn_wait.json")
    ap.add_argument("--preset", default="lfm2-350m", help="model preset (seeded random weights, nf4)")
    ap.add_argument("--device", default="dawn", help="dawn or dawn:N (webgpu works too: it has no spin wait)")
    ap.add_argument("--seq", type=int, default=346, help="prompt tokens per decision")
    ap.add_argument("--rounds", type=int, default=8, help="rounds; each times every mode")
    ap.add_argument("--per-round", type=int, default=10, help="decisions per mode per round")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ck = open_checkpoint(args.preset, weights="f32", seed=0).converted("nf4").materialize()
    model = from_checkpoint(ck, device=args.device, quiet=True)
    dev = model.executor.dev
    _, full = prompts(ck.config.vocab_size, args.seq, 32, PREFIX_TOKENS)
    modes = [m for m in MAP_WAITS if m == "block" or dev.runtime.process_events is not None]

    def set_mode(m: str) -> None:
        dev.map_wait = m

    def decide(i: int) -> np.ndarray:
        return model.scores(model.prefill(full[i % len(full)]))

    scores: dict[str, np.ndarray] = {}
    for m in modes:  # the scores of prompt 0 per mode
        set_mode(m)
        scores[m] = decide(0)
    t_start = time.perf_counter()
    samples = race_modes(decide, set_mode, modes, args.rounds, args.per_round)
    gpu_ms = None
    if hasattr(model.executor, "last_op_times"):
        from tilewise.model.bench import op_table

        gpu_ms = sum(op["ms"] for op in op_table(model.executor, full[0]))
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "command": "python3 bench/dawn_wait.py " + " ".join(argv), "device": dev.info.as_dict(),
                           "dispatch": str(getattr(model.executor.dispatch, "source", None)),
                           "gpu_ms_of_one_decision": gpu_ms, "seconds": time.perf_counter() - t_start, "modes": {}}
    print(f"{dev.info.name} ({model.device}), {args.preset} at {args.seq} tokens, {args.rounds} rounds x "
          f"{args.per_round} decisions per mode; GPU time of one decision {gpu_ms and f'{gpu_ms:.2f} ms'}")
    print(f"{'mode':<7}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'> 1.5 p50':>11}")
    for m in modes:
        p = percentiles(samples[m])
        slow = float(np.mean(np.asarray(samples[m]) > 1.5 * p["p50"]))
        doc["modes"][m] = {**p, "share_above_1.5x_p50": slow, "samples_ms": samples[m],
                           "max_abs_score_diff_vs_block": float(np.abs(scores[m] - scores["block"]).max())}
        print(f"{m:<7}{p['p50']:9.2f}{p['p90']:9.2f}{p['p99']:9.2f}{slow:11.0%}")
    (out / "dawn_wait.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
