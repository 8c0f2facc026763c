"""Where a CUDA matmul's time goes, by leaving a stage out: one config timed in variants that differ in one part.

For each (kind, config) at the model's shapes (`--rows` rows of lfm2-350m's FFN gate/up pair with SwiGLU and its
down projection), the same config runs as
- nf4 + fused RMSNorm (what the executor launches for gate/up), nf4 without the norm (the 1/rms prologue and the
  per-column scale left out), f16 weights with and without the norm (no NF4 decode: the weights are already f16),
and, for the pipe kind, with 3, 4 and 6 raw stages in flight (the latency the cp.async ring hides). Every variant is
verified against float64 (all outputs) before it is timed by the one engine, all in one interleaved race per shape,
so the differences are measured in the same run. Writes `matmul_cuda_parts.json` into `--out`.

    PYTHONPATH=src python3 bench/matmul_cuda_parts.py --out OUT_DIR [--rows 346]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.devices import get_device  # noqa: E402
from tilewise.kernels.matmul.cuda import CudaMatmul  # noqa: E402
from tilewise.model.tune import model_config, model_matmuls  # noqa: E402
from tilewise.tune.engine import Engine, Item  # noqa: E402

#: the configs measured best at 346 rows (mma for gate/up, split-K for down) and the pipe kind's default
CONFIGS = {
    "mma": {"BM": 128, "BN": 128, "BK": 32, "WM": 64, "WN": 16, "PIPE": 1},
    "splitk": {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "PIPE": 2, "KS": 4},
    "pipe": {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "ST": 4, "KS": 1, "MB": 2},
}


def variants(epilogue: str, norm: bool, eps: float) -> list[tuple[str, CudaMatmul, dict[str, Any]]]:
    out: list[tuple[str, CudaMatmul, dict[str, Any]]] = []
    for kind, cfg in CONFIGS.items():
        for fmt in ("nf4", "f16"):
            for nm in ((True, False) if norm else (False,)):
                label = f"{kind} {fmt}" + (" norm" if nm else "")
                out.append((label, CudaMatmul(kind, fmt, epilogue, nm, eps), cfg))
        if kind == "pipe":
            for st in (3, 6):
                out.append((f"pipe nf4{' norm' if norm else ''} st{st}", CudaMatmul(kind, "nf4", epilogue, norm, eps),
                            {**cfg, "ST": st}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for matmul_cuda_parts.json")
    ap.add_argument("--preset", default="lfm2-350m", help="model preset whose FFN shapes are measured")
    ap.add_argument("--rows", type=int, default=346, help="rows of x")
    ap.add_argument("--rounds", type=int, default=20, help="rounds of each race")
    ap.add_argument("--device", default="cuda", help="cuda or cuda:N")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = get_device(args.device)
    cfg = model_config(args.preset)
    eng = Engine(dev, None, seed=0)
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "command": "python3 bench/matmul_cuda_parts.py " + " ".join(argv),
                           "device": dev.info.as_dict(), "rows": args.rows, "shapes": []}
    print(f"{dev.info.name}: {args.preset} FFN matmuls at {args.rows} rows, one config per kind in variants")
    for label, (epilogue, n, k, norm) in model_matmuls(cfg).items():
        if not label.startswith("ffn."):
            continue
        shape = (args.rows, n, k)
        vs = [(name, tpl, tpl.config_of(c)) for name, tpl, c in variants(epilogue, norm, cfg.norm_eps)]
        vs = [(name, tpl, c) for name, tpl, c in vs if not tpl.why_illegal(c, dev.info.limits, shape)]
        outs = eng.evaluate([Item(tpl, c, shape) for _, tpl, c in vs], batch=None)
        ok = [(name, oc) for (name, _, _), oc in zip(vs, outs) if oc.status == "ok"]
        failed = {name: f"{oc.status}: {oc.reason}" for (name, _, _), oc in zip(vs, outs) if oc.status != "ok"}
        got = eng.race([oc.item for _, oc in ok], measure_kw={"warmup": 3, "min_rounds": args.rounds,
                                                              "max_rounds": args.rounds, "budget_s": 20.0},
                       outcomes=[oc for _, oc in ok])
        rows = [{"variant": name, "median_ms": st.median_ms, "stats": st.as_dict()}
                for (name, _), st in zip(ok, got.stats)]
        doc["shapes"].append({"label": label, "n": n, "k": k, "variants": rows, "failed": failed})
        print(f"\n{label} ({n}x{k}, {epilogue}{', norm' if norm else ''})")
        for r in rows:
            st = r["stats"]
            print(f"  {r['variant']:<22}{r['median_ms']:9.4f} ms  (p20 {st['p20_ms']:.4f}, p80 {st['p80_ms']:.4f}, "
                  f"n {st['samples']})")
        for name, why in failed.items():
            print(f"  {name:<22} {why}")
        (out / "matmul_cuda_parts.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
