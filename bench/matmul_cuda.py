"""The classifier's NF4 matmuls alone on CUDA against cuBLAS f16 on the same GPU, at a decision's row count.

For each matmul shape of a model preset (conv in/out projections, q/k/v and out projections, paired gate/up with
SwiGLU, down with the residual) at `--rows` rows: the tensor-core kernel's default, its seed configs and `--sample`
random legal configs go through the one engine (each verified against float64, every output, before it is timed);
the best `--race-top` and each kind's best are raced against cuBLAS (CuPy matmul, f16 x f16 with f32 accumulation,
on its own copies of x and the dequantized W; for SwiGLU one GEMM of both weight sets) in one interleaved
measurement, and the table prints each median, TFLOP/s and the ratio (`tilewise.tune.measure.compare`: `tie`
when the 95% intervals overlap, `noisy` when a sample scatters). Writes `matmul_cuda.json` (date, device, command,
every row) into `--out`.

Every kind but `mma`/`splitk`/`pipe` takes x as f16 rows that its `nf4_mm_prep` launch makes (normed first where the
matmul has the fused norm); cuBLAS is given f16 x. So each shape is raced twice: whole runs (prep + kernel + any
reduction: `tilewise ms`), and on f16 x as cuBLAS gets it (the prep run once before, untimed: `on f16 x`), which is
what the kernel costs where the executor hands it f16 rows written by the previous matmul's epilogue.

    PYTHONPATH=src python3 bench/matmul_cuda.py --out OUT_DIR [--preset lfm2-350m] [--rows 346] [--sample 16]
        [--kinds wgr] [--only conv.in_proj] [--grid 'BF=64,128;KS=1,2']
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.devices import get_device  # noqa: E402
from tilewise.kernels.matmul.cuda import KINDS, CudaMatmul  # noqa: E402
from tilewise.model.tune import candidates, model_config, model_matmuls  # noqa: E402
from tilewise.tune.engine import Engine, Item  # noqa: E402
from tilewise.tune.measure import compare, measure  # noqa: E402


def is_prep(launch: Any) -> bool:
    """The launch is an `nf4_mm_prep` (the x -> f16 prologue)."""
    return (launch.program.meta.get("role") or ("",))[0] == "prep"


def grid_configs(tpl: Any, grid: str, limits: Any) -> list[Any]:
    """The legal configs of `grid` ("P=V,V;P=V"): every combination of the listed values, the template's default
    config's value for each parameter left out."""
    if not grid.strip():
        return []
    space = tpl.space()
    axes: dict[str, list[Any]] = {}
    for part in grid.split(";"):
        name, _, vals = part.partition("=")
        name = name.strip()
        if name not in space.params:
            raise SystemExit(f"--grid names {name!r}, not a parameter of {tpl.kind} ({', '.join(space.params)})")
        kind = type(space.params[name][0])
        axes[name] = [kind(v.strip()) for v in vals.split(",") if v.strip()]
    base = dict(tpl.default_config().items())
    out = []
    for combo in itertools.product(*axes.values()):
        values = {**base, **dict(zip(axes, combo))}
        try:
            c = space.config(values)
        except Exception:  # a value outside the parameter's range: not a config
            continue
        if space.is_legal(c, limits) and c not in out:
            out.append(c)
    return out


def race_on_f16_x(eng: Engine, items: list[Item], rounds: int) -> tuple[list[Any], Any]:
    """Each item's kernel (and reduction) alone on the f16 rows its prep wrote, raced with cuBLAS: (stats, peer)."""
    dev = eng.device
    runs: dict[Any, list[Any]] = {}
    for i, it in enumerate(items):
        launches = eng.launches(it)
        preps = [x for x in launches if is_prep(x)]
        if preps:
            dev.run(preps)  # xh filled once
        runs[i] = [x for x in launches if not is_prep(x)]
    first = items[0]
    prog = eng.peer_program(first.kernel)
    if prog is not None:
        runs["cublas"] = first.kernel.peer_launches(prog, eng.timing_buffers(first), first.shape)
    got = measure(dev, runs, warmup=3, min_rounds=rounds, max_rounds=rounds, budget_s=30.0, rng=eng.rng)
    return [got.stats[i] for i in range(len(items))], got.stats.get("cublas")


