"""The one timing function, used for every device and every candidate.

Rules it keeps (DESIGN.md, seed 001):
- GPU timestamps where the device has them (`device.time` returns per-launch device milliseconds; the CUDA
  device uses events); never a sleeping poller.
- Warm-up first: pipeline creation and the first dispatch cost 50-300 ms on lavapipe.
- Candidates are timed interleaved: each round runs every candidate once, in one submission, so drift and
  thermal changes hit all of them alike. Orders are balanced, not merely shuffled: a launch's position in
  a submission changes its time (the second of two identical launches is often slower on lavapipe), and
  with free shuffling one candidate can land in the slow slot more often than its twin. Rounds come in
  blocks of rotations of a random order, so every candidate takes every position equally often.
- Many samples per candidate; report the median, 20th/80th percentiles and a bootstrap 95% interval of
  the median. Two candidates whose intervals overlap are a tie, and the ranking groups ties instead of
  inventing a winner (a candidate registered twice must come out tied with itself).
- Samples too scattered to rank (`noise_note`) are said to be so: `compare` answers `noisy`, `tie`, `faster` or
  `slower`, never a signed percentage of noise.

Backends that want work done between samples (an L2 flush on CUDA) pass `between_launches` (timed in the
same submission, discarded) or `between` (a host callable; then every sample is its own submission). A device
that does such work itself (`Device.time_runs`: CUDA's flush) is told where each candidate's run starts, so that
a candidate of several launches (a split-K matmul and its reduction) is never split by it.

A device with `min_round_ms` (a discrete GPU behind WebGPU) has its clock fall while the host reads a short round
back and starts the next, so rounds of a few milliseconds run at a fraction of the clock and rank candidates at a
speed no decision runs at. The first warm-up round is then a probe, and when it took less than `min_round_ms`,
every candidate's launches run `repeat` times back to back within each round and each sample is the mean of those
runs (`Measurement.repeat` says how many; without warm-up rounds there is no probe and no repeat).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch
from tilewise.errors import ConfigError

BOOTSTRAP_RESAMPLES = 2000
MAX_REPEAT = 64  # runs of a candidate per sample, at most
MAX_ROUND_LAUNCHES = 2048  # launches per round, at most (a WebGPU query set holds 4096 timestamps, two a launch)


@dataclass
class Stats:
    """Timing statistics of one candidate (milliseconds, per run of all its launches)."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    ci95_ms: tuple[float, float]
    samples_ms: np.ndarray = field(repr=False)

    @property
    def n(self) -> int:
        return int(self.samples_ms.size)

    def as_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "p20_ms": self.p20_ms, "p80_ms": self.p80_ms,
                "ci95_ms": list(self.ci95_ms), "samples": self.n}


