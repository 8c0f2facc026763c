"""What the per-kernel benchmarks of the classifier share: the command line (where to write, which preset's shapes at
how many rows, how many rounds of the race, which device; then the output folder, the device and the model config),
the interleaved race of timers, and a PyTorch peer timed by CUDA events.

    args, out, dev, cfg = bench_args.parse(__doc__, "attention_dawn.json", "attention shape", "dawn", "dawn or dawn:N")
    samples = bench_args.interleaved({"mine": mine_ms, "torch": bench_args.cuda_event_ms(peer, reps=5)}, 20, rng)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def parse(doc: str | None, json_name: str, measured: str, device: str, device_help: str,
          rows_help: str = "queries (a decision's prompt length)",
          more: Callable[[argparse.ArgumentParser], None] | None = None) -> tuple[argparse.Namespace, Path, Any, Any]:
    """(arguments, the output folder (made), the device, the preset's model config)."""
    from tilewise.devices import get_device
    from tilewise.model.tune import model_config

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help=f"folder for {json_name}")
    ap.add_argument("--preset", default="lfm2-350m", help=f"model preset whose {measured} is measured")
    ap.add_argument("--rows", type=int, default=346, help=rows_help)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of the race")
    ap.add_argument("--device", default=device, help=device_help)
    if more is not None:
        more(ap)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return args, out, get_device(args.device), model_config(args.preset)


def interleaved(timers: Mapping[str, Callable[[], float]], rounds: int, rng: Any) -> dict[str, list[float]]:
    """Each timer (a call returning one sample in ms) twice to warm up (pipelines, a peer's kernel choice, clocks),
    then `rounds` rounds that call every timer once in a fresh random order: each timer's samples."""
    for fn in timers.values():
        fn()
        fn()
    samples: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(rounds):
        for k in rng.permutation(list(timers)):
            samples[str(k)].append(timers[str(k)]())
    return samples


def cuda_event_ms(run: Callable[[], Any], reps: int) -> Callable[[], float]:
    """A timer of `run` on the current CUDA stream (PyTorch's events around `reps` calls): ms per call."""
    import torch

    def ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
    return ms
