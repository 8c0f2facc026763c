"""CUDA event timing: the host's launch time stays out of every sample, and L2 is flushed where a run starts."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tilewise.devices.base import Launch
from tilewise.devices.cuda_hold import HOLD_LAUNCHES

pytestmark = pytest.mark.cuda

SRC = r"""extern "C" __global__ void affine(const float *x, float *y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 1.5f * x[i] + 0.25f;
}"""
N = 1 << 16


@pytest.fixture(scope="module")
def affine(dev):
    rng = np.random.default_rng(11)
    x = rng.standard_normal(N).astype(np.float32)
    bx, by = dev.allocate(x.nbytes), dev.allocate(x.nbytes)
    dev.write(bx, x)
    prog = dev.compile(SRC, "affine")
    prog.meta["block"] = (256, 1, 1)
    launch = Launch(prog, (N // 256, 1, 1), [bx, by, np.int32(N)])
    dev.run([launch])
    # every value; atol for the values near zero, where the GPU's fused multiply-add rounds once
    np.testing.assert_allclose(dev.download(by, np.float32, (N,)), 1.5 * x + 0.25, rtol=1e-6, atol=1e-6)
    return launch


def test_a_slow_host_does_not_lengthen_a_sample(dev, affine, monkeypatch):
    # a few-microsecond kernel; without the hold each sample would also hold the host's ~0.2 ms before its launch
    plain = np.median(dev.time([affine] * 40, flush_l2=False))
    launch = dev._launch

    def slow(step, pdl=False):
        time.sleep(200e-6)
        return launch(step, pdl)

    monkeypatch.setattr(dev, "_launch", slow)
    before = dev._hold.timeouts
    slowed = np.median(dev.time([affine] * 40, flush_l2=False))
    assert slowed < plain + 0.05, (plain, slowed)
    assert dev._hold.timeouts == before


def test_l2_is_flushed_where_a_run_starts_only(dev, affine, monkeypatch):
    dev._flush_buf = None  # allocated by the first flush: before the hold, or the host would wait for the GPU
    before = dev._hold.timeouts if dev._hold else 0
    flushes = []
    flush = dev._flush
    monkeypatch.setattr(dev, "_flush", lambda: (flushes.append(1), flush()))
    assert dev.time([affine] * 6, flush_l2=True, runs=[0, 3]).shape == (6,)
    assert len(flushes) == 2  # one a run
    dev.time([affine] * 6, flush_l2=True)
    assert len(flushes) == 2 + 6  # without runs every launch is its own run
    dev.time([affine] * 6, flush_l2=False, runs=[0, 3])
    assert len(flushes) == 8
    assert dev._hold.timeouts == before


def test_a_library_calls_first_call_runs_before_the_hold(dev, affine):
    """A library call (cuBLAS through CuPy) makes its buffers at its first call; an allocation may wait for the GPU,
    so that call runs before the hold, and the hold never waits for it."""
    from tilewise.devices.base import Program

    cp = dev._cp
    made = []

    def alloc_and_fill(n):
        if not made:
            made.append(cp.empty(int(n), dtype=cp.float32))
        made[0].fill(1.0)

    lib = Launch(Program("alloc_and_fill", alloc_and_fill, "test", meta={"callable": True}), (1, 1, 1),
                 [np.int32(1 << 24)])
    before = dev._hold.timeouts if dev._hold else 0
    ms = dev.time([affine, lib, affine, lib], flush_l2=False)
    assert ms.shape == (4,) and np.all(ms > 0) and len(made) == 1
    assert dev._hold.timeouts == before


def test_batches_longer_than_one_hold_time_every_launch(dev, affine):
    before = dev._hold.timeouts if dev._hold else 0
    ms = dev.time([affine] * (2 * HOLD_LAUNCHES + 7), flush_l2=False)
    assert ms.shape == (2 * HOLD_LAUNCHES + 7,) and np.all(ms > 0)
    assert dev._hold.timeouts == before
