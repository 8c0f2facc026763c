"""Bad model inputs get one clear error and change nothing: malformed or rule-breaking dispatch tables, integer,
boolean and non-finite weights (at load and at `tilewise convert`). No GPU: the checks run before any device."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from tilewise.devices.profiles import get_profile
from tilewise.errors import ConfigError
from tilewise.kernels.attention.webgpu import AttentionTemplate
from tilewise.kernels.matmul import webgpu as mm
from tilewise.model import checkpoint as ckpt
from tilewise.model.config import preset
from tilewise.model.dispatch import check_model_table, checked_table, dispatch_path, load_model_table, matmul_key
from tilewise.tune.dispatch import DispatchTable, Entry

FP = "webgpu:test-adapter"
LIMITS = get_profile("webgpu-default")
SWIGLU = matmul_key("nf4", "swiglu", 128, 64, True)
DOWN = matmul_key("nf4", "residual", 64, 128)
ATTN = "attention:4x2x16"


def _good_table() -> DispatchTable:
    """Three entries of the tiny model's ops, with the current kernels' versions: short rows, then tiles."""
    table = DispatchTable(FP)
    sw = mm.MatmulTemplate("tiled", "nf4", "swiglu", norm=True)
    table.put(SWIGLU, Entry([
        {"m_min": 1, "m_max": 31, "kernel": "nf4_matmul.rows.swiglu.norm", "config": dict(mm.DEFAULT_ROWS)},
        {"m_min": 32, "m_max": None, "kernel": sw.name, "config": dict(mm.DEFAULT_TILED)}]), sw)
    down = mm.MatmulTemplate("tiled", "nf4", "residual")
    table.put(DOWN, Entry([{"m_min": 1, "m_max": None, "kernel": down.name,
                            "config": {**mm.DEFAULT_TILED, "BM": 32}}]), down)
    attn = AttentionTemplate()
    table.put(ATTN, Entry([{"m_min": 1, "m_max": None, "kernel": "attention",
                            "config": {"BQ": 16, "BKV": 8, "KT": 1, "LZ": 0}}]), attn)
    return table


DROP = object()


def _with(table: DispatchTable, key: str, index: int, **changes) -> dict:
    """The table's JSON with one range of one entry changed (DROP removes the field)."""
    d = json.loads(json.dumps(table.to_json()))
    r = d["entries"][key]["ranges"][index]
    for k, v in changes.items():
        if v is DROP:
            del r[k]
        else:
            r[k] = v
    return d


def test_the_good_table_passes_every_check():
    table = _good_table()
    kept, problems = check_model_table(table, LIMITS)
    assert problems == [] and set(kept.entries) == {SWIGLU, DOWN, ATTN}
    assert checked_table(table, LIMITS).pick(SWIGLU, 40)[0] == "nf4_matmul.tiled.swiglu.norm"


