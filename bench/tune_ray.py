"""Wall clock of one full-space tune run locally and through a local Ray cluster, on one host, in one session.

CUDA SGEMM (space `full`, 1434 legal configs on sm_90) where CUDA exists, else the WebGPU gemm; both runs start
from empty stores, tune the same shape with the same seed, and their best configs are compared (the same, or tied
in the Ray run's final race). On CUDA the Ray run compiles on CPU tasks and ships cubins to the GPU worker
(`--compile-on worker` measures the old path). `--limit-s S` stops the local run after S seconds and gives the
Ray run exactly the configs the local run measured (the JSON's `cut` says so); `--budget N` cuts both to N.
Writes `tune_ray.json` into `--out`: date, device, command, seconds of each run, the workers, the stage seconds
the engines report, where the Ray run's kernels were compiled, both best configs and whether they agree.

`--compile-probe N` (CUDA) first times N compiles of the space's configs through Ray CPU tasks alone, every task
submitted at once on the cluster's CPU slots, and records the tasks per second with the seconds each compile took
inside its task: whether a slow fan-out is the compiles or the tasks around them.

Where one call cannot hold both runs of the full space, `--local-only` writes the local half and a later
`--local-from JSON` (same device, space, shape and seed) runs Ray against it.

Run: PYTHONPATH=src python bench/tune_ray.py --out bench/results/tune_ray_h200 [--limit-s 150] [--workers N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _best(result: Any) -> dict[str, Any] | None:
    b = result.best
    return None if b is None else {"config": b.config.key(), "median_ms": b.median_ms, "worker": b.worker,
                                   "tie_group": b.tie_group}


def _timed_compile(request: Any) -> tuple[float, bool]:
    """One compile task of the probe: (seconds inside the task, compiled)."""
    from tilewise.devices.cuda_nvrtc import CompiledCuda
    from tilewise.tune.cluster import compile_on_cpu

    t = time.perf_counter()
    got = compile_on_cpu(request)
    return time.perf_counter() - t, isinstance(got, CompiledCuda)


def compile_probe(ray: Any, tpl: Any, info: Any, shape: tuple[int, ...], configs: list[Any],
                  slots: int) -> dict[str, Any]:
    """Compile `configs` in Ray CPU tasks, all submitted at once (`slots` run at a time, as the tuner's fan-out):
    wall seconds, tasks per second, the seconds inside each task, and the first task's start-up."""
    from tilewise.devices.cuda_nvrtc import CompileProbe

    requests = [CompileProbe.requests_of(tpl, c, shape, info)[-1] for c in configs]
    task = ray.remote(num_cpus=1, max_retries=0)(_timed_compile)
    t0 = time.perf_counter()
    first = ray.get(task.remote(requests[0]))  # a warm worker, its imports and libnvrtc loaded
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = ray.get([task.remote(r) for r in requests])
    wall = time.perf_counter() - t0
    inside = [s for s, _ in got]
    return {"kernels": len(requests), "slots": slots, "wall_s": wall, "per_s": len(requests) / wall,
            "inside_s_median": float(sorted(inside)[len(inside) // 2]), "inside_s_sum": float(sum(inside)),
            "first_task_s": warm_s, "first_inside_s": first[0], "compiled": sum(ok for _, ok in got)}


#: what a --local-from half must share with this run for the two to be compared
SAME_RUN = ("device", "backend", "shape", "space", "legal_configs", "budget", "limit_s", "seed")


def local_half(path: str, record: dict[str, Any], space: Any) -> tuple[list[Any], bool]:
    """The local run of an earlier `--local-only` call, copied into `record`: (the configs it measured, whether
    they were a cut). SystemExit with the differing keys when it was another device, space, shape or seed."""
    old = json.loads(Path(path).read_text())
    differ = [k for k in SAME_RUN if old.get(k) != record[k]]
    if "local" not in old or differ:
        raise SystemExit(f"{path} cannot be this run's local half: "
                         + (f"it differs in {', '.join(differ)}" if differ else "it holds no local run")
                         + "; run --local-only again with this run's options")
    record.update(local=old["local"], cut=old["cut"], cupy_cache=old.get("cupy_cache"),
                  local_from={"file": Path(path).name, "date": old.get("date")})
    keys = old["local"].get("configs") or []
    configs = [space.parse(key) for key in keys]
    return configs, old["cut"] is not None


def _cupy_nvrtc() -> str | None:
    """`major.minor` of the NVRTC CuPy compiles with (the local run's compiler)."""
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        return f"{major}.{minor}"
    except Exception:  # no CuPy, or a CuPy without NVRTC
        return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for tune_ray.json")
    p.add_argument("--shape", default=None, help="M,N,K (default 4096,4096,4096 on CUDA, 256,256,256 on WebGPU)")
    p.add_argument("--space", default="full", help="the space tuned (default full)")
    p.add_argument("--budget", type=int, default=None, help="most configs per run (default: every legal one)")
    p.add_argument("--workers", type=int, default=None, help="Ray device workers (default: one per GPU, else 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs")
    p.add_argument("--limit-s", type=float, default=None,
                   help="stop the local run after this many seconds; the Ray run then measures the same configs")
    p.add_argument("--compile-on", choices=("cpu", "worker"), default="cpu",
                   help="where the Ray run compiles CUDA kernels: CPU tasks (cubins shipped) or the GPU worker")
    p.add_argument("--compile-probe", type=int, default=0,
                   help="CUDA: first time this many compiles through Ray CPU tasks alone (0: no probe)")
    p.add_argument("--local-only", action="store_true",
                   help="stop after the local run (its half of tune_ray.json), for a host whose calls are too short "
                        "for both runs of the full space")
    p.add_argument("--local-from", default=None, metavar="JSON",
                   help="skip the local run and compare with the local half a --local-only run wrote on the same "
                        "device (refused for another device, space, shape or seed)")
    p.add_argument("--warm-cache", action="store_true",
                   help="let the local run use CuPy's kernel cache from earlier runs (default: an empty one)")
    args = p.parse_args()

    import ray
    from tilewise.devices import resolve
    from tilewise.devices.cuda_nvrtc import nvrtc_version
    from tilewise.errors import DeviceUnavailable
    from tilewise.files import write_atomic
    from tilewise.kernels.registry import get_template
    from tilewise.tune.cluster import Cluster
    from tilewise.tune.engine import Engine
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    legal_configs = set(tpl.space(args.space).legal(dev.info.limits))
    legal = len(legal_configs)
    record: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              "command": " ".join(["python", *sys.argv]), "host": platform.node(),
                              "device": dev.info.fingerprint, "backend": backend, "shape": list(shape),
                              "space": args.space, "legal_configs": legal, "budget": args.budget,
                              "limit_s": args.limit_s, "seed": args.seed, "compile_on": args.compile_on,
                              "nvrtc_local": _cupy_nvrtc() if backend == "cuda" else None}
    with tempfile.TemporaryDirectory() as tmp:
        # CuPy keeps compiled modules on disk; an earlier run's cache would spare the local run its compiles (the
        # Ray run's CPU tasks compile with NVRTC and never read it), so the local run starts from an empty one
        if not args.warm_cache:
            os.environ["CUPY_CACHE_DIR"] = str(Path(tmp) / "cupy-cache")
        record["cupy_cache"] = "warm (--warm-cache)" if args.warm_cache else "empty"
        if args.local_from:
            taken, cut = local_half(args.local_from, record, tpl.space(args.space))
        else:
            t0 = time.perf_counter()
            local_store = Store(Path(tmp) / "local.sqlite")
            local_eng = Engine(dev, local_store, seed=args.seed)
            local = tune(tpl, dev, shape, space=args.space, store=local_store,
                         budget=Budget(args.budget, args.limit_s), seed=args.seed, engine=local_eng)
            taken = list(dict.fromkeys(r.config for r in local.rows))  # what the local run measured, in its order
            done = len(legal_configs.intersection(taken))
            cut = done < legal
            record["local"] = {"seconds": time.perf_counter() - t0, "best": _best(local),
                               "rows": len(local.rows), "stage_seconds": dict(local_eng.seconds),
                               "configs": [c.key() for c in taken] if cut else None}
            record["cut"] = ({"configs": done, "of": legal,
                              "by": "budget" if args.budget is not None and done >= args.budget else "limit_s"}
                             if cut else None)
            write_atomic(out / "tune_ray.json", json.dumps(record, indent=1))  # the local half, should Ray not finish
            if args.local_only:
                print(f"local {record['local']['seconds']:.1f} s ({done} of {legal} configs); wrote "
                      f"{out / 'tune_ray.json'}")
                return 0
            del local_eng
        del dev, choice  # the Ray workers open the device themselves
        t0 = time.perf_counter()
        cluster = Cluster()
        try:
            workers = cluster.start(backend, [backend], "the Ray tuning bench", count=args.workers)
            started = time.perf_counter() - t0
            fp = workers[0].info.fingerprint
            store = Store(Path(tmp) / "ray.sqlite")
            eng = cluster.engine(fp, store, seed=args.seed)
            if args.compile_probe and backend == "cuda":
                import random

                picked = random.Random(args.seed + 1).sample(sorted(legal_configs, key=str),
                                                            min(args.compile_probe, legal))
                tp = time.perf_counter()
                record["compile_probe"] = compile_probe(ray, tpl, workers[0].info, shape, picked,
                                                        eng.compile_slots)
                pr = record["compile_probe"]
                print(f"compile probe: {pr['kernels']} kernels in {pr['wall_s']:.1f} s on {pr['slots']} slots "
                      f"({pr['per_s']:.2f}/s), {pr['inside_s_median']:.2f} s each inside its task", flush=True)
                t0 += time.perf_counter() - tp  # the probe is not part of the Ray run's time
            eng.cpu_compiles = eng.cpu_compiles and args.compile_on == "cpu"
            got = tune(tpl, eng.device, shape, space=args.space, store=store, engine=eng,
                       configs=taken if cut else None)
            counts = [ray.get(w.actor.compile_counts.remote()) for w in workers]
            record["ray"] = {"seconds": time.perf_counter() - t0, "startup_seconds": started,
                             "workers": [w.name for w in workers], "best": _best(got), "rows": len(got.rows),
                             "stage_seconds": eng.seconds, "cpu_compile_slots": eng.compile_slots,
                             "kernels_loaded_from_cpu": sum(c["loaded"] for c in counts),
                             "kernels_compiled_on_worker": sum(c["compiled"] for c in counts),
                             # which compiler the CPU tasks found (the local run compiles with CuPy's)
                             "nvrtc_in_cpu_tasks": ray.get(ray.remote(num_cpus=1)(nvrtc_version).remote())}
        finally:
            cluster.close()
        if ray.is_initialized():
            ray.shutdown()
    lb, rb = record["local"]["best"], record["ray"]["best"]
    ray_ranked = {r.config.key(): r.tie_group for r in got.ranked}
    record["same_best"] = bool(lb and rb and (lb["config"] == rb["config"] or ray_ranked.get(lb["config"]) == 1))
    record["speedup"] = record["local"]["seconds"] / record["ray"]["seconds"]
    write_atomic(out / "tune_ray.json", json.dumps(record, indent=1))
    cut_by = record["cut"] and "--" + record["cut"]["by"].replace("_", "-")
    space_note = (f"SPACE CUT to {record['cut']['configs']} of {legal} configs by {cut_by}" if record["cut"]
                  else f"full space ({legal} configs)")
    where = (f"; {record['ray']['kernels_loaded_from_cpu']} kernels compiled on CPU tasks, "
             f"{record['ray']['kernels_compiled_on_worker']} on the worker" if backend == "cuda" else "")
    print(f"{space_note}; local {record['local']['seconds']:.1f} s, ray {record['ray']['seconds']:.1f} s "
          f"(x{record['speedup']:.2f}{where}), same best: {record['same_best']}; wrote {out / 'tune_ray.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
