"""The TVM-emitted CUDA source store (emit with TVM here, run without it elsewhere), its emit script and the CUDA
ladders that read it: round trips with TVM made unimportable, the missing-key and corrupt-file errors, the emit
plan covering what tests/cuda compiles, and the CUDA ladders run from the store on a numpy stand-in device. The emit
script runs as a script (`python tools/tvm_cuda_emit.py ...`), never imported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tilewise.devices.base import Program, source_hash
from tilewise.devices.cpu import CPUDevice
from tilewise.devices.profiles import get_profile
from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.kernels.conv1d.tvm_cuda import TvmCudaConv1d
from tilewise.kernels.dwsep_conv2d.problem import reference_dwsep
from tilewise.kernels.dwsep_conv2d.tvm_cuda import TvmCudaDwsepConv2d
from tilewise.kernels.gemm.tvm_cuda import TvmCudaGemm
from tilewise.kernels.tvm import sources as tvm_sources
from tilewise.kernels.tvm.cuda import device_source

pytest.importorskip("tvm")

ROOT = Path(__file__).resolve().parents[2]
EMIT = ROOT / "tools" / "tvm_cuda_emit.py"
SM90 = get_profile("sm_90")
CONV, GEMM = TvmCudaConv1d(), TvmCudaGemm()
FAST = {"warmup": 1, "min_rounds": 3, "max_rounds": 3, "budget_s": 0.5}


def conv_cfg(NT=64, TPT=4, RK=8, STAGE="local"):
    return CONV.space("full").config(NT=NT, TPT=TPT, RK=RK, STAGE=STAGE)


def gemm_cfg(TY=16, TX=16, TM=4, TN=4, KB=8, STAGE="shared"):
    return GEMM.space("full").config(TY=TY, TX=TX, TM=TM, TN=TN, KB=KB, STAGE=STAGE)


def emit(*args: str) -> subprocess.CompletedProcess:
    """Run tools/tvm_cuda_emit.py with these arguments."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(EMIT), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def planned(template: str, config, shape) -> tuple:
    """A (template, config, shape) of the emit plan, the config's order not counting."""
    return template, tuple(sorted(dict(config).items())), tuple(shape)


