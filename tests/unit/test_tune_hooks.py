"""The tuner's optional template hooks, on a fake template and a fake-timed CPU device (no GPU needed).

- `precompile`: called once per batch with that batch's configs; its programs (and errors) are used as-is.
- `verify_shape`: verification (fresh inputs, NaN poison, float64 reference) runs at that shape, timing at the
  real shape; the stored message names the verified shape.
- `peer_program`/`peer_launches`: the peer runs in the final race's rounds, and `% of peer` comes from them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tilewise.devices.base import Launch
from tilewise.devices.cpu import CPUDevice
from tilewise.errors import ShaderCompileError, TilewiseError
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.gemm.problem import GEMM
from tilewise.kernels.space import Space
from tilewise.tune.store import Store
from tilewise.tune.tuner import tune

SHAPE = (16, 16, 16)  # no partial tile for any T below
VSHAPE = (7, 12, 8)  # M = 7: a partial row tile for T = 2 and 4
PEER_MS = 0.8
FAST = {"warmup": 0, "min_rounds": 8, "max_rounds": 8, "budget_s": 60.0}
POINTS = [dict(T=1, BUG=0), dict(T=2, BUG=0), dict(T=2, BUG=1), dict(T=4, BUG=0), dict(T=8, BUG=0)]


def tiny_kernel(bufs, grid, T, BUG):
    """out (M, N) = a (M, K) @ b (K, N); with BUG, the rows of a partial last T-row tile are never written."""
    M, N, K = grid
    a = bufs[0].view(np.float32)[: M * K].reshape(M, K)
    b = bufs[1].view(np.float32)[: K * N].reshape(K, N)
    out = bufs[2].view(np.float32)[: M * N].reshape(M, N)
    rows = M - M % T if BUG else M
    out[:rows] = a[:rows] @ b


def peer_kernel(bufs, grid):
    M, N, K = grid
    out = bufs[2].view(np.float32)[: M * N].reshape(M, N)
    out[:] = bufs[0].view(np.float32)[: M * K].reshape(M, K) @ bufs[1].view(np.float32)[: K * N].reshape(K, N)


class TimedCPU(CPUDevice):
    """Runs kernels for real (verification) but `time` returns each program's `meta["mean_ms"]` with 1% noise,
    and records every call: (program names, grids, returned ms)."""

    timer = "fake"

    def __init__(self) -> None:
        super().__init__()
        self.noise = np.random.default_rng(7)
        self.runs: list[tuple[int, ...]] = []
        self.timed: list[tuple[list[str], list[tuple[int, ...]], np.ndarray]] = []

    def run(self, launches):
        self.runs += [tuple(lch.grid) for lch in launches]
        super().run(launches)

    def time(self, launches):
        ms = np.array([lch.program.meta["mean_ms"] * (1 + 0.01 * self.noise.standard_normal()) for lch in launches])
        self.timed.append(([lch.program.name for lch in launches], [tuple(lch.grid) for lch in launches], ms))
        return ms


class Tiny(KernelTemplate):
    """A CPU GEMM whose configs differ in (fake) speed, one with an edge bug and one that cannot compile."""

    name = "tiny"
    backend = "cpu"
    problem = GEMM  # the math (shape checks, flops) of a GEMM; inputs and reference are recorded below
    shape_names = ("M", "N", "K")

    def __init__(self) -> None:
        self.compiled: list[str] = []
        self.precompiled: list[list[str]] = []
        self.inputs_at: list[tuple[int, ...]] = []
        self.reference_at: list[tuple[int, ...]] = []

    def space_names(self):
        return ("seed",)

    def space(self, which="seed"):
        return Space("tiny-seed", {"T": [1, 2, 4, 8], "BUG": [0, 1]}, points=POINTS)

    def source(self, config):
        return f"tiny T={config.T} BUG={config.BUG}"

    def compile(self, device, config, shape):
        self.compiled.append(config.key())
        if config.T == 8:
            raise ShaderCompileError("tiny.cu:3: T = 8 tiles need 9 registers too many", "pick T <= 4")
        prog = device.compile(tiny_kernel, constants=dict(config), name=f"tiny[{config.key()}]")
        prog.meta["mean_ms"] = 1.0 * config.T
        return prog

    def precompile(self, device, configs, shape):
        self.precompiled.append([c.key() for c in configs])
        out = {}
        for c in configs:
            try:
                out[c] = self.compile(device, c, shape)
            except TilewiseError as exc:
                out[c] = exc
        return out

    def verify_shape(self, config, shape):
        return VSHAPE if self.flops(shape) > self.flops(VSHAPE) else shape

    def make_inputs(self, shape, rng):
        self.inputs_at.append(tuple(shape))
        M, N, K = shape
        return {"a": rng.standard_normal((M, K), dtype=np.float32), "b": rng.standard_normal((K, N), dtype=np.float32)}

    def upload(self, device, host, shape):
        M, N, _ = shape
        return {"a": device.upload(host["a"]), "b": device.upload(host["b"]), "out": device.allocate(4 * M * N)}

    def launches(self, program, bufs, config, shape):
        return [Launch(program, tuple(shape), [bufs["a"], bufs["b"], bufs["out"]])]

    def read_output(self, device, bufs, shape):
        return device.download(bufs["out"], np.float32, shape[:2])

    def reference(self, host, shape):
        self.reference_at.append(tuple(shape))
        return host["a"].astype(np.float64) @ host["b"].astype(np.float64)

    def flops(self, shape):
        M, N, K = shape
        return 2 * M * N * K

    def bytes_moved(self, shape):
        M, N, K = shape
        return 4 * (M * K + K * N + M * N)


class TinyWithPeer(Tiny):
    peer_name = "fakeBLAS"

    def peer_program(self, device):
        prog = device.compile(peer_kernel, name="fakeblas")
        prog.meta["mean_ms"] = PEER_MS
        return prog

    def peer_launches(self, program, bufs, shape):
        return [Launch(program, tuple(shape), [bufs["a"], bufs["b"], bufs["out"]])]


class TinyPlain(Tiny):
    """No hooks: the base class's defaults."""

    precompile = KernelTemplate.precompile
    verify_shape = KernelTemplate.verify_shape


