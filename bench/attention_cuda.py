"""The classifier's causal GQA attention on CUDA: every legal config of its kernels, raced at a decision's length.

For a model preset's attention shape (heads, K/V heads, head size) at `--rows` queries and no cached positions, every
legal config of `CudaAttention` (QT 1: one query a block; QT > 1: QT queries sharing each staged 32-key tile; TC 1:
16 queries to each group of KW warps on tensor cores, f16 operands, PF 1 prefetching the next key tile) goes through
the one engine: verified against float64 (every output value), then all are timed together in one interleaved race.
Prints each config's median and its ratio to the best one-query-a-block config measured in the same race, and each
prefetching config against the same tile without the prefetch; writes `attention_cuda.json` (date, device,
command, every config) into `--out`.

    PYTHONPATH=src python3 bench/attention_cuda.py --out OUT_DIR [--preset lfm2-350m] [--rows 346] [--rounds 20]
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_args  # noqa: E402
from tilewise.kernels.attention.cuda import CudaAttention  # noqa: E402
from tilewise.tune.engine import Engine, Item  # noqa: E402


def main() -> int:
    args, out, dev, cfg = bench_args.parse(__doc__, "attention_cuda.json", "attention shape", "cuda", "cuda or cuda:N")
    shape = (args.rows, 0, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    tpl = CudaAttention()
    configs = [c for c in tpl.space().legal(dev.info.limits) if not tpl.config_problems(c, shape)]
    eng = Engine(dev, None, measure_kw={"warmup": 3, "min_rounds": 6, "max_rounds": 12, "budget_s": 0.5})
    outs = eng.evaluate([Item(tpl, c, shape) for c in configs], batch=None)
    ok = [oc for oc in outs if oc.status == "ok"]
    failed = {oc.config.key(): f"{oc.status}: {oc.reason}" for oc in outs if oc.status != "ok"}
    race = eng.race([oc.item for oc in ok], measure_kw={"warmup": 3, "min_rounds": args.rounds,
                                                         "max_rounds": args.rounds, "budget_s": 60.0}, outcomes=ok)
    rows = sorted(((oc.config, st) for oc, st in zip(ok, race.stats)), key=lambda r: r[1].median_ms)
    base = min((st.median_ms for c, st in rows if c["QT"] == 1), default=None)
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset} attention at {args.rows} queries "
          f"(HQ {shape[2]}, HKV {shape[3]}, D {shape[4]}); {len(ok)} of {len(configs)} configs verified")
    print(f"{'QT':>4}{'NW':>4}{'TC':>4}{'KW':>4}{'PF':>4}{'median ms':>11}{'p80 ms':>9}{'vs best QT 1':>14}"
          f"{'vs PF 0':>9}")
    pf0 = {(c["QT"], c["NW"], c["TC"], c["KW"]): st.median_ms for c, st in rows if not c["PF"]}
    for c, st in rows:
        ratio = f"{base / st.median_ms:.2f}x" if base else "-"
        same = pf0.get((c["QT"], c["NW"], c["TC"], c["KW"])) if c["PF"] else None
        vs_pf0 = f"{same / st.median_ms:.2f}x" if same else "-"
        print(f"{c['QT']:>4}{c['NW']:>4}{c['TC']:>4}{c['KW']:>4}{c['PF']:>4}{st.median_ms:11.4f}{st.p80_ms:9.4f}"
              f"{ratio:>14}{vs_pf0:>9}")
    print("vs best QT 1: the best one-query-a-block median / this median; vs PF 0: the same tile without the "
          "prefetch / this (above 1: faster); one interleaved race")
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "command": "python3 bench/attention_cuda.py " + " ".join(argv),
                           "device": dev.info.as_dict(), "shape": shape, "failed": failed, "rounds": race.rounds,
                           "configs": [{**dict(c), **st.as_dict()} for c, st in rows]}
    (out / "attention_cuda.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
