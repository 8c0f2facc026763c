"""Checkpoints: HF folders (prefixed, sharded, bf16), tilewise formats, lazy mapping, and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.model import checkpoint as ckpt
from tilewise.model.config import preset
from tilewise.quant.nf4 import NF4Tensor


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("tiny")
    return cfg, ckpt.random_tensors(cfg, seed=3)


def test_random_weights_are_seeded_and_never_zero(tiny):
    cfg, t = tiny
    again = ckpt.random_tensors(cfg, seed=3)
    other = ckpt.random_tensors(cfg, seed=4)
    for name, w in t.items():
        assert np.count_nonzero(w) == w.size, name
        np.testing.assert_array_equal(w, again[name])
        assert not np.array_equal(w, other[name])
    assert set(t) == set(ckpt.expected_shapes(cfg)) | {ckpt.HEAD}


@pytest.mark.parametrize("prefix", ["", "model."])
def test_hf_folder_loads_with_or_without_prefix(tmp_path, tiny, prefix):
    cfg, t = tiny
    ckpt.save_hf_folder(cfg, t, tmp_path, prefix=prefix)
    ck = ckpt.Checkpoint.open(tmp_path)
    assert ck.config == cfg and ck.weights == "f32" and ck.has_head
    for name, w in t.items():
        np.testing.assert_array_equal(ck.float32(name), w)
    # lazily memory-mapped: the stored array is a view of the mapped file, not a copy
    arr = ck.get("layers.0.conv.in_proj.weight")
    assert isinstance(arr.base, np.ndarray) and not arr.flags.writeable


def test_sharded_bf16_folder_with_lm_head(tmp_path, tiny):
    from safetensors.numpy import save_file

    cfg, t = tiny
    names = sorted(t)
    bf16 = {}
    for n in names:  # bfloat16 = the top 16 bits of float32 (round toward zero here)
        bf16[n] = (t[n].view(np.uint32) >> 16).astype(np.uint16)
    half = len(names) // 2
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        # safetensors.numpy cannot write BF16, so write U16 and patch the header's dtype (same byte count)
        save_file({"model." + n: bf16[n] for n in part}, str(tmp_path / fname))
        raw = (tmp_path / fname).read_bytes()
        n_header = int.from_bytes(raw[:8], "little")
        header = raw[8 : 8 + n_header].decode().replace('"U16"', '"BF16"').encode()
        (tmp_path / fname).write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n_header :])
        weight_map.update({"model." + n: fname for n in part})
    save_file({"lm_head.weight": np.ones((3, 3), np.float32)}, str(tmp_path / "extra.safetensors"))
    weight_map["lm_head.weight"] = "extra.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ck = ckpt.Checkpoint.open(tmp_path)
    assert ck.weights == "bf16" and "lm_head.weight" not in ck.names()
    for n in names:
        want = (bf16[n].astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(ck.float32(n), want)


@pytest.mark.parametrize("fmt,double_quant", [("nf4", False), ("nf4", True), ("f16", False), ("f32", False)])
def test_tilewise_format_roundtrip(tmp_path, tiny, fmt, double_quant):
    cfg, t = tiny
    src = ckpt.Checkpoint.from_arrays(cfg, t, "f32", "test")
    conv = src.converted(fmt, blocksize=32, double_quant=double_quant)
    conv.save(tmp_path / "out")
    meta = ckpt.SafetensorsFile(tmp_path / "out" / "model.safetensors").metadata
    assert meta["format"] == "tilewise" and meta["format_version"] == "1" and meta["weights"] == fmt
    back = ckpt.Checkpoint.open(tmp_path / "out")
    assert back.config == cfg and back.weights == fmt
    for name in t:
        stored = back.get(name)
        assert isinstance(stored, NF4Tensor) == (fmt == "nf4" and ckpt.is_matrix(name))
        np.testing.assert_array_equal(back.float32(name), conv.float32(name))
        if not ckpt.is_matrix(name):
            np.testing.assert_array_equal(back.float32(name), t[name])  # norms, conv taps, head stay exact
    err = np.abs(back.float32("layers.0.feed_forward.w1.weight") - t["layers.0.feed_forward.w1.weight"]).max()
    assert err > 0 if fmt != "f32" else err == 0


def test_missing_and_misshapen_tensors_are_named(tmp_path, tiny):
    cfg, t = tiny
    bad = dict(t)
    del bad["layers.1.self_attn.k_proj.weight"]
    bad["layers.2.feed_forward.w2.weight"] = np.ones((64, 100), np.float32)
    ckpt.save_hf_folder(cfg, bad, tmp_path)
    with pytest.raises(ConfigError) as exc:
        ckpt.Checkpoint.open(tmp_path)
    msg = str(exc.value)
    assert "layers.1.self_attn.k_proj.weight (32, 64)" in msg
    assert "layers.2.feed_forward.w2.weight has shape (64, 100), expected (64, 128)" in msg


def test_non_lfm2_checkpoint(tmp_path, tiny):
    cfg, t = tiny
    ckpt.save_hf_folder(cfg, {"wte.weight": t["embed_tokens.weight"]}, tmp_path)
    with pytest.raises(ConfigError, match="no LFM2 tensor names"):
        ckpt.Checkpoint.open(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="not an LFM2 checkpoint"):
        ckpt.Checkpoint.open(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"no config\.json"):
        ckpt.Checkpoint.open(tmp_path)


def test_truncated_file(tmp_path, tiny):
    cfg, t = tiny
    ckpt.save_hf_folder(cfg, t, tmp_path)
    f = tmp_path / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) - 1000])
    with pytest.raises(ConfigError, match="truncated"):
        ckpt.Checkpoint.open(tmp_path)
    f.write_bytes(raw[:20])
    with pytest.raises(ConfigError, match="truncated"):
        ckpt.Checkpoint.open(tmp_path)


def test_checkpoint_without_head(tmp_path, tiny):
    cfg, t = tiny
    ckpt.save_hf_folder(cfg, {k: v for k, v in t.items() if k != ckpt.HEAD}, tmp_path)
    ck = ckpt.Checkpoint.open(tmp_path)
    assert not ck.has_head
    bad = dict(t, **{ckpt.HEAD: np.ones((6, cfg.hidden_size), np.float32)})
    ckpt.save_hf_folder(cfg, bad, tmp_path / "b")
    with pytest.raises(ConfigError, match=r"score.weight has shape \(6, 64\), expected \(8, 64\)"):
        ckpt.Checkpoint.open(tmp_path / "b")


def test_convert_cli(tmp_path, tiny, capsys):
    from tilewise.cli import main

    cfg, t = tiny
    ckpt.save_hf_folder(cfg, t, tmp_path / "hf", prefix="model.")
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "nf4"), "--format", "nf4"]) == 0
    out = capsys.readouterr().out
    assert "round-trip relative Frobenius error" in out and "tokenizer: copied" in out
    ck = ckpt.Checkpoint.open(tmp_path / "nf4")
    assert ck.weights == "nf4" and (tmp_path / "nf4" / "tokenizer.json").exists()
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    assert "no model at" in capsys.readouterr().err
    assert main(["convert", "tiny", str(tmp_path / "t16"), "--format", "f16", "--seed", "3"]) == 0
    np.testing.assert_array_equal(ckpt.Checkpoint.open(tmp_path / "t16").float32("embedding_norm.weight"),
                                  t["embedding_norm.weight"])


def test_materialize_on_threads_gives_what_one_thread_gives_and_the_same_first_error(tiny):
    cfg, tensors = tiny
    one = ckpt.Checkpoint.from_arrays(cfg, tensors, "f32", "memory").converted("nf4").materialize(workers=1)
    many = ckpt.Checkpoint.from_arrays(cfg, tensors, "f32", "memory").converted("nf4").materialize(workers=4)
    assert list(one.names()) == list(many.names())
    for name in one.names():
        a, b = one.get(name), many.get(name)
        if isinstance(a, NF4Tensor):
            np.testing.assert_array_equal(a.packed, b.packed)
            np.testing.assert_array_equal(a.absmax, b.absmax)
        else:
            np.testing.assert_array_equal(a, b)
    names = list(one.names())
    broken = ckpt.Checkpoint.from_arrays(cfg, tensors, "f32", "memory").converted("nf4")

    def refuse(name):
        def load():
            raise ConfigError(f"tensor {name} is damaged", "use another file")
        return load

    for name in (names[-1], names[len(names) // 2]):  # two bad tensors: the error names the first in order
        broken._loaders[name] = refuse(name)
    with pytest.raises(ConfigError, match=f"tensor {names[len(names) // 2]} is damaged"):
        broken.materialize(workers=4)