def by_key(res):
    return {r.config.key(): r for r in res.rows}


class Graded(Tiny):
    """Tiny on a grid, T x U x V = 3 x 12 x 2, whose (fake) time falls one step at a time toward T 2, U 9, V b."""

    def space_names(self):
        return ("full",)

    def space(self, which="full"):
        return Space("graded", {"T": [1, 2, 4], "U": list(range(1, 13)), "V": ["a", "b"]})

    def source(self, config):
        return f"graded {config.key()}"

    def compile(self, device, config, shape):
        self.compiled.append(config.key())
        prog = device.compile(tiny_kernel, constants={"T": config.T, "BUG": 0}, name=f"graded[{config.key()}]")
        prog.meta["mean_ms"] = 1.0 + (config.T != 2) + 0.1 * (config.U - 9) ** 2 + 0.5 * (config.V == "a")
        return prog


def test_climb_through_the_tuner_finds_the_fastest_config_measuring_a_third_of_the_space():
    from tilewise.tune.search import Budget

    tpl = Graded()
    res = tune(tpl, TimedCPU(), SHAPE, space="full", strategy="climb", budget=Budget(count=24), measure_kw=FAST)
    assert res.best.config.key() == tpl.space().config(T=2, U=9, V="b").key()
    assert len(res.rows) <= 24 and len(set(tpl.compiled)) == len(res.rows)  # 72 configs in the grid
    assert all(r.status == "ok" for r in res.rows)  # every one verified against float64 before it was timed


# ---- precompile -------------------------------------------------------------------------------------------
def test_precompile_is_called_once_per_batch_with_that_batchs_configs():
    tpl, dev = Tiny(), TimedCPU()
    res = tune(tpl, dev, SHAPE, batch=2, measure_kw=FAST)
    keys = [f"T={p['T']},BUG={p['BUG']}" for p in POINTS]
    assert tpl.precompiled == [keys[0:2], keys[2:4], keys[4:5]]
    # every program came from the batch compile: nothing compiled twice, not even for the final race
    assert sorted(tpl.compiled) == sorted(keys)
    rows = by_key(res)
    assert rows["T=8,BUG=0"].status == "compile_error"
    assert rows["T=8,BUG=0"].reason == "tiny.cu:3: T = 8 tiles need 9 registers too many"


