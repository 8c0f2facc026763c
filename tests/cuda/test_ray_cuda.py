"""Cubins compiled without the GPU, on a real NVIDIA GPU: `load_compiled` gives the program `compile` gives (same key,
same resource meta, the same right answer), and a Ray tune whose compiles ran on CPU tasks stores the statuses (and
refusal reasons) a local run stores, with nothing compiled in the GPU worker. Skips without CuPy, a GPU, libnvrtc
or Ray."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tilewise.devices.cuda_nvrtc import compile_cubin, find_nvrtc
from tilewise.kernels.gemm.cuda import CudaGemm, _source, name_expression
from tilewise.tune.verify import compare

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(find_nvrtc() is None, reason="libnvrtc not found")]
MEASURE = {"warmup": 1, "min_rounds": 3, "max_rounds": 3, "budget_s": 1.0}
META = ("registers", "local_bytes", "static_shared_bytes", "max_threads_per_block", "entry", "options")


def test_a_loaded_cubin_is_the_program_compile_gives(dev):
    tpl = CudaGemm()
    cfg = random.Random(7).choice(tpl.space("seed").legal(dev.info.limits))
    entry = name_expression(cfg)
    shipped = compile_cubin(_source(), entry, dev.options)
    loaded = dev.load_compiled(shipped, "shipped", dict(cfg))
    local = dev.compile(_source(), entry=entry, constants=dict(cfg), name="local")
    assert loaded.source_hash == local.source_hash
    assert {k: loaded.meta[k] for k in META} == {k: local.meta[k] for k in META}
    assert dev.load_compiled(shipped).handle is not None and len(dev._cubins) >= 1  # cached per cubin
    rng = np.random.default_rng(3)
    shape = (131, 68, 44)
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    loaded.meta["block"] = (cfg.NT, 1, 1)
    dev.run(tpl.launches(loaded, bufs, cfg, shape))
    chk = compare(tpl.read_output(dev, bufs, shape), tpl.reference(host, shape), "f32")
    assert chk.ok, chk.message


def test_a_cubin_of_other_options_is_refused(dev):
    shipped = compile_cubin(_source(), name_expression(CudaGemm().space("seed").legal(dev.info.limits)[0]),
                            (*dev.options, "-DOTHER=1"))
    with pytest.raises(ValueError, match="compiled with"):
        dev.load_compiled(shipped)


def test_a_ray_tune_with_cpu_compiles_stores_what_a_local_run_stores(dev, tmp_path):
    ray = pytest.importorskip("ray", reason="tilewise[ray] is not installed")
    if not hasattr(ray, "init"):
        pytest.skip(f"`ray` here is an empty namespace package ({list(ray.__path__)}), not Ray")
    from tilewise.tune.cluster import Cluster
    from tilewise.tune.store import Store
    from tilewise.tune.tuner import tune

    tpl, shape = CudaGemm(), (200, 264, 132)
    local = Store(tmp_path / "local.sqlite")
    tune(tpl, dev, shape, space="seed", store=local, batch=4, final_race=3, measure_kw=MEASURE, seed=3)
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        cluster = Cluster()
        (worker,) = cluster.start("cuda", ["cuda"], "tuning gemm", count=1)
        remote = Store(tmp_path / "remote.sqlite")
        eng = cluster.engine(worker.info.fingerprint, remote, seed=3, measure_kw=MEASURE)
        assert eng.cpu_compiles
        got = tune(tpl, eng.device, shape, space="seed", store=remote, batch=4, final_race=3, engine=eng)
        counts = ray.get(worker.actor.compile_counts.remote())
        cluster.close()
    finally:
        ray.shutdown()
    def statuses(store: Store) -> dict[str, tuple[str, str | None]]:  # errors' reasons too; ok rows' numbers vary
        return {r.config: (r.status, r.message if r.status in ("illegal", "compile_error") else None)
                for r in store.query()}

    rows = statuses(remote)
    assert rows == statuses(local)
    assert got.best is not None and counts["compiled"] == 0 and counts["loaded"] >= len(rows) // 2


def test_tune_model_on_cuda_through_ray_writes_the_table_the_executor_runs(dev, tmp_path, monkeypatch):
    """`tilewise tune model --device cuda --ray` on a local cluster: its kernels compiled in CPU tasks, verified and
    timed by the GPU worker; the table it writes is this GPU's and the executor's scores match the CPU's."""
    ray = pytest.importorskip("ray", reason="tilewise[ray] is not installed")
    if not hasattr(ray, "init"):
        pytest.skip(f"`ray` here is an empty namespace package ({list(ray.__path__)}), not Ray")
    import argparse

    import tilewise
    from tilewise.cli import tune_model as tune_model_cli
    from tilewise.model.dispatch import dispatch_path, load_model_table
    from tilewise.tune.cluster import LOCAL
    from tilewise.tune.store import Store

    monkeypatch.setenv("TILEWISE_DISPATCH_DIR", str(tmp_path))
    store = tmp_path / "s.sqlite"
    args = argparse.Namespace(preset="tiny", seq=40, weights="nf4", device="cuda", budget=2, seed=0, json=None,
                              rows=[1, 40], force=False, hand_picked=False, ray=LOCAL, workers=1, store=str(store))
    assert tune_model_cli.run(args) == 0
    fp = dev.info.fingerprint
    table = load_model_table(fp, dispatch_path(fp), limits=dev.info.limits, backend="cuda")
    assert {"attention:4x2x16", "shortconv:64x3"} <= set(table.entries) and len(table.entries) == 7
    with Store(store, readonly=True) as st:
        rows = st.query(fingerprint=fp)
    assert rows and all(r.worker for r in rows)  # measured by the cluster's worker, not in this process
    model = tilewise.load("tiny", device="cuda", weights="nf4", seed=1)
    cpu = tilewise.load("tiny", device="cpu", weights="nf4", seed=1)
    ids = np.random.default_rng(5).integers(0, 512, 40)
    want = cpu.scores(cpu.prefill(ids))
    np.testing.assert_allclose(model.scores(model.prefill(ids)), want, atol=2e-2 * max(1.0, float(np.abs(want).max())),
                               rtol=0)