def group_of(oc: Any, split: list[str]) -> str:
    """An outcome's row in the per-kind report: its kind, with the values of the `--split-by` parameters it has."""
    cfg = oc.config
    return oc.item.kernel.kind + "".join(f"/{p}={cfg[p]}" for p in split if p in cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for matmul_cuda.json")
    ap.add_argument("--preset", default="lfm2-350m", help="model preset whose matmul shapes are measured")
    ap.add_argument("--rows", type=int, default=346, help="rows of x (a decision's prompt length)")
    ap.add_argument("--fmt", default="nf4", choices=("nf4", "f16", "f32"), help="weight format")
    ap.add_argument("--sample", type=int, default=16, help="random legal configs per shape besides the seeds")
    ap.add_argument("--race-top", type=int, default=3, help="best configs raced against cuBLAS per shape")
    ap.add_argument("--rounds", type=int, default=40, help="rounds of the race")
    ap.add_argument("--seed", type=int, default=0, help="inputs and sampling")
    ap.add_argument("--device", default="cuda", help="cuda or cuda:N")
    ap.add_argument("--kinds", default="mma,splitk",
                    help="tensor-core kernel kinds that compete, comma-separated (mma, splitk, pipe, ring, wg)")
    ap.add_argument("--only", default="", metavar="NAME[,NAME]",
                    help="measure only these matmuls of the preset (e.g. ffn.gate_up); default: all")
    ap.add_argument("--grid", default="", metavar="P=V,V;P=V,...",
                    help="also every legal config of this grid of each kind (parameters left out keep the default "
                         "config's value), e.g. 'BF=64,128;BT=120,176;KS=1,2'")
    ap.add_argument("--split-by", default="", metavar="PARAM[,PARAM]",
                    help="race each kind's best per value of these parameters too (e.g. DEC: wgr's two decodes), "
                         "and report them as KIND/PARAM=V")
    args = ap.parse_args()
    split = [s.strip() for s in args.split_by.split(",") if s.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS or k == "rows" for k in kinds):
        ap.error(f"--kinds takes tensor-core kinds from {[k for k in KINDS if k != 'rows']}, got {args.kinds!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cfg = model_config(args.preset)
    shapes = model_matmuls(cfg)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if any(name not in shapes for name in only):
        ap.error(f"--only takes matmul names of {args.preset} from {sorted(shapes)}, got {args.only!r}")
    dev = get_device(args.device)
    eng = Engine(dev, None, seed=args.seed, measure_kw={"warmup": 3, "min_rounds": 8, "max_rounds": 20,
                                                        "budget_s": 0.5})
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "command": "python3 bench/matmul_cuda.py " + " ".join(argv),
                           "device": dev.info.as_dict(), "rows": args.rows, "preset": args.preset, "shapes": []}
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset} matmuls at {args.rows} rows, {args.fmt}",
          flush=True)
    header = (f"{'matmul':<14}{'N x K':>12}{'tilewise ms':>12}{'TFLOP/s':>9}{'cuBLAS ms':>10}{'TFLOP/s':>9}"
              f"{'ratio':>8}{'on f16 x':>10}{'cuBLAS':>8}{'ratio':>8}")
    lines = []
    for label, (epilogue, n, k, norm) in shapes.items():
        if only and label not in only:
            continue
        shape = (args.rows, n, k)
        items = []
        for kind in kinds:
            tpl = CudaMatmul(kind, args.fmt, epilogue, norm, cfg.norm_eps)
            todo = candidates(tpl, dev.info.limits, args.sample, args.seed)
            todo += [c for c in grid_configs(tpl, args.grid, dev.info.limits) if c not in todo]
            items += [Item(tpl, c, shape) for c in todo if not tpl.config_problems(c, shape)]
        cands = items
        outs = eng.evaluate(items, batch=None)
        ok = sorted((oc for oc in outs if oc.status == "ok" and oc.stats is not None),
                    key=lambda oc: oc.stats.median_ms)
        row: dict[str, Any] = {"label": label, "epilogue": epilogue, "n": n, "k": k, "norm": norm,
                               "candidates": len(cands), "ok": len(ok),
                               "failed": {f"kind={oc.item.kernel.kind},{oc.config}": f"{oc.status}: {oc.reason}"
                                          for oc in outs if oc.status != "ok"},
                               # every config's median of the evaluation (prep + kernel + any reduction), fastest
                               # first: the landscape behind the raced few
                               "measured_ms": {f"kind={oc.item.kernel.kind},{oc.config}": oc.stats.median_ms
                                               for oc in ok}}
        if not ok:
            print(f"{label}: no config ran: {row['failed']}", flush=True)
            doc["shapes"].append(row)
            continue
        top = ok[: args.race_top]
        for group in dict.fromkeys(group_of(oc, split) for oc in ok):  # each kind's best races too, so the row
            best_of = next(oc for oc in ok if group_of(oc, split) == group)  # says what every kind reaches
            if best_of not in top:
                top.append(best_of)
        got = eng.race([oc.item for oc in top], peer=True,
                       measure_kw={"warmup": 3, "min_rounds": args.rounds, "max_rounds": args.rounds,
                                   "budget_s": 30.0}, outcomes=top)
        best_i = min(range(len(top)), key=lambda i: got.stats[i].median_ms)
        per_kind: dict[str, float] = {}
        for oc, st in zip(top, got.stats):
            group = group_of(oc, split)
            per_kind[group] = min(per_kind.get(group, float("inf")), st.median_ms)
        row["per_kind_ms"] = per_kind
        best, cub = got.stats[best_i], got.peer
        flops = 2 * args.rows * n * k * top[best_i].item.kernel.sets
        verdict = compare(cub, best) if cub is not None else None
        row.update(best=f"kind={top[best_i].item.kernel.kind},{top[best_i].config}", best_ms=best.median_ms,
                   best_stats=best.as_dict(),
                   tflops=flops / best.median_ms / 1e9,
                   cublas_ms=cub.median_ms if cub else None, cublas_stats=cub.as_dict() if cub else None,
                   cublas_tflops=flops / cub.median_ms / 1e9 if cub else None,
                   vs_cublas=verdict.as_dict() if verdict else None, peer_error=got.peer_error)
        f16_stats, f16_cub = race_on_f16_x(eng, [oc.item for oc in top], args.rounds)
        f16_i = min(range(len(top)), key=lambda i: f16_stats[i].median_ms)
        f16_verdict = compare(f16_cub, f16_stats[f16_i]) if f16_cub is not None else None
        row["on_f16_x"] = {"best": f"kind={top[f16_i].item.kernel.kind},{top[f16_i].config}",
                           "best_stats": f16_stats[f16_i].as_dict(),
                           "cublas_stats": f16_cub.as_dict() if f16_cub else None,
                           "vs_cublas": f16_verdict.as_dict() if f16_verdict else None}
        doc["shapes"].append(row)
        line = (f"{label:<14}{f'{n}x{k}':>12}{best.median_ms:12.4f}{row['tflops']:9.1f}"
                + (f"{cub.median_ms:10.4f}{row['cublas_tflops']:9.1f}{verdict.times():>8}" if cub and verdict
                   else f"  cuBLAS not raced: {got.peer_error}")
                + (f"{f16_stats[f16_i].median_ms:10.4f}{f16_cub.median_ms:8.4f}{f16_verdict.times():>8}"
                   if f16_cub is not None and f16_verdict else ""))
        lines.append(line)
        kinds_txt = ", ".join(f"{k} {v:.4f}" for k, v in sorted(per_kind.items(), key=lambda kv: kv[1]))
        print(f"{line}   [{row['best']}] per kind: {kinds_txt}", flush=True)
        (out / "matmul_cuda.json").write_text(json.dumps(doc, indent=1, default=str))
    print()
    print(header)
    print("-" * len(header))
    print("\n".join(lines))
    print("ratio: cuBLAS median / tilewise median (above 1: tilewise faster); tie: 95% intervals overlap; on f16 x: "
          "the kernel (and reduction) given f16 rows, as cuBLAS is, raced with cuBLAS again; "
          f"{time.perf_counter() - t0:.0f} s")
    (out / "matmul_cuda.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
