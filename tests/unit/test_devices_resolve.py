"""The one device resolver: the same names everywhere, `auto` = the fastest device the job has an implementation
for (discrete > integrated GPU > CPU > software adapter), one line saying which and why, refusals with the reason."""

from __future__ import annotations

import pytest

from tilewise import devices
from tilewise.devices.base import DeviceInfo, Limits
from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.kernels.registry import backends

LIM = Limits(32768, 1024, (1024, 1024, 64), 65535, 2**30, 2**30)


def info(backend: str, name: str, kind: str, index: int = 0) -> DeviceInfo:
    return DeviceInfo(backend, name, kind, "Vulkan" if backend == "webgpu" else backend, "d", "v", LIM, (),
                      index)


class Fake:
    def __init__(self, i: DeviceInfo) -> None:
        self.info = i


@pytest.fixture
def machine(monkeypatch):
    """A machine whose devices the test chooses: {backend: [DeviceInfo]} (cpu is always there)."""
    from tilewise.devices import cuda_info, webgpu_adapters

    have: dict[str, list[DeviceInfo]] = {"cpu": [info("cpu", "host CPU", "cpu")]}

    def listed(b):
        def f():
            if b not in have:
                raise DeviceUnavailable(f"no {b} here", "install it")
            return have[b]
        return f

    monkeypatch.setattr(webgpu_adapters, "list_adapters", listed("webgpu"))
    monkeypatch.setattr(cuda_info, "list_cuda_devices", listed("cuda"))
    monkeypatch.setattr(devices, "_dawn_adapters", listed("dawn"))

    def get(name):
        base, _, idx = name.partition(":")
        return Fake(have[base][int(idx or 0)])

    monkeypatch.setattr(devices, "get_device", get)
    return have


def test_auto_prefers_a_discrete_gpu_then_integrated_then_cpu_then_software(machine):
    machine["webgpu"] = [info("webgpu", "lavapipe", "cpu", 0), info("webgpu", "iGPU", "integrated", 1)]
    pick = devices.resolve("auto", ("webgpu", "cpu"), job="the classifier")
    assert pick.name == "webgpu:1" and "integrated GPU" in pick.reason
    assert pick.line().startswith("device: webgpu:1 (iGPU, Vulkan, integrated GPU): auto: an integrated GPU")
    machine["webgpu"].append(info("webgpu", "dGPU", "discrete", 2))
    assert devices.resolve("auto", ("webgpu", "cpu")).name == "webgpu:2"
    machine["webgpu"] = [info("webgpu", "lavapipe", "cpu", 0)]
    pick = devices.resolve("auto", ("webgpu", "cpu"))
    assert pick.name == "cpu" and "webgpu:0 is a software adapter, slower than the CPU" in pick.reason
    # a job without a CPU implementation takes the software adapter, and says it is slow
    pick = devices.resolve("auto", ("webgpu",), job="tuning gemm")
    assert pick.name == "webgpu:0" and "no CPU implementation" in pick.reason


def test_auto_breaks_ties_by_the_callers_preference(machine):
    machine["webgpu"] = [info("webgpu", "H200", "discrete")]
    machine["cuda"] = [info("cuda", "H200", "discrete")]
    assert backends("gemm")[:2] == ["cuda", "webgpu"]  # the family's preference: the faster implementation first
    assert devices.resolve("auto", backends("gemm")).name == "cuda:0"
    assert devices.resolve("auto", ("webgpu", "cpu")).name == "webgpu:0"  # a job without a CUDA implementation


def test_a_device_the_job_cannot_use_is_refused_with_the_ones_it_can(machine):
    with pytest.raises(DeviceUnavailable) as err:
        devices.resolve("cuda:0", ("webgpu", "cpu"), job="the classifier", noun="executor")
    assert "the classifier has no executor for 'cuda'" in err.value.problem
    assert err.value.fix == "use --device webgpu, webgpu:N, dawn, dawn:N, cpu or auto"  # dawn runs what webgpu runs
    for bad, needle in (("tpu", "unknown device"), ("webgpu:x", "must be a number"), ("cpu:1", "takes no index")):
        with pytest.raises(ConfigError, match=needle):
            devices.resolve(bad, ("webgpu", "cpu"))
    machine.pop("cpu")
    with pytest.raises(DeviceUnavailable, match="none of webgpu is usable"):
        devices.resolve("auto", ("webgpu",), job="tuning gemm")


