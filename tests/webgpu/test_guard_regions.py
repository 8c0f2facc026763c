"""Guard regions: a kernel that writes past the end of its output fails verification as "wrote out of bounds",
even on a bounds-checked device, where without guards the stray write vanishes and the config passes."""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.devices.base import Launch
from tilewise.kernels.base import KernelTemplate, Problem
from tilewise.kernels.space import Space
from tilewise.tune.engine import Engine, Item
from tilewise.tune.store import Store
from tilewise.tune.verify import GUARD_BYTES, Verifier

pytestmark = pytest.mark.webgpu


class Double(Problem):
    """out (N,) = 2 a (N,)."""

    name = "double"
    shape_names = ("N",)
    example_shape = (100,)

    def make_inputs(self, shape, rng):
        return {"a": rng.uniform(0.5, 1.5, shape[0]).astype(np.float32)}  # (N,)

    def reference(self, host, shape):
        return 2.0 * host["a"].astype(np.float64)

    def flops(self, shape):
        return shape[0]

    def bytes_moved(self, shape):
        return 8 * shape[0]

    def output_shape(self, shape):
        return (shape[0],)


class Doubler(KernelTemplate):
    """STRAY=1 also writes out[n], one past the end of the output."""

    problem = Double()
    backend = "webgpu"

    def space(self, which="full"):
        return Space("doubler", {"STRAY": [0, 1]}, [])

    def source(self, config, shape=None):
        stray = "  if (i == n) { out[n] = 7.0; }\n" if config["STRAY"] == 1 else ""
        return ("@group(0) @binding(0) var<storage, read> a: array<f32>;\n"
                "@group(0) @binding(1) var<storage, read_write> out: array<f32>;\n"
                "@group(0) @binding(2) var<uniform> dims: vec4<u32>;\n"
                "@compute @workgroup_size(64)\n"
                "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n"
                "  let i = gid.x; let n = dims.x;\n"
                "  if (i < n) { out[i] = 2.0 * a[i]; }\n" + stray + "}\n")

    def compile(self, device, config, shape):
        return device.compile(self.source(config), name=f"doubler[{config['STRAY']}]")

    def upload(self, device, host, shape):
        n = shape[0]
        return {"a": device.upload(host["a"]), "out": device.allocate(4 * n),
                "dims": device.upload(np.array([n, 0, 0, 0], dtype=np.uint32), uniform=True)}

    def launches(self, program, bufs, config, shape):
        return [Launch(program, (shape[0] // 64 + 1, 1, 1), [bufs["a"], bufs["out"], bufs["dims"]])]


@pytest.fixture
def guarded(monkeypatch):
    monkeypatch.setenv("TILEWISE_GUARD_OUTPUTS", "1")


def _check(device, stray, rng, shape=(100,)):
    tpl = Doubler()
    cfg = tpl.space().config(STRAY=stray)
    ver = Verifier(tpl, device, shape, rng)
    return ver, ver.check(tpl.compile(device, cfg, shape), cfg)


def test_without_guards_a_stray_write_passes_unseen(webgpu_device, rng, monkeypatch):
    monkeypatch.delenv("TILEWISE_GUARD_OUTPUTS", raising=False)
    ver, check = _check(webgpu_device, 1, rng)
    assert not ver.guard and check.ok  # the bounds check drops the write: the bug would ship


def test_a_correct_kernel_passes_with_guards(webgpu_device, rng, guarded):
    ver, check = _check(webgpu_device, 0, rng)
    assert ver.guard and check.ok, check.message
    out = ver.buffers()["out"]
    assert out.offset == GUARD_BYTES and out.bind_nbytes == out.nbytes + GUARD_BYTES


@pytest.mark.parametrize("n", [100, 128, 1])
def test_a_write_past_the_end_is_caught(webgpu_device, rng, guarded, n):
    _, check = _check(webgpu_device, 1, rng, (n,))
    assert not check.ok
    assert check.message == "wrote out of bounds (out: 0 canary words before it, 1 after it changed)"


def test_the_engine_stores_it_as_wrong(webgpu_device, guarded, tmp_path):
    store = Store(tmp_path / "s.sqlite")
    tpl = Doubler()
    out = Engine(webgpu_device, store, measure_kw={"warmup": 0, "min_rounds": 2, "max_rounds": 2}).evaluate(
        [Item(tpl, tpl.space().config(STRAY=s), (100,)) for s in (0, 1)])
    assert [o.status for o in out] == ["ok", "wrong"]
    assert "wrote out of bounds" in out[1].reason
    assert {r.config: r.status for r in store.query(kernel="double")} == {"STRAY=0": "ok", "STRAY=1": "wrong"}


def test_the_split_k_scratch_is_guarded_like_the_output(webgpu_device, rng, guarded):
    """The FMA split-K matmul writes its partial sums to `part` before the reduction writes `out`: both are bound
    between canary words, and a correct config passes with both guards intact."""
    from tilewise.kernels.matmul.webgpu import MatmulTemplate

    tpl = MatmulTemplate("splitk", "nf4", "residual")
    cfg, shape = tpl.default_config(), (20, 64, 256)
    ver = Verifier(tpl, webgpu_device, shape, rng)
    check = ver.check(tpl.compile(webgpu_device, cfg, shape), cfg)
    assert check.ok, check.message
    part = ver.buffers()["part"]
    assert set(ver._guards) == {"out", "part"} and part.offset == GUARD_BYTES
