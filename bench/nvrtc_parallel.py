"""How NVRTC compiles of the CUDA SGEMM scale over one host's cores: threads against processes, CuPy's NVRTC against
the libnvrtc tilewise's CPU compile tasks load (`devices.cuda_nvrtc`).

Why: the Ray tuning bench compiles in CPU tasks (processes), the local run on threads; on a 16-core GPU host the
tasks compiled at about half the local rate. This measures each way on the same configs in one run:
- `device-threads`: the local engine's path, `template.compile(device, ...)` (CuPy's NVRTC, the module loaded);
- `nvrtc-threads` / `nvrtc-processes`: `cuda_nvrtc.compile_cubin` on W threads / in W forked processes, once per
  libnvrtc found (`--nvrtc PATH,...`; default: the one `nvrtc_candidates` picks and CuPy's own);
- a serial pass of a few configs gives each compiler's seconds per kernel.
Prints a table of kernels per second and the ratio to `device-threads`; writes `nvrtc_parallel.json` into `--out`.

    PYTHONPATH=src python3 bench/nvrtc_parallel.py --out OUT_DIR [--configs 48] [--workers 16]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

REQUESTS: list[Any] = []  # (source, entry, options) per config, shared with forked workers


def _compile_one(i: int) -> float:
    from tilewise.devices.cuda_nvrtc import compile_cubin

    src, entry, opts = REQUESTS[i]
    t = time.perf_counter()
    compile_cubin(src, entry, opts)
    return time.perf_counter() - t


def _init_process(lib: str) -> None:
    os.environ["TILEWISE_NVRTC"] = lib  # before cuda_nvrtc loads its library in this process


def _version_in(lib: str) -> str | None:
    _init_process(lib)
    from tilewise.devices.cuda_nvrtc import nvrtc_version

    return nvrtc_version()


def _cupy_lib() -> str | None:
    """The libnvrtc file CuPy's process has mapped (after a compile), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            libs = {ln.split()[-1] for ln in f if "libnvrtc.so" in ln and "builtins" not in ln}
        return sorted(libs)[0] if libs else None
    except OSError:
        return None


def timed(label: str, fn: Any, n: int) -> dict[str, Any]:
    t = time.perf_counter()
    fn()
    s = time.perf_counter() - t
    print(f"  {label}: {n} kernels in {s:.2f} s ({n / s:.2f}/s)", flush=True)
    return {"mode": label, "kernels": n, "seconds": s, "per_s": n / s}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--configs", type=int, default=48, help="SGEMM configs compiled per parallel mode")
    p.add_argument("--serial", type=int, default=6, help="configs compiled one at a time per compiler")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--nvrtc", default=None, help="comma-separated libnvrtc files to compare (default: found ones)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from tilewise.devices.cuda_nvrtc import CompileProbe, nvrtc_candidates, nvrtc_version
    from tilewise.kernels.registry import get_template

    dev, info = None, None
    try:
        from tilewise.devices import get_device

        dev = get_device("cuda")
        info = dev.info
    except Exception as exc:  # no GPU here: the NVRTC rows only, for an H100/H200's sm_90
        from tilewise.devices.base import DeviceInfo
        from tilewise.devices.profiles import PROFILES

        print(f"no CUDA device ({type(exc).__name__}): NVRTC rows only, compiling for sm_90", flush=True)
        info = DeviceInfo("cuda", "none", "discrete", "CUDA", "0", "NVIDIA", PROFILES["sm_90"])
    tpl = get_template("gemm", "cuda")
    shape = (4096, 4096, 4096)
    legal = tpl.space("full").legal(info.limits)
    import random

    configs = random.Random(args.seed).sample(legal, min(len(legal), args.configs + args.serial))
    for c in configs:
        r = CompileProbe.requests_of(tpl, c, shape, info)[-1]
        REQUESTS.append((r.source, r.entry, r.options))
    n, w = args.configs, args.workers
    par = list(range(n))
    rows: list[dict[str, Any]] = []
    print(f"{n} SGEMM configs, {w} workers, {os.cpu_count()} CPUs", flush=True)

    if dev is not None:
        with cf.ThreadPoolExecutor(w) as pool:
            rows.append(timed("device-threads (CuPy NVRTC)", lambda: list(pool.map(
                lambda c: tpl.compile(dev, c, shape), configs[:n])), n))
    cupy_lib = _cupy_lib()
    libs = args.nvrtc.split(",") if args.nvrtc else [x for x in dict.fromkeys(
        [next((c for c in nvrtc_candidates() if c and os.path.exists(c)), ""), cupy_lib or ""]) if x]
    versions = {}
    ctx = multiprocessing.get_context("fork")
    for lib in libs:
        with cf.ProcessPoolExecutor(1, mp_context=ctx) as one:
            versions[lib] = one.submit(_version_in, lib).result()
        tag = f"NVRTC {versions[lib]}"
        print(f"{lib}: {tag}", flush=True)
        with cf.ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_process, initargs=(lib,)) as one:
            serial = [one.submit(_compile_one, n + i).result() for i in range(args.serial)]
        rows.append({"mode": f"serial, {tag}", "kernels": args.serial, "seconds": sum(serial),
                     "per_s": args.serial / sum(serial), "per_kernel_s": serial})
        print(f"  serial, {tag}: {sum(serial) / len(serial):.2f} s per kernel", flush=True)
        with cf.ProcessPoolExecutor(w, mp_context=ctx, initializer=_init_process, initargs=(lib,)) as pool:
            list(pool.map(_compile_one, range(min(w, n))))  # warm: every process has loaded the library
            rows.append(timed(f"nvrtc-processes, {tag}", lambda: list(pool.map(_compile_one, par)), n))
    if libs:
        _init_process(libs[0])
    with cf.ThreadPoolExecutor(w) as pool:
        rows.append(timed(f"nvrtc-threads, NVRTC {nvrtc_version()}", lambda: list(pool.map(_compile_one, par)), n))
    base = rows[0]["per_s"]
    print(f"\n| mode | kernels/s | vs {rows[0]['mode']} |\n|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['per_s']:.2f} | {r['per_s'] / base:.2f}x |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nvrtc_parallel.json").write_text(json.dumps({
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "device": info.fingerprint,
        "command": " ".join(["python", *sys.argv]), "cpus": os.cpu_count(), "workers": w, "libs": versions,
        "cupy_lib": cupy_lib, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
