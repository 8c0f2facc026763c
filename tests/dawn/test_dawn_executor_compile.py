"""The WebGPU executor on Dawn builds a decision's new pipelines together (on Dawn's threads): every launch of a plan
has its pipeline when the plan is returned, and a pipeline that fails is reported once and kept nowhere."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from dawn_support import null_device

from tilewise.errors import ShaderCompileError
from tilewise.kernels.rowops import webgpu as rowops
from tilewise.model.checkpoint import Checkpoint, random_tensors
from tilewise.model.config import PRESETS
from tilewise.model.webgpu import WebGPUExecutor

pytestmark = pytest.mark.dawn


@pytest.fixture(scope="module")
def executor():
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    return WebGPUExecutor(ck, device=null_device(), quiet=True)


def test_a_plans_pipelines_are_built_together_and_ready_when_it_is_returned(executor, rng, monkeypatch):
    dev, batches = executor.dev, []
    together = dev.compile_together

    @contextmanager
    def spy():
        with together() as batch:
            batches.append(batch)
            yield batch

    monkeypatch.setattr(dev, "compile_together", spy)
    plan, _ = executor.plan(rng.integers(0, 100, 21), 0, None, True)
    assert len(plan.launches) > 10 and all(launch.program.handle is not None for launch in plan.launches)
    (batch,) = batches
    used = {id(launch.program) for launch in plan.launches}
    assert len(batch.programs) >= 5 and all(id(p) in used for p in batch.programs) and not batch.errors


def test_a_pipeline_that_fails_in_the_batch_is_raised_and_not_kept(executor, rng, monkeypatch):
    good = rowops.copy_source
    # valid WGSL whose pipeline Dawn refuses (4096 invocations a workgroup): known only when the build finishes
    monkeypatch.setattr(rowops, "copy_source", lambda: good(4096))
    executor._programs.pop(("copy",), None)
    executor._plans.clear()
    for _ in range(2):  # the failed program was not cached: the second plan tries again and fails again
        with pytest.raises(ShaderCompileError, match="copy"):
            executor.plan(rng.integers(0, 100, 22), 0, None, True)
        assert ("copy",) not in executor._programs
    monkeypatch.setattr(rowops, "copy_source", good)
    plan, _ = executor.plan(rng.integers(0, 100, 22), 0, None, True)
    assert all(launch.program.handle is not None for launch in plan.launches)


def test_a_plan_that_fails_for_another_reason_keeps_none_of_its_programs(executor, rng, monkeypatch):
    """A pipeline that did not build and an error raised later in the same plan: the program without a pipeline must
    not stay cached for the next plan to launch."""
    from tilewise.errors import ConfigError

    good, build = rowops.copy_source, executor._build_plan
    monkeypatch.setattr(rowops, "copy_source", lambda: good(4096))

    def build_then_fail(*args, **kwargs):
        build(*args, **kwargs)
        raise ConfigError("a later step refused the plan", "fix it")

    monkeypatch.setattr(executor, "_build_plan", build_then_fail)
    executor._programs.pop(("copy",), None)
    executor._plans.clear()
    with pytest.raises((ConfigError, ShaderCompileError)):
        executor.plan(rng.integers(0, 100, 23), 0, None, True)
    assert ("copy",) not in executor._programs
    monkeypatch.setattr(rowops, "copy_source", good)
    monkeypatch.setattr(executor, "_build_plan", build)
    plan, _ = executor.plan(rng.integers(0, 100, 23), 0, None, True)
    assert all(launch.program.handle is not None for launch in plan.launches)


def test_every_short_conv_config_compiles_on_dawn(executor):
    """Tint takes every WG x RT of the conv at 2 to 8 taps (lavapipe runs them through wgpu-native's compiler)."""
    from tilewise.kernels.shortconv.webgpu import ConvTemplate

    tpl, dev = ConvTemplate(), executor.dev
    cfgs = tpl.space().legal(dev.info.limits)
    assert {c["RT"] for c in cfgs} == {1, 2, 4, 8, 16}
    for cfg in cfgs:
        for taps in (2, 3, 8):
            assert tpl.compile(dev, cfg, (37, 96, taps)).handle is not None
