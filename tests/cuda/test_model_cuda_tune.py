"""`tilewise tune model --device cuda` on a real GPU (skips cleanly without CuPy or a GPU): the tuner measures the
CUDA kernels, writes a table the CUDA executor loads, and the tuned executor still matches the float64 reference on
all 8 scores."""

from __future__ import annotations

import numpy as np
import pytest

import tilewise
from tilewise.kernels.matmul.cuda import KINDS as CUDA_KINDS
from tilewise.model import reference
from tilewise.model.checkpoint import HEAD

pytestmark = pytest.mark.cuda


def test_tuned_table_is_loaded_and_the_scores_still_match(dev, rng):
    from tilewise.model import tune as model_tune
    from tilewise.model.config import PRESETS
    from tilewise.model.dispatch import dispatch_path
    from tilewise.tune.dispatch import DispatchTable

    cfg = PRESETS["tiny"]
    path = dispatch_path(dev.info.fingerprint)  # the test's own folder (conftest), where the executor looks
    table = model_tune.tune_model(dev, cfg, seq=40, rows=[1, 8, 40], budget=3, log=lambda _m: None)
    assert path.exists() and not table.partial
    saved = DispatchTable.load(path)
    kernels = {r["kernel"] for e in saved.entries.values() for r in e.ranges}
    assert {"attention", "shortconv"} <= kernels  # tiny has conv blocks: their conv is tuned too
    assert all(k in ("attention", "shortconv") or k.split(".")[1] in CUDA_KINDS for k in kernels), kernels
    model = tilewise.load("tiny", device="cuda", weights="nf4", seed=3, quiet=True)
    ex = model.executor
    assert ex.dispatch.entries.keys() == saved.entries.keys()
    ck = model.checkpoint
    weights = {k: ck.float32(k) for k in ck.names()}
    for n in (1, 8, 40):
        ids = rng.integers(0, cfg.vocab_size, n)
        ref, _ = reference.forward(cfg, weights, ids)
        want = weights[HEAD].astype(np.float64) @ ref[-1]
        got = model.scores(model.prefill(ids))
        np.testing.assert_allclose(got, want, atol=2e-2 * max(1.0, float(np.abs(want).max())), rtol=0)


