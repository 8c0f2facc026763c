import numpy as np
import pytest

from tilewise.devices.base import Launch
from tilewise.errors import ShaderCompileError

pytestmark = pytest.mark.webgpu

VADD = """
override N: u32 = 1u;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  if (gid.x < N) { c[gid.x] = a[gid.x] + b[gid.x]; }
}
"""

# naive matmul: one thread per output, shapes as override constants
MATMUL = """
override M: u32 = 1u;
override N: u32 = 1u;
override K: u32 = 1u;
@group(0) @binding(0) var<storage, read> a: array<f32>;   // (M, K)
@group(0) @binding(1) var<storage, read> b: array<f32>;   // (K, N)
@group(0) @binding(2) var<storage, read_write> c: array<f32>;  // (M, N)
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row = gid.y; let col = gid.x;
  if (row >= M || col >= N) { return; }
  var acc = 0.0;
  for (var k = 0u; k < K; k++) { acc += a[row * K + k] * b[k * N + col]; }
  c[row * N + col] = acc;
}
"""


def test_adapter_is_not_opengl(webgpu_device):
    assert webgpu_device.info.api.lower() != "opengl"
    assert webgpu_device.info.backend == "webgpu"
    assert webgpu_device.info.limits.max_invocations_per_workgroup >= 256


