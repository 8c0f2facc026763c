"""A Ray run's CUDA compiles fan out to CPU tasks: on a local cluster, real NVRTC compiles in Ray tasks, and a GPU
worker whose device is a stand-in (this machine has no GPU) receives every kernel as a cubin and compiles none; a
config NVRTC refuses is stored as the same `compile_error` with the same reason a local compile gives."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="tilewise[ray] is not installed")

from tilewise.devices.base import Buffer, DeviceInfo, HostDevice, Program  # noqa: E402
from tilewise.devices.cuda_nvrtc import compile_cubin, find_nvrtc, nvrtc_options  # noqa: E402
from tilewise.devices.profiles import PROFILES  # noqa: E402
from tilewise.errors import LaunchError, ShaderCompileError  # noqa: E402
from tilewise.kernels.gemm import cuda as cuda_gemm  # noqa: E402
from tilewise.tune.cluster import Cluster, DeviceWorker, Worker  # noqa: E402
from tilewise.tune.engine import Item  # noqa: E402
from tilewise.tune.store import Store  # noqa: E402

pytestmark = pytest.mark.skipif(find_nvrtc() is None, reason="libnvrtc not found")
SHAPE = (40, 36, 24)
REFUSAL = '\nstatic_assert(sizeof(float) == 0, "refused_for_the_test");\n'
NO_KERNELS = "the stand-in GPU runs no kernels"


class RefusingGemm(cuda_gemm.CudaGemm):
    """The CUDA gemm whose source NVRTC refuses for configs with BK == 8 (a refusal the rules do not see)."""

    def compile(self, device: Any, config: Any, shape: Any) -> Program:
        src = cuda_gemm._source() + (REFUSAL if config.BK == 8 else "")
        prog = device.compile(src, entry=cuda_gemm.name_expression(config), constants=dict(config),
                              name=f"gemm_cuda[{config}]")
        prog.meta["block"] = (config.NT, 1, 1)
        return prog


class StandInGpu(HostDevice):
    """Host memory and sm_90 limits; records what it was asked to compile and load, and runs nothing."""

    def __init__(self) -> None:
        self.info = DeviceInfo("cuda", "stand-in GPU", "discrete", "CUDA", "0", "test", PROFILES["sm_90"])
        self.options = nvrtc_options("9.0")
        self.compiled: list[str] = []
        self.loaded: list[tuple[str, bytes]] = []

    def allocate(self, nbytes: int, *, uniform: bool = False) -> Buffer:
        return Buffer(self, np.zeros(max(4, nbytes), np.uint8), max(4, nbytes), uniform)

    def compile(self, source, entry="main", constants=None, name=None):
        self.compiled.append(entry)
        raise ShaderCompileError(f"{entry} was compiled on the GPU worker", "ship it")

    def load_compiled(self, compiled, name=None, constants=None):
        self.loaded.append((compiled.lowered_name, compiled.cubin[:4]))
        return Program(name or compiled.entry, None, compiled.key, dict(constants or {}), {"registers": 40})

    def _call(self, launch):
        raise LaunchError(NO_KERNELS, "run on a GPU")


class StandInWorker(DeviceWorker):
    def __init__(self) -> None:
        self.device = StandInGpu()
        self.name = "host/stand-in/1"
        self._setup()

    def record(self) -> tuple[list[str], list[tuple[str, bytes]]]:
        return self.device.compiled, self.device.loaded


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import a test module
    c = Cluster()
    actor = ray.remote(StandInWorker).options(num_cpus=1, max_restarts=0).remote()
    name, info, feats = ray.get(actor.describe.remote())
    c.workers.append(Worker(actor, name, info, feats))
    yield c, actor
    c.close()
    ray.shutdown()


def test_cuda_compiles_run_on_cpu_tasks_and_the_worker_only_loads(cluster, tmp_path):
    c, actor = cluster
    tpl = RefusingGemm()
    legal = tpl.space("seed").legal(PROFILES["sm_90"])
    good = [cfg for cfg in legal if cfg.BK != 8][:2]
    bad = [cfg for cfg in legal if cfg.BK == 8][:1]
    assert len(good) == 2 and len(bad) == 1
    store = Store(tmp_path / "r.sqlite")
    eng = c.engine(c.workers[0].info.fingerprint, store, seed=2)
    assert eng.cpu_compiles and eng.compile_slots == 1  # two CPUs, one held by the worker
    got = eng.evaluate([Item(tpl, cfg, SHAPE) for cfg in [*good, *bad]], batch=2)
    compiled, loaded = ray.get(actor.record.remote())
    assert compiled == []  # nothing compiled where the device is
    lowered = {compile_cubin(cuda_gemm._source(), cuda_gemm.name_expression(cfg), nvrtc_options("9.0")).lowered_name
               for cfg in good}
    assert {name for name, _ in loaded} == lowered and {magic for _, magic in loaded} == {b"\x7fELF"}
    assert ray.get(actor.compile_counts.remote()) == {"loaded": 3, "compiled": 0}
    assert [oc.status for oc in got] == ["launch_error", "launch_error", "compile_error"]
    with pytest.raises(ShaderCompileError) as local:  # what a local compile of the refused config says
        compile_cubin(cuda_gemm._source() + REFUSAL, cuda_gemm.name_expression(bad[0]), nvrtc_options("9.0"),
                      label=f"gemm_cuda[{bad[0]}]")
    rows = {r.config: r for r in store.query()}
    assert rows[bad[0].key()].status == "compile_error"
    assert rows[bad[0].key()].message == str(local.value.problem)
    assert all(NO_KERNELS in rows[cfg.key()].message for cfg in good)