def test_precompile_skips_stored_configs_and_a_failing_batch_compile_falls_back(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    tune(Tiny(), TimedCPU(), SHAPE, batch=2, store=store, measure_kw=FAST)

    class Broken(Tiny):
        def precompile(self, device, configs, shape):
            self.precompiled.append([c.key() for c in configs])
            raise RuntimeError("the compile pool died")

    again = Tiny()
    tune(again, TimedCPU(), SHAPE, batch=2, store=store, measure_kw=FAST)
    assert again.precompiled == [] and again.compiled == []  # all stored: nothing to compile
    broken = Broken()
    res = tune(broken, TimedCPU(), SHAPE, batch=8, measure_kw=FAST)
    assert len(broken.precompiled) == 1
    assert sorted(broken.compiled) == sorted(f"T={p['T']},BUG={p['BUG']}" for p in POINTS)  # one by one instead
    assert by_key(res)["T=8,BUG=0"].status == "compile_error" and by_key(res)["T=1,BUG=0"].status == "ok"


def test_default_precompile_compiles_nothing_and_the_tuner_compiles_each_config():
    tpl = TinyPlain()
    assert tpl.precompile(TimedCPU(), [], SHAPE) == {}
    res = tune(tpl, TimedCPU(), SHAPE, batch=2, measure_kw=FAST)
    assert sorted(tpl.compiled) == sorted(f"T={p['T']},BUG={p['BUG']}" for p in POINTS)
    assert by_key(res)["T=8,BUG=0"].status == "compile_error"


# ---- verify_shape -----------------------------------------------------------------------------------------
def test_verification_runs_at_verify_shape_and_timing_at_the_real_shape(tmp_path):
    tpl, dev = Tiny(), TimedCPU()
    store = Store(tmp_path / "s.sqlite")
    res = tune(tpl, dev, SHAPE, batch=2, store=store, measure_kw=FAST)
    rows = by_key(res)
    # four configs compiled; each ran once, at the verify shape, on its own fresh inputs
    assert dev.runs == [VSHAPE] * 4
    assert tpl.inputs_at.count(VSHAPE) == 4 and tpl.reference_at == [VSHAPE] * 4
    # timing: only the real shape, on inputs made once for it, never a reference at the real shape
    assert dev.timed and all(g == SHAPE for _, grids, _ in dev.timed for g in grids)
    assert tpl.inputs_at.count(SHAPE) == 1
    # the edge bug is correct at SHAPE (no partial tile) but caught at VSHAPE by the NaN poison
    bug = rows["T=2,BUG=1"]
    assert bug.status == "wrong" and bug.verified_shape == VSHAPE
    assert bug.reason.startswith("verified at 7x12x8: 12 of 84 outputs not finite")
    ok = rows["T=1,BUG=0"]
    assert ok.status == "ok" and ok.verified_shape == VSHAPE and ok.reason.startswith("verified at 7x12x8: rel_err")
    assert ok.gflops == pytest.approx(2 * 16**3 / (ok.stats.median_ms * 1e6))  # GFLOP/s of the timed shape
    stored = {r.config: r for r in store}
    assert stored["T=1,BUG=0"].message.startswith("verified at 7x12x8: ")
    assert stored["T=2,BUG=1"].status == "wrong" and stored["T=2,BUG=1"].message.startswith("verified at 7x12x8: ")
    resumed = by_key(tune(Tiny(), TimedCPU(), SHAPE, store=store, measure_kw=FAST))
    assert resumed["T=1,BUG=0"].cached and resumed["T=1,BUG=0"].verified_shape == VSHAPE


def test_without_the_hook_verification_uses_the_real_shape():
    tpl, dev = TinyPlain(), TimedCPU()
    assert tpl.verify_shape(None, SHAPE) == SHAPE
    res = tune(tpl, dev, SHAPE, batch=2, measure_kw=FAST)
    assert dev.runs == [SHAPE] * 4 and tpl.reference_at == [SHAPE] * 4
    assert by_key(res)["T=2,BUG=1"].status == "ok"  # at 16x16x16 the bug has no partial tile to skip
    assert by_key(res)["T=1,BUG=0"].reason.startswith("verified at 16x16x16: ")


def test_a_verify_shape_the_config_refuses_falls_back_to_the_real_shape():
    class Picky(Tiny):
        def shape_problems(self, config, shape):
            return [f"odd_m: M = {shape[0]} is odd"] if shape[0] % 2 else []

    tpl, dev = Picky(), TimedCPU()
    res = tune(tpl, dev, SHAPE, batch=8, measure_kw=FAST)
    assert dev.runs == [SHAPE] * 4
    assert all(r.verified_shape == SHAPE for r in res.rows if r.status in ("ok", "wrong"))


# ---- peer -------------------------------------------------------------------------------------------------
def test_peer_runs_in_the_final_race_and_its_percentage_comes_from_that_race():
    tpl, dev = TinyWithPeer(), TimedCPU()
    res = tune(tpl, dev, SHAPE, batch=2, measure_kw=FAST, peer=True)
    ranked = res.ranked
    assert [r.config.key() for r in ranked] == ["T=1,BUG=0", "T=2,BUG=0", "T=4,BUG=0"]
    race = [names for names, _, _ in dev.timed if "fakeblas" in names]
    assert len(race) == FAST["max_rounds"]  # one race, every round with the peer and every raced config
    assert all(sorted(names) == sorted(["fakeblas", *(f"tiny[{r.config.key()}]" for r in ranked)])
               for names in race)
    assert "fakeblas" not in {n for names, _, _ in dev.timed[:-len(race)] for n in names}  # only in the race
    # recompute the peer's median and each config's from the race's own samples
    samples: dict[str, list[float]] = {}
    for names, _, ms in dev.timed[-len(race):]:
        for n, t in zip(names, ms):
            samples.setdefault(n, []).append(t)
    peer_med = float(np.median(samples["fakeblas"]))
    assert res.peer is not None and res.peer.name == "fakeBLAS"
    assert res.peer.stats.median_ms == pytest.approx(peer_med)
    assert res.peer.gflops == pytest.approx(2 * 16**3 / (peer_med * 1e6))
    for r in ranked:
        med = float(np.median(samples[f"tiny[{r.config.key()}]"]))
        assert r.stats.median_ms == pytest.approx(med)
        assert r.pct_of_peer == pytest.approx(100 * peer_med / med)
    assert ranked[0].pct_of_peer == pytest.approx(100 * PEER_MS / 1.0, rel=0.05)
    assert ranked[2].pct_of_peer == pytest.approx(100 * PEER_MS / 4.0, rel=0.05)


def test_peer_is_off_by_default_and_absent_templates_have_none():
    dev = TimedCPU()
    res = tune(TinyWithPeer(), dev, SHAPE, batch=2, measure_kw=FAST)
    assert res.peer is None and all(r.pct_of_peer is None for r in res.rows)
    assert not any("fakeblas" in names for names, _, _ in dev.timed)
    res = tune(Tiny(), TimedCPU(), SHAPE, batch=2, measure_kw=FAST, peer=True)
    assert res.peer is None and list(res.as_json()) == ["kernel", "device", "shape", "results"]


def test_peer_race_happens_even_when_one_batch_measured_everything():
    # without a peer a single batch needs no final race; with one, the peer must share a measurement
    dev = TimedCPU()
    res = tune(TinyWithPeer(), dev, SHAPE, batch=16, measure_kw=FAST, peer=True)
    assert res.peer is not None and all(r.pct_of_peer is not None for r in res.ranked)
    dev = TimedCPU()
    tune(Tiny(), dev, SHAPE, batch=16, measure_kw=FAST)
    assert len(dev.timed) == FAST["max_rounds"]  # the batch's rounds only


def test_a_failing_peer_keeps_the_race_and_says_why():
    class BadPeer(TinyWithPeer):
        def peer_launches(self, program, bufs, shape):
            raise RuntimeError("cublas: handle lost")

    res = tune(BadPeer(), TimedCPU(), SHAPE, batch=2, measure_kw=FAST, peer=True)
    assert res.peer is None and res.peer_error == "RuntimeError: cublas: handle lost"
    assert res.ranked and all(r.pct_of_peer is None for r in res.ranked)


def test_base_template_has_no_peer():
    tpl = TinyPlain()
    assert tpl.peer_program(TimedCPU()) is None and tpl.peer_name == ""
    with pytest.raises(TilewiseError, match="has no peer"):
        KernelTemplate.peer_launches(tpl, None, {}, SHAPE)


# ---- the command line -------------------------------------------------------------------------------------
@pytest.fixture
def fake_cli(monkeypatch):
    """`tilewise tune tiny --device cpu` runs TinyWithPeer on a timed CPU device: a family registered for the cpu
    backend, resolved by the one device resolver like any other."""
    from tilewise import devices
    from tilewise.kernels import registry

    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setitem(registry.TEMPLATES, ("tiny", "cpu"), "test:TinyWithPeer")
    real = registry.get_template
    monkeypatch.setattr(registry, "get_template", lambda kernel, backend: TinyWithPeer() if kernel == "tiny"
                        else real(kernel, backend))
    dev = TimedCPU()
    monkeypatch.setattr(devices, "get_device", lambda name: dev)


def test_cli_prints_percent_of_peer_and_json_adds_peer_keys_only(fake_cli, tmp_path, capsys):
    from tilewise.cli import main

    out = tmp_path / "r.json"
    argv = ["tune", "tiny", "--device", "cpu", "--shape", "16,16,16", "--rounds", "6", "--json", str(out)]
    assert main([*argv, "--store", str(tmp_path / "a.sqlite")]) == 0
    text = capsys.readouterr().out
    assert "% of fakeBLAS" in text and "fakeBLAS (peer)" in text
    assert "fastest vs fakeBLAS: " in text and "% of fakeBLAS (" in text
    data = json.loads(out.read_text())
    assert list(data) == ["kernel", "device", "shape", "results", "peer"]
    assert list(data["peer"]) == ["name", "median_ms", "ci95_ms", "gflops"] and data["peer"]["name"] == "fakeBLAS"
    for r in data["results"]:
        assert list(r) == ["config", "status", "reason", "median_ms", "p20_ms", "p80_ms", "ci95_ms", "gflops",
                           "rel_err", "tie_group", "pct_of_peer"]
    best = data["results"][0]
    assert best["status"] == "ok" and best["pct_of_peer"] == pytest.approx(
        100 * data["peer"]["median_ms"] / best["median_ms"])
    assert main([*argv, "--store", str(tmp_path / "b.sqlite"), "--no-peer"]) == 0
    text = capsys.readouterr().out
    assert "% of fakeBLAS" not in text
    data = json.loads(out.read_text())
    assert list(data) == ["kernel", "device", "shape", "results"]
    assert all(list(r)[-1] == "tie_group" for r in data["results"])


def test_climb_over_a_full_space_starts_from_the_seed_points():
    from tilewise.tune.search import Budget

    class GradedSeeded(Graded):
        def space_names(self):
            return ("seed", "full")

        def space(self, which="full"):
            full = Space("graded", {"T": [1, 2, 4], "U": list(range(1, 13)), "V": ["a", "b"]})
            return full if which == "full" else Space("graded-seed", full.params, points=[{"T": 4, "U": 2, "V": "a"}])

    tpl = GradedSeeded()
    tune(tpl, TimedCPU(), SHAPE, space="full", strategy="climb", budget=Budget(count=6), measure_kw=FAST)
    assert tpl.compiled[0] == "T=4,U=2,V=a"  # the seed point first, then its neighbours
    near = {"T=2,U=2,V=a", "T=4,U=1,V=a", "T=4,U=3,V=a", "T=4,U=2,V=b"}
    assert set(tpl.compiled[1:5]) == near


# ---- the default precompile: threads, or the device's own batch -------------------------------------------------
class ThreadedCPU(TimedCPU):
    """TimedCPU whose compiler may be called from 3 threads at once; it records each compile's thread."""

    compile_workers = 3

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def compile(self, source, entry="main", constants=None, name=None):
        import threading

        self.threads.append(threading.current_thread().name)
        return super().compile(source, entry, constants, name)


class TogetherCPU(TimedCPU):
    """TimedCPU with a Dawn-like batch: inside `compile_together`, programs come back without a handle and are
    built when the block ends; a program whose name holds `fail` does not build."""

    def __init__(self) -> None:
        super().__init__()
        self.batch = None
        self.built_at_exit = 0

    def compile_together(self):
        from contextlib import contextmanager

        from tilewise.devices.base import CompileBatch

        @contextmanager
        def block():
            self.batch = CompileBatch()
            try:
                yield self.batch
            finally:
                batch, self.batch = self.batch, None
                for p in batch.programs:
                    if "fail" in p.name:
                        batch.errors[id(p)] = ShaderCompileError(f"{p.name}: no such pipeline", "fix it")
                    else:
                        p.handle, p.meta["pending"] = p.meta.pop("pending"), False
                        self.built_at_exit += 1

        return block()

    def compile(self, source, entry="main", constants=None, name=None):
        prog = super().compile(source, entry, constants, name)
        if self.batch is not None:
            prog.meta["pending"], prog.handle = prog.handle, None
            self.batch.programs.append(prog)
        return prog


class TinyDefault(Tiny):
    """Tiny with the base class's precompile; T = 4 also builds a second program (a reduction) that fails to build
    inside a batch."""

    precompile = KernelTemplate.precompile

    def compile(self, device, config, shape):
        prog = super().compile(device, config, shape)
        if config.T == 4:
            prog.meta["reduce"] = device.compile(tiny_kernel, constants=dict(config), name="tiny reduce fail")
        return prog


def test_default_precompile_compiles_a_batch_on_the_devices_threads_and_keeps_each_configs_error():
    tpl, dev = TinyDefault(), ThreadedCPU()
    res = tune(tpl, dev, SHAPE, batch=8, measure_kw=FAST)
    assert dev.compiles_in_parallel() and not any(t == "MainThread" for t in dev.threads)
    assert sorted(tpl.compiled) == sorted(f"T={p['T']},BUG={p['BUG']}" for p in POINTS)  # each config once
    rows = by_key(res)
    assert rows["T=8,BUG=0"].status == "compile_error" and "9 registers" in rows["T=8,BUG=0"].reason
    assert rows["T=2,BUG=1"].status == "wrong" and rows["T=1,BUG=0"].status == "ok"
    assert rows["T=4,BUG=0"].status == "ok"  # its reduction builds at once here


def test_default_precompile_inside_the_devices_batch_gives_each_config_its_own_programs_error():
    tpl, dev = TinyDefault(), TogetherCPU()
    assert dev.compile_workers == 1 and dev.compiles_in_parallel()
    res = tune(tpl, dev, SHAPE, batch=8, measure_kw=FAST)
    rows = by_key(res)
    assert rows["T=4,BUG=0"].status == "compile_error"  # its second program did not build
    assert rows["T=4,BUG=0"].reason.startswith("tiny reduce fail: no such pipeline")
    assert rows["T=8,BUG=0"].status == "compile_error" and "9 registers" in rows["T=8,BUG=0"].reason
    assert rows["T=1,BUG=0"].status == "ok" and rows["T=2,BUG=0"].status == "ok" and rows["T=2,BUG=1"].status == "wrong"
    assert dev.built_at_exit == 4  # T=1, T=2 twice and T=4's main program, all when the block ended
    assert sorted(tpl.compiled) == sorted(f"T={p['T']},BUG={p['BUG']}" for p in POINTS)


def test_default_precompile_does_nothing_for_one_config_or_a_serial_compiler():
    tpl = TinyDefault()
    assert tpl.precompile(ThreadedCPU(), [tpl.space().config(T=1, BUG=0)], SHAPE) == {}
    assert not TimedCPU().compiles_in_parallel()
    assert tpl.precompile(TimedCPU(), [tpl.space().config(**p) for p in POINTS], SHAPE) == {}
    assert tpl.compiled == []


def test_a_device_lost_during_a_batch_compile_stops_the_tune_instead_of_failing_a_config():
    from tilewise.errors import DeviceLost

    class Losing(TinyDefault):
        def compile(self, device, config, shape):
            if config.T == 2 and config.BUG == 1:
                raise DeviceLost("the GPU fell off the bus", "restart")
            return super().compile(device, config, shape)

    with pytest.raises(DeviceLost, match="fell off"):
        tune(Losing(), ThreadedCPU(), SHAPE, batch=8, measure_kw=FAST)


def test_a_grids_legal_configs_are_counted_once_per_template_space_and_limits(monkeypatch):
    from tilewise.tune import tuner as tuner_mod
    from tilewise.tune.search import Budget

    class Counted(dict):
        def __setitem__(self, key, value):
            self.stores = getattr(self, "stores", 0) + 1
            super().__setitem__(key, value)

    memo = Counted()
    monkeypatch.setattr(tuner_mod, "_LEGAL_IN_GRID", memo)
    tpl = Graded()
    for shape in (SHAPE, (16, 16, 32)):  # two shapes, one count
        res = tune(tpl, TimedCPU(), shape, space="full", strategy="climb", budget=Budget(count=4), measure_kw=FAST)
        assert res.illegal_in_grid == 0  # every config of the graded grid is legal
    assert memo.stores == 1 and list(memo.values()) == [72]
