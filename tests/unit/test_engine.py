"""The evaluation engine on the CPU device: one stored outcome per item for every status, resuming from the store,
and what it shares between items (programs by program key, verifications by verify shape, inputs via rebind)."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from tilewise.devices.base import Launch
from tilewise.devices.cpu import CPUDevice
from tilewise.errors import ShaderCompileError
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.gemm.problem import GEMM
from tilewise.kernels.space import Rule, Space
from tilewise.tune.engine import Engine, Item
from tilewise.tune.store import Store

FAST = {"warmup": 0, "min_rounds": 3, "max_rounds": 3}
# what each config of the fake kernel does
MODES = ("ok", "slow_ok", "wrong", "no_compile", "crash", "sleepy", "too_big")


def fake_kernel(bufs, grid, MODE):
    """out (M, N) = a @ b, except where MODE says otherwise (M, N, K come as the grid)."""
    M, N, K = grid
    if MODE == "crash":
        raise RuntimeError("launch failed: out of resources")
    if MODE == "sleepy":
        time.sleep(0.05)
    a = bufs[0].view(np.float32)[: M * K].reshape(M, K)
    b = bufs[1].view(np.float32)[: K * N].reshape(K, N)
    out = bufs[2].view(np.float32)[: M * N].reshape(M, N)
    out[:] = a @ b
    if MODE == "wrong":
        out[-1, -1] += 1.0  # one value off: every value is compared, so this one fails


class Fake(KernelTemplate):
    problem = GEMM
    name = "fake-gemm"
    backend = "cpu"

    def __init__(self) -> None:
        self.compiled: list[tuple[str, tuple[int, ...]]] = []
        self.uploads: list[tuple[int, ...]] = []
        self.checked_at: list[tuple[int, ...]] = []

    def space(self, which="full"):
        return Space("fake", {"MODE": list(MODES)}, [
            Rule("fits", lambda c, _: c.MODE != "too_big", lambda c, _: "MODE=too_big needs 2x the storage there is")])

    def source(self, config, shape=None):
        return f"fake {config.MODE}"

    def program_key(self, config, shape):
        return config  # one program serves every shape (sizes come with the launch)

    def compile(self, device, config, shape):
        self.compiled.append((config.MODE, tuple(shape)))
        if config.MODE == "no_compile":
            raise ShaderCompileError("fake.cu:1: error: no such thing", "fix the source")
        return device.compile(fake_kernel, constants=dict(config), name=f"fake[{config.MODE}]")

    def verify_shape(self, config, shape):
        return (5, 7, 3)  # partial everything, cheap

    def upload(self, device, host, shape):
        self.uploads.append(tuple(shape))
        M, N, _ = shape
        return {"a": device.upload(host["a"]), "b": device.upload(host["b"]), "out": device.allocate(4 * M * N)}

    def rebind(self, device, bufs, have, shape):
        # a's rows and b serve fewer rows of the same N, K (the kernel reads the first M rows)
        return bufs if have[1:] == tuple(shape[1:]) and shape[0] <= have[0] else None

    def launches(self, program, bufs, config, shape):
        return [Launch(program, tuple(shape), [bufs["a"], bufs["b"], bufs["out"]])]

    def read_output(self, device, bufs, shape):
        self.checked_at.append(tuple(shape))
        return super().read_output(device, bufs, shape)


def items(tpl, shape, modes=MODES):
    sp = tpl.space()
    return [Item(tpl, sp.config(MODE=m), shape) for m in modes]


def test_every_status_is_stored_once_per_item(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    tpl = Fake()
    eng = Engine(CPUDevice(), store, timeout_s=0.02, measure_kw=FAST)
    out = {oc.config.MODE: oc for oc in eng.evaluate(items(tpl, (16, 8, 4)))}
    assert {m: oc.status for m, oc in out.items()} == {
        "ok": "ok", "slow_ok": "ok", "wrong": "wrong", "no_compile": "compile_error", "crash": "launch_error",
        "sleepy": "timeout", "too_big": "illegal"}
    assert "fits: MODE=too_big needs 2x" in out["too_big"].reason
    assert "no such thing" in out["no_compile"].reason and "out of resources" in out["crash"].reason
    assert out["wrong"].reason.startswith("verified at 5x7x3: ") and "worst at (4, 6)" in out["wrong"].reason
    assert "> timeout 0.02 s (at 5x7x3)" in out["sleepy"].reason
    ok = out["ok"]
    assert ok.stats is not None and ok.stats.n == 3 and ok.gflops > 0 and ok.verified_shape == (5, 7, 3)
    stored = {r.config: r for r in store.query(kernel="fake-gemm")}
    assert {k.split("=")[1]: r.status for k, r in stored.items()} == {m: oc.status for m, oc in out.items()}
    assert stored["MODE=ok"].median_ms == pytest.approx(ok.stats.median_ms) and stored["MODE=ok"].shape == "16x8x4"
    assert ("too_big", (16, 8, 4)) not in tpl.compiled  # an illegal config never compiles


def test_a_config_that_loses_the_device_is_stored_and_a_rerun_skips_it(tmp_path):
    """A kernel fault (CUDA: the context is unusable until the process restarts) ends the run, but the config that
    caused it is stored as a launch error first: the same command run again skips it and finishes, instead of
    dying on it every time. The items still in flight beside it are not stored."""
    from tilewise.errors import DeviceLost

    def losing_kernel(bufs, grid, MODE):
        if MODE == "crash":
            raise DeviceLost("CUDA error while reading a buffer back: unspecified launch failure", "restart")
        fake_kernel(bufs, grid, MODE)

    class Losing(Fake):
        def compile(self, device, config, shape):
            self.compiled.append((config.MODE, tuple(shape)))
            return device.compile(losing_kernel, constants=dict(config), name=f"losing[{config.MODE}]")

    store = Store(tmp_path / "s.sqlite")
    modes = ["ok", "crash", "slow_ok"]
    with pytest.raises(DeviceLost):
        Engine(CPUDevice(), store, measure_kw=FAST).evaluate(items(Losing(), (16, 8, 4), modes))
    stored = {r.config: r for r in store.query(kernel="fake-gemm")}
    assert list(stored) == ["MODE=crash"] and stored["MODE=crash"].status == "launch_error"
    assert "device was lost" in stored["MODE=crash"].message and "unspecified launch failure" in \
        stored["MODE=crash"].message
    tpl = Losing()
    again = {oc.config.MODE: oc for oc in Engine(CPUDevice(), store, measure_kw=FAST).evaluate(
        items(tpl, (16, 8, 4), modes))}
    assert {m: oc.status for m, oc in again.items()} == {"ok": "ok", "crash": "launch_error", "slow_ok": "ok"}
    assert again["crash"].cached and ("crash", (16, 8, 4)) not in tpl.compiled


def test_a_second_run_resumes_from_the_store(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    Engine(CPUDevice(), store, timeout_s=0.02, measure_kw=FAST).evaluate(items(Fake(), (16, 8, 4)))
    tpl = Fake()
    again = Engine(CPUDevice(), store, timeout_s=0.02, measure_kw=FAST).evaluate(items(tpl, (16, 8, 4)))
    assert tpl.compiled == [] and all(oc.cached for oc in again if oc.status != "illegal")
    # a stored timeout is tried again once the timeout is longer than the stored first run
    tpl = Fake()
    longer = Engine(CPUDevice(), store, timeout_s=10.0, measure_kw=FAST).evaluate(items(tpl, (16, 8, 4), ["sleepy"]))
    assert longer[0].status == "ok" and not longer[0].cached and tpl.compiled == [("sleepy", (16, 8, 4))]
    forced = Fake()
    Engine(CPUDevice(), store, force=True, measure_kw=FAST).evaluate(items(forced, (16, 8, 4), ["ok"]))
    assert forced.compiled == [("ok", (16, 8, 4))]


def test_programs_verifications_and_inputs_are_shared_across_shapes():
    tpl = Fake()
    eng = Engine(CPUDevice(), None, measure_kw=FAST)
    shapes = [(2, 8, 4), (16, 8, 4), (9, 8, 4)]
    work = [it for s in shapes for it in items(tpl, s, ["ok", "slow_ok"])]
    outs = eng.evaluate(work, batch=None)
    assert all(oc.status == "ok" for oc in outs) and [oc.shape for oc in outs] == [it.shape for it in work]
    assert sorted(m for m, _ in tpl.compiled) == ["ok", "slow_ok"]  # one program each, for all three shapes
    assert tpl.checked_at.count((5, 7, 3)) == 2  # one verification per program at its verify shape
    # each check has fresh inputs; for timing the largest shape's inputs were made first and the two smaller
    # shapes were rebound onto them
    assert tpl.uploads == [(5, 7, 3), (5, 7, 3), (16, 8, 4)]


def test_race_times_items_together_and_updates_what_is_stored(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    tpl = Fake()
    eng = Engine(CPUDevice(), store, measure_kw=FAST)
    outs = [oc for oc in eng.evaluate(items(tpl, (16, 8, 4), ["ok", "slow_ok"])) if oc.status == "ok"]
    race = eng.race([oc.item for oc in outs] + [outs[0].item], outcomes=outs, measure_kw={"min_rounds": 5,
                                                                                          "max_rounds": 5})
    assert len(race.stats) == 3 and race.rounds == 5 and all(st.n == 5 for st in race.stats)
    assert outs[0].stats is race.stats[0] and outs[1].stats is race.stats[1]
    assert {r.samples for r in store.query(kernel="fake-gemm", status="ok")} == {5}


@pytest.mark.parametrize("bad,needle", [
    ({"min_rounds": -3, "max_rounds": -3}, "min_rounds=-3 is not a usable round count"),
    ({"min_rounds": 5, "max_rounds": 2}, "max_rounds 2 < min_rounds 5"),
    ({"warmup": 1.5}, "warmup=1.5"),
    ({"budget_s": float("nan")}, "budget_s=nan"),
    ({"budget_s": 0}, "budget_s=0"),
    ({"rounds": 3}, "unknown timing arguments ['rounds']"),
])
def test_bad_timing_arguments_are_refused_before_anything_is_stored(tmp_path, bad, needle):
    from tilewise.errors import ConfigError

    store = Store(tmp_path / "s.sqlite")
    tpl = Fake()
    with pytest.raises(ConfigError, match=re.escape(needle)):
        Engine(CPUDevice(), store, measure_kw=bad).evaluate(items(tpl, (16, 8, 4)))
    eng = Engine(CPUDevice(), store, measure_kw=FAST)
    (first,) = eng.evaluate(items(tpl, (16, 8, 4), ["ok"]))
    with pytest.raises(ConfigError, match=re.escape(needle)):
        eng.race([first.item], measure_kw=bad)
    # the only stored outcome is the good run's: the caller's bad arguments left no failure behind
    assert [r.status for r in store.query(kernel="fake-gemm")] == ["ok"] and tpl.compiled == [("ok", (16, 8, 4))]


def test_a_zero_timeout_is_refused():
    from tilewise.errors import ConfigError

    with pytest.raises(ConfigError, match="stops every run"):
        Engine(CPUDevice(), timeout_s=0.0)
