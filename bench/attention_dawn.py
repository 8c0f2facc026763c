"""The classifier's causal GQA attention on Dawn: the FMA kernel against the subgroup-matrix one (`attention.sgmat`),
and PyTorch's fused attention on the same GPU as the peer, at a decision's length.

For a model preset's attention shape (heads, K/V heads, head size) at `--rows` queries and no cached positions, every
legal config of both kernels goes through the one engine (verified against float64, every output value, then timed
per kernel); the best `--top` of each kernel then race `torch.nn.functional.scaled_dot_product_attention` (f16,
causal, GQA; CUDA events) in interleaved rounds in a fresh random order, five runs per sample. Prints each raced
config's median with its ratio to the FMA kernel's best and to PyTorch's; writes `attention_dawn.json` (date,
device, command, every verified config, the race) into `--out`.

    PYTHONPATH=src python3 bench/attention_dawn.py --out OUT_DIR [--preset lfm2-350m] [--rows 346] [--rounds 20]
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_args  # noqa: E402
from tilewise.kernels.attention.sgmat import SgmatAttention  # noqa: E402
from tilewise.kernels.attention.webgpu import AttentionTemplate  # noqa: E402
from tilewise.kernels.matmul.sgmat import has_subgroup_matrices  # noqa: E402
from tilewise.tune.engine import Engine, Item  # noqa: E402
from tilewise.tune.measure import compare, summarize  # noqa: E402

REPS = 5  # runs per sample in the race


def torch_peer(host: dict[str, np.ndarray], shape: tuple[int, ...]) -> Any:
    """A timer of PyTorch's fused causal GQA attention on f16 copies of the inputs (None without CUDA)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    m, _, hq, hkv, d = shape
    q = torch.from_numpy(host["q"]).cuda().half().view(m, hq, d).transpose(0, 1).unsqueeze(0)  # (1, HQ, M, D)
    k = torch.from_numpy(host["k_cache"]).cuda().half().view(m, hkv, d).transpose(0, 1).unsqueeze(0)  # (1, HKV, M, D)
    v = torch.from_numpy(host["v_cache"]).cuda().half().view(m, hkv, d).transpose(0, 1).unsqueeze(0)
    return bench_args.cuda_event_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                                    REPS)


def main() -> int:
    args, out, dev, cfg = bench_args.parse(
        __doc__, "attention_dawn.json", "attention shape", "dawn",
        "dawn or dawn:N (TILEWISE_DAWN_UNCHECKED=1: no robustness)",
        more=lambda ap: ap.add_argument("--top", type=int, default=3, help="best configs of each kernel in the race"))
    shape = (args.rows, 0, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    kernels: list[Any] = [AttentionTemplate()]
    if has_subgroup_matrices(dev):
        kernels.append(SgmatAttention(dev.enabled_features))
    eng = Engine(dev, None, measure_kw={"warmup": 3, "min_rounds": 6, "max_rounds": 12, "budget_s": 0.5})
    verified, failed, best = [], {}, {}
    for t in kernels:
        configs = [c for c in t.space().legal(dev.info.limits) if not t.config_problems(c, shape)]
        outs = eng.evaluate([Item(t, c, shape) for c in configs], batch=None)
        ok = sorted((oc for oc in outs if oc.status == "ok"), key=lambda oc: oc.stats.median_ms)
        failed.update({f"{t.name} {oc.config.key()}": f"{oc.status}: {oc.reason}" for oc in outs if oc.status != "ok"})
        verified += [{"kernel": t.name, **dict(oc.config), **oc.stats.as_dict()} for oc in ok]
        best[t.name] = ok[: args.top]
        print(f"{t.name}: {len(ok)} of {len(configs)} configs verified; best "
              + ", ".join(f"{oc.stats.median_ms * 1e3:.1f} us [{oc.config}]" for oc in ok[:3]), flush=True)
    rng = np.random.default_rng(0)
    host = kernels[0].problem.make_inputs(shape, rng)
    timers: dict[str, Any] = {}
    for name, ocs in best.items():
        t = next(k for k in kernels if k.name == name)
        bufs = t.upload(dev, host, shape)
        for oc in ocs:
            ls = t.launches(t.compile(dev, oc.config, shape), bufs, oc.config, shape) * REPS
            timers[f"{name} [{oc.config}]"] = lambda ls=ls: float(np.sum(dev.time(ls))) / REPS
    peer = torch_peer(host, shape)
    if peer is not None:
        timers["torch SDPA f16"] = peer
    samples = bench_args.interleaved(timers, args.rounds, rng)
    stats = {k: summarize(v, rng) for k, v in samples.items()}
    fma = min((s for k, s in stats.items() if k.startswith("attention [")), key=lambda s: s.median_ms, default=None)
    torch_st = stats.get("torch SDPA f16")
    print(f"\n{dev.info.name} [{dev.info.fingerprint}]: {args.preset} attention at {args.rows} queries "
          f"(HQ {shape[2]}, HKV {shape[3]}, D {shape[4]}), {args.rounds} interleaved rounds")
    print(f"{'kernel [config]':<60}{'median ms':>11}{'vs FMA best':>13}{'vs torch':>10}")
    for k, s in sorted(stats.items(), key=lambda kv: kv[1].median_ms):
        vs_fma = compare(fma, s).times() if fma is not None else "-"
        vs_torch = compare(torch_st, s).times() if torch_st is not None else "-"
        print(f"{k:<60}{s.median_ms:11.4f}{vs_fma:>13}{vs_torch:>10}")
    print("vs: the other's median / this one (above 1: this one faster); tie: the 95% intervals overlap")
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "command": "python3 bench/attention_dawn.py " + " ".join(argv), "device": dev.info.as_dict(),
           "shape": shape, "failed": failed, "verified": verified,
           "race": {k: {**s.as_dict(), "samples_ms": [float(x) for x in s.samples_ms]} for k, s in stats.items()}}
    (out / "attention_dawn.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
