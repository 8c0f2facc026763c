"""The TVM CPU conv1d template on the tvm-llvm device: every ladder rung and random legal schedules give every
output value of np.convolve; rules and shape refusals; a clear message when TVM is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tilewise.errors import DeviceUnavailable
from tilewise.kernels.conv1d.tvm_llvm import TvmConv1d, tvm_conv1d_space
from tilewise.tune.verify import compare


@pytest.fixture(scope="module")
def tvm_device():
    pytest.importorskip("tvm")
    from tilewise.devices.tvm_llvm import TVMLLVMDevice

    return TVMLLVMDevice()


def _check(dev, tpl, cfg, shape, rng):
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    dev.run(tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape))
    return compare(tpl.read_output(dev, bufs, shape), tpl.reference(host, shape), "f32")


def test_ladder_rungs_compute_the_full_convolution(tvm_device, rng):
    from tilewise.ladder import LADDERS

    tpl, spec = TvmConv1d(), LADDERS["conv1d-cpu"]
    sp = tpl.space()
    for shape in [(200, 16), (1000, 24)]:  # output lengths 215 and 1023: never a multiple of the 32-wide split
        for rung in spec.rungs:
            cfg = spec.rung_config(sp, rung)
            assert sp.why_illegal(cfg) == [] and tpl.shape_problems(cfg, shape) == []
            check = _check(tvm_device, tpl, cfg, shape, rng)
            assert check.ok, f"{rung.name} at {shape}: {check.message}"


def test_random_legal_schedules_are_correct(tvm_device, rng):
    tpl = TvmConv1d()
    shape = (300, 32)
    configs = [c for c in tpl.space().sample(12, seed=3) if not tpl.shape_problems(c, shape)]
    assert len(configs) >= 6
    for cfg in configs:
        check = _check(tvm_device, tpl, cfg, shape, rng)
        assert check.ok, f"{cfg}: {check.message}"


def test_schedule_choices_reach_the_generated_tir(tvm_device):
    tpl = TvmConv1d()
    sp = tpl.space()
    base = dict(XO=32, KI=8, ORDER="k_n", VEC=True, CACHE=True, PAD="root")
    root = tpl.source(sp.config(base), (1000, 16))
    at = tpl.source(sp.config({**base, "PAD": "compute_at"}), (1000, 16))
    inline = tpl.source(sp.config({**base, "PAD": "inline"}), (1000, 16))
    assert "T.vectorized(32)" in root and "B_local" in root
    assert 'sblock("Apad")' in root and 'sblock("Apad")' in at and 'sblock("Apad")' not in inline
    # compute_at: Apad is produced inside the output-tile loop, so its loop is nested under n_0
    assert at.index("for n_0") < at.index('sblock("Apad")')
    assert root.index('sblock("Apad")') < root.index("for n_0")


def test_rules_and_refusals():
    sp, tpl = tvm_conv1d_space(), TvmConv1d()
    bad = sp.config(XO=1, KI=4, ORDER="n_k", VEC=True, CACHE=False, PAD="compute_at")
    assert sp.why_illegal(bad) == [
        "vectorize_innermost: VEC needs n_i innermost and longer than 1: ORDER = n_k, XO = 1",
        "compute_at_needs_split: PAD = compute_at with XO = 1 recomputes N-1 padded inputs per output "
        "(no output tile to attach to)"]
    ok = sp.config(XO=32, KI=8, ORDER="k_n", VEC=True, CACHE=False, PAD="root")
    assert tpl.shape_problems(ok, (100, 12)) == [
        "reduction_split: N % KI = 12 % 8 = 4 != 0 (a predicated reduction loop)"]
    assert "longer than the input" in tpl.shape_problems(ok, (8, 16))[0]


def test_missing_tvm_names_the_install_command(monkeypatch):
    from tilewise.devices import tvm_llvm

    monkeypatch.setitem(sys.modules, "tvm", None)  # makes `import tvm` raise ImportError
    with pytest.raises(DeviceUnavailable) as info:
        tvm_llvm.import_tvm()
    assert "Apache TVM is not installed" in info.value.problem
    assert "pip install 'tilewise[tvm]'" in info.value.fix and "apache-tvm==0.27.0.post1" in info.value.fix
    with pytest.raises(DeviceUnavailable):
        tvm_llvm.TVMLLVMDevice()


def test_device_buffers_are_aligned_and_round_trip(tvm_device, rng):
    data = rng.standard_normal(37).astype(np.float32)
    buf = tvm_device.upload(data)
    assert buf.handle.ctypes.data % 64 == 0
    np.testing.assert_array_equal(tvm_device.download(buf, np.float32, (37,)), data)
