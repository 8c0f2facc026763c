"""The classifier on the WebGPU executor (tiny preset, lavapipe in CI): every score against the float64
reference per weight format, prefix-cache branching, final-row slicing, and the bad inputs users hit."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest

import tilewise
from tilewise.errors import ConfigError, DeviceLost
from tilewise.kernels.attention.webgpu import AttentionTemplate
from tilewise.kernels.matmul import webgpu as mm
from tilewise.kernels.matmul.webgpu import MatmulTemplate
from tilewise.model import reference
from tilewise.model.checkpoint import HEAD
from tilewise.model.dispatch import load_model_table, matmul_key
from tilewise.model.webgpu import WebGPUExecutor
from tilewise.tune.dispatch import DispatchTable, Entry

pytestmark = pytest.mark.webgpu


@pytest.fixture(scope="module")
def models(webgpu_device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no tuned dispatch table" is expected here
        return {w: tilewise.load("tiny", device="webgpu", weights=w, seed=3) for w in ("nf4", "f16", "f32")}


def _ids(rng, n, vocab=512):
    return rng.integers(0, vocab, n)


@pytest.mark.parametrize("weights", ["nf4", "f16", "f32"])
@pytest.mark.parametrize("n", [1, 95, 96, 97])
def test_all_scores_match_the_float64_reference(models, rng, weights, n):
    model = models[weights]
    ck = model.checkpoint
    dequant = {k: ck.float32(k) for k in ck.names()}
    ids = _ids(rng, n)
    ref, _ = reference.forward(model.config, dequant, ids)
    state = model.prefill(ids)
    ref_scores = dequant[HEAD].astype(np.float64) @ ref[-1]
    # the reference uses the same (dequantized) weights, so every format is held to float32 accumulation error
    np.testing.assert_allclose(model.scores(state), ref_scores, atol=2e-5, rtol=0)
    np.testing.assert_allclose(model.hidden(state), ref[-1], atol=2e-5, rtol=0)
    np.testing.assert_allclose(state.caches.scores, ref_scores, atol=2e-5, rtol=0)  # the GPU's own head


@pytest.mark.parametrize("split", [1, 47, 95, 96])
def test_prefill_all_equals_prefix_plus_extend(models, rng, split):
    model = models["nf4"]
    ids = _ids(rng, 130)
    full = model.scores(model.prefill(ids))
    ext = model.scores(model.extend(model.prefill(ids[:split]), ids[split:]))
    np.testing.assert_allclose(ext, full, atol=2e-6, rtol=0)


def test_base_state_unchanged_after_many_branches(models, rng):
    model = models["nf4"]
    ex = model.executor
    base = model.prefill(_ids(rng, 47))
    before = {i: [ex.dev.download(b) for b in kv] for i, kv in base.caches.kv.items()}
    conv_before = {i: ex.dev.download(b) for i, b in base.caches.conv.items()}
    tail = _ids(rng, 60)
    first = model.scores(model.extend(base, tail))
    for _ in range(12):
        model.extend(base, _ids(rng, int(rng.integers(1, 80))))
    for i, kv in base.caches.kv.items():
        for old, buf in zip(before[i], kv):
            np.testing.assert_array_equal(ex.dev.download(buf), old)
    for i, buf in base.caches.conv.items():
        np.testing.assert_array_equal(ex.dev.download(buf), conv_before[i])
    np.testing.assert_array_equal(model.scores(model.extend(base, tail)), first)


def test_reused_decision_plans_give_each_decision_its_own_answer(models, rng):
    """Decisions of one shape reuse their launch list (and, from its second run, commands encoded ahead); the token
    ids and the cached base must still be each decision's own: every branch matches a fresh CPU run of the same
    tokens, whether earlier states are kept alive (new pooled caches each time) or dropped (the same caches come back
    from the pool)."""
    model = models["nf4"]
    cpu = tilewise.load("tiny", device="cpu", weights="nf4", seed=3)
    ex = model.executor
    prefixes = [_ids(rng, 40), _ids(rng, 40)]
    bases = [model.prefill(p) for p in prefixes]
    cpu_bases = [cpu.prefill(p) for p in prefixes]
    kept = []
    reused = 0
    recorded_before = ex.dev.recorded_runs
    for step in range(24):
        b = int(rng.integers(2)) if step > 1 else step  # no pattern the cache pool could line up with
        tail = _ids(rng, 57)
        plans_before = len(ex._plans)
        state = model.extend(bases[b], tail)
        reused += len(ex._plans) == plans_before
        np.testing.assert_allclose(model.scores(state), cpu.scores(cpu.extend(cpu_bases[b], tail)), atol=2e-5,
                                   rtol=0)
        if step < 6:
            kept.append(state)  # alive: the next decisions draw other caches from the pool
    assert reused >= 6, "decisions of one shape from one base should reuse their plan once the pool cycles"
    # some of those reuses ran from commands encoded during the plan's previous run (and still matched the CPU)
    assert ex.dev.recorded_runs > recorded_before


@pytest.mark.parametrize("first", [0, 4])
def test_decision_submissions_carry_the_read_back(models, rng, monkeypatch, first):
    """With `submit_first_launches` 0 the launches and the read-back of the result row go to the GPU in one submit
    (no second one for the copy); otherwise in growing pieces, the copy with the last; a run from commands encoded
    ahead is one submit; same scores every way."""
    from tilewise.devices.webgpu import submit_pieces

    model = models["nf4"]
    ids = _ids(rng, 50 + first)  # a length no other test uses: this plan's first run is here
    model.scores(model.prefill(ids))  # buffers and pipelines made (their uploads are no decision's submits)
    n_launches = len(model.executor.plan(np.asarray(ids), 0, None, True)[0].launches)
    monkeypatch.setattr(model.executor.dev, "submit_first_launches", first)
    queue = model.executor.dev._dev.queue
    buffer_cls = type(model.executor.act["res"].handle)
    submits, mapping = [], []
    real_submit, real_map = type(queue).submit, buffer_cls.map_sync

    def submit(self, bufs):
        if not mapping:  # wgpu-py's map_sync submits an empty command buffer of its own to sync; that is no work
            submits.append(len(bufs))
        return real_submit(self, bufs)

    def map_sync(self, *args, **kwargs):
        mapping.append(1)
        try:
            return real_map(self, *args, **kwargs)
        finally:
            mapping.pop()

    monkeypatch.setattr(type(queue), "submit", submit)
    monkeypatch.setattr(buffer_cls, "map_sync", map_sync)
    scores = model.scores(model.prefill(ids))
    expected = [1] * len(submit_pieces(n_launches, first))
    assert (len(expected) > 2) == (first > 0)
    assert submits == expected, f"a decision of {n_launches} launches submitted {submits} command buffers"
    # the plan's third run submits the commands encoded during its second: one command buffer, read-back included
    submits.clear()
    again = model.scores(model.prefill(ids))
    assert submits == [1], f"a decision from recorded commands submitted {submits} command buffers"
    cpu = tilewise.load("tiny", device="cpu", weights="nf4", seed=3)
    np.testing.assert_allclose(scores, cpu.scores(cpu.prefill(ids)), atol=2e-5, rtol=0)
    np.testing.assert_array_equal(again, scores)


def test_final_row_slicing_changes_nothing_but_launch_count(models, rng):
    model = models["f32"]
    ids = _ids(rng, 100)
    model.final_row_slicing = False
    try:
        whole = model.scores(model.prefill(ids))
        n_whole = len(model.executor.plan(np.asarray(ids), 0, None, False)[0].launches)
    finally:
        model.final_row_slicing = True
    sliced = model.scores(model.prefill(ids))
    np.testing.assert_allclose(sliced, whole, atol=2e-6, rtol=0)
    plan, _ = model.executor.plan(np.asarray(ids), 0, None, True)
    # the sliced plan copies the last row once (plus nothing else): its FFN runs on one row
    assert len(plan.launches) == n_whole + 1
    assert plan.launches[-2].grid[1] == 1  # the last down projection covers one row


def test_timed_decision_reports_every_launch(models, rng):
    model = models["nf4"]
    ex = model.executor
    ids = np.asarray(_ids(rng, 20))
    hidden, _ = ex.forward(ids, 0, None, True, timed=True)
    labels = [lab for lab, _ in ex.last_op_times]
    assert labels[0] == "embed" and labels[-1] == "head" and "ffn.gate_up" in labels
    assert all(ms >= 0 for _, ms in ex.last_op_times)
    np.testing.assert_allclose(hidden, model.hidden(model.prefill(ids)), atol=1e-6)


def test_prompt_longer_than_positions_is_refused(models):
    model = models["nf4"]
    cfg = model.config
    with pytest.raises(ConfigError, match="positions"):
        model.executor.plan(np.zeros(cfg.max_position_embeddings + 1, np.int64), 0, None, True)
    with pytest.raises(ConfigError, match="positions"):
        model.prefill(np.zeros(cfg.max_position_embeddings + 1, np.int64))


class _Proxy:
    """The real device with other limits, or a device that loses itself once."""

    def __init__(self, dev, limits=None, lose_on_run=False):
        self._dev = dev
        self.info = dataclasses.replace(dev.info, limits=limits) if limits else dev.info
        self._lose = lose_on_run
        self._lost = False

    def __getattr__(self, name):
        return getattr(self._dev, name)

    def _maybe_lose(self):
        if self._lose:
            self._lose, self._lost = False, True
            raise DeviceLost("the WebGPU device was lost while submitting work: simulated", "retry")

    def run(self, launches):
        self._maybe_lose()
        return self._dev.run(launches)

    def run_and_download(self, launches, buffer, dtype=np.float32, shape=None, reuse=None):
        self._maybe_lose()
        return self._dev.run_and_download(launches, buffer, dtype, shape, reuse=reuse)


def test_model_too_big_for_the_adapter_names_tensor_and_limit(models, webgpu_device):
    ck = models["f32"].checkpoint
    small = dataclasses.replace(webgpu_device.info.limits, max_storage_binding_bytes=100_000)
    with pytest.raises(ConfigError) as err:
        WebGPUExecutor(ck, device=_Proxy(webgpu_device, small), dispatch=DispatchTable())
    text = str(err.value)
    assert "embed_tokens.weight" in text and "max_storage_binding_bytes 100000" in text and "fix:" in text


def test_device_loss_mid_decision_is_clear_and_the_next_decision_rebuilds(models, webgpu_device, rng):
    ck = models["nf4"].checkpoint
    ex = WebGPUExecutor(ck, device=_Proxy(webgpu_device, lose_on_run=True), dispatch=DispatchTable())
    ids = np.asarray(_ids(rng, 30))
    with pytest.raises(DeviceLost, match="during a decision") as err:
        ex.forward(ids, 0, None, True)
    assert "rebuild" in err.value.fix
    gen = ex.generation
    hidden, _ = ex.forward(ids, 0, None, True)
    assert ex.generation == gen + 1
    np.testing.assert_allclose(hidden, models["nf4"].hidden(models["nf4"].prefill(ids)), atol=1e-6)


def _table(fp, entries):
    """A dispatch table of the current kernels' versions with `entries`: key -> (kernel, config values)."""
    table = DispatchTable(fp)
    for key, (kernel, values) in entries.items():
        tpl = AttentionTemplate() if kernel == "attention" else MatmulTemplate.from_name(kernel)
        table.put(key, Entry([{"m_min": 1, "m_max": None, "kernel": kernel, "config": values}]), tpl)
    return table