MALFORMED = {
    "missing config": (lambda t: _with(t, SWIGLU, 0, config=DROP), "range 0 lacks config"),
    "missing m_min": (lambda t: _with(t, SWIGLU, 1, m_min=DROP), "range 1 lacks m_min"),
    "m_min a string": (lambda t: _with(t, SWIGLU, 0, m_min="1"), "m_min '1' is not a row count"),
    "m_min > m_max": (lambda t: _with(t, SWIGLU, 0, m_min=40, m_max=20), "m_min 40 > m_max 20"),
    "overlap": (lambda t: _with(t, SWIGLU, 1, m_min=20), "overlaps the rows up to 31"),
    "gap": (lambda t: _with(t, SWIGLU, 1, m_min=48), "rows 32..47 have no range"),
    "gap before the first": (lambda t: _with(t, DOWN, 0, m_min=3), "rows 1..2 have no range"),
    "open range not last": (lambda t: _with(t, SWIGLU, 0, m_max=None), "no upper bound"),
    "config a list": (lambda t: _with(t, DOWN, 0, config=[64, 64]), "is not an object of parameter values"),
    "config value a list": (lambda t: _with(t, DOWN, 0, config={"BM": [64]}), "not an object of parameter"),
    "kernel a number": (lambda t: _with(t, DOWN, 0, kernel=7), "kernel 7 is not a kernel name"),
    "entry a list": (lambda t: {**t.to_json(), "entries": {DOWN: [1, 2]}}, "is a list, not an object"),
    "no ranges": (lambda t: {**t.to_json(), "entries": {DOWN: {"family": "matmul", "ranges": []}}}, "no ranges"),
    "versions a list": (lambda t: {**t.to_json(), "kernel_versions": ["x"]}, "kernel_versions"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_table_is_one_config_error(case, tmp_path):
    make, message = MALFORMED[case]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(make(_good_table())))
    before = path.read_bytes()
    with pytest.raises(ConfigError) as err:
        DispatchTable.load(path)
    assert message in err.value.problem and "t.json" in err.value.problem and err.value.fix
    # the runtime's own file: ignored whole with one warning, defaults used, the file left as it was
    own = dispatch_path(FP)
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_bytes(before)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = load_model_table(FP, limits=LIMITS)
    assert len(caught) == 1 and message in str(caught[0].message) and "using defaults" in str(caught[0].message)
    assert table.entries == {} and path.read_bytes() == before and own.read_bytes() == before


BREAKING = {  # kernel-level: the table is well formed, a range names what the kernel cannot run
    "rows do not divide the threads": ("kernel", DOWN, 0, {"config": {**mm.DEFAULT_TILED, "BM": 36, "TM": 8}},
                                       "thread_rows: TM=8 does not divide BM=36"),
    "too few threads": ("kernel", DOWN, 0, {"config": {**mm.DEFAULT_TILED, "BM": 16, "BN": 16, "TN": 8}},
                        "min_threads"),
    "workgroup storage": ("kernel", ATTN, 0, {"config": {"BQ": 16, "BKV": 64, "KT": 8, "LZ": 0}},
                          "workgroup_storage"),
    "K step does not divide K": ("kernel", DOWN, 0, {"config": {**mm.DEFAULT_TILED, "BK": 48}}, "K=128 is not a "
                                 "multiple of BK=48"),
    "unknown kernel": ("kernel", DOWN, 0, {"kernel": "nf4_matmul.warp.residual"}, "not a matmul kernel name"),
    "kernel of another problem": ("kernel", SWIGLU, 1, {"kernel": "nf4_matmul.tiled.residual"},
                                  f"does not compute {SWIGLU}"),
    "unknown parameter": ("kernel", DOWN, 0, {"config": {"BM": 64, "WARP": 2}}, "unknown parameters ['WARP']"),
    "bool as int": ("kernel", DOWN, 0, {"config": {**mm.DEFAULT_TILED, "F16S": 0}}, "F16S=0 is a int"),
    "int as string": ("kernel", ATTN, 0, {"config": {"BQ": "16", "BKV": 8}}, "BQ='16' is a str"),
}


@pytest.mark.parametrize("case", sorted(BREAKING))
def test_a_config_breaking_a_kernel_rule_is_named(case):
    _, key, index, changes, message = BREAKING[case]
    d = _with(_good_table(), key, index, **changes)
    table = DispatchTable.from_json(d)
    _, problems = check_model_table(table, LIMITS)
    assert len(problems) == 1 and message in problems[0] and problems[0].startswith(f"{key} range {index}")
    # given by the caller: refused whole, with the key and the rule
    with pytest.raises(ConfigError) as err:
        checked_table(table, LIMITS)
    assert message in err.value.problem and key in err.value.problem


def test_the_runtimes_file_drops_only_the_bad_entry_with_one_warning():
    own = dispatch_path(FP)
    own.parent.mkdir(parents=True, exist_ok=True)
    bad = {**mm.DEFAULT_TILED, "BM": 36, "TM": 8}
    own.write_text(json.dumps(_with(_good_table(), DOWN, 0, config=bad)))
    before = own.read_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = load_model_table(FP, limits=LIMITS)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert DOWN in text and "BM=36" in text and "TM=8" in text and "thread_rows" in text and "defaults" in text
    assert set(table.entries) == {SWIGLU, ATTN} and table.pick(DOWN, 40) is None  # -> the executor's defaults
    assert own.read_bytes() == before


# ---------------------------------------------------------------------------------------------------- weights
@pytest.fixture
def tiny(rng):
    cfg = preset("tiny")
    return cfg, ckpt.random_tensors(cfg, seed=int(rng.integers(1 << 30)))


BAD_WEIGHTS = {
    "int": ("layers.0.feed_forward.w1.weight", lambda w, rng: rng.integers(-8, 8, w.shape).astype(np.int32),
            "stored as I32"),
    "bool": ("layers.1.operator_norm.weight", lambda w, rng: rng.random(w.shape) > 0.5, "stored as BOOL"),
    "nan": ("layers.2.conv.in_proj.weight", lambda w, rng: _spoil(w, rng, np.nan, 3), "3 non-finite"),
    "inf": ("embed_tokens.weight", lambda w, rng: _spoil(w, rng, -np.inf, 1), "1 non-finite"),
}


def _spoil(w: np.ndarray, rng: np.random.Generator, value: float, count: int) -> np.ndarray:
    out = w.copy()
    out.reshape(-1)[rng.choice(out.size, count, replace=False)] = value
    return out


@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
def test_bad_weights_are_refused_at_load_naming_the_tensor(case, tiny, tmp_path, rng):
    import tilewise

    cfg, tensors = tiny
    name, spoil, message = BAD_WEIGHTS[case]
    ckpt.save_hf_folder(cfg, {**tensors, name: spoil(tensors[name], rng)}, tmp_path / "hf")
    with pytest.raises(ConfigError) as err:
        tilewise.load(str(tmp_path / "hf"), device="cpu", weights="f32")
    assert repr(name) in err.value.problem and message in err.value.problem and err.value.fix
    with pytest.raises(ConfigError, match=message):  # and in memory, for the NF4 runtime path too
        tilewise.load(str(tmp_path / "hf"), device="cpu", weights="nf4")


@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
@pytest.mark.parametrize("fmt", ["nf4", "f16"])
def test_convert_refuses_bad_weights_and_writes_nothing(case, fmt, tiny, tmp_path, rng, capsys):
    from tilewise.cli import main

    cfg, tensors = tiny
    name, spoil, message = BAD_WEIGHTS[case]
    ckpt.save_hf_folder(cfg, {**tensors, name: spoil(tensors[name], rng)}, tmp_path / "hf")
    src_before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--format", fmt]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and repr(name) in err and message in err and "fix:" in err
    assert not (tmp_path / "out").exists()
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == src_before


def test_in_memory_integer_weights_are_refused(tiny, rng):
    cfg, tensors = tiny
    name = "layers.3.feed_forward.w2.weight"
    bad = {**tensors, name: rng.integers(0, 4, tensors[name].shape).astype(np.int8)}
    with pytest.raises(ConfigError, match=f"'{name}' is stored as int8"):
        ckpt.Checkpoint.from_arrays(cfg, bad, "f32", "memory")


def test_nf4_scales_that_are_not_finite_are_refused(tiny, tmp_path):
    cfg, tensors = tiny
    nf4 = ckpt.Checkpoint.from_arrays(cfg, tensors, "f32", "memory").converted("nf4").materialize()
    nf4.save(tmp_path / "nf4")
    name = "layers.0.feed_forward.w3.weight"
    t = nf4.get(name)
    t.absmax[5] = np.nan  # a damaged scale decodes a whole block to NaN
    again = ckpt.Checkpoint.from_arrays(cfg, dict(nf4.items()), "nf4", "memory")
    with pytest.raises(ConfigError, match=f"'{name}' has 1 non-finite"):
        again.get(name)
    assert np.isfinite(ckpt.Checkpoint.open(tmp_path / "nf4").get(name).absmax).all()  # saved before the damage


def test_a_cuda_attention_entry_from_before_the_tiled_kernel_is_refused_with_the_fix():
    """Tables written before `CudaAttention` grew QT (or TC) lack it: the entry is refused, naming what it lacks."""
    from tilewise.model.dispatch import range_choice

    sm90 = get_profile("sm_90")
    with pytest.raises(ConfigError) as err:
        range_choice("attention:16x8x64", "attention", {"NW": 4}, (1, 346), sm90, backend="cuda")
    assert "lacks QT" in err.value.problem and "tilewise tune model" in err.value.fix
    with pytest.raises(ConfigError) as err:  # nor one from before the tensor-core kernel (no TC)
        range_choice("attention:16x8x64", "attention", {"QT": 16, "NW": 8}, (1, 346), sm90, backend="cuda")
    assert "lacks TC" in err.value.problem
    tpl, cfg = range_choice("attention:16x8x64", "attention", {"QT": 16, "NW": 8, "TC": 0}, (1, 346), sm90,
                            backend="cuda")
    assert tpl.entry(cfg, 64) == "attention_tiled<64, 16, 8>"
    tpl, cfg = range_choice("attention:16x8x64", "attention", {"QT": 32, "NW": 2, "TC": 1}, (1, 346), sm90,
                            backend="cuda")
    assert tpl.entry(cfg, 64) == "attention_mma<64, 2, 1, 0>"  # from before the key split: KW 1, PF 0, as timed
    tpl, cfg = range_choice("attention:16x8x64", "attention", {"QT": 16, "NW": 4, "TC": 1, "KW": 4}, (1, 346), sm90,
                            backend="cuda")
    assert tpl.entry(cfg, 64) == "attention_mma<64, 4, 4, 0>"  # from before the prefetch: PF 0
    tpl, cfg = range_choice("attention:16x8x64", "attention", {"QT": 32, "NW": 8, "TC": 1, "KW": 4, "PF": 1},
                            (1, 346), sm90, backend="cuda")
    assert tpl.entry(cfg, 64) == "attention_mma<64, 8, 4, 1>"
    with pytest.raises(ConfigError, match=r"prefetch_registers.*128 floats"):  # D 64 on 2 warps: 4 D / NW floats
        range_choice("attention:16x8x64", "attention", {"QT": 32, "NW": 2, "TC": 1, "KW": 1, "PF": 1}, (1, 346), sm90,
                     backend="cuda")
    with pytest.raises(ConfigError, match="prefetch_needs_tc"):
        range_choice("attention:16x8x64", "attention", {"QT": 32, "NW": 8, "TC": 0, "KW": 1, "PF": 1}, (1, 346), sm90,
                     backend="cuda")
    with pytest.raises(ConfigError, match="key_warps_need_tc"):
        range_choice("attention:16x8x64", "attention", {"QT": 16, "NW": 8, "TC": 0, "KW": 2}, (1, 346), sm90,
                     backend="cuda")


def test_a_cuda_short_conv_entry_is_checked_like_a_candidate():
    """`shortconv:HxL` names the conv's NT (WebGPU: WG) and RT; a broken rule, a missing parameter, a tap count out
    of range or the other backend's parameters are refused with what is wrong."""
    from tilewise.model.config import PRESETS
    from tilewise.model.dispatch import conv_key, range_choice

    sm90 = get_profile("sm_90")
    key = conv_key(PRESETS["lfm2-350m"])
    assert key == "shortconv:1024x3"
    tpl, cfg = range_choice(key, "shortconv", {"NT": 64, "RT": 8}, (1, 346), sm90, backend="cuda")
    assert tpl.entry(cfg, 3) == "shortconv<64, 3, 8>"
    for values, why in (({"NT": 128, "RT": 65}, "rows_1_64"), ({"NT": 100, "RT": 2}, "whole_warps"),
                        ({"NT": 128}, "lacks RT")):
        with pytest.raises(ConfigError, match=why):
            range_choice(key, "shortconv", values, (1, 346), sm90, backend="cuda")
    with pytest.raises(ConfigError, match="taps_2_8"):
        range_choice("shortconv:1024x9", "shortconv", {"NT": 128, "RT": 1}, (1, 346), sm90, backend="cuda")
    with pytest.raises(ConfigError, match=r"unknown \['NT'\], missing \['WG'\]"):
        range_choice(key, "shortconv", {"NT": 128, "RT": 1}, (1, 346), sm90, backend="webgpu")
    tpl, cfg = range_choice(key, "shortconv", {"WG": 64, "RT": 4}, (1, 346), sm90, backend="webgpu")
    assert tpl.backend == "webgpu" and dict(cfg) == {"WG": 64, "RT": 4}
