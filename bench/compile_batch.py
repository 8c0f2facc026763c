"""How fast a kernel family's configs compile one by one against the tuner's batch compile, on one device.

Why: a tune spends most of its time compiling (on the H200, 14-16 of each shape's 20-25 s on Dawn, and about as
much on CUDA), while the GPU waits. The engine now hands each batch to `KernelTemplate.precompile`, which compiles
on `device.compile_workers` threads (CUDA's NVRTC, wgpu-native) or inside `device.compile_together()` (Dawn builds
the pipelines on its own threads). This measures both ways on the same device in one run:
- `serial`: `template.compile` for each config, as the engine did before;
- `batch`: `template.precompile` over the same number of configs.
After two warm-up compiles, each round compiles a fresh set of sampled legal configs in each mode (no config
twice, so no cache of the device or of the driver serves one mode a kernel the other built), the modes in a random
order per round. A config that fails to compile counts in its mode like one that compiles (`failed` says how many).
Prints kernels per second per mode and the ratio; writes `compile_batch.json` into `--out`. On Mesa's lavapipe set
`MESA_SHADER_CACHE_DISABLE=true`: its disk cache would serve kernels an earlier run built.

    PYTHONPATH=src python3 bench/compile_batch.py --out OUT_DIR --device dawn --kernel nf4-matmul [--configs 24]
        [--rounds 3] [--shape 346,1024,1024]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import time
from pathlib import Path

WARMUP = 2  # configs compiled before the rounds, counted in neither mode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for compile_batch.json")
    ap.add_argument("--device", default="webgpu", help="device name (webgpu, dawn, cuda, ...)")
    ap.add_argument("--kernel", default="nf4-matmul", help="kernel family (`tilewise tune --help` lists them)")
    ap.add_argument("--shape", default="346,1024,1024", help="problem shape, comma-separated")
    ap.add_argument("--configs", type=int, default=24, help="configs compiled per mode and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each compiles fresh configs in both modes")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.configs < 2 or args.rounds < 1:
        ap.error("--configs must be at least 2 and --rounds at least 1")

    from tilewise.devices import get_device
    from tilewise.errors import TilewiseError
    from tilewise.kernels.registry import get_template

    try:
        dev = get_device(args.device)
        tpl = get_template(args.kernel, dev.info.backend)
        shape = tpl.problem.check_shape(tuple(int(x) for x in args.shape.split(",")))
    except TilewiseError as exc:
        print(f"error: {exc}")
        return 2
    except ValueError:
        ap.error(f"--shape {args.shape!r} is not comma-separated integers")
    need = 2 * args.configs * args.rounds + WARMUP
    sources: set[str] = set()
    configs = []
    for c in tpl.space().sample(20 * need, args.seed, dev.info.limits):
        if tpl.why_illegal(c, dev.info.limits, shape):
            continue
        src = tpl.source(c, shape)
        if src not in sources:  # a config whose source another one has would be served from the module cache
            sources.add(src)
            configs.append(c)
        if len(configs) == need:
            break
    if len(configs) < need:
        print(f"error: only {len(configs)} legal configs with distinct sources, {need} needed; lower --configs")
        return 1
    print(f"{dev.info.name}: {args.kernel} at {shape}, {args.rounds} rounds x {args.configs} configs per mode; "
          f"compile_workers {dev.compile_workers}, compiles in parallel: {dev.compiles_in_parallel()}")

    def serial(cfgs):
        out = {}
        for c in cfgs:
            try:
                out[c] = tpl.compile(dev, c, shape)
            except Exception as exc:  # counted, as the engine stores it
                out[c] = exc
        return out

    serial(configs[need - WARMUP:])  # the compiler's own first-use costs, in neither mode
    modes = {"serial": serial, "batch": lambda cfgs: tpl.precompile(dev, cfgs, shape)}
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    failed = {m: 0 for m in modes}
    rng = random.Random(args.seed + 1)
    for r in range(args.rounds):
        order = list(modes)
        rng.shuffle(order)
        for i, m in enumerate(order):
            cfgs = configs[(2 * r + i) * args.configs:(2 * r + i + 1) * args.configs]
            t0 = time.perf_counter()
            got = modes[m](cfgs)
            seconds[m].append(time.perf_counter() - t0)
            if len(got) != len(cfgs):
                print(f"error: {m} compiled {len(got)} of {len(cfgs)} configs")
                return 1
            failed[m] += sum(isinstance(p, Exception) for p in got.values())
        print(f"round {r + 1}: " + ", ".join(f"{m} {args.configs / seconds[m][-1]:.2f}/s" for m in modes))
    rate = {m: args.configs * len(v) / sum(v) for m, v in seconds.items()}
    print(f"{'mode':7} {'kernels/s':>10} {'failed':>7}")
    for m in modes:
        print(f"{m:7} {rate[m]:10.2f} {failed[m]:7d}")
    print(f"batch / serial: {rate['batch'] / rate['serial']:.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "device": dev.info.name, "fingerprint": dev.info.fingerprint, "cpus": os.cpu_count(),
              "compile_workers": dev.compile_workers, "kernel": args.kernel, "shape": list(shape),
              "configs_per_mode_round": args.configs, "rounds": args.rounds, "seconds": seconds,
              "kernels_per_s": rate, "failed": failed, "ratio": rate["batch"] / rate["serial"]}
    (out / "compile_batch.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