def test_named_devices_get_canonical_names(machine):
    machine["webgpu"] = [info("webgpu", "a", "discrete", 0), info("webgpu", "b", "discrete", 1)]
    assert devices.resolve("webgpu:1", ("webgpu",)).name == "webgpu:1"
    assert devices.resolve("cpu").name == "cpu" and devices.resolve("cpu").reason == "asked for cpu"


def _cuda(name: str, cc: str) -> DeviceInfo:
    import dataclasses

    return dataclasses.replace(info("cuda", name, "discrete"), limits=dataclasses.replace(LIM, compute_capability=cc))


def test_the_classifier_on_auto_takes_the_cuda_executor_on_an_ampere_or_newer_gpu(machine):
    from tilewise.model.runtime import resolve_device

    machine["cuda"] = [_cuda("H200", "9.0")]
    pick = resolve_device("auto")  # a CUDA-only GPU host
    assert pick.name == "cuda:0" and "the CUDA executor (tensor cores) over WebGPU" in pick.reason
    machine["webgpu"] = [info("webgpu", "H200", "discrete")]
    assert resolve_device("auto").name == "cuda:0"
    assert resolve_device("webgpu").name == "webgpu:0"  # by name the other runs


def test_an_older_nvidia_gpu_runs_the_webgpu_executor_and_says_why(machine):
    from tilewise.model.cuda import cuda_executor_problem
    from tilewise.model.runtime import resolve_device

    machine["cuda"] = [_cuda("T4", "7.5")]
    machine["webgpu"] = [info("webgpu", "T4", "discrete")]
    pick = resolve_device("auto")
    assert pick.name == "webgpu:0"
    assert "not CUDA: T4 has compute capability 7.5; the CUDA executor's tensor-core matmuls need 8.0" in pick.reason
    assert cuda_executor_problem(_cuda("A100", "8.0")) is None
    machine.pop("webgpu")
    assert resolve_device("auto").name == "cpu"  # and without WebGPU, the CPU


def _twins(machine):
    import dataclasses

    native = info("webgpu", "H200", "discrete")
    dawn = dataclasses.replace(native, runtime="dawn", runtime_version="1")
    machine["webgpu"], machine["dawn"] = [native], [dawn]
    return native, dawn


def test_auto_takes_the_webgpu_runtime_bench_measured_faster(machine, rng):
    from tilewise.model.measured import record_decision
    from tilewise.model.runtime import resolve_device

    native, dawn = _twins(machine)
    assert resolve_device("auto").name == "webgpu:0"  # nothing measured: the rule's choice (wgpu-native on a tie)
    record_decision(native.fingerprint, "lfm2-350m", "nf4", 346, 21.7 + rng.normal(0, 0.1, 40))
    record_decision(dawn.fingerprint, "lfm2-350m", "nf4", 346, 14.6 + rng.normal(0, 0.1, 40))
    pick = resolve_device("auto", "lfm2-350m")
    assert pick.name == "dawn:0"
    assert "auto: a discrete GPU; Dawn measured faster than wgpu-native on it (14." in pick.line()
    assert " vs 21." in pick.line() and " ms p50 deciding lfm2-350m, `tilewise bench`)" in pick.line()
    assert resolve_device("webgpu").name == "webgpu:0"  # a named device is never overridden


@pytest.mark.parametrize("dawn_ms,native_ms,n", [(21.7, 21.7, 40), (14.6, 21.7, 5), (30.0, 21.7, 40)])
def test_a_tie_too_few_samples_or_a_slower_dawn_keep_the_rule(machine, rng, dawn_ms, native_ms, n):
    from tilewise.model.measured import record_decision
    from tilewise.model.runtime import resolve_device

    native, dawn = _twins(machine)
    record_decision(native.fingerprint, "m", "nf4", 346, native_ms + rng.normal(0, 0.5, n))
    record_decision(dawn.fingerprint, "m", "nf4", 346, dawn_ms + rng.normal(0, 0.5, n))
    assert resolve_device("auto").name == "webgpu:0"


def test_a_corrupt_record_is_ignored(machine):
    from tilewise.model.measured import decisions_path
    from tilewise.model.runtime import resolve_device

    native, dawn = _twins(machine)
    for fp in (native.fingerprint, dawn.fingerprint):
        decisions_path(fp).parent.mkdir(parents=True, exist_ok=True)
        decisions_path(fp).write_text('{"format": "tilewise-decisions", "entries": {"m:nf4:346": {"samples_ms": '
                                      '["fast"]}}}')
    assert resolve_device("auto").name == "webgpu:0"
