"""The Model API on the CPU executor: reference agreement per weight format, prefix-cache branching,
final-row slicing, presets' activation scale, and bad input."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tilewise
from tilewise.errors import ConfigError, DeviceUnavailable, TilewiseError
from tilewise.model import checkpoint as ckpt
from tilewise.model import reference, runtime
from tilewise.model.config import preset


@pytest.fixture(scope="module")
def tiny_nf4():
    return tilewise.load("tiny", weights="nf4", seed=1)


def _ids(rng, n, vocab=512):
    return rng.integers(0, vocab, n)


@pytest.mark.parametrize("weights", ["nf4", "f16", "f32"])
def test_executor_matches_float64_reference_on_its_weights(rng, weights):
    model = tilewise.load("tiny", weights=weights, seed=2)
    ck = model.checkpoint
    dequant = {n: ck.float32(n) for n in ck.names()}
    ids = _ids(rng, 97)
    ref, _ = reference.forward(model.config, dequant, ids)
    state = model.prefill(ids)
    np.testing.assert_allclose(model.hidden(state), ref[-1], atol=1e-4, rtol=0)
    np.testing.assert_allclose(model.scores(state), dequant[ckpt.HEAD] @ ref[-1], atol=1e-4, rtol=0)
    assert model.scores(state).shape == (8,) and model.hidden(state).shape == (64,)


def test_formats_differ_only_by_quantization(rng):
    ids = _ids(rng, 50)
    s = {w: tilewise.load("tiny", weights=w, seed=2) for w in ("nf4", "f16", "f32")}
    out = {w: m.scores(m.prefill(ids)) for w, m in s.items()}
    assert np.abs(out["f16"] - out["f32"]).max() < 1e-2
    assert 1e-4 < np.abs(out["nf4"] - out["f32"]).max() < 0.5  # NF4 moves scores, but not wildly


def test_extend_branches_without_changing_the_base(rng, tiny_nf4):
    m = tiny_nf4
    prefix, a, b = _ids(rng, 47), _ids(rng, 30), _ids(rng, 30)
    base = m.prefill(prefix)
    base_hidden = m.hidden(base)
    base_caches = [tuple(np.copy(x) for x in c) if isinstance(c, tuple) else np.copy(c) for c in base.caches]
    sa = m.extend(base, a)
    sb = m.extend(base, b)
    sa2 = m.extend(base, a)  # the same branch again, after another branch was taken
    np.testing.assert_array_equal(m.hidden(base), base_hidden)
    for before, after in zip(base_caches, base.caches):
        for x, y in zip(before if isinstance(before, tuple) else (before,),
                        after if isinstance(after, tuple) else (after,)):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(m.scores(sa), m.scores(sa2))
    assert not np.allclose(m.scores(sa), m.scores(sb))
    full = m.prefill(np.concatenate([prefix, a]))
    np.testing.assert_allclose(m.scores(sa), m.scores(full), atol=1e-5, rtol=0)
    assert sa.n_tokens == 77 and base.n_tokens == 47
    with pytest.raises(ValueError):
        base.last_hidden[0] = 1.0  # states are read-only


def test_a_state_keeps_nothing_of_the_callers_ids(rng, tiny_nf4):
    """int64 ids are checked without a copy; a state must still not change when the caller reuses the array."""
    m = tiny_nf4
    ids = rng.integers(0, 512, 60)
    state = m.prefill(ids)
    scores, hidden = m.scores(state), m.hidden(state)
    ids[:] = rng.integers(0, 512, 60)
    np.testing.assert_array_equal(m.scores(state), scores)
    np.testing.assert_array_equal(m.hidden(state), hidden)
    np.testing.assert_array_equal(m.scores(m.prefill(ids)), m.scores(m.prefill(ids.copy())))
    assert not np.array_equal(m.scores(m.prefill(ids)), scores)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 40])
def test_final_row_slicing_changes_nothing(rng, tiny_nf4, n):
    m = tiny_nf4
    ids, more = _ids(rng, n), _ids(rng, n)
    m.final_row_slicing = True
    sliced = m.extend(m.prefill(ids), more)
    m.final_row_slicing = False
    try:
        full = m.extend(m.prefill(ids), more)
    finally:
        m.final_row_slicing = True
    np.testing.assert_allclose(m.hidden(sliced), m.hidden(full), atol=2e-6, rtol=0)
    # the sliced run must also leave a state every later token can use
    last = _ids(rng, 3)
    np.testing.assert_allclose(m.hidden(m.extend(sliced, last)), m.hidden(m.extend(full, last)), atol=2e-6, rtol=0)


LFM2_350M_TYPES = preset("lfm2-350m").layer_types  # attention at 2, 5, 8, 10, 12, 14 of 16 blocks


def test_block_rows_cut_the_blocks_after_the_last_attention_block_to_what_the_last_row_reaches():
    plan = runtime.block_rows(LFM2_350M_TYPES, 3, 346, True)
    assert plan[:14] == [runtime.BlockRows(346, 346)] * 14
    assert plan[14:] == [runtime.BlockRows(346, 3), runtime.BlockRows(3, 1)]  # attention, then the last conv
    assert runtime.block_rows(LFM2_350M_TYPES, 3, 346, False) == [runtime.BlockRows(346, 346)] * 16
    # convs only: each reaches L - 1 rows further back, until every row is needed
    assert runtime.block_rows(("conv",) * 4, 3, 10, True) == [
        runtime.BlockRows(9, 7), runtime.BlockRows(7, 5), runtime.BlockRows(5, 3), runtime.BlockRows(3, 1)]
    assert runtime.block_rows(("conv",) * 4, 3, 6, True)[:2] == [runtime.BlockRows(6, 6), runtime.BlockRows(6, 5)]
    assert runtime.block_rows(("full_attention",) * 2, 3, 5, True) == [runtime.BlockRows(5, 5),
                                                                       runtime.BlockRows(5, 1)]
    assert runtime.tail_capacity(LFM2_350M_TYPES, 3) == 3 and runtime.tail_capacity(("conv",) * 4, 4) == 10
    assert runtime.tail_capacity(("conv", "full_attention"), 3) == 1


@given(types=st.lists(st.sampled_from(["conv", "full_attention"]), min_size=1, max_size=12),
       conv_L=st.integers(2, 6), n=st.integers(1, 80), sliced=st.booleans())
def test_block_rows_give_every_block_the_rows_its_mixer_reads(types, conv_L, n, sliced):
    plan = runtime.block_rows(types, conv_L, n, sliced)
    assert plan[-1].outputs == (1 if sliced else n)
    before = n  # the embedding outputs every row
    for kind, b in zip(types, plan):
        assert 1 <= b.outputs <= b.inputs <= before  # a block reads only rows the block before it output
        if kind == "full_attention":
            assert b.inputs == n  # every row's K and V go into the cache
        else:  # exactly each output row's L taps and the new conv state's last L rows (all rows if fewer)
            assert b.inputs == min(n, b.outputs + conv_L - 1)
        before = b.outputs
    assert max([b.outputs for b in plan if b.outputs < n], default=1) <= runtime.tail_capacity(types, conv_L)


def test_the_tune_measures_the_tails_row_counts():
    from tilewise.model.tune import tail_rows

    assert tail_rows(preset("lfm2-350m"), 346) == {1, 3} == tail_rows(preset("seed-250m"), 346)
    assert tail_rows(preset("tiny"), 346) == {1}  # it ends in attention: only the last row is cut


TAIL_TYPES = {"one conv after": ("conv", "full_attention", "conv"),
              "two convs after": ("full_attention", "conv", "conv"),
              "convs only": ("conv", "conv", "conv")}


@pytest.mark.parametrize("types", TAIL_TYPES.values(), ids=TAIL_TYPES.keys())
@pytest.mark.parametrize("n", [1, 2, 4, 9, 40])
def test_sliced_tails_change_nothing_and_leave_a_state_later_tokens_can_use(rng, types, n):
    import dataclasses

    cfg = dataclasses.replace(preset("tiny"), layer_types=types)
    ck = ckpt.Checkpoint.from_arrays(cfg, ckpt.random_tensors(cfg, 5), "f32", "preset:tail")
    m = runtime.from_checkpoint(ck, device="cpu", quiet=True)
    ids, more, last = _ids(rng, n), _ids(rng, n), _ids(rng, 3)
    sliced = m.extend(m.prefill(ids), more)
    m.final_row_slicing = False
    full = m.extend(m.prefill(ids), more)
    np.testing.assert_allclose(m.hidden(sliced), m.hidden(full), atol=2e-6, rtol=0)
    for x, y in zip(sliced.caches, full.caches):  # every K/V row and conv state, not just the last row
        for a, b in zip(x if isinstance(x, tuple) else (x,), y if isinstance(y, tuple) else (y,)):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)  # float32 GEMMs of other row counts
    m.final_row_slicing = True
    np.testing.assert_allclose(m.hidden(m.extend(sliced, last)), m.hidden(m.extend(full, last)), atol=2e-6, rtol=0)
    dequant = {k: ck.float32(k) for k in ck.names()}
    ref, _ = reference.forward(cfg, dequant, np.concatenate([ids, more]))
    np.testing.assert_allclose(m.hidden(sliced), ref[-1], atol=1e-4, rtol=0)


def test_deep_random_preset_keeps_activations_order_one(rng):
    cfg = preset("tiny").replace(layer_types=("conv", "conv", "full_attention") * 6, name="deep")
    t = ckpt.random_tensors(cfg, seed=0)
    ids = _ids(rng, 64)
    unit = dict(t, **{"embedding_norm.weight": np.ones(cfg.hidden_size, np.float32)})
    hidden, _ = reference.forward(cfg, unit, ids)
    assert 0.5 < hidden.std() < 2.0  # RMS-normed output
    # each stack of blocks changes the (normed) stream by O(1): later blocks neither vanish nor explode
    prev, _ = reference.forward(cfg.replace(layer_types=cfg.layer_types[:1]), unit, ids)
    for n_layers in (3, 9, 18):
        sub = cfg.replace(layer_types=cfg.layer_types[:n_layers])
        h, _ = reference.forward(sub, unit, ids)
        assert 0.05 < np.abs(h - prev).mean() < 2.0
        prev = h
    scores = t[ckpt.HEAD] @ hidden[-1]
    assert scores.std() > 0.1


def test_bad_token_ids_and_lengths(tiny_nf4):
    m = tiny_nf4
    with pytest.raises(ConfigError, match=r"token id 512 at index 2 is outside the vocabulary \(0\.\.511\)"):
        m.prefill([1, 2, 512])
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        m.prefill([-1])
    with pytest.raises(ConfigError, match="no token ids"):
        m.prefill([])
    with pytest.raises(ConfigError, match="1-D"):
        m.prefill([[1, 2]])
    with pytest.raises(ConfigError, match="1-D"):
        m.prefill([1.5, 2.0])
    state = m.prefill(np.arange(2000) % 512)
    with pytest.raises(ConfigError, match="exceeds the model's 2048 positions"):
        m.extend(state, np.arange(49))
    with pytest.raises(ConfigError, match="no tokenizer"):
        m.prefill("hello")
    other = tilewise.load("tiny", weights="f32")
    with pytest.raises(ConfigError, match="another model"):
        other.extend(state, [1])
    with pytest.raises(ConfigError, match="expected a State"):
        m.scores(np.zeros(64))


@given(st.sampled_from(["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]),
       st.lists(st.integers(-2**70, 2**70), min_size=1, max_size=12), st.integers(0, 3))
def test_token_ids_are_taken_exactly_when_every_one_is_in_the_vocabulary(tiny_nf4, dtype, values, near):
    """`Model._ids` over every integer dtype, ids near the vocabulary's ends and past int64: taken (as the same int64
    values) when all lie in 0..vocab-1, refused naming the first outside id otherwise."""
    m, vocab = tiny_nf4, tiny_nf4.config.vocab_size
    info = np.iinfo(dtype)
    # values near the edges that matter (-1, 0, vocab - 1, vocab), folded into the dtype's range
    edges = [-1, 0, vocab - 1, vocab]
    vals = [min(max(v if i % 4 != near else edges[i % 4], info.min), info.max) for i, v in enumerate(values)]
    arr = np.array(vals, dtype=dtype)
    inside = [0 <= v < vocab for v in vals]
    if all(inside):
        got = m._ids(arr, 0)
        assert got.dtype == np.int64 and got.tolist() == vals
    else:
        first = inside.index(False)
        with pytest.raises(ConfigError, match=f"token id {vals[first]} at index {first} is outside"):
            m._ids(arr, 0)


def test_devices_and_sources():
    with pytest.raises(DeviceUnavailable, match="no executor for 'tvm-llvm'"):
        tilewise.load("tiny", device="tvm-llvm")
    if importlib.util.find_spec("cupy") is None:  # cuda has an executor: without CuPy the device itself is refused
        with pytest.raises(DeviceUnavailable, match="CuPy is not installed"):
            tilewise.load("tiny", device="cuda:0")
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        tilewise.load("tiny", device="tpu")
    with pytest.raises(ConfigError, match="weights format"):
        tilewise.load("tiny", weights="int8")
    with pytest.raises(ConfigError, match="neither a model preset nor an existing path"):
        tilewise.load("no-such-model")
    model = tilewise.load("tiny", device="auto")
    assert model.device == "cpu"  # CI has lavapipe at most: a software adapter is slower than the CPU
    assert model.device_choice.name == "cpu" and model.device_choice.line().startswith("device: cpu")


def test_default_model_missing_is_explained():
    if runtime.DEFAULT_MODEL_DIR.exists():
        pytest.skip("a bundled model is present")
    with pytest.raises(TilewiseError, match="no bundled model is present") as exc:
        tilewise.load("default")
    assert "tiny" in str(exc.value) and "path" in str(exc.value)


def test_headless_checkpoint_gives_hidden_not_scores(tmp_path, rng):
    cfg = preset("tiny")
    t = ckpt.random_tensors(cfg, seed=5, head=False)
    ckpt.save_hf_folder(cfg, t, tmp_path)
    m = tilewise.load(str(tmp_path), weights="f32")
    state = m.prefill(_ids(rng, 10))
    assert m.hidden(state).shape == (cfg.hidden_size,)
    with pytest.raises(ConfigError, match=r"no classifier head \(score.weight, 8 x 64\)"):
        m.scores(state)


def test_tokenizer_is_loaded_from_the_folder(tmp_path, rng):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(100)} | {"[UNK]": 100}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    cfg = preset("tiny")
    ckpt.save_hf_folder(cfg, ckpt.random_tensors(cfg, seed=6), tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    m = tilewise.load(str(tmp_path), weights="nf4")
    assert m.tokenizer is not None and m.encode("w3 w7 w99") == [3, 7, 99]
    np.testing.assert_array_equal(m.scores(m.prefill("w3 w7 w99")), m.scores(m.prefill([3, 7, 99])))


def test_load_progress_goes_to_stderr_and_quiet_prints_nothing(capfd, monkeypatch, rng):
    monkeypatch.setattr(runtime, "PROGRESS_AFTER_S", 0.0)  # report every step, however fast
    seed = int(rng.integers(1 << 30))
    loud = tilewise.load("tiny", device="cpu", weights="nf4", seed=seed)
    out, err = capfd.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 3, lines
    n_matrices = sum(ckpt.is_matrix(n) for n in loud.checkpoint.names())
    assert lines[0].startswith(f"loading tiny: seeded random weights (seed {seed}) ... ")
    assert lines[1].startswith(f"loading tiny: quantizing {n_matrices} tensors to NF4 ... ")
    assert lines[2].startswith("loading tiny: preparing float32 weights for ") and all(ln.endswith(" s")
                                                                                       for ln in lines)
    quiet = tilewise.load("tiny", device="cpu", weights="nf4", seed=seed, quiet=True)
    assert capfd.readouterr() == ("", "")
    ids = rng.integers(0, 512, 9)
    np.testing.assert_array_equal(quiet.scores(quiet.prefill(ids)), loud.scores(loud.prefill(ids)))


def test_cpu_swiglu_is_silu_times_up_to_the_bit_and_leaves_its_inputs(rng):
    """The CPU executor's one-temporary SwiGLU computes g / (1 + exp(-g)) * u in the same order as the formula."""
    from tilewise.model.cpu import _swiglu

    gu = (rng.standard_normal((37, 2 * 96)) * 40).astype(np.float32)  # some |g| > 88: exp(-g) overflows, underflows
    before = gu.copy()
    g, u = gu[:, :96], gu[:, 96:]
    with np.errstate(over="ignore"):  # exp(-g) = inf, so g / inf = -0.0 on both sides
        np.testing.assert_array_equal(_swiglu(g, u), g / (np.float32(1.0) + np.exp(-g)) * u)
    np.testing.assert_array_equal(gu, before)
