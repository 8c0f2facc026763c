"""The tuner end to end on lavapipe: ranking, JSON contract, failures as results, resume, sweep + dispatch."""

import json

import numpy as np
import pytest

from tilewise.cli import main
from tilewise.errors import ConfigError
from tilewise.kernels.gemm.webgpu import WgslGemm
from tilewise.tune.dispatch import DispatchTable, dispatch_table, lookup, sweep
from tilewise.tune.measure import measure, tie_groups
from tilewise.tune.store import Store
from tilewise.tune.tuner import tune

pytestmark = pytest.mark.webgpu
FAST = {"warmup": 1, "min_rounds": 6, "max_rounds": 6}
SHAPE = (64, 64, 32)


class Sabotaged(WgslGemm):
    """Breaks three seed configs on purpose: one computes a wrong value, one does not compile, one cannot launch."""

    def launches(self, program, bufs, config, shape):
        out = super().launches(program, bufs, config, shape)
        if config["VEC"] == 1:  # more workgroups than any adapter dispatches in one dimension
            return [out[0]._replace(grid=(10**6, 1, 1))]
        return out

    def source(self, config):
        src = super().source(config)
        if config["BK"] == 8:  # 1% off in a sixteenth of the outputs: a silent, plausible bug
            src = src.replace("= acc_0_0_0_0; }", "= acc_0_0_0_0 * 1.01; }", 1)
        if config["BK"] == 32:
            src = src.replace("workgroupBarrier();", "workgroupBarrier(;", 1)
        return src


def test_tune_ranks_stores_and_reports_failures(webgpu_device, tmp_path):
    store = Store(tmp_path / "s.sqlite")
    res = tune(Sabotaged(), webgpu_device, SHAPE, space="seed", store=store, measure_kw=FAST)
    by_status = {}
    for r in res.rows:
        by_status.setdefault(r.status, []).append(r)
    assert len(by_status["illegal"]) == 2
    assert all(r.reason.split(":")[0] in ("threads", "vec4_tn") for r in by_status["illegal"])
    (wrong,) = by_status["wrong"]
    assert wrong.config["BK"] == 8 and wrong.rel_err > 1e-4 and wrong.stats is None
    (bad,) = by_status["compile_error"]
    assert bad.config["BK"] == 32 and "\n" not in bad.reason and bad.reason
    (nolaunch,) = by_status["launch_error"]
    assert nolaunch.config["VEC"] == 1 and "max_workgroups_per_dimension" in nolaunch.reason
    ranked = res.ranked
    assert len(ranked) == 11 and all(r.config != wrong.config for r in ranked)
    assert all(r.stats.n >= 6 and r.gflops > 0 for r in ranked)
    meds = [r.stats.median_ms for r in ranked if r.tie_group == ranked[0].tie_group]
    assert ranked[0].tie_group == 1 and min(meds) == ranked[0].stats.median_ms
    stored = {r.config: r.status for r in store.query(kernel="gemm", shape="64x64x32")}
    assert len(stored) == 16 and stored[wrong.config.key()] == "wrong"
    assert stored[nolaunch.config.key()] == "launch_error"


def test_slow_first_run_is_a_timeout(webgpu_device):
    res = tune(WgslGemm(), webgpu_device, SHAPE, space="seed", measure_kw=FAST, timeout_s=1e-9)
    assert {r.status for r in res.rows} == {"illegal", "timeout"}
    assert res.ranked == [] and "timeout" in next(r for r in res.rows if r.status == "timeout").reason


