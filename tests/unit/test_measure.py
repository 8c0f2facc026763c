"""The timing function: statistics, tie verdicts, interleaved rounds, hooks, self-tie."""

import numpy as np
import pytest

from tilewise.devices.base import Launch, Program
from tilewise.tune.measure import Stats, balanced_orders, measure, summarize, tie_groups, ties


class FakeDevice:
    """Records every `time` call; each launch 'takes' a value drawn around its program's mean."""

    timer = "gpu-timestamp"

    def __init__(self, means, noise=0.02, seed=0):
        self.means = means
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.calls = []

    def time(self, launches):
        self.calls.append([launch.program.name for launch in launches])
        return np.array([self.means[launch.program.name] * (1 + self.noise * self.rng.standard_normal())
                         for launch in launches])


def launch(name):
    return Launch(Program(name, None, name), (1, 1, 1), [])


def test_summarize_median_percentiles_and_interval(rng):
    x = rng.uniform(1.0, 2.0, 200)
    st = summarize(x)
    assert st.median_ms == pytest.approx(np.median(x))
    assert st.p20_ms == pytest.approx(np.percentile(x, 20))
    assert st.p80_ms == pytest.approx(np.percentile(x, 80))
    lo, hi = st.ci95_ms
    assert lo <= st.median_ms <= hi
    assert hi - lo < st.p80_ms - st.p20_ms  # the median's interval is narrower than the spread
    assert st.n == 200


def test_interval_shrinks_with_more_samples(rng):
    few = summarize(rng.normal(1.0, 0.1, 10))
    many = summarize(rng.normal(1.0, 0.1, 1000))
    assert (many.ci95_ms[1] - many.ci95_ms[0]) < (few.ci95_ms[1] - few.ci95_ms[0])


def test_ties_and_groups():
    a = Stats(1.0, 0.9, 1.1, (0.95, 1.05), np.ones(3))
    b = Stats(1.02, 0.9, 1.1, (1.0, 1.04), np.ones(3))
    c = Stats(2.0, 1.9, 2.1, (1.9, 2.1), np.ones(3))
    assert ties(a, b) and ties(b, a)
    assert not ties(a, c)
    ranked = tie_groups({"c": c, "b": b, "a": a})
    assert [(k, g) for k, _, g in ranked] == [("a", 1), ("b", 1), ("c", 2)]


def test_rounds_are_interleaved_one_submission_each_with_every_candidate():
    dev = FakeDevice({"x": 1.0, "y": 2.0, "z": 3.0})
    cands = {"x": [launch("x")], "y": [launch("y")], "z": [launch("z")]}
    m = measure(dev, cands, warmup=2, min_rounds=12, max_rounds=12, budget_s=60)
    assert m.rounds == 12 and len(dev.calls) == 14  # 2 warm-up + 12 timed, each one `time` call
    for call in dev.calls:
        assert sorted(call) == ["x", "y", "z"]
    orders = {tuple(call) for call in dev.calls[2:]}
    assert len(orders) > 1  # order reshuffled between rounds
    assert [k for k, _, _ in tie_groups(m.stats)] == ["x", "y", "z"]
    assert m.stats["y"].median_ms == pytest.approx(2.0, rel=0.05)


def test_candidate_registered_twice_ties_with_itself():
    dev = FakeDevice({"same": 1.0, "slow": 1.5}, noise=0.05, seed=3)
    one = launch("same")
    m = measure(dev, {"a": [one], "b": [one], "slow": [launch("slow")]}, min_rounds=30, max_rounds=30)
    groups = {k: g for k, _, g in tie_groups(m.stats)}
    assert groups["a"] == groups["b"] == 1
    assert groups["slow"] == 2


class PositionDevice(FakeDevice):
    """Every launch after the first of a submission is 10% slower: a position effect, not a property of the program."""

    def time(self, launches):
        times = super().time(launches)
        times[1:] *= 1.10
        return times


def test_balanced_orders_give_every_key_every_position_once_per_block():
    keys = ["a", "b", "c", "d", "e"]
    gen = balanced_orders(keys, np.random.default_rng(7))
    for _ in range(4):
        block = [next(gen) for _ in keys]
        assert all(sorted(order) == keys for order in block)
        for pos in range(len(keys)):
            assert sorted(order[pos] for order in block) == keys


def test_position_effect_cancels_so_twins_tie():
    # with free shuffling a twin can sit in the slow slot more often and lose to itself; balanced blocks
    # give both twins the slow slot equally often, so they must tie for every seed
    one = launch("same")
    for seed in range(25):
        dev = PositionDevice({"same": 1.0}, noise=0.01, seed=seed)
        m = measure(dev, {"a": [one], "b": [one]}, warmup=0, min_rounds=30, max_rounds=30,
                    rng=np.random.default_rng(seed))
        assert ties(m.stats["a"], m.stats["b"]), seed


def test_multi_launch_candidate_sums_its_launches():
    dev = FakeDevice({"p": 1.0, "q": 0.5}, noise=0.0)
    m = measure(dev, {"two": [launch("p"), launch("q")]}, warmup=0, min_rounds=3, max_rounds=3)
    assert m.stats["two"].median_ms == pytest.approx(1.5)


