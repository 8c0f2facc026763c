"""The CUDA GEMM template's tuner hooks without a GPU: its verify shape, its C restore per buffer, and a whole
`tune` of the real `CudaGemm` on a fake CUDA device (numpy stands in for the kernel, cuBLAS and CuPy)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from tilewise.devices.base import Buffer, Program
from tilewise.devices.cpu import CPUDevice
from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.cuda import VERIFY_SHAPE, CudaGemm
from tilewise.tune.tuner import tune

SM90 = get_profile("sm_90")
REAL = (1024, 1024, 1024)


def test_verify_shape_has_partial_tiles_for_every_legal_config():
    tpl = CudaGemm()
    legal = tpl.space("full").legal(SM90)
    assert len(legal) > 1000
    M, N, K = VERIFY_SHAPE
    for c in legal:
        assert tpl.verify_shape(c, (4096, 4096, 4096)) == VERIFY_SHAPE
        assert M % c.BM and N % c.BN and K % c.BK  # a partial tile in every dimension
        assert M > c.BM and N > c.BN and K > c.BK  # and more than one tile: interior and edge blocks both run


@pytest.mark.parametrize("shape,expect", [
    ((4096, 4096, 4096), VERIFY_SHAPE),
    ((346, 2560, 1024), VERIFY_SHAPE),  # 1.8 GFLOP: worth the smaller check
    ((256, 256, 256), (256, 256, 256)),  # already cheaper than the verify shape
    ((517, 1036, 388), (517, 1036, 388)),
    ((1, 8192, 8192), (1, 8192, 8192)),  # 134 MFLOP
])
def test_verify_shape_only_when_cheaper(shape, expect):
    tpl = CudaGemm()
    kernel7 = next(iter(tpl.space("seed")))
    assert tpl.verify_shape(kernel7, shape) == expect


def test_beta_restore_keeps_each_buffer_sets_own_c(rng):
    # verification and timing hold buffers of two shapes at once; poisoning one must restore its own C
    dev = CPUDevice()
    tpl = CudaGemm(alpha=1.0, beta=0.5)
    small, big = (5, 8, 4), (9, 12, 8)
    h_small, h_big = tpl.make_inputs(small, rng), tpl.make_inputs(big, rng)
    b_small = tpl.upload(dev, h_small, small)
    b_big = tpl.upload(dev, h_big, big)
    dev.write(b_small["out"], rng.standard_normal(40).astype(np.float32))  # a kernel wrote over C
    tpl.poison(dev, b_small, small)
    np.testing.assert_array_equal(tpl.read_output(dev, b_small, small), h_small["c"])
    tpl.poison(dev, b_big, big)
    np.testing.assert_array_equal(tpl.read_output(dev, b_big, big), h_big["c"])


class FakeCuda(CPUDevice):
    """sm_90 limits; `compile` records its thread; kernels run as numpy SGEMM; cuBLAS through `_cp = numpy`.

    `time` returns a fixed fake time per program (no work), recording names and (M, N, K) per call.
    """

    timer = "fake"
    _cp = np

    def __init__(self) -> None:
        super().__init__()
        self.info = dataclasses.replace(self.info, backend="cuda", api="CUDA", name="fake sm_90", limits=SM90)
        self.compile_threads: list[str] = []
        self.runs: list[tuple[str, tuple[int, int, int]]] = []
        self.timed: list[list[tuple[str, tuple[int, int, int]]]] = []
        self.noise = np.random.default_rng(3)

    def compile(self, source, entry="main", constants=None, name=None):
        self.compile_threads.append(threading.current_thread().name)
        ms = 1.0 + 0.01 * (constants["BM"] * constants["BN"] % 97)  # distinct, deterministic fake speeds
        return Program(name or entry, entry, "h", dict(constants or {}), {"mean_ms": ms})

    @staticmethod
    def _mnk(launch):
        return tuple(int(x) for x in launch.buffers[:3])

    def _call(self, launch):
        args = [b.handle if isinstance(b, Buffer) else b for b in launch.buffers]
        if launch.program.meta.get("callable"):
            launch.program.handle(*args)  # the cuBLAS peer: np.matmul on views of the buffers
            return
        M, N, K, alpha, a, b, beta, out = args
        M, N, K = int(M), int(N), int(K)
        c = out.view(np.float32)[: M * N].reshape(M, N)
        prod = a.view(np.float32)[: M * K].reshape(M, K) @ b.view(np.float32)[: K * N].reshape(K, N)
        c[:] = np.float32(alpha) * prod + (np.float32(beta) * c if float(beta) != 0.0 else 0.0)

    def run(self, launches):
        for launch in launches:
            self.runs.append((launch.program.name, self._mnk(launch)))
            self._call(launch)

    def time(self, launches):
        self.timed.append([(launch.program.name, self._mnk(launch)) for launch in launches])
        return np.array([launch.program.meta.get("mean_ms", 0.9) * (1 + 0.01 * self.noise.standard_normal())
                         for launch in launches])


def test_tune_cuda_gemm_precompiles_per_batch_verifies_small_times_real_and_races_cublas(monkeypatch):
    monkeypatch.delenv("CUPY_TF32", raising=False)
    tpl, dev = CudaGemm(), FakeCuda()
    batches = []
    real_precompile = tpl.precompile

    def spy(device, configs, shape, workers=None):
        batches.append(list(configs))
        return real_precompile(device, configs, shape, workers=2)

    monkeypatch.setattr(tpl, "precompile", spy)
    fast = {"warmup": 0, "min_rounds": 5, "max_rounds": 5}
    res = tune(tpl, dev, REAL, space="seed", batch=5, final_race=4, measure_kw=fast, peer=True)
    legal = [r.config for r in res.rows if r.status != "illegal"]
    assert len(legal) == 14 and [len(b) for b in batches] == [5, 5, 4]
    assert [c for b in batches for c in b] == legal
    # NVRTC's stand-in ran on the pool's threads, once per config (the final race reused the programs)
    assert len(dev.compile_threads) == 14 and not any(t == "MainThread" for t in dev.compile_threads)
    # every kernel run outside timing is a verification at the small shape; every timed launch is at REAL
    assert {mnk for _, mnk in dev.runs} == {VERIFY_SHAPE} and len(dev.runs) == 14
    assert {mnk for call in dev.timed for _, mnk in call} == {REAL}
    assert all(r.status == "ok" and r.verified_shape == VERIFY_SHAPE and r.reason.startswith("verified at 517x1036x388")
               for r in res.rows if r.status != "illegal")
    # the final race: the four fastest plus cuBLAS, in every round
    race = [call for call in dev.timed if "cublas_sgemm" in [n for n, _ in call]]
    assert len(race) == 5 and all(len(call) == 5 for call in race)
    assert res.peer is not None and res.peer.name == "cuBLAS"
    raced = [r for r in res.ranked if r.pct_of_peer is not None]
    assert len(raced) == 4
    for r in raced:
        assert r.pct_of_peer == pytest.approx(100 * res.peer.stats.median_ms / r.stats.median_ms)
