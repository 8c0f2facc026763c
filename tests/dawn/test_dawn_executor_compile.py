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