def test_vector_add_matches_numpy(webgpu_device, rng):
    n = 1000  # not a multiple of the workgroup size: the guard matters
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dev = webgpu_device
    ba, bb, bc = dev.upload(a), dev.upload(b), dev.allocate(4 * n)
    dev.write(bc, np.full(n, np.nan, np.float32))
    prog = dev.compile(VADD, constants={"N": n})
    dev.launch(prog, (n + 63) // 64, [ba, bb, bc])
    np.testing.assert_array_equal(dev.download(bc, np.float32, (n,)), a + b)


@pytest.mark.parametrize("m,n,k", [(33, 17, 40), (64, 64, 64)])
def test_small_matmul_matches_float64(webgpu_device, rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    dev = webgpu_device
    ba, bb, bc = dev.upload(a), dev.upload(b), dev.allocate(4 * m * n)
    dev.write(bc, np.full(m * n, np.nan, np.float32))
    prog = dev.compile(MATMUL, constants={"M": m, "N": n, "K": k})
    dev.launch(prog, ((n + 7) // 8, (m + 7) // 8), [ba, bb, bc])
    out = dev.download(bc, np.float32, (m, n))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_gpu_timing_returns_positive_durations(webgpu_device, rng):
    dev = webgpu_device
    n = 1 << 16
    ba = dev.upload(rng.standard_normal(n).astype(np.float32))
    bb = dev.upload(rng.standard_normal(n).astype(np.float32))
    bc = dev.allocate(4 * n)
    prog = dev.compile(VADD, constants={"N": n})
    times = dev.time([Launch(prog, (n // 64, 1, 1), [ba, bb, bc])] * 4)
    assert times.shape == (4,)
    assert np.all(times > 0) and np.all(np.isfinite(times))


def test_wgsl_syntax_error_names_the_line(webgpu_device):
    bad = "@compute @workgroup_size(1)\nfn main() {\n  let x = ;\n}\n"
    with pytest.raises(ShaderCompileError) as exc:
        webgpu_device.compile(bad, name="broken")
    msg = str(exc.value)
    assert "line 3" in msg and "let x = ;" in msg
    assert "fix:" in msg


def test_missing_entry_point_is_a_clear_error(webgpu_device):
    with pytest.raises(ShaderCompileError, match=r"(?i)entry point"):
        webgpu_device.compile(VADD, entry="nope")


def test_grid_over_limit_is_refused(webgpu_device):
    from tilewise.errors import LaunchError

    dev = webgpu_device
    prog = dev.compile(VADD, constants={"N": 4})
    bufs = [dev.allocate(16) for _ in range(3)]
    with pytest.raises(LaunchError, match="max_workgroups_per_dimension"):
        dev.launch(prog, dev.info.limits.max_workgroups_per_dimension + 1, bufs)


SCALE = """
override S: f32 = 1.0;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  if (gid.x < arrayLength(&c)) { c[gid.x] = S * a[gid.x]; }
}
"""


def test_bind_groups_survive_freed_pipelines(webgpu_device, rng):
    """Programs created and dropped in a loop must never reuse a stale cached bind group."""
    import gc

    dev = webgpu_device
    n = 256
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    ba, bb, bc = dev.upload(a), dev.upload(b), dev.allocate(4 * n)
    for i in range(12):
        dev.write(bc, np.full(n, np.nan, np.float32))
        if i % 2:
            prog = dev.compile(VADD, constants={"N": n})
            dev.launch(prog, n // 64, [ba, bb, bc])
            expected = a + b
        else:
            prog = dev.compile(SCALE, constants={"S": float(i + 1)})
            dev.launch(prog, n // 64, [ba, bc])
            expected = (i + 1) * a
        np.testing.assert_allclose(dev.download(bc, np.float32, (n,)), expected, rtol=1e-6)
        del prog
        gc.collect()


def test_recorded_runs_read_the_inputs_written_before_them(webgpu_device, rng):
    """A launch list run again under one `reuse` key is submitted from commands encoded during its previous run:
    each run must still see the inputs written just before it; a different launch list under the same key must
    not run the old commands."""
    dev = webgpu_device
    n = 300
    ba, bb, bc = dev.allocate(4 * n), dev.allocate(4 * n), dev.allocate(4 * n)
    add = [Launch(dev.compile(VADD, constants={"N": n}), ((n + 63) // 64, 1, 1), [ba, bb, bc])]

    class Key:
        pass

    key = Key()
    before = dev.recorded_runs
    for _ in range(5):
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        dev.write(ba, a)
        dev.write(bb, b)
        dev.write(bc, np.full(n, np.nan, np.float32))
        np.testing.assert_array_equal(dev.run_and_download(add, bc, np.float32, (n,), reuse=key), a + b)
    assert dev.recorded_runs - before == 3  # runs 3, 4 and 5 (recording starts at a key's second run)
    dev.record_ahead = False  # off: the commands recorded during run 5 are not used either
    try:
        a = rng.standard_normal(n).astype(np.float32)
        dev.write(ba, a)
        np.testing.assert_array_equal(dev.run_and_download(add, bc, np.float32, (n,), reuse=key), a + b)
        assert dev.recorded_runs - before == 3
    finally:
        dev.record_ahead = True
    scale = [Launch(dev.compile(SCALE, constants={"S": 3.0}), (n // 64, 1, 1), [ba, bc])]
    a = rng.standard_normal(n).astype(np.float32)
    dev.write(ba, a)
    out = dev.run_and_download(scale, bc, np.float32, (n // 64 * 64,), reuse=key)
    np.testing.assert_array_equal(out, 3 * a[: n // 64 * 64])
    assert dev.recorded_runs - before == 3


def test_run_and_download_returns_each_runs_result(webgpu_device, rng):
    """One submission runs the launches and copies the result back; the kept staging buffers (one per size) must
    never hand back an earlier run's bytes."""
    dev = webgpu_device
    for n in (1000, 37, 1000, 5):
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        ba, bb, bc = dev.upload(a), dev.upload(b), dev.allocate(4 * n)
        dev.write(bc, np.full(n, np.nan, np.float32))
        prog = dev.compile(VADD, constants={"N": n})
        out = dev.run_and_download([Launch(prog, ((n + 63) // 64, 1, 1), [ba, bb, bc])], bc, np.float32, (n - 1,))
        np.testing.assert_array_equal(out, (a + b)[: n - 1])


def test_spin_map_wait_reads_back_what_the_blocking_wait_reads(webgpu_device, rng, monkeypatch):
    """`map_wait = "spin"` (Dawn: map_async, then event processing until it resolves) returns each run's result; on
    a runtime without event processing (wgpu-native) the device keeps the blocking wait."""
    from tilewise.devices.webgpu_adapters import map_wait_mode

    dev = webgpu_device
    monkeypatch.setattr(dev, "map_wait", "spin")
    spins = []
    events = dev.runtime.process_events
    if events is not None:
        monkeypatch.setattr(dev, "runtime", type(dev.runtime)(**{**dev.runtime.__dict__,
                                                                  "process_events": lambda m: (spins.append(1),
                                                                                               events(m))}))
    monkeypatch.setenv("TILEWISE_MAP_WAIT", "spin")
    assert map_wait_mode(dev.runtime) == ("spin" if events is not None else "block")
    n = 4099
    for _ in range(3):
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        ba, bb, bc = dev.upload(a), dev.upload(b), dev.allocate(4 * n)
        dev.write(bc, np.full(n, np.nan, np.float32))
        prog = dev.compile(VADD, constants={"N": n})
        out = dev.run_and_download([Launch(prog, ((n + 63) // 64, 1, 1), [ba, bb, bc])], bc, np.float32, (n,))
        np.testing.assert_array_equal(out, a + b)
    assert (len(spins) > 0) == (events is not None)  # Dawn: the wait went through event processing


def test_an_unknown_map_wait_mode_is_refused_with_the_choices(monkeypatch):
    from tilewise.devices.webgpu_adapters import WGPU_NATIVE, map_wait_mode
    from tilewise.errors import ConfigError

    monkeypatch.setenv("TILEWISE_MAP_WAIT", "busy")
    with pytest.raises(ConfigError, match="block, spin"):
        map_wait_mode(WGPU_NATIVE)


def test_one_pipeline_per_source_and_constants_shared_by_every_program(webgpu_device, rng):
    """A template's split-K reduction is the same for all its configs: each compile of it gets the one pipeline."""
    from tilewise.errors import ShaderCompileError

    dev, n = webgpu_device, 128
    first, again = dev.compile(VADD, constants={"N": n}), dev.compile(VADD, constants={"N": n}, name="again")
    other = dev.compile(VADD, constants={"N": n + 64})
    assert first.handle is again.handle and other.handle is not first.handle
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    ba, bb, bc = dev.upload(a), dev.upload(b), dev.allocate(4 * n)
    dev.launch(again, n // 64, [ba, bb, bc])
    np.testing.assert_allclose(dev.download(bc, np.float32, (n,)), a + b, rtol=1e-6)
    for _ in range(2):  # a failed compile is not kept: the next one compiles (and fails) again
        with pytest.raises(ShaderCompileError):
            dev.compile(VADD.replace("fn main", "fn main_broken"), name="broken")
