"""Tuning through a local Ray cluster of two lavapipe workers: the same stored configs and statuses as a local run,
and a worker that dies costs only its in-flight batch (retried on the other worker)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="tilewise[ray] is not installed")

from tilewise.errors import DeviceLost  # noqa: E402
from tilewise.kernels.registry import get_template  # noqa: E402
from tilewise.tune.cluster import Cluster  # noqa: E402
from tilewise.tune.engine import Engine, Item  # noqa: E402
from tilewise.tune.store import Store  # noqa: E402
from tilewise.tune.tuner import tune  # noqa: E402

pytestmark = pytest.mark.webgpu
SHAPE = (33, 36, 20)
MEASURE = {"warmup": 1, "min_rounds": 3, "max_rounds": 3, "budget_s": 1.0}


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def cluster(ray_cluster, webgpu_device):
    c = Cluster()
    c.start("webgpu", ["webgpu"], "tuning gemm", count=2)
    yield c
    c.close()


def _rows(store: Store) -> dict[str, str]:
    return {r.config: r.status for r in store.query()}


def test_cluster_tune_stores_what_a_local_run_stores(cluster, webgpu_device, tmp_path):
    tpl = get_template("gemm", "webgpu")
    local = Store(tmp_path / "local.sqlite")
    tune(tpl, webgpu_device, SHAPE, space="seed", store=local, batch=4, final_race=3, measure_kw=MEASURE, seed=3)
    remote = Store(tmp_path / "remote.sqlite")
    fp = webgpu_device.info.fingerprint
    assert set(cluster.groups()) == {fp}
    eng = cluster.engine(fp, remote, seed=3, measure_kw=MEASURE)
    got = tune(tpl, eng.device, SHAPE, space="seed", store=remote, batch=4, final_race=3, engine=eng)
    assert _rows(remote) == _rows(local) and len(_rows(local)) >= 8
    assert {r.fingerprint for r in remote.query()} == {fp}
    measured = [r for r in remote.query() if r.status != "illegal"]
    assert {r.worker for r in measured} == {w.name for w in cluster.workers}  # both workers measured
    assert all(r.worker is None for r in remote.query() if r.status == "illegal")  # refused in the driver
    assert got.best is not None and got.best.worker in {w.name for w in cluster.workers}
    again = cluster.engine(fp, remote, seed=3, measure_kw=MEASURE)  # a resumed run sends nothing
    items = [Item(tpl, r.config, SHAPE) for r in got.rows]
    assert all(oc.cached or oc.status == "illegal" for oc in again.evaluate(items, batch=4))


def test_a_dead_worker_loses_only_its_batch(cluster, webgpu_device, tmp_path):
    tpl = get_template("gemm", "webgpu")
    legal = tpl.space("seed").legal(webgpu_device.info.limits)
    items = [Item(tpl, c, SHAPE) for c in legal]
    store = Store(tmp_path / "r.sqlite")
    eng = cluster.engine(webgpu_device.info.fingerprint, store, seed=1, measure_kw=MEASURE)
    first = eng.evaluate(items[:4], batch=2)
    before = {r.config: (r.status, r.median_ms, r.worker) for r in store.query()}
    survivor, victim = cluster.workers
    ray.kill(victim.actor)  # the driver learns of it when its next batch fails
    rest = eng.evaluate(items[4:], batch=2)
    assert [oc.status for oc in first + rest] == ["ok"] * len(items)  # retried, not failed
    assert {oc.worker for oc in rest} == {survivor.name}
    after = {r.config: (r.status, r.median_ms, r.worker) for r in store.query()}
    assert {k: after[k] for k in before} == before and len(after) == len(items)


def test_every_worker_dead_stores_nothing_and_says_so(cluster, webgpu_device, tmp_path):
    tpl = get_template("gemm", "webgpu")
    legal = tpl.space("seed").legal(webgpu_device.info.limits)
    store = Store(tmp_path / "r.sqlite")
    eng = cluster.engine(webgpu_device.info.fingerprint, store, seed=1, measure_kw=MEASURE)
    for w in cluster.workers:
        ray.kill(w.actor)
    with pytest.raises(DeviceLost, match="every worker"):
        eng.evaluate([Item(tpl, c, SHAPE) for c in legal[:4]], batch=2)
    assert len(store) == 0  # an infrastructure failure is never stored as a property of the configs


def test_local_engine_rows_have_no_worker(webgpu_device, tmp_path):
    tpl = get_template("gemm", "webgpu")
    store = Store(tmp_path / "r.sqlite")
    c = tpl.space("seed").legal(webgpu_device.info.limits)[0]
    Engine(webgpu_device, store, measure_kw=MEASURE).evaluate([Item(tpl, c, SHAPE)])
    assert [r.worker for r in store.query()] == [None]