TILE = {"BM": 16, "BN": 16, "BK": 8, "TM": 1, "TN": 8, "F16S": False}


def test_dispatch_table_from_another_device_or_unreadable_is_ignored(webgpu_device, tmp_path):
    fp = webgpu_device.info.fingerprint
    path = _table(fp, {"nf4_matmul.none:64x64": ("nf4_matmul.tiled.none", TILE)}).save(tmp_path / "t.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_model_table(fp, path)
    assert loaded.pick("nf4_matmul.none:64x64", 5) == ("nf4_matmul.tiled.none", TILE)
    d = json.loads(path.read_text())
    d["device"] = "webgpu:Vulkan:other-gpu:1:abc"
    (tmp_path / "other.json").write_text(json.dumps(d))
    (tmp_path / "junk.json").write_text("{")
    for name, needle in (("other.json", "measured on"), ("junk.json", "ignoring")):
        with pytest.warns(UserWarning, match=needle):
            table = load_model_table(fp, tmp_path / name)
        assert table.entries == {} and table.source == "defaults"
    with pytest.warns(UserWarning, match="tilewise tune model"):
        load_model_table(fp, tmp_path / "missing.json")


def test_dispatch_table_drops_only_the_families_whose_kernels_changed(webgpu_device, tmp_path):
    fp = webgpu_device.info.fingerprint
    attn = {"BQ": 16, "BKV": 8, "KT": 1, "LZ": 0}
    path = _table(fp, {"nf4_matmul.none:64x64": ("nf4_matmul.tiled.none", TILE),
                       "attention:4x2x16": ("attention", attn)}).save(tmp_path / "t.json")
    for family in ("attention", "matmul"):
        d = json.loads(path.read_text())
        d["kernel_versions"][family] = "0ld"
        stale = tmp_path / f"stale-{family}.json"
        stale.write_text(json.dumps(d))
        with pytest.warns(UserWarning, match=f"the {family} kernels changed"):
            table = load_model_table(fp, stale)
        assert table.source == str(stale)
        kept = {"attention:4x2x16"} if family == "matmul" else {"nf4_matmul.none:64x64"}
        assert set(table.entries) == kept


def test_the_executor_launches_a_config_as_the_tuner_measured_it(models, webgpu_device, rng):
    """One launch-building path: the executor's launches of a tuned matmul are the template's own launches."""
    from tilewise.tune.engine import Engine, Item

    model = models["nf4"]
    h = model.config.hidden_size
    cfg = {**mm.DEFAULT_TILED, "BM": 32, "KS": 2}
    key = matmul_key("nf4", "residual", h, model.config.ffn_dim)
    table = _table(webgpu_device.info.fingerprint, {key: ("nf4_matmul.splitk.residual", cfg)})
    ex = WebGPUExecutor(model.checkpoint, device=webgpu_device, dispatch=table)
    plan, _ = ex.plan(np.asarray(_ids(rng, 40)), 0, None, True)
    mine = [ln for ln, lab in zip(plan.launches, plan.labels) if lab == "ffn.down"][:2]  # slices + reduction
    tpl, config = ex.matmul_choice("residual", h, model.config.ffn_dim, 40, False)
    shape = (40, h, model.config.ffn_dim)
    eng = Engine(webgpu_device)
    item = Item(tpl, config, shape)
    theirs = eng.launches(item)
    assert tpl.name == "nf4_matmul.splitk.residual" and config == tpl.config_of(cfg)
    assert [ln.grid for ln in mine] == [ln.grid for ln in theirs] and len(mine) == 2
    assert [ln.program.source_hash for ln in mine] == [ln.program.source_hash for ln in theirs]
    assert [len(ln.buffers) for ln in mine] == [len(ln.buffers) for ln in theirs]
    assert eng.evaluate([item])[0].status == "ok"  # the config the executor runs is a verified one


@pytest.mark.parametrize("kind", ["splitk", "rows", "tiled"])
def test_every_matmul_kind_runs_the_whole_model(models, rng, webgpu_device, kind):
    from tilewise.model.tune import model_matmuls

    model = models["nf4"]
    cfg = {"splitk": {**mm.DEFAULT_TILED, "BM": 32, "KS": 2}, "rows": mm.DEFAULT_ROWS, "tiled": mm.DEFAULT_TILED}[kind]
    table = _table(webgpu_device.info.fingerprint, {
        matmul_key("nf4", e, n, k, nm): (MatmulTemplate(kind, "nf4", e, None, norm=nm).name, cfg)
        for e, n, k, nm in model_matmuls(model.config).values()})
    ex = WebGPUExecutor(model.checkpoint, device=webgpu_device, dispatch=table)
    for n in (1, 97):
        ids = np.asarray(_ids(rng, n))
        plan, _ = ex.plan(ids, 0, None, True)
        names = {lab.program.name.split("[")[0] for lab in plan.launches}
        assert f"nf4_matmul.{kind}.swiglu.norm" in names  # split-K too: the norm's sums of squares add over K
        assert f"nf4_matmul.{kind}.residual" in names
        hidden, _ = ex.forward(ids, 0, None, True)
        np.testing.assert_allclose(hidden, model.hidden(model.prefill(ids)), atol=2e-5, rtol=0)


def test_play_takes_an_adapter_index(webgpu_device, capsys):
    from tilewise.cli import main

    index = webgpu_device.info.index
    assert main(["play", "--policy", "model", "--device", f"webgpu:{index}", "--steps", "2", "--json", "-"]) == 0
    out = capsys.readouterr()
    assert out.err.startswith(f"device: webgpu:{index} (") and json.loads(out.out)["device"] == "webgpu"


def test_the_command_shows_warnings_as_notes(tmp_path):
    """A user running `tilewise` sees a missing dispatch table as one `note:` line, not a Python warning with a path."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TILEWISE_DISPATCH_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "tilewise", "play", "--device", "webgpu", "--steps", "2"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    assert "note: no tuned dispatch table for webgpu:" in run.stderr
    assert "UserWarning" not in run.stderr and ".py:" not in run.stderr


@pytest.mark.parametrize("types, copies", [(("conv", "full_attention", "conv"), 2),  # 97 rows, 3, then 1
                                           (("full_attention", "conv", "conv"), 3)])  # 97, 5, 3, 1
def test_sliced_tail_blocks_match_the_reference_and_leave_a_usable_state(webgpu_device, rng, types, copies):
    import dataclasses

    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import preset
    from tilewise.model.runtime import from_checkpoint

    cfg = dataclasses.replace(preset("tiny"), layer_types=types)
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 6), "f32", "preset:tail")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = from_checkpoint(ck, device="webgpu", quiet=True)
    dequant = {k: ck.float32(k) for k in ck.names()}
    ids, more = _ids(rng, 97), _ids(rng, 5)
    state = model.prefill(ids)
    ref, _ = reference.forward(cfg, dequant, ids)
    np.testing.assert_allclose(model.hidden(state), ref[-1], atol=2e-5, rtol=0)
    ref2, _ = reference.forward(cfg, dequant, np.concatenate([ids, more]))  # from the sliced run's caches
    np.testing.assert_allclose(model.hidden(model.extend(state, more)), ref2[-1], atol=2e-5, rtol=0)
    plan, _ = model.executor.plan(np.asarray(ids), 0, None, True)
    assert plan.labels.count("copy.last_rows") == copies
