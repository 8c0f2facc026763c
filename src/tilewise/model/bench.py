"""Decision latency of the classifier on a device, per-op GPU time, and agreement with the CPU (`tilewise bench`).

One decision = the scores of one prompt of `--seq` tokens (batch 1), timed on the host clock around
the whole call (submit + wait + read-back), as a user sees it. Reported:
- latency p50 / p90 / p99 over `--decisions` decisions after warm-up, decisions/s and APM (one action
  per decision);
- the same for prefix-cached decisions (a shared prefix of `--prefix` tokens prefilled once, each decision
  extends it with its own tail) and without final-row slicing, so both savings are measured in one run;
- per-op GPU time from per-pass timestamps (each launch in its own pass; sums are over a decision);
- the largest |score difference| against the CPU executor on the same weights (all 8 scores).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PREFIX_TOKENS = 47  # seed 001: tokens shared by every game prompt before the board starts


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    a = np.asarray(samples_ms, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "min": float(a.min()), "n": int(a.size)}


def time_calls(fn: Callable[[int], Any], n: int, warmup: int, budget_s: float | None = None) -> list[float]:
    """Wall-clock ms of `fn(i)` for n calls after `warmup` untimed ones (stops early past `budget_s`)."""
    for i in range(warmup):
        fn(-1 - i)
    out: list[float] = []
    t_end = None if budget_s is None else time.perf_counter() + budget_s
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e3)
        if t_end is not None and time.perf_counter() > t_end and len(out) >= 5:
            break
    return out


def prompts(vocab: int, seq: int, count: int, prefix: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(shared prefix, [full prompt per decision]): random ids, one fixed prefix, a fresh tail each time."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, vocab, prefix)
    return head, [np.concatenate([head, rng.integers(0, vocab, seq - prefix)]) for _ in range(count)]


def op_table(executor: Any, ids: np.ndarray, reps: int = 5) -> list[dict[str, Any]]:
    """GPU ms per op label (mean over `reps` timed decisions) and launches per decision."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for _ in range(reps):
        executor.forward(ids, 0, None, True, timed=True)
        for label, ms in executor.last_op_times:
            sums[label] = sums.get(label, 0.0) + ms
    for label, _ in executor.last_op_times:
        counts[label] = counts.get(label, 0) + 1
    rows = [{"name": k, "ms": sums[k] / reps, "launches": counts[k]} for k in sums]
    return sorted(rows, key=lambda r: -r["ms"])


def bench_model(model: Any, seq: int, decisions: int, prefix: int = PREFIX_TOKENS, warmup: int = 3,
                cpu_model: Any = None, op_reps: int = 5, budget_s: float | None = None,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure one loaded model (see the module docstring); returns the JSON-ready result."""
    if not 0 < prefix < seq:
        prefix = max(1, seq // 7)
    head, full = prompts(model.config.vocab_size, seq, decisions + warmup, prefix)
    res: dict[str, Any] = {"device": model.device, "preset": model.config.name, "seq": seq,
                           "weights": model.weights, "decisions": decisions}
    ex = model.executor
    if hasattr(ex, "dev"):
        res["adapter"] = ex.dev.info.name
        res["fingerprint"] = ex.dev.info.fingerprint
        source = str(getattr(getattr(ex, "dispatch", None), "source", "defaults"))
        res["dispatch"] = Path(source).name if source not in ("defaults", "tuned") else source  # no local paths

    def decide(i: int) -> None:
        model.scores(model.prefill(full[i]))

    lat = percentiles(time_calls(decide, decisions, warmup, budget_s))
    res.update(latency_ms_p50=lat["p50"], latency_ms_p90=lat["p90"], latency_ms_p99=lat["p99"],
               latency_ms_mean=lat["mean"], decisions_timed=lat["n"], decisions_per_s=1e3 / lat["mean"],
               apm=60e3 / lat["mean"])
    log(f"  {model.config.name} {model.weights} full prefill {seq}: p50 {lat['p50']:.2f} ms "
        f"p90 {lat['p90']:.2f} p99 {lat['p99']:.2f} ({lat['n']} decisions)")
    base = model.prefill(head)

    def decide_cached(i: int) -> None:
        model.scores(model.extend(base, full[i][prefix:]))

    cached = percentiles(time_calls(decide_cached, decisions, warmup, budget_s))
    res["prefix_cached"] = {"prefix_tokens": prefix, "latency_ms_p50": cached["p50"],
                            "latency_ms_p90": cached["p90"], "saving_pct": 100 * (1 - cached["p50"] / lat["p50"])}
    log(f"  prefix-cached ({prefix} shared): p50 {cached['p50']:.2f} ms")
    model.final_row_slicing = False
    try:
        whole = percentiles(time_calls(decide, max(5, decisions // 2), 1, budget_s))
    finally:
        model.final_row_slicing = True
    res["no_final_row_slicing"] = {"latency_ms_p50": whole["p50"],
                                   "final_row_saving_pct": 100 * (1 - lat["p50"] / whole["p50"])}
    log(f"  without final-row slicing: p50 {whole['p50']:.2f} ms")
    if hasattr(ex, "last_op_times"):
        res["ops"] = op_table(ex, full[0], op_reps)
        res["gpu_ms_sum_of_ops"] = sum(r["ms"] for r in res["ops"])
        res["launches_per_decision"] = sum(r["launches"] for r in res["ops"])
    else:
        res["ops"] = []
    if cpu_model is not None:
        diffs = []
        for ids in full[:2]:
            g = model.scores(model.prefill(ids))
            c = cpu_model.scores(cpu_model.prefill(ids))
            diffs.append(float(np.abs(g.astype(np.float64) - c).max()))
        res["max_abs_score_diff"] = max(diffs)
        res["reference"] = "cpu executor (float32, same weights)"
    else:
        res["max_abs_score_diff"] = None
    return res


def print_result(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    where = res.get("adapter", res["device"])
    t = Table(title=f"tilewise bench: {res['preset']} {res['weights']} seq {res['seq']} on {where}")
    for col in ("op", "GPU ms / decision", "launches"):
        t.add_column(col, justify="right" if col != "op" else "left")
    for r in res.get("ops", []):
        t.add_row(r["name"], f"{r['ms']:.3f}", str(r["launches"]))
    if res.get("ops"):
        t.add_row("sum", f"{res['gpu_ms_sum_of_ops']:.3f}", str(res["launches_per_decision"]))
        con.print(t)
    diff = res.get("max_abs_score_diff")
    con.print(f"decision latency p50 {res['latency_ms_p50']:.2f} ms, p90 {res['latency_ms_p90']:.2f}, "
              f"p99 {res['latency_ms_p99']:.2f} ({res['decisions_timed']} decisions); "
              f"{res['decisions_per_s']:.1f} decisions/s = {res['apm']:.0f} APM")
    pc = res["prefix_cached"]
    con.print(f"prefix cache ({pc['prefix_tokens']} tokens): p50 {pc['latency_ms_p50']:.2f} ms "
              f"({pc['saving_pct']:.1f}% saved); final-row slicing saves "
              f"{res['no_final_row_slicing']['final_row_saving_pct']:.1f}%")
    con.print("max |score - CPU score| over all 8 scores: " + ("not measured" if diff is None else f"{diff:.3g}"))
