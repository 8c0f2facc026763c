"""A dispatch table naming a config that breaks a kernel rule never gives wrong scores: the runtime's own file
falls back to the defaults for that op (one warning naming the key, config and rule) and scores exactly as the
defaults do; a table handed to the executor is refused. Lavapipe, the `tiny` preset."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tilewise
from tilewise.errors import ConfigError
from tilewise.kernels.matmul import webgpu as mm
from tilewise.model import dispatch as model_dispatch
from tilewise.model.dispatch import dispatch_path, matmul_key
from tilewise.model.tune import model_matmuls
from tilewise.model.webgpu import WebGPUExecutor
from tilewise.tune.dispatch import DispatchTable, Entry

pytestmark = pytest.mark.webgpu

# TM=8 does not divide BM=36: the last thread row of each tile is dropped (thread_rows), so rows go unwritten
BROKEN = {**mm.DEFAULT_TILED, "BM": 36, "TM": 8, "TN": 8}


def _table(fp: str, cfg) -> DispatchTable:
    """Every matmul of the model on the tiled kernel with the broken config, at every row count."""
    table = DispatchTable(fp)
    for e, n, k, norm in model_matmuls(cfg).values():
        tpl = mm.MatmulTemplate("tiled", "nf4", e, None, norm=norm)
        table.put(matmul_key("nf4", e, n, k, norm),
                  Entry([{"m_min": 1, "m_max": None, "kernel": tpl.name, "config": dict(BROKEN)}]), tpl)
    return table


def _scores(model, ids_list):
    return np.stack([model.scores(model.prefill(ids)) for ids in ids_list])


def test_a_broken_table_falls_back_to_the_default_scores(webgpu_device, rng, monkeypatch):
    fp = webgpu_device.info.fingerprint
    seed = int(rng.integers(1 << 30))
    ids_list = [rng.integers(0, 512, n) for n in (1, 40, 130)]  # the short-row, tiled and 96+ row defaults
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no table yet: the "not tuned" note
        plain = tilewise.load("tiny", device="webgpu", weights="nf4", seed=seed)
    assert plain.executor.dispatch.entries == {}
    want = _scores(plain, ids_list)

    table = _table(fp, plain.config)
    path = table.save(dispatch_path(fp))
    before = path.read_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = tilewise.load("tiny", device="webgpu", weights="nf4", seed=seed)
    assert len(caught) == 1, [str(w.message) for w in caught]
    text = str(caught[0].message)
    for key in table.entries:
        assert key in text
    assert "BM=36" in text and "TM=8" in text and "thread_rows" in text and "defaults" in text
    assert model.executor.dispatch.entries == {} and path.read_bytes() == before
    np.testing.assert_array_equal(_scores(model, ids_list), want)  # every score, not just the argmax

    # the test can fail: the same table used unchecked gives other scores
    monkeypatch.setattr(model_dispatch, "check_model_table", lambda t, *a, **k: (t, []))
    unchecked = WebGPUExecutor(model.checkpoint, device=webgpu_device, dispatch=table)
    wrong = np.stack([plain._head @ unchecked.forward(np.asarray(ids), 0, None, True)[0] for ids in ids_list])
    assert np.abs(wrong - want).max() > 1e-2


def test_a_broken_table_given_to_the_executor_is_refused(webgpu_device, rng):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tilewise.load("tiny", device="webgpu", weights="nf4", seed=int(rng.integers(1 << 30)))
    table = _table(webgpu_device.info.fingerprint, model.config)
    with pytest.raises(ConfigError) as err:
        WebGPUExecutor(model.checkpoint, device=webgpu_device, dispatch=table)
    assert "thread_rows: TM=8 does not divide BM=36" in err.value.problem
    assert "the given dispatch table" in err.value.problem and "4 more entries" in err.value.problem


def test_a_head_dim_the_rope_kernel_cannot_split_is_refused_with_one_error(webgpu_device):
    """q/k norm + RoPE takes vec4s of both halves of a head: 12 (a multiple of 4, not of 8) is refused up front."""
    import dataclasses

    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import PRESETS

    cfg = dataclasses.replace(PRESETS["tiny"], head_dim=12, num_attention_heads=16)
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:bad")
    with pytest.raises(ConfigError, match="head_dim 12 must be a multiple of 8"):
        WebGPUExecutor(ck, device=webgpu_device)
