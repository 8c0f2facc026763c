"""Adapter choice without touching a real GPU: fake adapters stand in for wgpu's."""

import pytest

from tilewise.devices import webgpu_adapters as wg
from tilewise.errors import DeviceUnavailable

LIMITS = {
    "max-compute-workgroup-storage-size": 32768, "max-compute-invocations-per-workgroup": 1024,
    "max-compute-workgroup-size-x": 1024, "max-compute-workgroup-size-y": 1024, "max-compute-workgroup-size-z": 64,
    "max-compute-workgroups-per-dimension": 65535, "max-buffer-size": 1 << 30,
    "max-storage-buffer-binding-size": 1 << 27,
}


class FakeAdapter:
    def __init__(self, name, backend, adapter_type):
        self.info = {"device": name, "backend_type": backend, "adapter_type": adapter_type, "vendor": "v",
                     "description": "drv 1.0", "vendor_id": 1, "device_id": 2}
        self.limits = LIMITS
        self.features = {"timestamp-query"}


@pytest.fixture
def fake_adapters(monkeypatch):
    box = []

    class FakeGPU:
        def enumerate_adapters_sync(self):
            return list(box)

    class FakeWgpu:
        gpu = FakeGPU()

    monkeypatch.setattr(wg, "import_wgpu", lambda: FakeWgpu)
    return box


def test_prefers_discrete_over_integrated_over_cpu(fake_adapters):
    fake_adapters += [FakeAdapter("soft", "Vulkan", "CPU"), FakeAdapter("igpu", "Vulkan", "IntegratedGPU"),
                      FakeAdapter("dgpu", "Vulkan", "DiscreteGPU")]
    _, info = wg.pick_adapter(None)
    assert info.name == "dgpu" and info.adapter_type == "discrete"


def test_opengl_is_never_chosen_automatically(fake_adapters):
    fake_adapters += [FakeAdapter("gl", "OpenGL", "DiscreteGPU"), FakeAdapter("soft", "Vulkan", "CPU")]
    _, info = wg.pick_adapter(None)
    assert info.name == "soft"


def test_opengl_only_says_how_to_fix(fake_adapters):
    fake_adapters += [FakeAdapter("gl", "OpenGL", "CPU")]
    with pytest.raises(DeviceUnavailable) as exc:
        wg.pick_adapter(None)
    assert "OpenGL" in str(exc.value) and "mesa-vulkan-drivers" in str(exc.value)


def test_no_adapter_says_how_to_fix(fake_adapters):
    with pytest.raises(DeviceUnavailable, match="apt-get install"):
        wg.pick_adapter(None)


def test_adapter_index_out_of_range(fake_adapters):
    fake_adapters += [FakeAdapter("soft", "Vulkan", "CPU")]
    with pytest.raises(DeviceUnavailable, match="no WebGPU adapter 3"):
        wg.pick_adapter(3)


def _refusing_runtime(box, said):
    """A runtime like Dawn's: it lists `box` and reports `said` as the adapters it refused."""
    class FakeModule:
        class gpu:
            @staticmethod
            def enumerate_adapters_sync():
                return list(box)

    return wg.Runtime("dawn", lambda: FakeModule, lambda m: list(m.gpu.enumerate_adapters_sync()), wg.info_from,
                      lambda a, f: None, (), "the dawn fix", refusals=lambda: list(said))


def test_no_adapter_names_what_the_runtime_refused():
    said = ["Vulkan shaderUniform*ArrayDynamicIndexing required"]
    with pytest.raises(DeviceUnavailable) as exc:
        wg.pick_adapter(None, _refusing_runtime([], said))
    assert "refused what it found: Vulkan shaderUniform*ArrayDynamicIndexing required" in str(exc.value)
    assert "no Vulkan, Metal or D3D12 driver" not in str(exc.value) and exc.value.fix == "the dawn fix"
    with pytest.raises(DeviceUnavailable, match="no Dawn WebGPU adapter found"):  # an index changes nothing
        wg.pick_adapter(2, _refusing_runtime([], said))
    with pytest.raises(DeviceUnavailable, match=r"adapter 3 \(found 1; Dawn refused others: Vulkan shader"):
        wg.pick_adapter(3, _refusing_runtime([FakeAdapter("soft", "Vulkan", "CPU")], said))
    with pytest.raises(DeviceUnavailable, match=r"no Vulkan, Metal or D3D12 driver"):  # nothing refused
        wg.pick_adapter(None, _refusing_runtime([], []))


def test_dawn_refusals_come_from_its_listing_notes(monkeypatch):
    from tilewise.devices import dawn
    monkeypatch.setitem(dawn._state, "notes", [dawn._SAID + "Vulkan foo required.", "another note"])
    assert dawn.refusals() == ["Vulkan foo required"]


@pytest.mark.parametrize("n,first", [(1, 0), (130, 0), (130, 8), (8, 8), (9, 8), (24, 8), (25, 8), (3, 1)])
def test_submit_pieces_cover_every_launch_once_in_growing_pieces(n, first):
    from tilewise.devices.webgpu import submit_pieces

    pieces = submit_pieces(n, first)
    assert [i for a, b in pieces for i in range(a, b)] == list(range(n))
    sizes = [b - a for a, b in pieces]
    if first <= 0 or n <= first:
        assert sizes == [n]
    else:
        assert sizes[:-1] == [first * 2**i for i in range(len(sizes) - 1)]
        assert 0 < sizes[-1] <= first * 2 ** (len(sizes) - 1)
