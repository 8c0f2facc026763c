import json
import subprocess
import sys

import numpy as np
import pytest

from tilewise.devices import get_device, parse_device_name
from tilewise.devices.base import Launch, grid3
from tilewise.errors import ConfigError


def _axpy(bufs, grid, alpha):
    x = bufs[0].view(np.float32)
    y = bufs[1].view(np.float32)
    y[:] = alpha * x + y


def test_cpu_roundtrip_and_launch(cpu_device, rng):
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(np.float32)
    bx, by = cpu_device.upload(x), cpu_device.upload(y)
    assert np.array_equal(cpu_device.download(bx, np.float32, (1000,)), x)
    prog = cpu_device.compile(_axpy, constants={"alpha": 2.5})
    cpu_device.launch(prog, 1, [bx, by])
    np.testing.assert_allclose(cpu_device.download(by, np.float32, (1000,)), 2.5 * x + y, rtol=1e-6)


def test_cpu_time_positive_per_launch(cpu_device, rng):
    bx = cpu_device.upload(rng.standard_normal(1 << 16).astype(np.float32))
    by = cpu_device.upload(rng.standard_normal(1 << 16).astype(np.float32))
    prog = cpu_device.compile(_axpy, constants={"alpha": 1.0})
    times = cpu_device.time([Launch(prog, (1, 1, 1), [bx, by])] * 3)
    assert times.shape == (3,) and np.all(times > 0)


def test_write_overflow_is_refused(cpu_device):
    buf = cpu_device.allocate(16)
    with pytest.raises(ValueError, match="overflows"):
        cpu_device.write(buf, np.ones(5, np.float32))


def test_fingerprint_is_stable_and_distinguishes_devices(cpu_device):
    again = type(cpu_device)()
    assert again.info.fingerprint == cpu_device.info.fingerprint
    assert cpu_device.info.fingerprint.startswith("cpu:")
    other = type(cpu_device.info)(**{**cpu_device.info.__dict__, "driver": "another-blas"})
    assert other.fingerprint != cpu_device.info.fingerprint


@pytest.mark.parametrize("name", ["gpu", "webgpu:x", "cuda:-1", ""])
def test_unknown_device_names_are_refused(name):
    with pytest.raises(ConfigError):
        parse_device_name(name)


def test_grid3_normalises():
    assert grid3(5) == (5, 1, 1)
    assert grid3((2, 3)) == (2, 3, 1)
    with pytest.raises(ValueError):
        grid3((1, 2, 3, 4))


def test_import_does_not_load_gpu_libraries():
    code = ("import sys, tilewise, tilewise.cli, tilewise.kernels.space; "
            "print(sorted(m for m in ('wgpu', 'cupy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().replace("'", '"')) == []


def test_cpu_device_is_cached():
    assert get_device("cpu") is get_device("cpu")


def test_host_buffers_roundtrip_with_offsets_and_shapes(cpu_device, rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    buf = cpu_device.allocate(4 * 32)
    cpu_device.write(buf, np.full(32, np.nan, np.float32))
    cpu_device.write(buf, x, offset_bytes=8)
    np.testing.assert_array_equal(cpu_device.download(buf, np.float32, (3, 5), offset_bytes=8), x)
    assert np.isnan(cpu_device.download(buf, np.float32, (2,))).all()
