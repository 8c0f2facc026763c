"""The Dawn device on Dawn's Null backend: toggles applied, features and subgroup_matrix_configs reported, its own
fingerprint (never wgpu-native's for the same GPU), the same device interface as wgpu-native's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dawn_support import need_dawn, null_device

from tilewise.devices import dawn
from tilewise.devices.base import DeviceInfo
from tilewise.devices.webgpu import WebGPUDevice

pytestmark = pytest.mark.dawn


@pytest.fixture(scope="module")
def dev():
    return null_device()


def test_dawn_toggles_are_applied(dev):
    assert {"allow_unsafe_apis", "vulkan_enable_f16_on_nvidia", "use_vulkan_memory_model"} <= set(dev.toggles)
    assert "timestamp_quantization" not in dev.toggles
    assert "disable_robustness" not in dev.toggles  # robustness stays on unless asked for
    assert dev.info.extra["robustness"] is True


def test_dawn_requests_f16_subgroups_and_subgroup_matrices(dev):
    assert {"shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"} <= dev.enabled_features
    assert dev.timer == "gpu-timestamp"


def test_dawn_reports_subgroup_matrix_configs_in_its_info_and_json(dev):
    d = json.loads(json.dumps(dev.info.as_dict()))
    assert d["backend"] == "webgpu" and d["runtime"] == "dawn"
    assert d["subgroup_matrix_configs"] == [
        {"component_type": c.component_type, "result_component_type": c.result_component_type, "m": c.m, "n": c.n,
         "k": c.k, "min_subgroup_size": c.min_subgroup_size, "max_subgroup_size": c.max_subgroup_size}
        for c in dev.info.limits.subgroup_matrix_configs]
    assert dev.info.adapter_type == "virtual" and dev.info.device_name == f"dawn:{dev.info.index}"


def test_dawn_fingerprint_differs_from_wgpu_natives_for_the_same_adapter(dev):
    info = dev.info
    as_wgpu = DeviceInfo(info.backend, info.name, info.adapter_type, info.api, info.driver, info.vendor,
                         info.limits, info.features, info.index)
    assert info.fingerprint != as_wgpu.fingerprint
    assert info.fingerprint.startswith(f"webgpu+dawn-{dawn.dawn_version()}:")
    assert as_wgpu.fingerprint.startswith("webgpu:")


def test_disable_robustness_is_an_explicit_flag_and_changes_the_fingerprint(dev):
    unsafe = null_device(disable_robustness=True)
    assert "disable_robustness" in unsafe.toggles
    assert unsafe.info.fingerprint != dev.info.fingerprint


def test_tilewise_dawn_unchecked_gives_the_unchecked_device_by_name(dev, monkeypatch):
    """`TILEWISE_DAWN_UNCHECKED=1` is how a command asks for Dawn without robustness: `get_device("dawn:N")` then
    disables it, the device is `unchecked` (verification guards outputs with canaries), its fingerprint is its
    own and the device line says so; a value other than 0 or 1 is refused with the fix."""
    from tilewise.devices import Choice, get_device
    from tilewise.errors import ConfigError

    monkeypatch.setenv("WGPU_BACKEND_TYPE", "Null")
    monkeypatch.setenv("TILEWISE_DAWN_UNCHECKED", "1")
    got = get_device(f"dawn:{dev.info.index}")
    assert got.unchecked and "disable_robustness" in got.toggles
    assert got.info.fingerprint != dev.info.fingerprint and got.info.extra["robustness"] is False
    assert "unchecked: no robustness" in Choice(got, f"dawn:{dev.info.index}", "asked for").line()
    assert "unchecked" not in Choice(dev, f"dawn:{dev.info.index}", "asked for").line()
    monkeypatch.setenv("TILEWISE_DAWN_UNCHECKED", "yes")
    with pytest.raises(ConfigError, match="TILEWISE_DAWN_UNCHECKED='yes' is not 0 or 1"):
        dawn.unchecked_asked()


def test_dawn_device_has_the_webgpu_device_interface(dev, rng):
    """The Null backend executes nothing, so this checks the calls and shapes, not values."""
    assert isinstance(dev, WebGPUDevice)
    buf = dev.upload(rng.standard_normal(37).astype(np.float32))
    assert dev.download(buf, np.float32, (37,)).shape == (37,)
    prog = dev.compile("@group(0) @binding(0) var<storage, read_write> x: array<f32>;\n"
                       "@compute @workgroup_size(128) fn main(@builtin(global_invocation_id) i: vec3<u32>) "
                       "{ if (i.x < arrayLength(&x)) { x[i.x] = 2.0 * x[i.x]; } }", name="double")
    from tilewise.devices.base import Launch

    launches = [Launch(prog, (1, 1, 1), [buf])] * 3
    assert dev.time(launches).shape == (3,)
    assert dev.run_and_download(launches, buf, np.float32, (37,)).shape == (37,)


def test_dawn_shader_errors_quote_the_line(dev):
    from tilewise.errors import ShaderCompileError

    with pytest.raises(ShaderCompileError) as err:
        dev.compile("@compute @workgroup_size(1) fn main() {\n  let active = 1u;\n}", name="bad")
    assert "at line 2" in err.value.problem and "let active" in err.value.problem


def test_missing_wgpudawn_says_how_to_install(monkeypatch):
    need_dawn()
    import builtins

    real_import = builtins.__import__

    def no_dawn(name, *args, **kwargs):
        if name.startswith("wgpudawn"):
            raise ImportError("No module named 'wgpudawn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(dawn, "_state", {})
    monkeypatch.setattr(builtins, "__import__", no_dawn)
    from tilewise.errors import DeviceUnavailable

    with pytest.raises(DeviceUnavailable) as err:
        dawn.DawnDevice()
    assert "wgpudawn" in err.value.problem
    assert err.value.fix == "pip install 'tilewise[dawn]' (in a clone: bash scripts/run extras dawn)"


def test_compile_together_builds_pipelines_at_the_blocks_end_and_keeps_each_ones_error(dev):
    from tilewise.errors import ShaderCompileError

    body = "@group(0) @binding(0) var<storage, read_write> o: array<f32>;\n"
    good = body + "@compute @workgroup_size(128) fn main(@builtin(global_invocation_id) g: vec3u) {{ o[g.x] = {}; }}\n"
    too_big = body + "@compute @workgroup_size(4096) fn main() { o[0] = 1.0; }\n"  # valid WGSL, invalid pipeline
    assert dev.compile_workers == 1 and dev.compiles_in_parallel()  # one thread at a time into Dawn's device
    with dev.compile_together() as batch:
        progs = [dev.compile(too_big, name="too_big") if i == 2 else
                 dev.compile(good.format(f"f32(g.x) * {i}.0"), name=f"k{i}") for i in range(6)]
        assert progs[-1].handle is None  # started, not waited for (at most 2 x CPUs are in flight)
        with pytest.raises(ShaderCompileError, match="nosuch"):  # a WGSL error is known at once
            dev.compile(good.format("nosuch(g.x)"), name="syntax")
    assert batch.programs == progs
    assert [p.name for p in progs if p.handle is None] == ["too_big"]
    (err,) = batch.errors.values()
    assert isinstance(err, ShaderCompileError) and "too_big" in str(err) and "4096" in str(err)
    with dev.compile_together() as inner:
        with dev.compile_together() as nested:
            assert nested is None  # one batch at a time: the inner block compiles into the outer one
        p = dev.compile(good.format("1.0"), name="again")
    assert inner.programs == [p] and p.handle is not None


def test_a_pipeline_is_built_once_whether_asked_for_in_a_batch_or_alone(dev):
    src = ("@group(0) @binding(0) var<storage, read_write> o: array<f32>;\n"
           "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) {{ o[g.x] = {}; }}\n")
    alone = dev.compile(src.format("3.0"), name="alone")
    with dev.compile_together() as batch:
        again = dev.compile(src.format("3.0"), name="again")  # built before: ready at once
        twice = [dev.compile(src.format("5.0"), name=f"twice{i}") for i in range(2)]  # one build for both
    assert again.handle is alone.handle
    assert twice[0].handle is twice[1].handle is not None and twice[0].handle is not alone.handle
    assert batch.programs == [again, *twice] and not batch.errors
    assert dev.compile(src.format("5.0"), name="after").handle is twice[0].handle
