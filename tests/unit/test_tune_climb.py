"""`tune model --climb`: the climb starts from the fastest config and from each config that ties with it (their
medians' 95% intervals overlap), its steps split between them; a clear leader gets every step. No device: the
engine's measurements are made up, on the real subgroup-matrix space and its neighbours."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tilewise.devices.profiles import get_profile
from tilewise.kernels.matmul import sgmat as sg
from tilewise.model.tune_climb import MAX_STARTS, climb_matmul
from tilewise.tune.measure import summarize
from tilewise.tune.outcome import Item, Outcome
from tilewise.tune.search import neighbours

H200 = get_profile("h200-dawn")
N, K, SEQ = 1024, 1024, 346


def timed(tpl, cfg, median_ms: float, spread: float, rng) -> Outcome:
    samples = median_ms * (1 + spread * rng.standard_normal(40))  # (40,) ms
    return Outcome(Item(tpl, cfg, (SEQ, N, K)), "ok", stats=summarize(samples))


def run_climb(spread: float, seed: int, count: int):
    """Four measured configs: three within 0.4% of each other, one twice as slow; every climbing step measures
    slower than all of them, so no climb moves and each start's steps stay in its own neighbourhood."""
    rng = np.random.default_rng(seed)
    tpl = sg.SgmatMatmul("nf4", "residual", None, False)
    space = tpl.space()
    legal = [c for c in tpl.seed_configs(H200) if space.is_legal(c, H200)]
    picks = [legal[i] for i in rng.choice(len(legal), 4, replace=False)]
    base = float(rng.uniform(0.02, 0.08))
    outcomes = [timed(tpl, c, base * f, spread, rng) for c, f in zip(picks, (1.0, 1.002, 1.004, 2.0))]
    measured: list = []

    def evaluate(items):
        measured.extend(it.config for it in items)
        return [timed(tpl, it.config, base * 3, 0.001, rng) for it in items]

    eng = SimpleNamespace(device=SimpleNamespace(info=SimpleNamespace(limits=H200)))
    _, record = climb_matmul(eng, evaluate, outcomes, N, K, SEQ, [SEQ], count, seed)
    ranked = [oc.config for oc in sorted(outcomes, key=lambda oc: oc.stats.median_ms)]  # as measured
    return space, ranked, measured, record


@pytest.mark.parametrize("seed", range(3))
def test_configs_tied_with_the_fastest_each_start_a_climb_with_a_share_of_the_steps(seed):
    count = 3 * MAX_STARTS
    space, picks, measured, record = run_climb(0.05, seed, count)  # 5% noise: the three leaders tie
    assert picks[3].key() not in record["starts"]  # the slow one is last by far whatever the noise
    assert record["starts"] == [c.key() for c in picks[:3]] and record["measured"] == count == len(measured)
    near = [set(neighbours(space, c, H200)) for c in picks[:3]]
    assert all(len(n) >= count // 3 for n in near)
    for i in range(3):  # each start's share: its own untried neighbours, in turn
        share = measured[3 * i:3 * i + 3]
        assert set(share) <= near[i], (i, [str(c) for c in share])
    assert not set(measured) & {picks[3]}


@pytest.mark.parametrize("seed", range(3))
def test_a_clear_leader_gets_every_step(seed):
    count = 3 * MAX_STARTS
    space, picks, measured, record = run_climb(0.0002, seed, count)  # 0.02% noise: the 0.2% gaps are real
    assert record["starts"] == [picks[0].key()] and record["from"] == picks[0].key()
    near = set(neighbours(space, picks[0], H200))
    assert len(measured) == count and set(measured) <= near


def test_no_more_starts_than_steps():
    _, picks, measured, record = run_climb(0.05, 5, 2)
    assert record["starts"] == [c.key() for c in picks[:2]] and len(measured) == 2
