"""Timing that does not overclaim: the BLAS thread count is chosen and reported, noisy samples are said to be noisy
instead of ranked, a tie is a tie, a ladder rung slower than (or tied with) its baseline is never a win, and torch
is kept from spinning on the cores BLAS needs."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from tilewise.devices import cpu as cpudev
from tilewise.errors import ConfigError
from tilewise.ladder import verdict
from tilewise.ladder.run import VERDICTS
from tilewise.tune.measure import Stats, compare, noise_note, summarize


def _stats(center: float, rel_spread: float, seed: int, n: int = 60) -> Stats:
    r = np.random.default_rng(seed)
    return summarize(center * (1 + rel_spread * r.standard_normal(n)), r)


def _heavy(center: float, seed: int, n: int = 40) -> Stats:
    """Samples of a loaded machine: most runs near `center`, many 5-50x slower."""
    r = np.random.default_rng(seed)
    x = center * (1 + 0.05 * r.random(n))
    slow = r.random(n) < 0.45
    x[slow] *= r.uniform(5, 50, slow.sum())
    return summarize(x, r)


# ---- the noise check and the comparison -------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_steady_samples_carry_no_noise_note(seed):
    assert noise_note(_stats(np.random.default_rng(seed).uniform(0.1, 50), 0.03, seed)) is None


@pytest.mark.parametrize("seed", range(5))
def test_scattered_samples_are_too_noisy_with_their_spread_in_the_sentence(seed):
    st = _heavy(np.random.default_rng(seed).uniform(0.5, 5), seed)
    note = noise_note(st, "cached")
    assert note is not None and note.startswith("too noisy to compare (cached p20..p80 = ")
    assert f"{st.p20_ms:.3g}..{st.p80_ms:.3g} ms" in note


def test_too_few_samples_are_not_compared():
    assert noise_note(summarize([1.3, 1.4])) == "too few samples to compare (n = 2)"
    assert compare(summarize([1.0, 1.1]), _stats(5.0, 0.01, 1)).verdict == "noisy"


@pytest.mark.parametrize("seed", range(6))
def test_clearly_apart_medians_give_a_signed_verdict_and_the_ratio(seed):
    r = np.random.default_rng(seed)
    base_ms, factor = r.uniform(1, 100), r.uniform(1.3, 3.0)
    base, fast = _stats(base_ms, 0.02, seed), _stats(base_ms / factor, 0.02, seed + 100)
    c = compare(base, fast)
    assert c.verdict == "faster" and c.ratio == pytest.approx(base.median_ms / fast.median_ms)
    assert c.saving() == f"{c.saving_pct:.1f}% saved" and c.times() == f"{c.ratio:.2f}x"
    back = compare(fast, base)
    assert back.verdict == "slower" and back.saving().endswith("% slower") and "-" not in back.saving()


@pytest.mark.parametrize("seed", range(6))
def test_overlapping_intervals_are_a_tie_not_a_percentage(seed):
    center = np.random.default_rng(seed).uniform(1, 100)
    a, b = _stats(center, 0.05, seed), _stats(center * 1.002, 0.05, seed + 50)
    c = compare(a, b)
    assert c.verdict == "tie" and c.saving() == "tie (within noise)" and c.times() == "tie"
    assert compare(a, a).verdict == "tie"  # a candidate ties with itself


def test_a_noisy_saving_is_never_a_negative_percentage():
    """The -1812% of a loaded machine: the cached run caught the spikes, the full one did not."""
    full, cached = _stats(0.95, 0.02, 3), _heavy(0.9, 4)
    c = compare(full, cached, ("full", "cached"))
    assert c.verdict == "noisy" and c.saving().startswith("too noisy to compare (cached p20..p80 = ")
    assert "%" not in c.saving() and c.times() == "noisy"
    assert c.as_dict()["verdict"] == "noisy"


# ---- the bench command's savings ----------------------------------------------------------------------------------
class _FakeModel:
    """A model whose decisions are numpy work (no device): enough for the bench's bookkeeping."""

    class config:
        name, vocab_size = "fake", 97

    device, weights, final_row_slicing = "cpu", "f32", True
    executor = object()

    def __init__(self) -> None:
        self.w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        return np.tanh(self.w[ids % 64].sum(0))

    def extend(self, state: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return np.tanh(state + self.w[ids % 64].sum(0))

    def scores(self, state: np.ndarray) -> np.ndarray:
        return state[:8]


def test_bench_result_states_savings_only_with_their_verdict(capsys):
    from tilewise.model.bench import bench_model, print_result

    res = bench_model(_FakeModel(), 24, 12, prefix=6, log=lambda _s: None)
    for part, key in ((res["prefix_cached"], "saving_pct"), (res["no_final_row_slicing"], "final_row_saving_pct")):
        assert part["verdict"] in ("faster", "slower", "tie", "noisy")
        assert (part[key] is None) == (part["verdict"] in ("tie", "noisy"))
    print_result(res)
    out = capsys.readouterr().out
    assert res["prefix_cached"]["saving"] in out and res["no_final_row_slicing"]["saving"] in out
    assert len(res["latency_samples_ms"]) == res["decisions_timed"]


def test_bench_threads_option_is_checked_and_documented(capsys):
    from tilewise.cli import build_parser, main

    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "--threads" in err and "at least 1" in err
    (bench,) = [a for a in build_parser()._subparsers._group_actions[0].choices["bench"]._actions
                if "--threads" in a.option_strings]
    assert "physical cores" in bench.help and "OMP_NUM_THREADS" in bench.help


# ---- ladder verdicts ----------------------------------------------------------------------------------------------
def test_a_rung_faster_than_the_previous_but_not_the_baseline_is_no_win():
    base, prev = _stats(1.0, 0.01, 1), _stats(2.0, 0.01, 2)
    slower_than_base = _stats(1.5, 0.01, 3)
    tied_with_base = _stats(1.0005, 0.01, 4)
    assert verdict(prev, slower_than_base, base) == "regained"
    assert verdict(prev, tied_with_base, base) == "regained"
    assert verdict(prev, _stats(0.5, 0.01, 5), base) == "win"
    assert verdict(base, _stats(1.0, 0.01, 6), base) == "tie"
    assert verdict(base, _stats(1.8, 0.01, 7), base) == "loss"
    assert verdict(prev, _heavy(0.5, 8), base) == "noisy"


@pytest.mark.parametrize("seed", range(40))
def test_win_always_means_clear_of_the_previous_rung_and_the_baseline(seed):
    r = np.random.default_rng(seed)
    base, prev, cur = (_stats(r.uniform(0.5, 2.0), r.uniform(0.005, 0.2), seed * 3 + i) for i in range(3))
    v = verdict(prev, cur, base)
    assert v in VERDICTS and v != "baseline"
    if v == "win":
        assert cur.ci95_ms[1] < base.ci95_ms[0] and cur.ci95_ms[1] < prev.ci95_ms[0]
    if cur.median_ms >= base.median_ms:
        assert v != "win"


def test_ladder_table_fits_80_columns_and_explains_its_verdicts():
    from tilewise.kernels.space import Config
    from tilewise.ladder import LadderResult, Rung

    stats = [_stats(m, 0.01, i) for i, m in enumerate((1.0, 2.0, 1.4, 0.4))]
    rungs = [Rung(n, "", Config({"X": i}), stats=s) for i, (n, s) in
             enumerate(zip(("baseline", "split", "vectorize", "tuned best"), stats))]
    rungs[0].verdict = "baseline"
    for prev, cur in itertools.pairwise(rungs):
        cur.verdict = verdict(prev.stats, cur.stats, rungs[0].stats)
        cur.speedup_vs_baseline = rungs[0].stats.median_ms / cur.stats.median_ms
    assert [r.verdict for r in rungs] == ["baseline", "loss", "regained", "win"]
    res = LadderResult("gemm-gpu", "GEMM", {"name": "gpu", "api": "Vulkan"}, "timestamps", (64, 64, 64),
                       ("M", "N", "K"), rungs, [("numpy.matmul", _stats(0.8, 0.01, 9))], threads="BLAS 2")
    text = res.table()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert f"regained: {VERDICTS['regained']}" in text and "references' threads: BLAS 2" in text
    assert "X=3" in res.table(wide=True) and "configs:" not in res.table(wide=True)


# ---- BLAS threads -------------------------------------------------------------------------------------------------
def test_hyperthread_siblings_count_as_one_core(tmp_path, monkeypatch):
    siblings = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}  # two cores with two hardware threads each
    for cpu, text in siblings.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "core_cpus_list").write_text(text + "\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert cpudev.physical_cores(tmp_path) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 2})  # one core's two threads only
    assert cpudev.physical_cores(tmp_path) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 7})  # cpu7 has no topology: counted alone
    assert cpudev.physical_cores(tmp_path) == 3