def summarize(samples_ms: Sequence[float] | np.ndarray, rng: np.random.Generator | None = None,
              resamples: int = BOOTSTRAP_RESAMPLES) -> Stats:
    """Median, p20, p80 and a bootstrap 95% interval of the median of `samples_ms`.

    Args:
        samples_ms: one time per sample, in milliseconds.
        rng: random generator for the bootstrap (seeded by default, so a report reproduces).
        resamples: bootstrap resamples.

    Returns:
        The `Stats` of the samples.
    """
    x = np.asarray(samples_ms, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples to summarize")
    rng = rng or np.random.default_rng(0)
    med = float(np.median(x))
    if x.size == 1:
        return Stats(med, med, med, (med, med), x)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    boot = np.median(x[idx], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Stats(med, float(np.percentile(x, 20)), float(np.percentile(x, 80)), (float(lo), float(hi)), x)


def ties(a: Stats, b: Stats) -> bool:
    """True when the two 95% intervals of the median overlap: the difference is inside the noise."""
    return a.ci95_ms[0] <= b.ci95_ms[1] and b.ci95_ms[0] <= a.ci95_ms[1]


# A median is a poor summary when the samples scatter this much: under load (other processes, OpenMP threads
# spinning) one run can take 20x another, and a ratio of two such medians is noise, not a result.
NOISY_SPREAD = 2.0  # p80 / p20 above this: the middle 60% of samples spans more than 2x
NOISY_INTERVAL = 0.5  # 95% interval of the median wider than half the median
MIN_SAMPLES = 3  # fewer samples give no interval at all


def noise_note(stats: Stats, what: str = "") -> str | None:
    """`too noisy to compare (p20..p80 = 1.2..40 ms)` when `stats` cannot support a comparison, else None.

    Noisy means fewer than `MIN_SAMPLES` samples, p80 / p20 above `NOISY_SPREAD`, or a 95% interval of the median
    wider than `NOISY_INTERVAL` of the median. `what` names the candidate in the sentence.
    """
    label = f"{what} " if what else ""
    if stats.n < MIN_SAMPLES:
        return f"too few samples to compare ({label}n = {stats.n})"
    lo, hi = stats.ci95_ms
    spread = stats.p80_ms / stats.p20_ms if stats.p20_ms > 0 else float("inf")
    width = (hi - lo) / stats.median_ms if stats.median_ms > 0 else float("inf")
    if spread > NOISY_SPREAD or width > NOISY_INTERVAL:
        return f"too noisy to compare ({label}p20..p80 = {stats.p20_ms:.3g}..{stats.p80_ms:.3g} ms)"
    return None


@dataclass(frozen=True)
class Comparison:
    """`new` against `base`: a verdict that refuses to rank noise.

    verdict: `faster` / `slower` (intervals apart), `tie` (intervals overlap), `noisy` (see `noise_note`).
    ratio: base median / new median (above 1: new is faster), whatever the verdict (JSON keeps it).
    note: the noise sentence when noisy.
    """

    verdict: str
    ratio: float
    note: str | None = None
    interval: tuple[float, float] | None = None  # `paired_compare`: the ratio's interval over rounds, at `level`
    level: float | None = None

    @property
    def saving_pct(self) -> float:
        """100 * (1 - new / base): the time `new` saves, negative when slower."""
        return 100.0 * (1.0 - 1.0 / self.ratio) if self.ratio > 0 else float("-inf")

    def times(self) -> str:
        """A compact cell: `1.45x` (base / new), `tie` or `noisy`."""
        return f"{self.ratio:.2f}x" if self.verdict in ("faster", "slower") else self.verdict

    def saving(self) -> str:
        """A phrase: `31.0% saved`, `12.0% slower`, `tie (within noise)` or the noise sentence."""
        if self.verdict == "noisy":
            return str(self.note)
        if self.verdict == "tie":
            return "tie (within noise)"
        pct = self.saving_pct
        return f"{pct:.1f}% saved" if pct >= 0 else f"{-pct:.1f}% slower"

    def as_dict(self) -> dict[str, Any]:
        out = {"verdict": self.verdict, "ratio": self.ratio, "saving_pct": self.saving_pct, "note": self.note}
        return out if self.interval is None else {**out, "ratio_interval": list(self.interval), "level": self.level}


def compare(base: Stats, new: Stats, names: tuple[str, str] = ("", "")) -> Comparison:
    """Compare `new` with `base`: noisy when either one is (`noise_note`), a tie when the 95% intervals of the
    medians overlap, else faster or slower. `names` label (base, new) in the noise sentence."""
    ratio = base.median_ms / new.median_ms if new.median_ms > 0 else float("inf")
    for st, name in ((base, names[0]), (new, names[1])):
        note = noise_note(st, name)
        if note is not None:
            return Comparison("noisy", ratio, note)
    if ties(base, new):
        return Comparison("tie", ratio)
    return Comparison("faster" if new.median_ms < base.median_ms else "slower", ratio)


MIN_PAIRED_ROUNDS = 6  # fewer round pairs give no 95% interval of their median


def rounds_of(samples_ms: Sequence[float], per_round: int) -> list[list[float]]:
    """A side's samples of an alternating race (`model.bench.race_modes`: `per_round` a round, in order) per round."""
    if per_round < 1 or len(samples_ms) % per_round:
        raise ValueError(f"{len(samples_ms)} samples are not whole rounds of {per_round}")
    return [list(samples_ms[i:i + per_round]) for i in range(0, len(samples_ms), per_round)]


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of `values`: the order statistics x_(k) and x_(n+1-k) whose
    binomial coverage is at least `level` (the sign test's interval; no bootstrap, which covers a median of a few
    values too narrowly). Fewer than 6 values cover less than 95% even from min to max: then (min, max)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n == 0:
        raise ValueError("no values")
    tail, k = (1.0 - level) / 2, 0
    cdf = 0.0  # P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = cdf + math.comb(n, k) / 2.0**n
        if nxt > tail:
            break
        cdf, k = nxt, k + 1
    k = max(k, 1)
    return float(x[k - 1]), float(x[n - k])


def paired_compare(base_rounds: Sequence[Sequence[float]], new_rounds: Sequence[Sequence[float]],
                   names: tuple[str, str] = ("", ""), level: float = 0.95) -> Comparison:
    """`new` against `base` timed in alternating rounds, round r of each side back to back.

    A GPU's speed can step by a few percent and stay there for many rounds (its clock under a power limit, a
    neighbour's load); pooled medians then rank whichever side happened to get more of the fast stretches. Each
    round's pair shares the machine's state, so the ratio here is the median over rounds of base's round median /
    new's round median, with its interval (`median_interval` at `level`): faster or slower where it excludes 1,
    a tie where it holds 1, noisy where either side's samples are (`noise_note`) or there are fewer than
    `MIN_PAIRED_ROUNDS` rounds."""
    if len(base_rounds) != len(new_rounds):
        raise ValueError(f"{len(base_rounds)} rounds of {names[0] or 'base'} against {len(new_rounds)} of "
                         f"{names[1] or 'new'}: a paired comparison needs the same rounds")
    if len(base_rounds) < MIN_PAIRED_ROUNDS:
        return Comparison("noisy", float("nan"),
                          f"too few rounds to pair ({len(base_rounds)}; {MIN_PAIRED_ROUNDS} at least)")
    a = np.array([float(np.median(r)) for r in base_rounds])
    b = np.array([float(np.median(r)) for r in new_rounds])
    if (b <= 0).any():
        return Comparison("noisy", float("nan"), f"a round of {names[1] or 'new'} has no positive time to divide by")
    ratios = a / b
    ratio = float(np.median(ratios))
    for rounds, name in ((base_rounds, names[0]), (new_rounds, names[1])):
        note = noise_note(summarize([x for r in rounds for x in r]), name)
        if note is not None:
            return Comparison("noisy", ratio, note)
    lo, hi = median_interval(ratios, level)
    verdict = "tie" if lo <= 1.0 <= hi else "faster" if lo > 1.0 else "slower"
    return Comparison(verdict, ratio, None, (lo, hi), level)


def tie_groups(stats: Mapping[Hashable, Stats]) -> list[tuple[Hashable, Stats, int]]:
    """Rank by median and group ties: (key, stats, group) best first; group 1 holds the winners.

    A candidate joins the current group when its interval overlaps the interval of the group's fastest
    member; otherwise it opens the next group. Groups are numbered from 1.
    """
    order = sorted(stats.items(), key=lambda kv: kv[1].median_ms)
    out: list[tuple[Hashable, Stats, int]] = []
    group, leader = 0, None
    for key, st in order:
        if leader is None or not ties(leader, st):
            group += 1
            leader = st
        out.append((key, st, group))
    return out


@dataclass
class Measurement:
    """What `measure` returns: per-candidate stats plus how the measurement went."""

    stats: dict[Hashable, Stats]
    rounds: int
    warmup_rounds: int
    timer: str
    seconds: float
    repeat: int = 1  # runs of each candidate per sample (a device's `min_round_ms`)


def measure(device: Device, candidates: Mapping[Hashable, Sequence[Launch]], *, warmup: int = 2,
            min_rounds: int = 10, max_rounds: int = 50, budget_s: float = 5.0,
            between_launches: Sequence[Launch] = (), between: Callable[[], None] | None = None,
            rng: np.random.Generator | None = None,
            on_round: Callable[[int, int], None] | None = None) -> Measurement:
    """Time candidates interleaved, in rounds, and summarize each one.

    Each round shuffles the candidates and times all of them in one `device.time` call (one submission),
    so a round's samples share the machine's state. Rounds continue until `max_rounds`, or until at
    least `min_rounds` are done and `budget_s` has passed.

    Args:
        device: any tilewise device (`time(launches)` -> ms per launch).
        candidates: key -> the launches of one run of that candidate (a candidate may have several).
        warmup: untimed rounds first (pipeline creation, first-dispatch costs, clocks ramping up).
        min_rounds: fewest timed rounds.
        max_rounds: most timed rounds.
        budget_s: wall-clock seconds after which no new round starts (once `min_rounds` are done).
        between_launches: launches put before every candidate's launches (e.g. a cache flush); their
            times are discarded.
        between: host callable run before every sample; then each sample is its own submission.
        rng: order shuffling and bootstrap; seeded by default.
        on_round: progress callback (round index, total rounds planned).

    Returns:
        A `Measurement` with one `Stats` per candidate key.
    """
    if not candidates:
        return Measurement({}, 0, 0, device.timer, 0.0)
    if min_rounds < 1 or max_rounds < min_rounds:
        raise ValueError(f"need 1 <= min_rounds <= max_rounds, got {min_rounds}, {max_rounds}")
    rng = rng or np.random.default_rng(0)
    keys = list(candidates)
    samples: dict[Hashable, list[float]] = {k: [] for k in keys}
    t0 = time.perf_counter()
    repeat = 1
    run_len: dict[Hashable, int] | None = None
    for i in range(warmup):
        probe = _one_round(device, candidates, keys, between_launches, between)
        if i == 0:
            repeat = _repeat_for(device, probe, candidates, between_launches, between)
            if repeat > 1:
                run_len = {k: len(v) for k, v in candidates.items()}
                candidates = {k: [*v] * repeat for k, v in candidates.items()}
    done = 0
    orders = balanced_orders(keys, rng)
    while done < max_rounds:
        if done >= min_rounds and time.perf_counter() - t0 > budget_s:
            break
        order = next(orders)
        for key, ms in _one_round(device, candidates, order, between_launches, between, run_len).items():
            samples[key].append(ms / repeat)
        done += 1
        if on_round:
            on_round(done, max_rounds)
    stats = {k: summarize(v, rng) for k, v in samples.items()}
    return Measurement(stats, done, warmup, device.timer, time.perf_counter() - t0, repeat)


def _repeat_for(device: Device, probe: Mapping[Hashable, float], candidates: Mapping[Hashable, Sequence[Launch]],
                between_launches: Sequence[Launch], between: Callable[[], None] | None) -> int:
    """Runs of each candidate per sample so that a round lasts the device's `min_round_ms` (1 without one, with a
    host callable between samples, or when the probe round was long enough)."""
    target = float(getattr(device, "min_round_ms", 0.0) or 0.0)
    total = float(sum(probe.values()))
    if target <= 0 or between is not None or total >= target:
        return 1
    per_round = sum(len(between_launches) + len(v) for v in candidates.values())
    want = int(np.ceil(target / max(total, 1e-6)))
    return max(1, min(want, MAX_REPEAT, MAX_ROUND_LAUNCHES // max(per_round, 1)))


def balanced_orders(keys: Sequence[Hashable], rng: np.random.Generator) -> Iterator[list[Hashable]]:
    """Endless round orders in blocks of len(keys): the rotations of one random order, shuffled.

    Within a block every key takes every position exactly once, so position effects cancel per block.
    """
    n = len(keys)
    while True:
        base = [keys[i] for i in rng.permutation(n)]
        for shift in rng.permutation(n):
            yield base[shift:] + base[:shift]


def _one_round(device: Device, candidates: Mapping[Hashable, Sequence[Launch]], order: Sequence[Hashable],
               between_launches: Sequence[Launch], between: Callable[[], None] | None,
               run_len: Mapping[Hashable, int] | None = None) -> dict[Hashable, float]:
    if between is not None:
        out = {}
        for key in order:
            between()
            launches = [*between_launches, *candidates[key]]
            out[key] = float(np.sum(device.time(launches)[len(between_launches):]))
        return out
    flat: list[Launch] = []
    spans: list[tuple[Hashable, int, int]] = []
    runs: list[int] = []
    for key in order:
        runs.append(len(flat))
        flat.extend(between_launches)
        start = len(flat)
        flat.extend(candidates[key])
        step = run_len.get(key, 0) if run_len else 0  # a repeated candidate: each repetition is a run
        runs.extend(range(start + step, len(flat), step) if step else ())
        spans.append((key, start, len(flat)))
    times = device.time(flat, runs=runs) if getattr(device, "time_runs", False) else device.time(flat)
    return {key: float(np.sum(times[a:b])) for key, a, b in spans}


DEFAULT_MEASURE = {"warmup": 2, "min_rounds": 10, "max_rounds": 40, "budget_s": 5.0}


def check_measure_kw(kw: dict[str, Any]) -> dict[str, Any]:
    """`kw` unchanged, or ConfigError before anything runs: a measurement that fails because of the caller's
    arguments would otherwise be stored as a failure of every config it touched."""
    unknown = set(kw) - set(DEFAULT_MEASURE) - {"between", "between_launches", "on_round"}
    if unknown:
        raise ConfigError(f"unknown timing arguments {sorted(unknown)}", f"use {', '.join(DEFAULT_MEASURE)}")
    for name in ("warmup", "min_rounds", "max_rounds"):
        value = kw[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "warmup" else 1):
            raise ConfigError(f"{name}={value!r} is not a usable round count",
                              f"give {name} as a whole number >= {0 if name == 'warmup' else 1} (e.g. --rounds 20)")
    if kw["max_rounds"] < kw["min_rounds"]:
        raise ConfigError(f"max_rounds {kw['max_rounds']} < min_rounds {kw['min_rounds']}",
                          "give max_rounds >= min_rounds")
    budget = kw["budget_s"]
    if not isinstance(budget, (int, float)) or not budget > 0 or budget == float("inf"):
        raise ConfigError(f"budget_s={budget!r} is not a usable time budget", "give a finite number of seconds > 0")
    return kw