def kind_table(dev, cfg, kind: str):
    """A dispatch table that runs every matmul of `cfg` from 8 rows on `kind`: split-K (KS 2, whole 32-wide steps
    of tiny's K = 64 and 128) or a wgmma kind's default (skips off Hopper); `wg-split` (`wgr-split`) is wg's (wgr's)
    default with ffn.down in two slices, whose reduction the next layer's f16 prologue can join; `wgr-cluster` the
    same with those two slices summed inside a cluster (SR 2); `splitk-cluster` every matmul on split-K with SR 2."""
    from tilewise.kernels.matmul.cuda import CudaMatmul
    from tilewise.model.dispatch import matmul_key
    from tilewise.tune.dispatch import DispatchTable, Entry

    H, F = cfg.hidden_size, cfg.ffn_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    split = {"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "PIPE": 2, "KS": 2}
    if kind != "splitk" and dev.info.limits.compute_capability != "9.0":
        pytest.skip("wgmma and clusters need a Hopper GPU")
    if kind == "splitk-cluster":
        split = {**split, "SR": 2}
    elif kind != "splitk":
        from tilewise.kernels.matmul.cuda import DEFAULT_WG, DEFAULT_WGR

        split = DEFAULT_WGR if kind.startswith("wgr") else DEFAULT_WG
    table = DispatchTable(dev.info.fingerprint)
    for epi, n, k, norm in (("none", 3 * H, H, True), ("none", qkv, H, True), ("residual", H, H, False),
                            ("residual", H, cfg.num_attention_heads * cfg.head_dim, False),
                            ("swiglu", F, H, True), ("residual", H, F, False)):
        tpl = CudaMatmul(kind.removesuffix("-split").removesuffix("-cluster").removesuffix("-splitk-out"), "nf4", epi,
                         norm)
        sliced = {**split, "KS": 2, **({"SR": 2} if kind.endswith("-cluster") else {})}
        config = sliced if kind.startswith("w") and kind.endswith(("-split", "-cluster")) and (n, k) == (H, F) \
            else split
        if kind == "wgr-splitk-out" and epi == "residual" and n == H and k != F:  # the out projections: clusters
            tpl = CudaMatmul("splitk", "nf4", epi, norm)
            config = {"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "PIPE": 2, "KS": 2, "SR": 2}
        table.put(matmul_key("nf4", epi, n, k, norm), Entry([
            {"m_min": 8, "m_max": None, "kernel": tpl.name, "config": config}]), tpl)
    return table


@pytest.mark.parametrize("kind", ["splitk", "wg", "wgt", "wgr", "wg-split", "wgr-cluster", "splitk-cluster"])
def test_an_executor_with_split_k_tables_matches_the_float64_reference(dev, rng, kind):
    """Every matmul of the model on split-K from 8 rows (KS 2, whole 32-wide steps of tiny's K = 64 and 128), or on
    a wgmma kind (wgt, wgr: x by TMA, its tensor map made for the executor's own f16 scratch): the scores still match
    the float64 forward, launch by launch and in the captured graph's replays."""
    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import PRESETS
    from tilewise.model.cuda import CUDAExecutor

    cfg = PRESETS["tiny"]
    table = kind_table(dev, cfg, kind)
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=dev, dispatch=table)
    weights = {k: ck.float32(k) for k in ck.names()}
    for n in (8, 40, 70):
        ids = rng.integers(0, cfg.vocab_size, n)
        ref, _ = reference.forward(cfg, weights, ids)
        want = weights[HEAD].astype(np.float64) @ ref[-1]
        for graphs in (False, True, True):  # launch by launch, then the capture and its replay
            ex.graphs = graphs
            _, state = ex.forward(ids, 0, None, True)
            np.testing.assert_allclose(state.scores, want, atol=2e-2 * max(1.0, float(np.abs(want).max())), rtol=0)
    if kind == "splitk-cluster":  # the clusters sum the slices in shared memory: no partial sums in global memory
        assert ex._scratch.get("partial") is None
    else:
        assert ex._scratch.get("partial" if kind == "splitk" else "xh") is not None


def test_the_settings_race_is_saved_and_taken_by_the_next_executor(dev, rng, monkeypatch):
    from tilewise.model import tune as model_tune
    from tilewise.model.config import PRESETS
    from tilewise.model.cuda import CUDAExecutor
    from tilewise.model.dispatch import CUDA_SETTINGS, dispatch_path, model_signature
    from tilewise.model.runtime import open_checkpoint
    from tilewise.model.tune_settings import tune_settings
    from tilewise.tune.dispatch import DispatchTable

    monkeypatch.delenv("TILEWISE_CUDA_PDL", raising=False)
    cfg = PRESETS["tiny"]
    path = dispatch_path(dev.info.fingerprint)
    table = model_tune.tune_model(dev, cfg, seq=40, rows=[1, 8, 40], budget=2, log=lambda _m: None)
    lines: list[str] = []
    rec = tune_settings(dev, cfg, "tiny", "nf4", 40, table, path, lines.append)
    raced = set(CUDA_SETTINGS) - (set() if dev.pdl else {"pdl"})
    assert set(rec["values"]) == raced and all(isinstance(v, bool) for v in rec["values"].values())
    assert all(r["outputs_agree"] for r in rec["raced"].values()), rec["raced"]  # both sides (fold_norm: tolerance)
    assert sum(line.startswith("settings: ") for line in lines) >= len(raced) + 1
    saved = DispatchTable.load(path)
    assert saved.settings[model_signature(cfg, "nf4")]["values"] == rec["values"]
    ck = open_checkpoint("tiny", "nf4", seed=int(rng.integers(0, 100)))
    ex = CUDAExecutor(ck, dev, quiet=True)  # the table from its file, as `tilewise.load` finds it
    assert ex.measured_settings == rec["values"]
    assert all(getattr(ex, k) is v for k, v in rec["values"].items())
    told = CUDAExecutor(ck, dev, quiet=True, pdl=False)
    assert told.pdl is False and "pdl" not in told.measured_settings