def test_between_launches_are_timed_but_discarded():
    dev = FakeDevice({"flush": 100.0, "k": 1.0}, noise=0.0)
    m = measure(dev, {"k": [launch("k")]}, warmup=0, min_rounds=4, max_rounds=4, between_launches=[launch("flush")])
    assert m.stats["k"].median_ms == pytest.approx(1.0)
    assert all(call == ["flush", "k"] for call in dev.calls)


def test_between_callable_runs_before_every_sample():
    dev = FakeDevice({"a": 1.0, "b": 2.0}, noise=0.0)
    count = []
    m = measure(dev, {"a": [launch("a")], "b": [launch("b")]}, warmup=1, min_rounds=5, max_rounds=5,
                between=lambda: count.append(1))
    assert len(count) == 2 * 6  # every sample (warm-up included), each its own submission
    assert all(len(call) == 1 for call in dev.calls)
    assert m.stats["b"].median_ms == pytest.approx(2.0)


def test_budget_stops_after_min_rounds():
    dev = FakeDevice({"a": 1.0})
    m = measure(dev, {"a": [launch("a")]}, warmup=0, min_rounds=3, max_rounds=1000, budget_s=0.0)
    assert m.rounds == 3


def test_cpu_device_self_tie(cpu_device, rng):
    a = rng.standard_normal((96, 96)).astype(np.float32)

    def work(buffers, grid):
        np.dot(a, a)

    prog = cpu_device.compile(work, name="mm")
    one = Launch(prog, (1, 1, 1), [])
    m = measure(cpu_device, {"first": [one], "again": [one]}, warmup=3, min_rounds=40, max_rounds=40)
    groups = {k: g for k, _, g in tie_groups(m.stats)}
    assert groups["first"] == groups["again"]


def test_a_device_with_min_round_ms_repeats_candidates_to_fill_a_round():
    """Rounds shorter than the device's `min_round_ms` run each candidate back to back; samples stay per run."""
    dev = FakeDevice({"x": 0.5, "y": 1.5}, noise=0.0)
    dev.min_round_ms = 20.0
    m = measure(dev, {"x": [launch("x")], "y": [launch("y")]}, warmup=2, min_rounds=4, max_rounds=4)
    assert m.repeat == 10  # the probe round took 2 ms
    assert [len(c) for c in dev.calls] == [2, 20, 20, 20, 20, 20]  # probe, one more warm-up, four timed rounds
    assert all(c.count("x") == c.count("y") == 10 for c in dev.calls[1:])
    assert m.stats["x"].median_ms == pytest.approx(0.5) and m.stats["y"].median_ms == pytest.approx(1.5)


def test_repeats_stay_within_a_rounds_timestamps_and_without_min_round_ms_never_happen():
    many = {f"k{i}": 0.001 for i in range(300)}
    dev = FakeDevice(many, noise=0.0)
    dev.min_round_ms = 20.0
    m = measure(dev, {k: [launch(k)] for k in many}, warmup=1, min_rounds=1, max_rounds=1)
    assert m.repeat == 2048 // 300 and max(len(c) for c in dev.calls) <= 2048  # a query set's timestamps
    plain = FakeDevice({"x": 0.5}, noise=0.0)
    assert measure(plain, {"x": [launch("x")]}, warmup=1, min_rounds=2, max_rounds=2).repeat == 1
    assert [len(c) for c in plain.calls] == [1, 1, 1]


class RunsDevice(FakeDevice):
    """A device that does work before each candidate's run (CUDA's L2 flush): it takes `runs=`."""

    time_runs = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.runs = []

    def time(self, launches, runs=None):
        self.runs.append(list(runs))
        return super().time(launches)


def test_runs_mark_where_each_candidates_launches_start_so_a_flush_never_splits_a_candidate():
    dev = RunsDevice({"mm": 1.0, "reduce": 0.2, "one": 0.5, "flush": 3.0})
    cands = {"split": [launch("mm"), launch("reduce")], "whole": [launch("one")]}
    m = measure(dev, cands, warmup=1, min_rounds=6, max_rounds=6, between_launches=[launch("flush")])
    assert len(dev.runs) == 7
    for call, runs in zip(dev.calls, dev.runs):
        # every run starts with the between-launch, and nothing else starts one: the reduction follows its
        # matmul within the run, as it does in the model
        assert [call[i] for i in runs] == ["flush", "flush"]
        assert sorted(runs) == runs and runs[0] == 0
        assert call.count("flush") == len(runs)
    assert m.stats["split"].median_ms == pytest.approx(1.2, rel=0.05)  # the flush's time is not the candidate's


def test_a_repeated_candidates_every_repetition_is_a_run():
    dev = RunsDevice({"mm": 1.0, "reduce": 0.2})
    dev.min_round_ms = 6.0
    m = measure(dev, {"split": [launch("mm"), launch("reduce")]}, warmup=1, min_rounds=2, max_rounds=2)
    assert m.repeat == 5
    assert dev.runs[0] == [0]  # the probe round: one run
    for call, runs in zip(dev.calls[1:], dev.runs[1:]):
        assert runs == [0, 2, 4, 6, 8] and all(call[i] == "mm" for i in runs)


def test_devices_without_runs_are_called_as_before():
    dev = FakeDevice({"x": 1.0})  # its `time` takes no `runs`: measure must not pass one
    assert measure(dev, {"x": [launch("x")]}, warmup=1, min_rounds=2, max_rounds=2).rounds == 2