@pytest.mark.parametrize("var", cpudev.THREAD_ENV)
def test_the_users_thread_variable_wins_over_the_core_count(monkeypatch, var):
    for v in cpudev.THREAD_ENV:
        monkeypatch.delenv(v, raising=False)
    assert cpudev.default_threads() == (cpudev.physical_cores(), "physical cores available")
    monkeypatch.setenv(var, "3")
    assert cpudev.default_threads() == (3, f"{var}=3")
    monkeypatch.setenv(var, "zero")  # not a count: ignored, not obeyed
    assert cpudev.default_threads()[1] == "physical cores available"


def test_set_threads_applies_reports_and_keys_the_fingerprint():
    from tilewise.devices import get_device

    dev = get_device("cpu")
    before = cpudev.thread_setup()
    try:
        one = cpudev.set_threads(1)
        assert one.threads == 1 and one.source == "threads=1" and "BLAS threads: 1" in one.line()
        if one.applied:  # numpy's OpenBLAS (or any BLAS threadpoolctl knows) took the setting
            assert cpudev.blas_threads_now() == 1
        assert dev.info.extra["threads"] == 1 and dev.info.api == "numpy, 1 thread"
        fp_one = dev.info.fingerprint
        cpudev.set_threads(2)
        assert dev.info.extra["threads"] == 2 and dev.info.fingerprint != fp_one
        assert type(dev)(threads=1).info.fingerprint == fp_one
    finally:
        cpudev.set_threads(before.threads if before.source.startswith("threads=") else None)
    with pytest.raises(ConfigError, match="at least one thread"):
        cpudev.set_threads(0)