def load(path: Path, name: str):
    """Import a test module of tests/cuda by path (for the shapes and configs it compiles), with its own folder
    importable (as pytest has it) for its helper modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.fixture
def store(tmp_path, monkeypatch):
    path = tmp_path / "tvm-cuda-sources"
    monkeypatch.setenv(tvm_sources.ENV, str(path))
    return path


@pytest.fixture
def no_tvm(monkeypatch):
    """`import tvm` raises ImportError for the rest of the test (the modules come back afterwards)."""
    import tvm  # noqa: F401  (loaded, so monkeypatch restores the real modules)

    for name in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.") or m.startswith("tvm_ffi")]:
        monkeypatch.setitem(sys.modules, name, None)
    assert not tvm_sources.tvm_available()


class FakeCuda(CPUDevice):
    """A `cuda` device with sm_90 limits that records every source it is given and computes the template's output
    with numpy (it checks the plumbing, not the kernels: tests/unit/test_tvm_cuda.py runs those on the host)."""

    def __init__(self) -> None:
        super().__init__()
        self.info = replace(self.info, backend="cuda", name="fake CUDA (numpy)", api="CUDA", limits=SM90)
        self.sources: dict[str, str] = {}

    def compile(self, source, entry="main", constants=None, name=None):
        assert isinstance(source, str) and f" {entry}(" in source
        self.sources[entry] = source
        return Program(name or entry, entry, source_hash(source), dict(constants or {}))

    def _call(self, launch):
        meta = launch.program.meta
        t = {n: b.handle.view(np.float32) for n, b in zip(meta["arg_order"], launch.buffers)}
        if len(meta["shape"]) == 2:
            M, N = meta["shape"]
            t["B"][: M + N - 1] = np.convolve(t["A"][:M], t["W"][:N])
        elif len(meta["shape"]) == 7:
            B, C, H, W, O, K, P = meta["shape"]
            x = t["X"][: B * C * H * W].reshape(B, C, H, W)
            out = reference_dwsep(x, t["DW"][: C * K * K].reshape(C, K, K), t["PW"][: O * C].reshape(O, C), P)
            t["Out"][: out.size] = out.reshape(-1)
        else:
            M, N, K = meta["shape"]
            t["C"][: M * N] = (t["A"][: M * K].reshape(M, K) @ t["B"][: K * N].reshape(K, N)).reshape(-1)


# ---- the store ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tpl,c,shape", [(CONV, conv_cfg(), (1000, 16)), (CONV, conv_cfg(STAGE="shared"), (64, 64)),
                                         (GEMM, gemm_cfg(), (128, 128, 64))], ids=["conv-local", "conv-shared", "gemm"])
def test_emitted_with_tvm_stored_and_read_back_identically_without_tvm(tpl, c, shape, store, monkeypatch):
    emitted = tpl.source(c, shape)
    assert emitted == tpl.emit_tvm(c, shape)  # the store changes nothing about the emission
    key = tvm_sources.SourceKey.make(tpl.name, c, shape, "sm_90")
    path = store / key.filename
    assert path.is_file() and not [p for p in store.iterdir() if p.name.endswith(".tmp")]
    header = json.loads(path.read_text().splitlines()[0][len(tvm_sources.HEADER):])
    assert header["template"] == tpl.name and header["config"] == dict(c) and header["shape"] == list(shape)
    assert header["arch"] == "sm_90" and header["tvm"] == tvm_sources.tvm_version()

    for name in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")]:
        monkeypatch.setitem(sys.modules, name, None)
    assert not tvm_sources.tvm_available()
    assert tpl.source(c, shape) == emitted
    dev = FakeCuda()
    prog = tpl.compile(dev, c, shape)
    assert list(dev.sources.values()) == [device_source(emitted)]
    assert prog.meta["shape"] == tuple(shape)


def test_rewriting_an_identical_source_leaves_the_file_alone(store):
    key = tvm_sources.SourceKey.make("conv1d", conv_cfg(), (1000, 16), "sm_90")
    path, changed = tvm_sources.write(store, key, "x\n", "0.27")
    assert changed and tvm_sources.write(store, key, "x\n", "0.27") == (path, False)
    assert tvm_sources.write(store, key, "y\n", "0.27") == (path, True)
    assert tvm_sources.read(store, key) == "y\n"
    # the key does not depend on the order of the config's values
    swapped = tvm_sources.SourceKey.make("conv1d", dict(reversed(list(conv_cfg().items()))), (1000, 16), "sm_90")
    assert swapped.filename == key.filename


def test_missing_key_names_the_key_and_the_emit_command(store, no_tvm):
    store.mkdir()
    c = conv_cfg(NT=128, TPT=2, RK=16, STAGE="shared")
    with pytest.raises(DeviceUnavailable) as err:
        CONV.source(c, (5000, 32))
    problem, fix = err.value.problem, err.value.fix
    assert "conv1d NT=128,TPT=2,RK=16,STAGE=shared at shape 5000,32 for sm_90" in problem
    assert str(store) in problem and tvm_sources.ENV in problem
    assert (f"python tools/tvm_cuda_emit.py --arch sm_90 --out {store} --template conv1d --shapes 5000,32 "
            "--config NT=128,TPT=2,RK=16,STAGE=shared") in fix
    with pytest.raises(DeviceUnavailable, match=r"gemm-tvm TY=16,TX=16,TM=4,TN=4,KB=8,STAGE=shared at shape "
                                                r"128,128,64 for sm_90"):
        GEMM.compile(FakeCuda(), gemm_cfg(), (128, 128, 64))


def test_without_tvm_or_store_the_error_names_both_fixes(monkeypatch, no_tvm):
    monkeypatch.delenv(tvm_sources.ENV, raising=False)
    with pytest.raises(DeviceUnavailable) as err:
        CONV.compile(FakeCuda(), conv_cfg(), (1000, 16))
    assert "TVM-scheduled CUDA templates" in err.value.problem and tvm_sources.ENV in err.value.problem
    assert "conv1d NT=64,TPT=4,RK=8,STAGE=local at shape 1000,16 for sm_90" in err.value.problem
    assert "pip install 'tilewise[tvm]'" in err.value.fix and "tools/tvm_cuda_emit.py --arch sm_90" in err.value.fix


def test_a_corrupt_or_mismatched_store_file_is_an_error_naming_it(store, monkeypatch):
    a, b = conv_cfg(), conv_cfg(TPT=8)
    CONV.source(a, (1000, 16))
    key_a = tvm_sources.SourceKey.make("conv1d", a, (1000, 16), "sm_90")
    key_b = tvm_sources.SourceKey.make("conv1d", b, (1000, 16), "sm_90")
    path_a, path_b = store / key_a.filename, store / key_b.filename
    text = path_a.read_text()
    for name in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")]:
        monkeypatch.setitem(sys.modules, name, None)

    path_b.write_text(text)  # a's file under b's name: its header names a
    with pytest.raises(ConfigError, match=r"is unusable: its header is for conv1d NT=64,TPT=4,RK=8,STAGE=local .* "
                                          r"not conv1d NT=64,TPT=8") as err:
        CONV.source(b, (1000, 16))
    assert str(path_b) in err.value.problem and "delete it" in err.value.fix
    path_a.write_text(text[:-40])  # truncated
    with pytest.raises(ConfigError, match="does not match the sha256 in its header") as err:
        CONV.source(a, (1000, 16))
    assert str(path_a) in err.value.problem
    path_a.write_text(text.split("\n", 1)[1])  # no header
    with pytest.raises(ConfigError, match="the first line is not a") as err:
        CONV.source(a, (1000, 16))
    assert str(path_a) in err.value.problem
    path_a.write_text(tvm_sources.HEADER + "{not json\n" + text.split("\n", 1)[1])
    with pytest.raises(ConfigError, match="its header is not JSON"):
        CONV.source(a, (1000, 16))
    with pytest.raises(ConfigError, match=str(path_a.name)):  # listing the store trips over it too
        tvm_sources.stored_configs("conv1d", (1000, 16), "sm_90")


# ---- the emit script ---------------------------------------------------------------------------------------------
def test_default_emit_plan_covers_what_the_cuda_tests_and_ladders_compile(tmp_path):
    res = emit("--arch", "sm_90", "--out", str(tmp_path / "store"), "--dry-run", "--plan-json", str(tmp_path / "p"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert not (tmp_path / "store").exists()  # a dry run writes the plan only
    plan = json.loads((tmp_path / "p").read_text())
    assert plan["arch"] == "sm_90"
    have = {planned(r["template"], r["config"], r["shape"]) for r in plan["sources"] if not r["skip"]}
    runtime = load(ROOT / "tests" / "cuda" / "test_tvm_cuda_runtime.py", "tvm_cuda_runtime")
    full = CONV.space("full")
    need = {("conv1d", c, s) for s in runtime.SHAPES for c in CONV.space("seed") if not CONV.shape_problems(c, s)}
    need |= {("conv1d", full.config(dict(zip(("NT", "TPT", "RK", "STAGE"), v))), runtime.LARGE_SHAPE)
             for v in runtime.LARGE}
    need.add(("conv1d", full.config(runtime.TIMED[0]), runtime.TIMED[1]))
    need |= {("gemm-tvm", c, s) for s in runtime.GEMM_SHAPES for c in GEMM.space("seed")
             if not GEMM.shape_problems(c, s)}
    dwsep_runtime = load(ROOT / "tests" / "cuda" / "test_tvm_cuda_dwsep_runtime.py", "tvm_cuda_dwsep_runtime")
    dwsep = TvmCudaDwsepConv2d()
    need |= {("dwsep-conv2d", c, s) for s in dwsep_runtime.SHAPES for c in dwsep.space("seed")
             if not dwsep.shape_problems(c, s)}
    need.add(("dwsep-conv2d", dwsep.space("full").config(dwsep_runtime.TIMED[0]), dwsep_runtime.TIMED[1]))
    from tilewise.ladder import VARIANTS, _search_points

    for spec in VARIANTS.values():
        tpl = spec.template()
        sp = tpl.space("full")
        for shape in (spec.shape, spec.small_shape):
            need |= {(tpl.name, spec.rung_config(sp, r), shape) for r in spec.rungs}
            need |= {(tpl.name, c, shape) for c in _search_points(spec, tpl, sp, SM90, shape, 24, 0)}
    need = {planned(*item) for item in need}
    assert need <= have, sorted(need - have, key=str)[:5]  # each one planned, and legal (emitted, not skipped)


def test_emit_script_writes_one_config_and_the_index(tmp_path):
    out = tmp_path / "store"
    res = emit("--arch", "sm_90", "--out", str(out), "--template", "conv1d", "--shapes", "300,16",
               "--config", "NT=64,TPT=4,RK=8,STAGE=shared", "--config", "NT=64,TPT=4,RK=32,STAGE=local")
    text = res.stdout
    assert res.returncode == 0, res.stderr[-3000:]
    assert "skip conv1d NT=64,TPT=4,RK=32,STAGE=local at 300,16: reduction_split: N % RK = 16 % 32" in text
    assert "conv1d: 1 sources at 1 shapes (1 written, 0 already stored), 1 illegal skipped, 0 failed" in text
    assert "total: 1 sources" in text
    key = tvm_sources.SourceKey.make("conv1d", conv_cfg(STAGE="shared"), (300, 16), "sm_90")
    assert tvm_sources.read(out, key) == CONV.emit_tvm(conv_cfg(STAGE="shared"), (300, 16))
    index = json.loads((out / "index.json").read_text())
    assert [r["file"] for r in index["sources"]] == [key.filename]
    assert index["sources"][0]["shape"] == [300, 16] and index["sources"][0]["tvm"] == tvm_sources.tvm_version()
    assert tvm_sources.stored_configs("conv1d", (300, 16), "sm_90", out) == [dict(conv_cfg(STAGE="shared"))]


# ---- the CUDA ladders ----------------------------------------------------------------------------------------
def test_cuda_ladder_variants_are_picked_by_device_and_their_rungs_are_legal():
    from tilewise.ladder import LADDERS, VARIANTS, get_ladder, get_ladder_device

    assert set(VARIANTS) == {("conv1d-gpu", "cuda"), ("gemm-gpu", "cuda"), ("dwsep-conv2d-gpu", "cuda")}
    for (primitive, _backend), spec in VARIANTS.items():
        assert get_ladder(primitive, "cuda") is spec and get_ladder(primitive, "cuda:1") is spec
        assert get_ladder(primitive) is LADDERS[primitive] and get_ladder(primitive, "webgpu") is LADDERS[primitive]
        assert spec.rungs[0].name == "baseline" and len(spec.rungs) - 1 >= 3
        tpl = spec.template()
        sp = tpl.space("full")
        configs = [spec.rung_config(sp, r) for r in spec.rungs]
        assert len(set(configs)) == len(configs)
        for shape in (spec.shape, spec.small_shape):
            for r, c in zip(spec.rungs, configs):
                assert sp.why_illegal(c, SM90) == [] and tpl.shape_problems(c, shape) == [], (r.name, shape)
        by_name = dict(zip((r.name for r in spec.rungs), configs))
        for wg, pv in spec.staging_pairs:
            assert spec.stage_of(by_name[wg]) == "workgroup" and spec.stage_of(by_name[pv]) == "private"
            assert spec.restage(by_name[wg], "private") == by_name[pv]
            assert spec.restage(by_name[pv], "workgroup") == by_name[wg]
        with pytest.raises(ConfigError, match="runs on CUDA"):
            get_ladder_device(spec, "webgpu")
    with pytest.raises(ConfigError, match="WGSL templates only") as err:
        get_ladder_device(LADDERS["conv1d-gpu"], "cuda")
    assert "get_ladder('conv1d-gpu', 'cuda')" in err.value.fix


@pytest.mark.parametrize("primitive,shape", [("conv1d-gpu", (1024, 16)), ("gemm-gpu", (128, 128, 128)),
                                             ("dwsep-conv2d-gpu", (1, 8, 12, 12, 16, 3, 1))])
def test_cuda_ladder_runs_from_the_store_without_tvm(primitive, shape, store, monkeypatch):
    from tilewise.ladder import run_ladder

    name = {"conv1d-gpu": "conv1d", "gemm-gpu": "gemm-tvm", "dwsep-conv2d-gpu": "dwsep-conv2d"}[primitive]
    res = emit("--arch", "sm_90", "--out", str(store), "--template", name, "--shapes", ",".join(map(str, shape)))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    stored = tvm_sources.stored_configs(name, shape, "sm_90")
    with_tvm = FakeCuda()
    res = run_ladder(primitive, with_tvm, shape, tune_count=3, tune_seconds=20, measure_kw=FAST,
                     tune_measure_kw={"min_rounds": 2, "max_rounds": 2})
    assert res.tuned["sources"] == "tvm" and res.tuned["note"] == ""

    for mod in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")]:
        monkeypatch.setitem(sys.modules, mod, None)
    without = FakeCuda()
    res = run_ladder(primitive, without, shape, tune_count=40, tune_seconds=30, measure_kw=FAST,
                     tune_measure_kw={"min_rounds": 2, "max_rounds": 2})
    d = res.as_json()
    assert d["primitive"] == primitive and d["device_info"]["backend"] == "cuda"
    names = [r["name"] for r in d["rungs"]]
    assert names[0] == "baseline" and names[5] == "tuned best"
    assert all(r["status"] == "ok" for r in d["rungs"]), [(r["name"], r["reason"]) for r in d["rungs"]]
    assert d["tuned"]["sources"] == "store" and d["tuned"]["searched"] == min(40, len(stored))
    assert "only among configs with a pre-emitted source" in d["tuned"]["note"] and str(store) in d["tuned"]["note"]
    assert "stored source; TVM is not importable" in d["rungs"][5]["what"]
    assert "tuned best: TVM is not importable" in res.table()
    assert dict(res.rungs[5].config) in stored
    assert set(with_tvm.sources) & set(without.sources)
    for entry in set(without.sources) & set(with_tvm.sources):
        assert without.sources[entry] == with_tvm.sources[entry]  # the same kernel text, emitted or stored
    assert d["staging"] and {"workgroup", "private"} <= set(d["staging"][0])


def test_cuda_ladder_without_tvm_or_store_stops_at_the_baseline_with_the_fix(monkeypatch, no_tvm, tmp_path):
    from tilewise.ladder import run_ladder

    monkeypatch.setenv(tvm_sources.ENV, str(tmp_path / "empty"))
    with pytest.raises(DeviceUnavailable, match=r"conv1d NT=64,TPT=1,RK=1,STAGE=global at shape 1024,16 for "
                                                r"sm_90") as err:
        run_ladder("conv1d-gpu", FakeCuda(), (1024, 16), tune_count=0, measure_kw=FAST)
    assert "tools/tvm_cuda_emit.py" in err.value.fix
