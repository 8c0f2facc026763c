"""bench/matmul_cuda.py's second race, on f16 x: each candidate's `nf4_mm_prep` launch runs once before the race
(so the kernel reads real f16 rows) and is left out of what is timed, the kernel and any reduction launch stay, and
cuBLAS races beside them; kinds without a prep are timed whole."""

from __future__ import annotations

import types

import numpy as np
from tests.scripts import load_script

from tilewise.devices.base import Launch
from tilewise.tune.measure import summarize


def load_bench():
    return load_script("bench/matmul_cuda.py", "matmul_cuda_bench")


def prog(role=None):
    return types.SimpleNamespace(meta={"role": role} if role else {})


def test_the_f16_race_times_each_kernel_without_its_prep_and_runs_the_prep_first(monkeypatch):
    bench = load_bench()
    rng = np.random.default_rng(0)
    prep, main, reduce, other = prog(("prep", 1)), prog(), prog(("reduce", 1)), prog()
    cublas = prog()
    runs_before: list[list[Launch]] = []
    raced: dict = {}

    class Dev:
        def run(self, launches):
            runs_before.append(list(launches))

    item_a = types.SimpleNamespace(kernel=types.SimpleNamespace(
        peer_launches=lambda p, bufs, shape: [Launch(p, (1, 1, 1), [])]), shape=(346, 64, 128))
    item_b = types.SimpleNamespace(kernel=item_a.kernel, shape=item_a.shape)
    launches = {id(item_a): [Launch(prep, (346, 1, 1), []), Launch(main, (4, 3, 2), []), Launch(reduce, (9, 1, 1), [])],
                id(item_b): [Launch(other, (8, 1, 1), [])]}  # a kind that reads x as it is: nothing to drop
    eng = types.SimpleNamespace(device=Dev(), rng=rng, launches=lambda it: launches[id(it)],
                                peer_program=lambda k: cublas, timing_buffers=lambda it: {})

    def fake_measure(dev, runs, **kw):
        raced.update(runs)
        times = {key: 0.01 * (i + 1) for i, key in enumerate(runs)}
        return types.SimpleNamespace(stats={key: summarize(np.full(kw["min_rounds"], t) + rng.uniform(0, 1e-4, kw[
            "min_rounds"])) for key, t in times.items()})

    monkeypatch.setattr(bench, "measure", fake_measure)
    stats, peer = bench.race_on_f16_x(eng, [item_a, item_b], rounds=5)
    assert [[ln.program for ln in run] for run in runs_before] == [[prep]]  # the prep once, before the race
    assert [ln.program for ln in raced[0]] == [main, reduce]
    assert [ln.program for ln in raced[1]] == [other]
    assert [ln.program for ln in raced["cublas"]] == [cublas]
    assert len(stats) == 2 and peer is not None
    assert stats[0].median_ms < stats[1].median_ms < peer.median_ms  # each key's own samples came back
