"""The model tune's L2 timing condition on CUDA (`--l2 auto|cold|warm`): which one `auto` picks, the errors, that
the store keeps timings with L2 kept apart from cold ones, and that the device's setting comes back after a tune."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_engine import FAST, Fake, items

from tilewise.devices.cpu import CPUDevice
from tilewise.errors import ConfigError
from tilewise.model import tune as model_tune
from tilewise.model.tune import WEIGHT_BYTES, l2_timing, model_config
from tilewise.tune.engine import Engine
from tilewise.tune.store import Store


def cuda_like(l2_bytes: int, flush: bool = True) -> SimpleNamespace:
    info = SimpleNamespace(extra={"l2_cache_bytes": l2_bytes}, fingerprint="cuda:fake", name="fake GPU",
                           features=(), backend="cuda", limits=None)
    return SimpleNamespace(info=info, flush_l2=flush)


def weight_bytes(name: str, fmt: str = "nf4") -> float:
    return model_config(name).parameter_count(with_embeddings=False) * WEIGHT_BYTES[fmt]


@pytest.mark.parametrize("name", ["default", "lfm2-350m", "seed-250m", "tiny"])
def test_auto_keeps_l2_exactly_where_the_weights_fit_in_half_of_it(name):
    cfg, need = model_config(name), weight_bytes(name)
    rng = np.random.default_rng(7)
    for l2 in [int(2 * need), int(2 * need) - 1, *rng.integers(1, int(4 * need) + 2, 20)]:
        keep, why = l2_timing(cuda_like(int(l2)), cfg, "nf4")
        assert keep == (need <= l2 / 2), (name, l2)
        assert ("kept" if keep else "evicted") in why and "MiB" in why


def test_the_bundled_model_is_timed_warm_and_lfm2_350m_cold_on_a_50_mib_l2():
    gpu = cuda_like(50 << 20)
    assert l2_timing(gpu, model_config("default"), "nf4")[0] is True
    assert l2_timing(gpu, model_config("lfm2-350m"), "nf4")[0] is False


def test_cold_and_warm_are_taken_as_given_on_cuda():
    cfg = model_config("lfm2-350m")
    assert l2_timing(cuda_like(50 << 20), cfg, "nf4", "warm") == (True, "timing with L2 kept between samples "
                                                                        "(--l2 warm)")
    assert l2_timing(cuda_like(1 << 40), model_config("default"), "nf4", "cold")[0] is False


def test_an_unknown_mode_and_warm_where_it_cannot_apply_are_refused():
    cfg = model_config("default")
    with pytest.raises(ConfigError, match="'hot' is not a timing mode"):
        l2_timing(cuda_like(50 << 20), cfg, "nf4", "hot")
    webgpu = SimpleNamespace(info=SimpleNamespace(extra={}))
    assert l2_timing(webgpu, cfg, "nf4") == (False, "")  # nothing to set, nothing said
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        l2_timing(webgpu, cfg, "nf4", "warm")
    with pytest.raises(ConfigError, match="Ray cluster"):
        l2_timing(cuda_like(50 << 20), cfg, "nf4", "warm", local=False)
    assert l2_timing(cuda_like(50 << 20), cfg, "nf4", "auto", local=False)[0] is False


class TaggedCPU(CPUDevice):
    """A device whose timings are taken under another condition (as CUDA's with L2 kept)."""

    timing_tag = "+l2kept"


def test_timings_with_l2_kept_are_stored_apart_from_cold_ones(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    tpl = Fake()
    warm = Engine(TaggedCPU(), store, measure_kw=FAST)
    cold = Engine(CPUDevice(), store, measure_kw=FAST)
    assert warm.fingerprint == cold.fingerprint + "+l2kept"
    warm.evaluate(items(tpl, (16, 8, 4), ("ok",)))
    assert len(tpl.compiled) == 1
    cold.evaluate(items(tpl, (16, 8, 4), ("ok",)))  # not served from the warm timing: measured again
    assert len(tpl.compiled) == 2
    Engine(TaggedCPU(), store, measure_kw=FAST).evaluate(items(tpl, (16, 8, 4), ("ok",)))
    assert len(tpl.compiled) == 2  # the warm timing serves a warm engine


@pytest.mark.parametrize("mode, during", [("warm", False), ("cold", True), ("auto", False)])
def test_the_tune_sets_the_devices_l2_condition_and_restores_it_when_cut(tmp_path, monkeypatch, mode, during):
    seen: list[bool] = []

    def cut(dev, *a, **kw):
        seen.append(dev.flush_l2)
        raise KeyboardInterrupt

    monkeypatch.setattr(model_tune, "matmul_candidates", lambda *a, **kw: [object()])
    monkeypatch.setattr(model_tune, "attention_items", lambda *a, **kw: [object()])
    monkeypatch.setattr(model_tune, "tune_matmul", cut)
    gpu = cuda_like(50 << 20, flush=True)
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        model_tune.tune_model(gpu, model_config("default"), 348, "nf4", path=tmp_path / "t.json", log=lines.append,
                              l2=mode)
    assert seen == [during]  # auto: the bundled model fits in half of 50 MiB, so L2 is kept
    assert gpu.flush_l2 is True
    assert any(line.startswith("timing with L2 ") for line in lines)
