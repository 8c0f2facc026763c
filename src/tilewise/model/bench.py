"""Decision latency of the classifier on a device, per-op GPU time, and agreement with the CPU (`tilewise bench`).

One decision = the scores of one prompt of `--seq` tokens (batch 1), timed on the host clock around
the whole call (submit + wait + read-back), as a user sees it. Reported:
- latency p50 / p90 / p99 over `--decisions` decisions after warm-up, decisions/s and APM (one action
  per decision);
- the same for prefix-cached decisions (a shared prefix of `--prefix` tokens prefilled once, each decision
  extends it with its own tail) and without final-row slicing, so both savings are measured in one run;
- per-op GPU time from per-pass timestamps (each launch in its own pass; sums are over a decision);
- the largest |score difference| against the CPU executor on the same weights (all 8 scores).
A saving is stated only where the samples support it (`tilewise.tune.measure.compare`): `tie (within noise)` when
the 95% intervals overlap, `too noisy to compare (p20..p80 = ...)` when the samples scatter too much to rank.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tilewise.errors import ConfigError
from tilewise.tune.measure import Comparison, Stats, compare, noise_note, paired_compare, rounds_of, summarize

PREFIX_TOKENS = 47  # seed 001: tokens shared by every game prompt before the board starts

#: the CUDA executor's raced settings (model/dispatch.py's `CUDA_SETTINGS`) as `tilewise bench` names them
SETTING_NAMES = {"pdl": "programmatic dependent launch", "fuse_preps": "fused prologues",
                 "serial_reduce": "split-K summed in the matmul", "fold_norm": "the norm folded into the matmuls",
                 "fuse_rope": "q/k norm and RoPE in the qkv matmul",
                 "zero_copy": "ids and result row read and written in host memory"}


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    a = np.asarray(samples_ms, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "min": float(a.min()), "n": int(a.size)}


#: the least warm-up of a timed series, in seconds, counted from the end of the first call: an idle GPU runs at
#: its lowest clock and needs a few hundred milliseconds of work to reach full speed, and a first call that spends
#: its time on the host (pipelines, a graph capture) leaves the GPU idle
WARMUP_S = 1.0


def time_calls(fn: Callable[[int], Any], n: int, warmup: int, budget_s: float | None = None,
               warmup_s: float = WARMUP_S, trace: list[tuple[float, float, bool]] | None = None) -> list[float]:
    """Wall-clock ms of `fn(i)` for n calls after untimed ones: `warmup` calls (cycling over indices -1..-warmup)
    and then more until `warmup_s` seconds have passed since the first one returned (none at all with warmup 0).
    Stops early past `budget_s`. `trace` gets (Unix start time, ms, timed) for every call, warm-up included, to set
    beside a clock log."""
    t_warm = math.inf
    i = 0
    while warmup and (i < warmup or time.perf_counter() < t_warm):
        unix0 = time.time()  # before the timed interval, which then holds the call alone
        t0 = time.perf_counter()
        fn(-1 - i % warmup)
        t1 = time.perf_counter()
        if trace is not None:
            trace.append((unix0, (t1 - t0) * 1e3, False))
        if i == 0:
            t_warm = t1 + warmup_s
        i += 1
    out: list[float] = []
    t_end = None if budget_s is None else time.perf_counter() + budget_s
    for i in range(n):
        unix0 = time.time()  # before the timed interval, which then holds the call alone
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e3)
        if trace is not None:
            trace.append((unix0, out[-1], True))
        if t_end is not None and time.perf_counter() > t_end and len(out) >= 5:
            break
    return out


def race_modes(decide: Callable[[int], Any], set_mode: Callable[[str], None], modes: Sequence[str], rounds: int,
               per_round: int, warmup_s: float = WARMUP_S) -> dict[str, list[float]]:
    """Wall-clock ms of `decide(i)` per mode (`set_mode(m)` switches), timed in `rounds` rounds of `per_round`
    calls per mode, the modes in turn (reversed every other round), so drift and the GPU's clock hit every mode
    alike. Every mode warms up first (`time_calls`' warm-up, which also absorbs a first call that captures or
    compiles), and each switch is followed by one untimed call."""
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for m in modes:
        set_mode(m)
        time_calls(decide, 0, 3, warmup_s=warmup_s)
    i = 0
    for r in range(rounds):
        for m in (modes if r % 2 == 0 else list(modes)[::-1]):
            set_mode(m)
            decide(-1)
            for _ in range(per_round):
                t0 = time.perf_counter()
                decide(i)
                samples[m].append((time.perf_counter() - t0) * 1e3)
                i += 1
    return samples


def race_args(ap: Any, preset: str, seq: int, per: str) -> None:
    """The arguments of a script racing whole decisions (experiments/*_cuda.py): the model preset, a decision's
    length, the rounds of the race and the decisions per `per` (table, mode) and round, and the device."""
    ap.add_argument("--preset", default=preset, help="model preset")
    ap.add_argument("--seq", type=int, default=seq, help="a decision's prompt length")
    ap.add_argument("--rounds", type=int, default=40,
                    help="rounds of the decision race, judged round by round (short rounds, many of them)")
    ap.add_argument("--per-round", type=int, default=5, help=f"decisions per {per} and round")
    ap.add_argument("--device", default="cuda")


def race_executors(executors: dict[str, Any], full: list[np.ndarray], rounds: int, per_round: int,
                   warmup_s: float = WARMUP_S) -> tuple[dict[str, list[float]], float]:
    """Whole decisions (final-row slicing, no prefix cache) of each executor on the prompts `full`, in alternating
    rounds (`race_modes`), and the largest |score difference| between the first executor and the others over the
    first 8 prompts: (ms per mode, difference)."""
    first, *rest = executors.values()
    diff = max((float(np.abs(first.forward(ids, 0, None, True)[1].scores - ex.forward(ids, 0, None, True)[1].scores)
                          .max()) for ex in rest for ids in full[:8]), default=0.0)
    current = {"ex": first}

    def decide(i: int) -> None:
        current["ex"].forward(full[i % len(full)], 0, None, True)

    return (race_modes(decide, lambda m: current.update(ex=executors[m]), list(executors), rounds, per_round,
                       warmup_s), diff)


def race_verdict(samples: dict[str, list[float]], per_round: int, base: str, new: str,
                 labels: tuple[str, str] = ("", ""), level: float = 0.95) -> Comparison:
    """Mode `new` against mode `base` of a `race_modes` race, round by round (`paired_compare`): the rounds' pairs
    share the machine's state, so a clock step that lasts many rounds does not pick the winner."""
    return paired_compare(rounds_of(samples[base], per_round), rounds_of(samples[new], per_round), labels, level)


def verdict_record(verdict: Comparison) -> dict[str, Any]:
    """A race verdict as the JSON records keep it."""
    return {"verdict": verdict.verdict, "speedup": verdict.ratio, "note": verdict.note,
            **({"speedup_interval": list(verdict.interval), "level": verdict.level} if verdict.interval else {})}


class PairRace(NamedTuple):
    """A race of two settings' executors (`race_pair`)."""

    samples: dict[str, list[float]]  # ms per decision, per mode
    stats: dict[str, Stats]
    verdict: Any  # tune.measure.Comparison: the new mode against the base
    diff: float  # the largest |score difference| (`race_executors`)
    ops: dict[str, dict[str, Any]]  # `op_columns`
    op_lines: list[str]


def race_pair(executors: dict[str, Any], full: list[np.ndarray], rounds: int, per_round: int, base: str, new: str,
              labels: tuple[str, str]) -> PairRace:
    """`race_executors`, each mode's stats, `new` compared with `base` round by round (`race_verdict`; `labels` name
    them in the comparison's notes), and every executor's GPU time per op on the first prompt (`op_columns`)."""
    samples, diff = race_executors(executors, full, rounds, per_round)
    stats = {m: summarize(v) for m, v in samples.items()}
    ops, op_lines = op_columns(executors, full[0])
    return PairRace(samples, stats, race_verdict(samples, per_round, base, new, labels), diff, ops, op_lines)


def report_pair(race: PairRace, title: str, args: Any, dev: Any, filename: str, script: str,
                **fields: Any) -> None:
    """Print a `race_pair` of two executors (`title` says new over base) and write its JSON record into `args.out`:
    each side's percentiles, the verdict, the largest score difference (0: the same bits) and the GPU time per op."""
    print("\n".join(race_lines(race.samples)))
    print(f"{title}: {verdict_text(race.verdict)}")
    print(f"max |score difference| {race.diff:.2e}" + ("" if race.diff == 0.0 else "  (not bit-identical)"))
    print("\n".join(race.op_lines))
    write_race(args.out, filename, script, dev, args.preset, args.seq, race.samples, race.stats,
               max_abs_score_diff=race.diff, ops=race.ops, **fields,
               verdict=verdict_record(race.verdict))


def verdict_text(verdict: Any) -> str:
    """A comparison as the race scripts print it: `faster (1.063x, 95% 1.051-1.070)` (the interval where the
    comparison has one: round by round), with its note after a semicolon."""
    iv = getattr(verdict, "interval", None)
    ci = f", {100 * verdict.level:.0f}% {iv[0]:.3f}-{iv[1]:.3f}" if iv else ""
    return f"{verdict.verdict} ({verdict.ratio:.3f}x{ci}{'; ' + verdict.note if verdict.note else ''})"


def prompts(vocab: int, seq: int, count: int, prefix: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(shared prefix, [full prompt per decision]): random ids, one fixed prefix, a fresh tail each time."""
    if not 0 <= prefix < seq:
        raise ConfigError(f"a {seq}-token prompt leaves no new tokens after its {prefix}-token shared prefix",
                          f"give a prompt length (--seq) above {prefix}")
    rng = np.random.default_rng(seed)
    head = rng.integers(0, vocab, prefix)
    return head, [np.concatenate([head, rng.integers(0, vocab, seq - prefix)]) for _ in range(count)]


def race_lines(samples: dict[str, list[float]], what: str = "decision, ") -> list[str]:
    """One line per mode of a whole-decision race: p50, p90 and p99 ms and how many decisions."""
    return [f"{what}{m}: p50 {p['p50']:.4f} ms, p90 {p['p90']:.4f}, p99 {p['p99']:.4f} ({p['n']} decisions)"
            for m, p in ((m, percentiles(v)) for m, v in samples.items())]


def write_race(out: str | Path | None, filename: str, script: str, dev: Any, preset: str, seq: int,
               samples: dict[str, list[float]], stats: dict[str, Stats], **fields: Any) -> None:
    """The JSON record of a whole-decision race (experiments/*_cuda.py) into folder `out` (nothing without one):
    when, the command, the device, the model and prompt length, `fields`, and each mode's percentiles, the 95%
    interval of its median and its samples."""
    if not out:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "command": f"python3 {script} " + " ".join(sys.argv[1:]), "device": dev.info.as_dict(), "preset": preset,
           "seq": seq, **fields, **{m: {**percentiles(v), "median_ci95_ms": list(stats[m].ci95_ms), "samples_ms": v}
                                    for m, v in samples.items()}}
    (folder / filename).write_text(json.dumps(doc, indent=1, default=str))


def op_columns(executors: dict[str, Any], ids: np.ndarray) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each executor's `op_table` on `ids` by op label, and the printed table: GPU us and launches per op, one
    column pair per executor, the op slowest in the last executor first."""
    ops = {m: {r["name"]: r for r in op_table(ex, ids)} for m, ex in executors.items()}
    modes, last = list(ops), list(ops.values())[-1]
    lines = [f"{'op':<22}" + "".join(f"{m + ' us':>14}" for m in modes) + "".join(f"{'launches':>10}" for _ in modes)]
    for name in sorted(set().union(*ops.values()), key=lambda n: -last.get(n, {"ms": 0})["ms"]):
        rows = [ops[m].get(name, {"ms": float("nan"), "launches": 0}) for m in modes]
        lines.append(f"{name:<22}" + "".join(f"{1e3 * r['ms']:>14.1f}" for r in rows)
                     + "".join(f"{r['launches']:>10}" for r in rows))
    return ops, lines


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
    if hasattr(ex, "measured_settings"):  # the CUDA executor: how its launches run together, and who chose it
        res["executor_settings"] = {**{k: bool(getattr(ex, k)) for k in SETTING_NAMES if hasattr(ex, k)},
                                    "raced": sorted(ex.measured_settings)}

    def decide(i: int) -> None:
        model.scores(model.prefill(full[i]))

    trace: list[tuple[float, float, bool]] = []
    full_ms = time_calls(decide, decisions, warmup, budget_s, trace=trace)
    lat = percentiles(full_ms)
    full_st = summarize(full_ms)
    res.update(latency_ms_p50=lat["p50"], latency_ms_p90=lat["p90"], latency_ms_p99=lat["p99"],
               latency_ms_mean=lat["mean"], latency_ms_p20=full_st.p20_ms, latency_ms_p80=full_st.p80_ms,
               decisions_timed=lat["n"], decisions_per_s=1e3 / lat["mean"], apm=60e3 / lat["mean"],
               noise=noise_note(full_st), latency_samples_ms=full_ms,
               latency_trace=[{"unix_s": round(u, 4), "ms": round(ms, 4), "timed": t} for u, ms, t in trace])
    log(f"  {model.config.name} {model.weights} full prefill {seq}: p50 {lat['p50']:.2f} ms "
        f"p90 {lat['p90']:.2f} p99 {lat['p99']:.2f} ({lat['n']} decisions)")
    base = model.prefill(head)

    def decide_cached(i: int) -> None:
        model.scores(model.extend(base, full[i][prefix:]))

    cached_ms = time_calls(decide_cached, decisions, warmup, budget_s)
    cached, cached_st = percentiles(cached_ms), summarize(cached_ms)
    cmp = compare(full_st, cached_st, ("full", "cached"))
    res["prefix_cached"] = {"prefix_tokens": prefix, "latency_ms_p50": cached["p50"],
                            "latency_ms_p90": cached["p90"], **_saving(cmp, "saving_pct")}
    log(f"  prefix-cached ({prefix} shared): p50 {cached['p50']:.2f} ms")
    model.final_row_slicing = False
    try:
        whole_ms = time_calls(decide, max(5, decisions // 2), 1, budget_s)
    finally:
        model.final_row_slicing = True
    whole_st = summarize(whole_ms)
    cmp = compare(whole_st, full_st, ("without slicing", "with slicing"))
    res["no_final_row_slicing"] = {"latency_ms_p50": whole_st.median_ms, **_saving(cmp, "final_row_saving_pct")}
    log(f"  without final-row slicing: p50 {whole_st.median_ms:.2f} ms")
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
        res["vs_cpu"] = time_against_cpu(model, cpu_model, full, max(5, min(decisions, 20)), budget_s)
        log(f"  against the CPU executor: {res['vs_cpu']['text']}")
    else:
        res["max_abs_score_diff"] = None
    return res


def _saving(cmp: Any, key: str) -> dict[str, Any]:
    """JSON of a saving: the percentage only when the samples support one (None for a tie or noise), the verdict,
    and the sentence to print."""
    return {key: cmp.saving_pct if cmp.verdict in ("faster", "slower") else None, "verdict": cmp.verdict,
            "saving": cmp.saving(), "ratio": cmp.ratio}


def cpu_gpu_ratio(gpu: Stats, cpu: Stats) -> str:
    """`GPU 3.20x faster than the CPU`, a tie or the noise sentence (for a run that timed both)."""
    cmp = compare(cpu, gpu, ("CPU", "GPU"))
    if cmp.verdict == "faster":
        return f"GPU {cmp.ratio:.2f}x faster than the CPU"
    if cmp.verdict == "slower":
        return f"GPU {1 / cmp.ratio:.2f}x slower than the CPU"
    return cmp.saving()


def time_against_cpu(model: Any, cpu_model: Any, prompts_ids: list[np.ndarray], pairs: int,
                     budget_s: float | None = None) -> dict[str, Any]:
    """Decisions on the device and on the CPU executor, alternating (the first of a pair swaps each time, so
    drift and the order effect hit both alike); medians, intervals and a ratio only the samples support."""
    ms: dict[str, list[float]] = {"device": [], "cpu": []}
    runs = {"device": model, "cpu": cpu_model}
    t_end = None if budget_s is None else time.perf_counter() + budget_s
    for i in range(pairs + 1):  # pair 0 is a warm-up
        for who in (("device", "cpu") if i % 2 else ("cpu", "device")):
            m = runs[who]
            t0 = time.perf_counter()
            m.scores(m.prefill(prompts_ids[i % len(prompts_ids)]))
            if i:
                ms[who].append((time.perf_counter() - t0) * 1e3)
        if t_end is not None and time.perf_counter() > t_end and i >= 5:
            break
    dev_st, cpu_st = summarize(ms["device"]), summarize(ms["cpu"])
    cmp = compare(cpu_st, dev_st, ("CPU", "device"))
    return {"pairs": len(ms["device"]), "device_ms_p50": dev_st.median_ms, "cpu_ms_p50": cpu_st.median_ms,
            "cpu_over_device": cmp.ratio, "verdict": cmp.verdict, "text": cpu_gpu_ratio(dev_st, cpu_st)}


def print_result(res: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
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
    say = lambda text: con.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(f"decision latency p50 {res['latency_ms_p50']:.2f} ms, p90 {res['latency_ms_p90']:.2f}, "
        f"p99 {res['latency_ms_p99']:.2f} ({res['decisions_timed']} decisions)")
    say(f"  {res['decisions_per_s']:.1f} decisions/s = {res['apm']:.0f} APM")
    if res.get("executor_settings"):
        st = res["executor_settings"]
        said = ", ".join(f"{SETTING_NAMES[k]} {'on' if st[k] else 'off'}"
                         f"{' (raced by tune model)' if k in st['raced'] else ''}" for k in SETTING_NAMES if k in st)
        say(f"  launches: {said}")
    if res.get("noise"):
        say(f"  note: {res['noise']}; other work on the machine is the usual cause")
    pc, nf = res["prefix_cached"], res["no_final_row_slicing"]
    say(f"prefix cache ({pc['prefix_tokens']} of {res['seq']} tokens shared): p50 {pc['latency_ms_p50']:.2f} ms")
    say(f"  {pc['saving']}")
    say(f"final-row slicing (p50 {nf['latency_ms_p50']:.2f} ms without it)")
    say(f"  {nf['saving']}")
    if res.get("vs_cpu"):
        v = res["vs_cpu"]
        say(f"against the CPU executor ({v['pairs']} alternating pairs): p50 {v['device_ms_p50']:.2f} ms here, "
            f"{v['cpu_ms_p50']:.2f} ms on the CPU")
        say(f"  {v['text']}")
    say("max |score - CPU score| over all 8 scores: " + ("not measured" if diff is None else f"{diff:.3g}"))
