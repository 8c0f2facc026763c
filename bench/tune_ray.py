"""Wall clock of one full-space tune run locally and through a local Ray cluster, on one host, in one session.

CUDA SGEMM (space `full`) where CUDA exists, else the WebGPU gemm; both runs start from empty stores, tune the
same shape with the same seed and budget, and their best configs are compared (the same, or tied in the Ray run's
final race). Writes `tune_ray.json` into `--out`: seconds of each run, the workers, the stage seconds the engines
report, both best configs and whether they agree.

Run: PYTHONPATH=src python bench/tune_ray.py --out bench/results/tune_ray_h200 [--workers N] [--budget N]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any


def _best(result: Any) -> dict[str, Any] | None:
    b = result.best
    return None if b is None else {"config": b.config.key(), "median_ms": b.median_ms, "worker": b.worker,
                                   "tie_group": b.tie_group}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for tune_ray.json")
    p.add_argument("--shape", default=None, help="M,N,K (default 4096,4096,4096 on CUDA, 256,256,256 on WebGPU)")
    p.add_argument("--space", default="full", help="the space tuned (default full)")
    p.add_argument("--budget", type=int, default=None, help="most configs per run (default: every legal one)")
    p.add_argument("--workers", type=int, default=None, help="Ray device workers (default: one per GPU, else 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs")
    args = p.parse_args()

    import ray
    from tilewise.devices import resolve
    from tilewise.errors import DeviceUnavailable
    from tilewise.kernels.registry import get_template
    from tilewise.tune.cluster import Cluster
    from tilewise.tune.search import Budget
    from tilewise.tune.store import Store
    from tilewise.tune.tuner import tune

    try:
        choice = resolve("cuda", ["cuda"], job="the Ray tuning bench")
    except DeviceUnavailable:
        choice = resolve("webgpu", ["webgpu"], job="the Ray tuning bench")
    dev = choice.device
    backend = dev.info.backend
    shape = tuple(int(s) for s in (args.shape or ("4096,4096,4096" if backend == "cuda" else "256,256,256"))
                  .split(","))
    tpl = get_template("gemm", backend)
    budget = Budget(args.budget)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"host": platform.node(), "device": dev.info.fingerprint, "backend": backend,
                              "shape": list(shape), "space": args.space, "budget": args.budget, "seed": args.seed}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        local = tune(tpl, dev, shape, space=args.space, store=Store(Path(tmp) / "local.sqlite"), budget=budget,
                     seed=args.seed)
        record["local"] = {"seconds": time.perf_counter() - t0, "best": _best(local),
                           "rows": len(local.rows)}
        del dev, choice  # the Ray workers open the device themselves
        t0 = time.perf_counter()
        cluster = Cluster()
        try:
            workers = cluster.start(backend, [backend], "the Ray tuning bench", count=args.workers)
            started = time.perf_counter() - t0
            fp = workers[0].info.fingerprint
            store = Store(Path(tmp) / "ray.sqlite")
            eng = cluster.engine(fp, store, seed=args.seed)
            got = tune(tpl, eng.device, shape, space=args.space, store=store, budget=budget, engine=eng)
            record["ray"] = {"seconds": time.perf_counter() - t0, "startup_seconds": started,
                             "workers": [w.name for w in workers], "best": _best(got), "rows": len(got.rows),
                             "stage_seconds": eng.seconds}
        finally:
            cluster.close()
        if ray.is_initialized():
            ray.shutdown()
    lb, rb = record["local"]["best"], record["ray"]["best"]
    ray_ranked = {r.config.key(): r.tie_group for r in got.ranked}
    record["same_best"] = bool(lb and rb and (lb["config"] == rb["config"] or ray_ranked.get(lb["config"]) == 1))
    record["speedup"] = record["local"]["seconds"] / record["ray"]["seconds"]
    (out / "tune_ray.json").write_text(json.dumps(record, indent=1))
    print(f"local {record['local']['seconds']:.1f} s, ray {record['ray']['seconds']:.1f} s "
          f"(x{record['speedup']:.2f}), same best: {record['same_best']}; wrote {out / 'tune_ray.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
