"""How Ray tuning scales with the GPUs of one host: the same tunes with 1, 2 (and 4, ...) device workers.

For each worker count G in `--gpus` (default 1,2,4 capped at the GPUs the host has), on fresh stores:
- `tilewise tune gemm --space full --ray --workers G` at `--shape` (4096^3 on CUDA): the full-space SGEMM, its
  kernels compiled in Ray CPU tasks on CUDA, verified and timed by one actor per GPU;
- `tilewise tune model --ray --workers G` for `--preset` (lfm2-350m).
Each leg is the real command in a subprocess (its own local Ray cluster: `ray.init()` sees the host's GPUs and CPUs)
timed by wall clock. Recorded per leg: seconds, configs measured, configs per minute, the best config overall and
the best each worker measured (`Result.worker`), and the portable choice over the leg's device fingerprints (one
fingerprint when the GPUs are identical: then it is that device's own choice). The table printed at the end gives
each leg's speed-up over the one-worker leg of the same run.

On a host without a CUDA GPU the legs run the WebGPU gemm and the tiny model on the WebGPU adapter (lavapipe in
CI), with G workers sharing it: that shows the mechanics, not the scaling.

Run: PYTHONPATH=src python bench/ray_scaling.py --out OUT_DIR [--gpus 1,2,4] [--budget N] [--model-budget N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _gpus_on_host() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy or no driver: no CUDA GPU here
        return 0


def _run(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    """Run one leg's command with its output in `log`: (exit code, wall seconds)."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        fh.write("$ " + " ".join(["python", *cmd[1:]]) + "\n")  # the interpreter's path says nothing of the run
        fh.flush()
        rc = subprocess.call(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    secs = time.perf_counter() - t0
    # the log names no machine: the checkout, temporary folders and the host's name are replaced
    text = log.read_text(errors="replace").replace(str(Path.cwd()), ".")
    text = re.sub(rf"\b{re.escape(platform.node())}\b", "HOST", text)
    log.write_text(re.sub(r"/tmp/[^\s'\"]*", "TMP", text))
    return rc, secs


def _host_free(worker: str) -> str:
    """A worker's name (`host/device/pid`) with the host's name replaced by HOST: records name no machine."""
    return re.sub(rf"^{re.escape(platform.node())}/", "HOST/", worker)


def _store_summary(store_path: Path, kernel: str | None) -> dict[str, Any]:
    """Configs measured, the best ok config overall and per worker, and the portable choice over the store's
    fingerprints, from one leg's store."""
    from tilewise.errors import ConfigError
    from tilewise.tune.portable import portable_choice
    from tilewise.tune.store import Store

    with Store(store_path, readonly=True) as store:
        rows = [r for r in store.query() if kernel is None or r.kernel == kernel]
    ok = [r for r in rows if r.status == "ok" and r.median_ms is not None]
    per_worker: dict[str, Any] = {}
    for r in ok:
        w = _host_free(r.worker or "local")
        if kernel is not None and (w not in per_worker or r.median_ms < per_worker[w]["median_ms"]):
            per_worker[w] = {"config": r.config, "median_ms": r.median_ms, "shape": r.shape}
    best = min(ok, key=lambda r: r.median_ms) if ok and kernel is not None else None
    try:
        choice = portable_choice(ok)
        portable: Any = {"devices": choice["devices"], "stale": choice["stale"],
                         "groups": [{"key": g["key"], "ranges": [{k: r[k] for k in ("m_min", "m_max", "kernel",
                                                                                   "config_key", "worst_ratio")}
                                                                  for r in g["ranges"]]} for g in choice["groups"]]}
    except ConfigError as exc:
        portable = {"error": exc.problem}
    return {"results": len(rows), "measured": sum(r.status != "illegal" for r in rows), "ok": len(ok),
            "fingerprints": sorted({r.fingerprint for r in rows}),
            "workers": sorted({_host_free(r.worker or "local") for r in rows}),
            "best": best and {"config": best.config, "median_ms": best.median_ms,
                              "worker": _host_free(best.worker or "local")},
            "best_per_worker": per_worker, "portable": portable}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for ray_scaling.json and one log per leg")
    p.add_argument("--gpus", default=None, help="worker counts, e.g. 1,2,4 (default: 1,2,4,8 up to the host's GPUs; "
                                                "1,2 without a CUDA GPU)")
    p.add_argument("--shape", default=None, help="gemm M,N,K (default 4096,4096,4096 on CUDA, 128,128,128 else)")
    p.add_argument("--space", default="full", help="gemm space (default full)")
    p.add_argument("--budget", type=int, default=None, help="most gemm configs per leg (default: every legal one)")
    p.add_argument("--preset", default=None, help="model preset (default lfm2-350m on CUDA, tiny else)")
    p.add_argument("--model-budget", type=int, default=None,
                   help="tune model --budget per leg (default: tune model's; 1 without a CUDA GPU)")
    p.add_argument("--model-rows", default=None, help="tune model --rows (default: its own; 1,8 without CUDA)")
    p.add_argument("--no-model", action="store_true", help="only the gemm legs")
    args = p.parse_args()

    host_gpus = _gpus_on_host()
    cuda = host_gpus > 0
    device = "cuda" if cuda else "webgpu"
    counts = ([int(c) for c in args.gpus.split(",")] if args.gpus else
              [g for g in (1, 2, 4, 8) if g <= host_gpus] if cuda else [1, 2])
    if cuda and max(counts) > host_gpus:
        print(f"the host has {host_gpus} GPUs; --gpus asks for {max(counts)}", file=sys.stderr)
        return 2
    shape = args.shape or ("4096,4096,4096" if cuda else "128,128,128")
    preset = args.preset or ("lfm2-350m" if cuda else "tiny")
    model_budget = args.model_budget if args.model_budget is not None else (None if cuda else 1)
    model_rows = args.model_rows or (None if cuda else "1,8")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exe = [sys.executable, "-m", "tilewise"]
    record: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              "command": " ".join(["python", *sys.argv]),
                              "cpus": os.cpu_count(), "host_gpus": host_gpus, "device": device, "shape": shape,
                              "space": args.space, "budget": args.budget, "preset": preset, "legs": []}
    scratch = Path(tempfile.mkdtemp(prefix="ray-scaling-"))  # the legs' stores and tables: not part of the record
    for g in counts:
        leg_dir, state = out / f"workers{g}", scratch / f"workers{g}"
        leg_dir.mkdir(exist_ok=True)
        state.mkdir()
        env = {**os.environ, "TILEWISE_STORE": str(state / "results.sqlite"),
               "TILEWISE_DISPATCH_DIR": str(state / "dispatch")}
        leg: dict[str, Any] = {"workers": g}
        gemm = [*exe, "tune", "gemm", "--device", device, "--shape", shape, "--space", args.space, "--ray",
                "--workers", str(g), "--json", str(state / "gemm.json"), "--no-peer"]
        if args.budget is not None:
            gemm += ["--budget", str(args.budget)]
        rc, secs = _run(gemm, env, leg_dir / "gemm.log")
        leg["gemm"] = {"rc": rc, "seconds": secs, **_store_summary(state / "results.sqlite", "gemm")}
        n = leg["gemm"]["measured"]  # compiled (or refused by the compiler), verified, timed: illegal ones cost nothing
        leg["gemm"]["configs_per_min"] = n / (secs / 60) if secs > 0 else None
        print(f"[workers {g}] gemm: rc {rc}, {secs:.1f} s, {n} configs", flush=True)
        if not args.no_model:
            model = [*exe, "tune", "model", "--device", device, "--preset", preset, "--ray", "--workers", str(g),
                     "--json", str(state / "model.json")]
            if model_budget is not None:
                model += ["--budget", str(model_budget)]
            if model_rows:
                model += ["--rows", model_rows]
            before = leg["gemm"]["results"]
            rc, secs = _run(model, env, leg_dir / "model.log")
            summary = _store_summary(state / "results.sqlite", None)
            measured = summary["results"] - before
            leg["model"] = {"rc": rc, "seconds": secs, "results": measured,
                            "configs_per_min": measured / (secs / 60) if secs > 0 else None,
                            "workers_seen": summary["workers"], "portable": summary["portable"]}
            print(f"[workers {g}] tune model: rc {rc}, {secs:.1f} s, {measured} results", flush=True)
        record["legs"].append(leg)
        (out / "ray_scaling.json").write_text(json.dumps(record, indent=1))  # what is done survives a later leg

    base = record["legs"][0]
    print(f"\n{'workers':>7} {'gemm s':>9} {'cfg/min':>8} {'x vs ' + str(base['workers']):>8} "
          f"{'model s':>9} {'x vs ' + str(base['workers']):>8}  best gemm config")
    for leg in record["legs"]:
        gm, md = leg["gemm"], leg.get("model")
        x_g = base["gemm"]["seconds"] / gm["seconds"]
        x_m = f"{base['model']['seconds'] / md['seconds']:8.2f}" if md else f"{'-':>8}"
        m_s = f"{md['seconds']:9.1f}" if md else f"{'-':>9}"
        best = gm["best"]["config"] if gm["best"] else "-"
        print(f"{leg['workers']:>7} {gm['seconds']:9.1f} {gm['configs_per_min']:8.1f} {x_g:8.2f} {m_s} {x_m}  {best}")
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out / 'ray_scaling.json'}")
    failed = [leg["workers"] for leg in record["legs"] if leg["gemm"]["rc"] or leg.get("model", {}).get("rc")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