def test_json_contract_and_resume(webgpu_device, tmp_path, capsys):
    st = str(tmp_path / "s.sqlite")
    out = tmp_path / "r.json"
    argv = ["tune", "gemm", "--device", "webgpu", "--shape", "33,36,20", "--store", st, "--json", str(out),
            "--rounds", "5"]
    assert main([*argv, "--plot", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").stat().st_size > 5000
    text = capsys.readouterr().out
    assert "skipped (illegal: threads: threads = (BM/WM)*(BN/WN)*32" in text
    data = json.loads(out.read_text())
    assert list(data) == ["kernel", "device", "shape", "results"]
    assert data["kernel"] == "gemm" and data["shape"] == [33, 36, 20] and data["device"].startswith("webgpu:")
    assert len(data["results"]) == 16
    for r in data["results"]:
        assert list(r) == ["config", "status", "reason", "median_ms", "p20_ms", "p80_ms", "ci95_ms", "gflops",
                           "rel_err", "tie_group"]
    ok = [r for r in data["results"] if r["status"] == "ok"]
    assert ok and ok[0]["tie_group"] == 1 and ok[0]["p20_ms"] <= ok[0]["median_ms"] <= ok[0]["p80_ms"]
    # second run: everything comes from the store (nothing compiled), same answers
    with Store(st) as s:
        before = {r.config: (r.median_ms, r.created) for r in s}
    assert main(argv) == 0
    assert "14 results came from the store" in capsys.readouterr().out
    with Store(st) as s:
        after = {r.config: (r.median_ms, r.created) for r in s if r.status == "ok"}
    assert all(after[k] == before[k] for k in after)


def test_resume_after_crash_measures_only_the_rest(webgpu_device, tmp_path):
    store = Store(tmp_path / "s.sqlite")
    tpl = WgslGemm()
    calls = []

    class Crash(Exception):
        pass

    def crash_after_first_batch(stage, done, total):
        calls.append(stage)
        if stage.startswith("compile+verify") and done >= 4:
            raise Crash

    with pytest.raises(Crash):
        tune(tpl, webgpu_device, SHAPE, space="seed", store=store, batch=4, measure_kw=FAST,
             progress=crash_after_first_batch)
    kept = {r.config for r in store.query(status="ok")}
    assert len(kept) == 4  # the first batch was committed before the crash
    compiled = []

    class Counting(WgslGemm):
        def compile(self, device, config, shape):
            compiled.append(config)
            return super().compile(device, config, shape)

    res = tune(Counting(), webgpu_device, SHAPE, space="seed", store=store, batch=4, measure_kw=FAST, final_race=0)
    assert len(compiled) == 10 and not ({c.key() for c in compiled} & kept)
    assert sum(r.cached for r in res.rows) == 4 and len(res.ranked) == 14


def test_self_tie_on_the_gpu(webgpu_device, rng):
    tpl = WgslGemm()
    cfg = tpl.default_config()
    host = tpl.make_inputs(SHAPE, rng)
    bufs = tpl.upload(webgpu_device, host, SHAPE)
    prog = tpl.compile(webgpu_device, cfg, SHAPE)
    launches = tpl.launches(prog, bufs, cfg, SHAPE)
    m = measure(webgpu_device, {"a": launches, "b": launches}, warmup=2, min_rounds=30, max_rounds=30)
    groups = {k: g for k, _, g in tie_groups(m.stats)}
    assert groups["a"] == groups["b"] == 1


def test_all_illegal_space_is_a_clear_error(webgpu_device):
    class NoneLegal(WgslGemm):
        def shape_problems(self, config, shape):
            return ["pretend: nothing fits"]

    with pytest.raises(ConfigError, match="every config of gemm space 'seed' is illegal"):
        tune(NoneLegal(), webgpu_device, SHAPE, space="seed", measure_kw=FAST)


def test_sweep_and_dispatch_table(webgpu_device, tmp_path):
    tpl = WgslGemm()
    base = tpl.default_config()
    configs = [base.replace(BM=64, NT=64), base]  # 64-row and 128-row tiles
    ms = [1, 40, 64, 65, 100, 128]
    res = sweep(tpl, webgpu_device, ms, 64, 16, configs, store=Store(tmp_path / "s.sqlite"),
                measure_kw={"warmup": 1, "min_rounds": 4, "max_rounds": 4})
    assert not res.failures
    assert res.waste[configs[1]][65] == pytest.approx(128 / 65)
    assert res.waste[configs[0]][65] == pytest.approx(128 / 65) and res.waste[configs[0]][64] == 1.0
    table = dispatch_table(res, 0.03)
    ranges = table["entries"]["gemm:64x16"]["ranges"]
    assert ranges[0]["m_min"] == 1 and ranges[-1]["m_max"] == 128 and all(r["kernel"] == "gemm" for r in ranges)
    for m in ms:  # the table's pick at every measured M is within 3% of that M's best
        pick = lookup(table, m)
        best = min(res.median(c, m) for c in configs)
        chosen = next(c for c in configs if dict(c) == pick)
        assert res.median(chosen, m) <= 1.03 * best


def test_sweep_cli_writes_dispatch_json_and_plot(webgpu_device, tmp_path, capsys):
    out, plot, js = tmp_path / "d.json", tmp_path / "p.png", tmp_path / "s.json"
    code = main(["sweep", "gemm", "--device", "webgpu", "--m", "1..33:16", "--n", "8", "--k", "8",
                 "--configs", "VEC=1;VEC=1,BM=64,NT=64", "--out", str(out), "--plot", str(plot), "--json", str(js),
                 "--store", str(tmp_path / "s.sqlite")])
    assert code == 0
    table = json.loads(out.read_text())
    entry = table["entries"]["gemm:8x8"]
    assert entry["fixed"] == {"N": 8, "K": 8} and entry["measured_m"] == [1, 17, 33]
    loaded = DispatchTable.load(out)  # the format the runtime loads
    assert loaded.device == webgpu_device.info.fingerprint and loaded.pick("gemm:8x8", 17) is not None
    assert plot.stat().st_size > 5000
    rows = json.loads(js.read_text())["results"]
    assert len(rows) == 6 and all(r["median_ms"] > 0 and r["tile_waste"] >= 1 for r in rows)
    assert np.isclose(rows[0]["tile_waste"], 128 * 64 / 8)  # M=1, N=8 in a 128x64 tile


def test_explicit_candidates_replace_the_strategy(webgpu_device):
    tpl = WgslGemm()
    base = tpl.default_config()
    res = tune(tpl, webgpu_device, SHAPE, space="full", configs=[base, base.replace(PF=2), base.replace(NT=256)],
               measure_kw=FAST)
    assert sorted(r.status for r in res.rows) == ["illegal", "ok", "ok"]
    assert {r.config for r in res.ranked} == {base, base.replace(PF=2)}


def test_random_search_over_a_grid_reports_the_illegal_count(webgpu_device):
    from tilewise.tune.search import Budget

    res = tune(WgslGemm(), webgpu_device, (32, 32, 16), space="large", strategy="random", budget=Budget(count=3),
               measure_kw=FAST, seed=2)
    assert len([r for r in res.rows if r.status != "illegal"]) == 3
    space = WgslGemm().space("large")
    assert res.illegal_in_grid == space.size - len(space.legal(webgpu_device.info.limits)) > 0
    assert res.illegal_examples and all(why for _, why in res.illegal_examples)