def test_torch_is_told_to_sleep_before_it_loads():
    code = ("import os, sys; from tilewise.devices.cpu import quiet_torch_threads as q; "
            "print(q()); print(os.environ['OMP_WAIT_POLICY']); print(q()); print('torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    first, policy, again, torch_loaded = out.stdout.splitlines()
    assert policy == "PASSIVE" and first == again == "OpenMP: OMP_WAIT_POLICY=PASSIVE (set by tilewise)"
    assert torch_loaded == "False"  # the helper never imports torch itself
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"})
    assert out.stdout.splitlines()[:2] == ["OpenMP: OMP_WAIT_POLICY=ACTIVE (yours)", "ACTIVE"]


def test_torch_threads_are_matched_to_the_blas_pool():
    class FakeTorch:
        threads = 7

        def get_num_threads(self) -> int:
            return self.threads

        def set_num_threads(self, n: int) -> None:
            self.threads = n

    t = FakeTorch()
    line = cpudev.match_torch_threads(t)
    assert t.threads == cpudev.thread_setup().threads and line == f"torch threads: {t.threads} (matched to BLAS)"


def test_time_calls_warms_up_for_its_seconds_and_never_times_a_warmup_call():
    """A call that is slow for its first 0.2 s (a GPU fresh from other work) is not in the timed samples: the
    warm-up lasts `warmup_s`, cycles over the warm-up indices only, and the timed calls get 0..n-1."""
    import time as _time

    from tilewise.model.bench import time_calls

    start = _time.perf_counter()
    seen: list[int] = []

    def fn(i: int) -> None:
        seen.append(i)
        _time.sleep(0.02 if _time.perf_counter() - start < 0.2 else 0.001)

    samples = time_calls(fn, 8, 2, warmup_s=0.3)
    warm = seen[:-8]
    assert len(warm) > 2 and set(warm) == {-1, -2}
    assert seen[-8:] == list(range(8))
    assert max(samples) < 15.0  # ms: no slow (20 ms) call was timed
    seen.clear()
    time_calls(fn, 3, 0, warmup_s=5.0)
    assert seen == [0, 1, 2]  # warmup 0: none at all


def test_time_calls_warm_up_seconds_start_after_a_slow_first_call():
    """A first call that takes longer than `warmup_s` on the host (pipeline creation: the GPU sits idle at its
    lowest clock) still leaves `warmup_s` of warm-up calls after it: the calls slow in the 0.15 s after the first
    one returned are never timed."""
    import time as _time

    from tilewise.model.bench import time_calls

    first_done: list[float] = []

    def fn(i: int) -> None:
        if not first_done:
            _time.sleep(0.4)  # the first call: longer than warmup_s
            first_done.append(_time.perf_counter())
            return
        _time.sleep(0.015 if _time.perf_counter() - first_done[0] < 0.15 else 0.001)

    trace: list[tuple[float, float, bool]] = []
    samples = time_calls(fn, 10, 2, warmup_s=0.25, trace=trace)
    assert max(samples) < 10.0, samples  # ms: no slow (15 ms) call was timed
    warm = [ms for _, ms, timed in trace if not timed]
    assert warm[0] >= 400.0 and sum(warm[1:]) >= 250.0 - 20.0  # the warm-up after the first call: ~0.25 s


def test_time_calls_trace_holds_every_call_in_order_with_its_start_and_time():
    """The trace has one entry per call, warm-up first and marked untimed, starts increasing, and the timed
    entries' ms are exactly the returned samples (so a slow stretch can be set beside a clock log)."""
    import random
    import time as _time

    from tilewise.model.bench import time_calls

    rng = random.Random(7)
    sleeps = [rng.uniform(0.001, 0.006) for _ in range(40)]
    calls: list[int] = []

    def fn(i: int) -> None:
        _time.sleep(sleeps[len(calls) % len(sleeps)])
        calls.append(i)

    trace: list[tuple[float, float, bool]] = []
    before = _time.time()
    samples = time_calls(fn, 6, 3, warmup_s=0.05, trace=trace)
    assert len(trace) == len(calls)
    assert [t for _, _, t in trace] == [False] * (len(calls) - 6) + [True] * 6
    starts = [u for u, _, _ in trace]
    assert starts == sorted(starts) and starts[0] >= before - 1e-3
    assert [ms for _, ms, t in trace if t] == samples
    assert all(ms >= 1.0 for _, ms, _ in trace)  # every call slept at least 1 ms


@pytest.mark.parametrize("raced", [(), ("pdl",), ("pdl", "fuse_preps"), ("fuse_preps", "serial_reduce")])
def test_bench_says_how_the_cuda_executors_launches_run_and_which_settings_were_raced(capsys, raced):
    from types import SimpleNamespace

    from tilewise.model.bench import bench_model, print_result

    rng = np.random.default_rng(len(raced))
    values = {k: bool(rng.integers(0, 2)) for k in ("pdl", "fuse_preps", "serial_reduce")}
    model = _FakeModel()
    model.executor = SimpleNamespace(**values, measured_settings={k: values[k] for k in raced})
    res = bench_model(model, 24, 8, prefix=6, log=lambda _s: None)
    assert res["executor_settings"] == {**values, "raced": sorted(raced)}
    print_result(res)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("launches:"))
    for key, name in (("pdl", "programmatic dependent launch"), ("fuse_preps", "fused prologues"),
                      ("serial_reduce", "split-K summed in the matmul")):
        assert f"{name} {'on' if values[key] else 'off'}" in line
        assert (f"{name} {'on' if values[key] else 'off'} (raced by tune model)" in line) == (key in raced)

