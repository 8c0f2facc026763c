"""The model's CUDA C++ templates under nvcc (no GPU needed): every instantiation the executor and the seed spaces
generate compiles for sm_90 without spilling, illegal configs fail the static_assert naming the Python rule, and the
C++ legality walk of the tensor-core matmul agrees with the Python rules on random tuples.

What the executor launches on Hopper compiles every run: every nf4 wgr seed built on a tile that won a shape (its
SR 2 cluster twins included), every rows config, split-K's cluster kernels and reductions, ring's preps, and every
variant's default config (`test_every_rows_config_and_the_executor_defaults_compile`; the wg, wgt and ws defaults in
their seed tests). The rest of the seed grids (wgr's other tiles and formats; the older kinds mma, splitk, pipe,
ring, wg, wgt, ws: still tunable, no longer picked on the H100/H200) compile a sample each run, one legal seed config
per variant drawn with `random.Random` from the run's seed (TILEWISE_TEST_SEED, else a fresh one; it is named in a
failure and at the end of the run), so that runs over time cover the grids while the counts of the legal seeds are
checked whole every run. Set TILEWISE_TEST_FULL_GRIDS=1 to compile every seed config of every kind (about five
minutes more on two cores).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from tilewise.devices.profiles import get_profile
from tilewise.kernels.attention.cuda import SOURCE_FILES as ATTENTION_FILES
from tilewise.kernels.attention.cuda import CudaAttention
from tilewise.kernels.cudasrc import MODEL_HEADERS
from tilewise.kernels.matmul import cuda as mm
from tilewise.kernels.rowops.cuda import nt_space
from tilewise.kernels.shortconv.cuda import CudaShortConv

NVCC = shutil.which("nvcc") or (shutil.which("/usr/local/cuda/bin/nvcc"))
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found")
SM90 = get_profile("sm_90")

MM_SIG = ("(const float *, int, const unsigned *, const float *, const unsigned *, const float *, const float *, "
          "float, float *, int, int, int)")
SPLITK_SIG = MM_SIG[:-1] + ", float *, unsigned *, unsigned short *, const float *, float *)"
ATTN_SIG = "(const float *, const float *, const float *, float *, int, int, int, int, int, unsigned short *)"
SIGS = {
    "rmsnorm": "(const float *, const float *, float *, int, int, float)",
    "embed": "(const int *, const unsigned *, const float *, float *, int, int)",
    "head": "(const float *, int, const float *, const float *, float *, int, int, float)",
    "copy_words": "(const unsigned *, int, unsigned *, int, int)",
    "copy_pairs": "(" + "const unsigned *, unsigned *, " * 8 + "int)",
    "shortconv": "(const float *, const float *, const float *, float *, float *, int, int, unsigned short *)",
    "qknorm_rope": ("(const float *, const float *, const float *, const float *, const float *, float *, float *, "
                    "float *, int, int, int, int, float)"),
    "attention": ATTN_SIG,
    "attention_tiled": ATTN_SIG,
    "attention_mma": ATTN_SIG,
    "nf4_mm_mma": MM_SIG,
    "nf4_mm_rows": MM_SIG,
    "nf4_mm_splitk": SPLITK_SIG,
    "nf4_mm_splitk_cluster": SPLITK_SIG,
    "nf4_mm_pipe": MM_SIG,
    "nf4_mm_ring": ("(const unsigned short *, const unsigned *, const float *, const unsigned *, const float *, "
                    "float *, int, int, int)"),
    "nf4_mm_wg": ("(const unsigned short *, const unsigned *, const float *, const unsigned *, const float *, "
                  "float *, int, int, int)"),
    "nf4_mm_wgt": ("(const unsigned short *, const unsigned *, const float *, const unsigned *, const float *, "
                   "float *, int, int, int, const __grid_constant__ TmaMap)"),
    "nf4_mm_wgr": ("(const unsigned short *, const unsigned *, const float *, const unsigned *, const float *, "
                   "float *, int, int, int, const __grid_constant__ TmaMap, float *, unsigned *, unsigned short *, "
                   "const float *, float, const float *, float *, const RopeOut *)"),
    "nf4_mm_wgr_cluster": ("(const unsigned short *, const unsigned *, const float *, const unsigned *, "
                           "const float *, float *, int, int, int, const __grid_constant__ TmaMap, float *, "
                           "unsigned *, unsigned short *, const float *, float, const float *, float *, "
                           "const RopeOut *)"),
    "nf4_mm_ws": ("(const unsigned short *, const unsigned *, const float *, const unsigned *, const float *, "
                  "float *, int, int, int)"),
    "nf4_mm_prep": "(const float *, int, const float *, float, unsigned short *, int)",
    "nf4_mm_splitk_reduce": "(const float *, int, float *, int, int)",
    "nf4_mm_reduce_prep": "(const float *, int, float *, int, int, const float *, float, unsigned short *)",
}


def cu(family: str, name: str) -> str:
    return str(resources.files(f"tilewise.kernels.{family}").joinpath(name))


#: every model source starts with the PDL macros and the tensor-core pieces (`cudasrc.model_source`)
HEADERS = [str(resources.files("tilewise.kernels").joinpath(h)) for h in MODEL_HEADERS]
MATMUL = [*HEADERS, *(cu("matmul", f) for f in mm.SOURCE_FILES)]  # in order: the later files use matmul.cu's helpers
ATTENTION = [*HEADERS, *(cu("attention", f) for f in ATTENTION_FILES)]


def instantiate(entry: str) -> str:
    return f"template __global__ void {entry}{SIGS[entry.split('<')[0]]};\n"


#: the architecture-specific Hopper target (wgmma); nvcc 13.0's `-arch=sm_90a` shorthand also runs a plain sm_90
#: pass, which refuses wgmma
SM90A = "-gencode=arch=compute_90a,code=sm_90a"


def nvcc(tmp_path: Path, name: str, includes: list[str], body: str, *args: str,
         arch: str = "-arch=sm_90") -> subprocess.CompletedProcess:
    src = tmp_path / f"{name}.cu"
    src.write_text("".join(f'#include "{p}"\n' for p in includes) + body)
    return subprocess.run([NVCC, "-std=c++17", arch, *args, str(src)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)


def cubin(tmp_path: Path, name: str, includes: list[str], entries: list[str], arch: str = "-arch=sm_90",
          note: str = "") -> str:
    """Compile `entries` to cubins with ptxas' report and check that none spills; the entries are split over one
    nvcc process per CPU (at most 4), since one nvcc compiles on one core. `note` heads each failure message."""
    parts = [entries[i::max(1, min(4, os.cpu_count() or 1, len(entries)))] for i in range(
        max(1, min(4, os.cpu_count() or 1, len(entries))))]
    procs = []
    for i, part in enumerate(parts):
        src = tmp_path / f"{name}{i}.cu"
        src.write_text("".join(f'#include "{p}"\n' for p in includes) + "".join(instantiate(e) for e in part))
        procs.append(subprocess.Popen([NVCC, "-std=c++17", arch, "-cubin", "-Xptxas", "-v", "-o", f"{name}{i}.cubin",
                                       str(src)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    log = ""
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, note + err[-3000:]
        log += err
    names = re.findall(r"Compiling entry function '(\w+)'", log)
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
    assert len(names) == len(spills) == len(entries), note + log[-3000:]
    bad = [(n, s) for n, s in zip(names, spills) if s]
    assert not bad, f"{note}{bad}"
    return log


def legal(space):
    ok, _ = space.split(SM90)
    return ok


#: TILEWISE_TEST_FULL_GRIDS=1: the older kinds' seed tests compile every legal seed config, not a sample
FULL_GRIDS = os.environ.get("TILEWISE_TEST_FULL_GRIDS", "") not in ("", "0")


def seed_sample(variants: list[mm.CudaMatmul], seed: int, always: set[str] = frozenset()) -> tuple[list[str], str]:
    """(the entries to compile, a note for failure messages) of the legal seed configs of `variants`: `always`, and
    one other legal seed config of each variant drawn with the run's `seed`; every one with TILEWISE_TEST_FULL_GRIDS.
    The draw is the kind's own (`random.Random` of the seed and the kind), so the seed alone repeats it."""
    kind = variants[0].kind
    every = {t.entry(c) for t in variants for c in legal(t.space("seed"))}
    if FULL_GRIDS:
        return sorted(every | always), f"{kind}: every seed config (TILEWISE_TEST_FULL_GRIDS=1): "
    rng = random.Random(f"{seed}:{kind}")
    picked = set(always)
    for t in variants:
        others = sorted({t.entry(c) for c in legal(t.space("seed"))} - picked)
        picked.update(rng.sample(others, min(1, len(others))))
    return sorted(picked), (f"{kind}: {len(picked)} of {len(every | always)} seed entries drawn with "
                            f"TILEWISE_TEST_SEED={seed} (TILEWISE_TEST_FULL_GRIDS=1 compiles all): ")


def test_mma_seed_configs_of_every_variant_compile(tmp_path, sample_seed):
    """The legal seeds of every variant, counted whole; one drawn per variant compiles (`seed_sample`)."""
    mma = [t for t in mm.all_variants() if t.kind == "mma"]
    assert len(mma) == 18  # 3 formats x 3 epilogues x norm on/off
    for t in mma:  # the default is legal everywhere; swiglu's second W tile rules out the larger seed tiles (and
        # with f32 weights and the norm's registers, two more)
        assert t.default_config() in legal(t.space("seed")), t.name
        least = (3 if t.fmt == "f32" and t.norm else 5) if t.epilogue == "swiglu" else 11
        assert len(legal(t.space("seed"))) >= least, t.name
    entries, note = seed_sample(mma, sample_seed)
    cubin(tmp_path, "mma", MATMUL, entries, note=note)


def test_splitk_seed_configs_of_every_variant_and_the_reductions_compile(tmp_path, sample_seed):
    """Every cluster kernel (SR 2) of the seeds and every reduction compile, and one more seed drawn per variant
    (`seed_sample`); the seeds' entries are counted whole."""
    split = [t for t in mm.all_variants() if t.kind == "splitk"]
    assert len(split) == 18
    for t in split:
        assert t.default_config() in legal(t.space("seed")), t.name
        assert len(legal(t.space("seed"))) >= (5 if t.epilogue == "swiglu" else 9), t.name
    entries = sorted({t.entry(c) for t in split for c in legal(t.space("seed"))} | {t.reduce_entry() for t in split})
    assert sum(e.startswith("nf4_mm_splitk_reduce") for e in entries) == 3  # one per epilogue
    assert sum(e.endswith(", 1>") for e in entries if e.startswith("nf4_mm_splitk<")) >= 18  # SR 1 in every variant
    assert sum(e.startswith("nf4_mm_splitk_cluster<") for e in entries) >= 18  # SR 2 (sm_90) in every variant
    whole = {e for e in entries if e.startswith(("nf4_mm_splitk_cluster<", "nf4_mm_splitk_reduce"))}
    picked, note = seed_sample(split, sample_seed, whole)
    assert whole <= set(picked) <= set(entries)
    cubin(tmp_path, "splitk", MATMUL, picked, note=note)
    ampere = dataclasses.replace(SM90, compute_capability="8.0")
    assert not any(c["SR"] == 2 for t in split for c in t.space("seed").split(ampere)[0])  # cluster_sm90


def test_split_k_with_sr_keeps_its_flag_within_48_kb():
    """SR 1 adds one shared word beside `mma_smem_bytes` (which the smem_48k rule counts): every legal split-K
    config of the space leaves room for it, so no rule needs to count it."""
    most = max(mm.mma_smem_bytes(c, t.sets) for t in mm.all_variants() if t.kind == "splitk"
               for c in legal(t.space()) if c["SR"] == 1)
    assert most + 4 <= mm.STATIC_SMEM_BYTES


def test_pipe_seed_configs_of_every_variant_compile_without_spilling(tmp_path, sample_seed):
    """The legal seeds of every variant, counted whole; one drawn per variant compiles (`seed_sample`)."""
    pipe = [t for t in mm.all_variants() if t.kind == "pipe"]
    assert len(pipe) == 18
    for t in pipe:  # f32 raw stages are 8x nf4's: its larger seed tiles break smem_227k / mb_fit_smem
        assert t.default_config() in legal(t.space("seed")), t.name
        least = {"nf4": 10, "f16": 6, "f32": 3}[t.fmt] if t.epilogue == "swiglu" else {"nf4": 12, "f16": 11,
                                                                                          "f32": 7}[t.fmt]
        assert len(legal(t.space("seed"))) >= least, t.name
    entries, note = seed_sample(pipe, sample_seed)
    cubin(tmp_path, "pipe", MATMUL, entries, note=note)


def test_ring_seed_configs_of_every_variant_and_the_preps_compile_without_spilling(tmp_path, sample_seed):
    """The preps (both norms, and the executor's reduce-and-prep fusion) compile, and one seed drawn per variant
    (`seed_sample`); the legal seeds are counted whole."""
    ring = [t for t in mm.all_variants() if t.kind == "ring"]
    assert len(ring) == 18
    for t in ring:  # swiglu's two accumulator sets rule out the 64x64 warp tiles; f32's stages the largest rings
        assert t.default_config() in legal(t.space("seed")), t.name
        least = {"nf4": (17, 13), "f16": (20, 16), "f32": (16, 8)}[t.fmt]
        assert len(legal(t.space("seed"))) >= least[t.epilogue == "swiglu"], t.name
    # the preps, and the executor's fusion of a reduction with the next prep
    preps = {t.prep_entry() for t in ring} | {f"nf4_mm_reduce_prep<{norm}, {mm.PREP_NT}>" for norm in (0, 1)}
    assert sum(e.startswith("nf4_mm_prep") for e in preps) == 2  # with and without the norm
    entries, note = seed_sample(ring, sample_seed, preps)
    cubin(tmp_path, "ring", MATMUL, entries, note=note)


def test_wg_seed_configs_of_every_variant_compile_for_sm_90a_without_spilling(tmp_path, sample_seed):
    """The wgmma kind on Hopper's own target: every variant's default and one seed drawn per variant (`seed_sample`;
    the legal seeds are counted whole), no spills, no static shared memory (so `wg_smem_bytes` is all a block uses
    and smem_227k is the launch's limit: a static NF4 table once made a legal config 64 bytes too big to launch)."""
    wg = [t for t in mm.all_variants() if t.kind == "wg"]
    assert len(wg) == 18
    for t in wg:  # swiglu's two accumulator sets rule out the widest tiles; f32's stored tiles the largest rings
        assert t.why_illegal(t.default_config(), SM90, (346, 1024, 1024)) == [], t.name
        least = {"nf4": (18, 12), "f16": (18, 9), "f32": (8, 2)}[t.fmt]
        assert len(legal(t.space("seed"))) >= least[t.epilogue == "swiglu"], t.name
    entries, note = seed_sample(wg, sample_seed, {t.entry(t.default_config()) for t in wg})
    log = cubin(tmp_path, "wg", MATMUL, entries, arch=SM90A, note=note)
    assert not re.findall(r"used \d+ barriers, \d+ bytes smem", log), note + log[-3000:]


def test_wgt_seed_configs_of_every_variant_compile_for_sm_90a_without_spilling(tmp_path, sample_seed):
    """The wg kind with x by TMA: every variant's default and one seed drawn per variant (`seed_sample`; the legal
    seeds are counted whole) compile for sm_90a with no spills and no static shared memory (the mbarriers are in the
    dynamic memory `wg_smem_bytes(..., tma=True)` counts), and the winning tiles keep their wgmma ops asynchronous
    (no C7515)."""
    wgt = [t for t in mm.all_variants() if t.kind == "wgt"]
    assert len(wgt) == 18
    for t in wgt:
        assert t.why_illegal(t.default_config(), SM90, (346, 1024, 1024)) == [], t.name
        assert len(legal(t.space("seed"))) == len(legal(mm.CudaMatmul("wg", t.fmt, t.epilogue).space("seed")))
    entries, note = seed_sample(wgt, sample_seed, {t.entry(t.default_config()) for t in wgt})
    assert all(e.startswith("nf4_mm_wgt<") for e in entries)
    log = cubin(tmp_path, "wgt", MATMUL, entries, arch=SM90A, note=note)
    assert not re.findall(r"used \d+ barriers, \d+ bytes smem", log), note + log[-3000:]
    winners = [mm.CudaMatmul("wgt", "nf4", e, True).entry(mm.CudaMatmul("wgt", "nf4", e, True).config_of(
        dict(zip(mm.WG_PARAMS, v)))) for e, *v in WG_WINNERS]
    log = cubin(tmp_path, "wgtwin", MATMUL, winners, arch=SM90A)
    assert "C7515" not in log and "serialized" not in log, log[-3000:]


def test_ws_seed_configs_of_every_variant_compile_for_sm_90a_without_spilling(tmp_path, sample_seed):
    """The warp-specialized kind: every variant's default and one seed drawn per variant (`seed_sample`; the legal
    seeds are counted whole), no spills in either the producer's region (40 registers after setmaxnreg) or the
    consumers', no static shared memory, every named barrier declared, and no serialized wgmma (C7515)."""
    ws = [t for t in mm.all_variants() if t.kind == "ws"]
    assert len(ws) == 18
    for t in ws:  # f32's raw slots are the largest: its SwiGLU pairs fit one seed
        assert t.why_illegal(t.default_config(), SM90, (346, 1024, 1024)) == [], t.name
        least = {"nf4": (13, 8), "f16": (13, 8), "f32": (9, 1)}[t.fmt]
        assert len(legal(t.space("seed"))) >= least[t.epilogue == "swiglu"], t.name
    entries, note = seed_sample(ws, sample_seed, {t.entry(t.default_config()) for t in ws})
    log = cubin(tmp_path, "ws", MATMUL, entries, arch=SM90A, note=note)
    assert not re.findall(r"used \d+ barriers, \d+ bytes smem", log), note + log[-3000:]
    assert len(re.findall(r"used 16 barriers", log)) == len(entries), note + log[-3000:]
    assert "C7515" not in log, note + log[-3000:]


def test_the_wgr_seed_configs_compile_for_sm_90a_without_spilling(tmp_path, sample_seed):
    """The swapped kind (W decoded into wgmma's register operand, x by TMA), the one the tables pick on Hopper: every
    variant's default, every nf4 seed built on a tile that won a shape (`_WGR_WINNERS`: what the tables launch), and
    one other legal seed of each variant drawn with the run's seed (all with TILEWISE_TEST_FULL_GRIDS) compile for
    sm_90a with no spills, no static shared memory, and no serialized wgmma (C7515): the fragment set being decoded
    is never one an in-flight wgmma reads."""
    from tilewise.kernels.matmul.cuda_space import _WGR_WINNERS

    wgr = [t for t in mm.all_variants() if t.kind == "wgr"]
    assert len(wgr) == 18
    for t in wgr:  # swiglu's two accumulator sets and f32's stored rows rule out the widest tiles
        assert t.why_illegal(t.default_config(), SM90, (346, 1024, 1024)) == [], t.name
        least = {"nf4": (16, 10), "f16": (15, 8), "f32": (11, 3)}[t.fmt]
        assert len(legal(t.space("seed"))) >= least[t.epilogue == "swiglu"], t.name
    winners = {t.entry(c) for t in wgr if t.fmt == "nf4" for c in legal(t.space("seed"))
               if (c["BF"], c["BT"], c["ST"], c["KS"], c["MB"]) in _WGR_WINNERS}
    assert any(e.startswith("nf4_mm_wgr_cluster<") for e in winners)  # the split winners' cluster twins
    entries, note = seed_sample(wgr, sample_seed, winners | {t.entry(t.default_config()) for t in wgr})
    assert all(e.startswith(("nf4_mm_wgr<", "nf4_mm_wgr_cluster<")) for e in entries)
    log = cubin(tmp_path, "wgr", MATMUL, entries, arch=SM90A, note=note)
    assert not re.findall(r"used \d+ barriers, \d+ bytes smem", log), note + log[-3000:]
    assert "C7515" not in log and "serialized" not in log, note + log[-3000:]


#: the tiles that won the lfm2-350m shapes at 346 rows (bench/results/2026-12-01-h200-cuda-wgmma), as (epilogue,
#: BM, BN, MT, ST, KS, MB)
WG_WINNERS = [("swiglu", 128, 128, 1, 4, 1, 1), ("swiglu", 128, 128, 1, 5, 1, 1), ("none", 192, 64, 1, 4, 1, 1),
              ("residual", 192, 64, 1, 4, 4, 1), ("none", 128, 64, 1, 4, 1, 2), ("none", 192, 64, 1, 6, 1, 1)]


def test_the_winning_wg_tiles_keep_their_wgmma_ops_asynchronous(tmp_path):
    """ptxas serializes a kernel's wgmma ops (warning C7515) when it finds other instructions defining their
    accumulators in flight; index loops written `e += NT` did that to nf4 tiles. The tiles the tuner picks must
    compile without it (a few small ones still get it, and lose the race)."""
    entries = [mm.CudaMatmul("wg", "nf4", e, True).entry(mm.CudaMatmul("wg", "nf4", e, True).config_of(
        dict(zip(mm.WG_PARAMS, v)))) for e, *v in WG_WINNERS]
    log = cubin(tmp_path, "wgwin", MATMUL, entries, arch=SM90A)
    assert "C7515" not in log and "serialized" not in log, log[-3000:]


def test_wg_needs_hopper():
    """wgmma exists on compute capability 9.0 only: on any other device every wg config is refused by name."""
    tpl = mm.CudaMatmul("wg", "nf4", "none", False)
    ada = dataclasses.replace(SM90, compute_capability="8.9")
    why = tpl.why_illegal(tpl.default_config(), ada, (346, 1024, 1024))
    assert [w.split(":")[0] for w in why] == ["wgmma_sm90"] and "8.9" in why[0]
    assert tpl.why_illegal(tpl.default_config(), SM90, (346, 1024, 1024)) == []


def test_cpp_attention_mma_rules_agree_with_python_rules(tmp_path):
    """`mma_attention_first_failure` and the Python space + shape rules accept the same tensor-core configs, over
    every head size and (NW, KW, PF) of the space at D 16-128 (PF 1's register bound and the 48 KB both bind)."""
    attn = CudaAttention()
    cases = [(d, nw, kw, pf) for d in (16, 32, 48, 64, 80, 96, 128) for nw in (1, 2, 4, 8) for kw in (1, 2, 4)
             for pf in (0, 1)]
    rows = ",\n".join("{" + ", ".join(map(str, c)) + "}" for c in cases)
    body = (f"#include <cstdio>\nstatic const int T[][4] = {{\n{rows}\n}};\n"
            "int main() { for (const auto &t : T) printf(\"%d\\n\", mma_attention_first_failure(t[0], t[1], t[2], "
            "t[3])); }\n")
    res = nvcc(tmp_path, "host", ATTENTION, body, "-o", "host")
    assert res.returncode == 0, res.stderr[-3000:]
    cpp = [int(v) == 0 for v in subprocess.run([str(tmp_path / "host")], capture_output=True, text=True,
                                                check=True).stdout.split()]
    py = []
    for d, nw, kw, pf in cases:
        cfg = attn.space().config({"QT": 16 * nw // kw if nw % kw == 0 else 16, "NW": nw, "TC": 1, "KW": kw, "PF": pf})
        py.append(not attn.why_illegal(cfg, SM90, (346, 0, 16, 8, d)))
    assert cpp == py
    assert 0 < sum(cpp) < len(cpp) and any(ok for (_, _, _, pf), ok in zip(cases, cpp) if pf)


@pytest.mark.parametrize("kind", ["pipe", "ring"])
def test_smem_bytes_agree_in_cpp_and_python(tmp_path, kind):
    """`pipe_smem_bytes` / `ring_smem_bytes` in C++ and Python agree (the launch asks for the Python number, the
    kernel lays out the C++ one), for every format and epilogue on the seed points."""
    cases = [(f, e, c) for f in (0, 1, 2) for e in (0, 2) for c in mm.CudaMatmul(kind).space("seed").points]
    rows = ",\n".join("{" + ", ".join(map(str, (f, e, c["BM"], c["BN"], c["BK"], c["ST"]))) + "}"
                       for f, e, c in cases)
    body = (f"#include <cstdio>\nstatic const int T[][6] = {{\n{rows}\n}};\n"
            f"int main() {{ for (const auto &t : T) printf(\"%d\\n\", {kind}_smem_bytes(t[0], t[1], t[2], t[3], "
            "t[4], t[5])); }\n")
    res = nvcc(tmp_path, "host", MATMUL, body, "-o", "host")
    assert res.returncode == 0, res.stderr[-3000:]
    out = [int(v) for v in subprocess.run([str(tmp_path / "host")], capture_output=True, text=True,
                                          check=True).stdout.split()]
    fmts = {v: k for k, v in mm.FMT_CODE.items()}
    py = {"pipe": mm.pipe_smem_bytes, "ring": mm.ring_smem_bytes}[kind]
    want = [py(mm.CudaMatmul(kind).space().config(c), fmts[f], 2 if e == 2 else 1) for f, e, c in cases]
    assert out == want and len(set(out)) > 10


def test_every_rows_config_and_the_executor_defaults_compile(tmp_path):
    variants = mm.all_variants()
    rows = [t for t in variants if t.kind == "rows"]
    # what the executor launches (the wg, wgt, ws and wgr defaults need sm_90a: their seed tests compile them)
    entries = {t.entry(t.default_config()) for t in variants if t.kind not in (*mm.WGMMA_KINDS, "wgr")}
    entries |= {rows[0].entry(c) for c in legal(rows[0].space())}  # every rows config of one variant
    entries |= {t.entry(t.config_of({"NT": 256, "RM": rm, "WK": wk, "CW": cw})) for t in rows for wk in (1, 8)
                for rm, cw in ((16, 1), (4, 4))}  # the most accumulators (and merged sums), every variant
    cubin(tmp_path, "rows", MATMUL, sorted(entries))


def test_row_ops_conv_and_attention_compile_for_their_spaces(tmp_path):
    nts = [c["NT"] for c in legal(nt_space("x"))]
    entries = [f"rmsnorm<{nt}>" for nt in nts] + [f"head<{nt}>" for nt in nts] + ["copy_words<256>", "copy_pairs<256>"]
    entries += [f"embed<{f}, {nt}>" for f in (0, 1, 2) for nt in nts]
    conv = CudaShortConv()  # every config at every tap count: a window of 1 to 7 values carried in registers
    entries += [conv.entry(c, taps) for c in legal(conv.space()) for taps in (2, 3, 4, 8)]
    dims = (16, 32, 48, 64, 128, 256)  # tiny's 16, the bundled model's 64, a partial last warp (48)
    entries += [f"qknorm_rope<{d}>" for d in dims]
    attn = CudaAttention()  # both kernels (QT 1 and tiled), every config whose shared memory fits the head size
    entries += [attn.entry(c, d) for c in legal(attn.space()) for d in dims
                if not attn.config_problems(c, (1, 0, 16, 8, d))]
    assert sum(e.startswith("attention_tiled") for e in entries) > 40
    # (QT, NW, KW): (16, 1, 1), (32, 2, 1), (64, 4, 1), (16, 2, 2), (32, 4, 2), (64, 8, 2), (16, 4, 4), (32, 8, 4) at D
    # 16-64; at D 128 only (16, 1, 1), (32, 2, 1) and (16, 2, 2) fit 48 KB. PF 1 where 4 D / NW <= 64 floats: all 8
    # at D 16, NW >= 2 (7) at D 32, NW >= 4 (5) at D 48 and 64, none at D 128
    mma = [e for e in entries if e.startswith("attention_mma")]
    assert len(mma) == 4 * 8 + 3 + 8 + 7 + 5 + 5
    assert sum(e.endswith(", 1>") for e in mma) == 25
    cubin(tmp_path, "rows", [*HEADERS, cu("rowops", "rowops.cu"), cu("shortconv", "shortconv.cu"),
                             *ATTENTION[len(HEADERS):]], entries)


ILLEGAL = [
    ("matmul", "matmul.cu", "nf4_mm_mma<0, 0, 0, 128, 128, 64, 64, 64, 2>", "smem_48k"),
    ("matmul", "matmul.cu", "nf4_mm_mma<0, 2, 1, 64, 64, 24, 32, 32, 2>", "fragments_16"),
    ("matmul", "matmul.cu", "nf4_mm_mma<1, 0, 0, 64, 96, 32, 32, 64, 2>", "warp_tiles_divide"),
    ("matmul", "matmul.cu", "nf4_mm_mma<2, 2, 0, 128, 128, 32, 64, 64, 2>", "smem_48k"),
    ("matmul", "matmul.cu", "nf4_mm_mma<0, 0, 0, 128, 128, 32, 16, 16, 2>", "threads_1024"),
    ("matmul", "matmul.cu", "nf4_mm_mma<0, 2, 0, 64, 64, 32, 64, 64, 2>", "fragments_per_warp_16"),
    ("matmul", "matmul.cu", "nf4_mm_mma<3, 0, 0, 64, 64, 32, 32, 32, 2>", "variant"),
    ("matmul", "matmul.cu", "nf4_mm_mma<0, 1, 0, 64, 64, 32, 32, 32, 3>", "pipe_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_splitk<0, 1, 0, 64, 64, 32, 32, 32, 2, 3, 0>", "ks_2_4_8"),
    ("matmul", "matmul.cu", "nf4_mm_splitk<0, 2, 1, 128, 128, 64, 64, 64, 2, 4, 0>", "smem_48k"),
    ("matmul", "matmul.cu", "nf4_mm_splitk<0, 1, 0, 64, 64, 32, 32, 32, 2, 4, 3>", "sr_0_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_splitk_cluster<0, 0, 1, 64, 64, 64, 32, 32, 2, 4, 2>", "cluster_tile_48k"),
    ("matmul", "matmul.cu", "nf4_mm_splitk_reduce<1, 48>", "whole_warps"),
    ("matmul", "matmul.cu", "nf4_mm_pipe<0, 0, 0, 64, 64, 32, 32, 32, 2, 1, 2>", "stages_3_8"),
    ("matmul", "matmul.cu", "nf4_mm_pipe<0, 0, 0, 64, 64, 48, 32, 32, 4, 1, 2>", "raw_rows_16b"),
    ("matmul", "matmul.cu", "nf4_mm_pipe<0, 1, 0, 64, 64, 32, 32, 32, 4, 3, 2>", "ks_1_2_4_8"),
    ("matmul", "matmul.cu", "nf4_mm_pipe<0, 1, 0, 64, 64, 32, 32, 32, 4, 1, 3>", "mb_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_pipe<2, 2, 1, 128, 128, 64, 64, 32, 6, 1, 1>", "smem_227k"),
    ("matmul", "matmul.cu", "nf4_mm_pipe<0, 2, 0, 64, 64, 32, 64, 64, 4, 1, 1>", "fragments_per_warp_16"),
    ("matmul", "matmul.cu", "nf4_mm_pipe<0, 0, 0, 128, 128, 32, 64, 64, 3, 1, 1>", "warp_tile_2048"),
    ("matmul", "matmul.cu", "nf4_mm_ring<0, 0, 64, 64, 48, 32, 32, 3, 1, 2>", "bk_32_64"),
    ("matmul", "matmul.cu", "nf4_mm_ring<0, 2, 64, 64, 64, 64, 64, 3, 1, 1>", "fragments_per_warp_16"),
    ("matmul", "matmul.cu", "nf4_mm_ring<1, 0, 128, 128, 64, 32, 32, 3, 1, 2>", "registers_spare"),
    ("matmul", "matmul.cu", "nf4_mm_ring<0, 0, 128, 256, 32, 64, 64, 3, 1, 2>", "registers_spare"),  # 0 to spare
    ("matmul", "matmul.cu", "nf4_mm_ring<0, 1, 64, 64, 32, 32, 32, 8, 1, 2>", "stages_2_6"),
    ("matmul", "matmul.cu", "nf4_mm_ring<0, 1, 64, 64, 32, 32, 32, 4, 3, 2>", "ks_1_2_4_8"),
    ("matmul", "matmul.cu", "nf4_mm_ring<0, 1, 64, 64, 32, 32, 32, 4, 1, 3>", "mb_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_ring<2, 2, 128, 128, 64, 64, 32, 6, 1, 1>", "smem_227k"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 128, 64, 3, 4, 1, 1>", "mt_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 96, 64, 1, 4, 1, 1>", "warpgroups_1_4"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 640, 32, 2, 4, 1, 1>", "warpgroups_1_4"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 64, 96, 1, 4, 1, 1>", "bn_32_256"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 2, 128, 128, 2, 4, 1, 1>", "accumulators_128"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 64, 64, 1, 4, 1, 3>", "mb_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 256, 256, 1, 4, 1, 2>", "registers_spare"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 64, 64, 1, 2, 1, 1>", "stages_3_6"),
    ("matmul", "matmul.cu", "nf4_mm_wg<0, 0, 64, 64, 1, 4, 3, 1>", "ks_1_2_4_8"),
    ("matmul", "matmul.cu", "nf4_mm_wg<2, 0, 384, 64, 2, 4, 1, 1>", "smem_227k"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 0, 128, 64, 3, 4, 1, 1, 1>", "mt_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 0, 256, 64, 1, 4, 1, 1, 1>", "consumers_1_3"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 0, 64, 48, 1, 4, 1, 1, 1>", "bn_32_256"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 2, 128, 256, 1, 4, 1, 1, 1>", "accumulators_128"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 0, 64, 64, 1, 4, 1, 3, 1>", "mb_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 0, 64, 64, 1, 4, 1, 1, 3>", "pw_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 2, 192, 128, 1, 3, 1, 1, 1>", "registers_spare"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 0, 64, 64, 1, 7, 1, 1, 1>", "stages_3_6"),
    ("matmul", "matmul.cu", "nf4_mm_ws<0, 0, 64, 64, 1, 4, 16, 1, 1>", "ks_1_2_4_8"),
    ("matmul", "matmul.cu", "nf4_mm_ws<2, 2, 128, 128, 1, 4, 1, 1, 1>", "smem_227k"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 96, 88, 4, 1, 1, 0, 0>", "warpgroups_1_4"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 320, 88, 4, 1, 1, 0, 0>", "warpgroups_1_4"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 128, 84, 4, 1, 1, 0, 0>", "bt_8_256"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 264, 4, 1, 1, 0, 0>", "bt_8_256"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 2, 64, 136, 4, 1, 1, 0, 0>", "accumulators_128"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 64, 4, 1, 3, 0, 0>", "mb_1_2"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<1, 0, 64, 64, 4, 1, 1, 1, 0>", "dec_nf4"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<2, 0, 64, 64, 4, 1, 1, 3, 0>", "dec_nf4"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 64, 4, 1, 1, 4, 0>", "dec_nf4"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 256, 6, 1, 1, 3, 0>", "smem_227k"),  # legal with DEC 1
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 256, 96, 4, 1, 1, 1, 0>", "registers_spare"),  # legal with DEC 0
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 256, 104, 4, 1, 1, 0, 0>", "registers_spare"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 2, 128, 24, 4, 1, 2, 0, 0>", "registers_spare"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 64, 2, 1, 1, 0, 0>", "stages_3_6"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 64, 4, 16, 1, 0, 0>", "ks_1_2_4_8"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 64, 4, 1, 1, 0, 1>", "sr_with_slices"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<0, 0, 64, 64, 4, 4, 1, 0, 3>", "sr_with_slices"),
    ("matmul", "matmul.cu", "nf4_mm_wgr_cluster<0, 0, 64, 64, 4, 1, 1, 0, 2>", "sr_with_slices"),
    ("matmul", "matmul.cu", "nf4_mm_wgr<2, 2, 128, 64, 6, 1, 1, 0, 0>", "smem_227k"),
    ("matmul", "matmul.cu", "nf4_mm_prep<1, 48>", "whole_warps"),
    ("matmul", "matmul.cu", "nf4_mm_rows<0, 0, 0, 48, 4, 1, 1>", "whole_warps"),
    ("matmul", "matmul.cu", "nf4_mm_rows<0, 2, 1, 128, 32, 1, 1>", "rows_1_16"),
    ("matmul", "matmul.cu", "nf4_mm_rows<0, 2, 1, 128, 2, 3, 1>", "column_warps_1_2_4_8"),
    ("matmul", "matmul.cu", "nf4_mm_rows<0, 1, 0, 64, 1, 4, 1>", "column_warps_divide_warps"),
    ("matmul", "matmul.cu", "nf4_mm_rows<0, 1, 0, 128, 1, 1, 3>", "warp_columns_1_2_4"),
    ("matmul", "matmul.cu", "nf4_mm_rows<0, 2, 1, 128, 8, 1, 2>", "warp_columns_rows_4"),
    ("rowops", "rowops.cu", "rmsnorm<96>", "pow2"),
    ("rowops", "rowops.cu", "head<2048>", "threads_32_1024"),
    ("shortconv", "shortconv.cu", "shortconv<128, 9, 1>", "taps_2_8"),
    ("shortconv", "shortconv.cu", "shortconv<100, 3, 4>", "whole_warps"),
    ("shortconv", "shortconv.cu", "shortconv<128, 3, 65>", "rows_1_64"),
    ("attention", "attention.cu", "attention<40, 4>", "head_dim_16_256"),
    ("attention", "attention.cu", "attention<64, 33>", "warps_1_32"),
    ("attention", "attention.cu", "attention_tiled<64, 24, 16>", "queries_per_warp_whole"),
    ("attention", "attention.cu", "attention_tiled<64, 64, 4>", "queries_per_warp_8"),
    ("attention", "attention_mma.cu", "attention_mma<144, 2, 1, 0>", "head_dim_16_128"),
    ("attention", "attention_mma.cu", "attention_mma<64, 9, 1, 0>", "warps_1_8"),
    ("attention", "attention_mma.cu", "attention_mma<128, 8, 1, 0>", "smem_48k"),
    ("attention", "attention_mma.cu", "attention_mma<64, 4, 3, 0>", "key_warps_1_2_4"),
    ("attention", "attention_mma.cu", "attention_mma<64, 6, 4, 0>", "key_warps_divide_warps"),
    ("attention", "attention_mma.cu", "attention_mma<128, 4, 2, 0>", "smem_48k"),
    ("attention", "attention_mma.cu", "attention_mma<64, 4, 1, 2>", "prefetch_0_1"),
    ("attention", "attention_mma.cu", "attention_mma<64, 2, 1, 1>", "prefetch_registers"),
    ("attention", "attention.cu", "attention_tiled<256, 64, 8>", "smem_48k"),
    ("attention", "attention.cu", "qknorm_rope<24>", "head_dim_16_1024"),
]


@pytest.mark.parametrize(("family", "filename", "entry", "rule"), ILLEGAL)
def test_illegal_instantiation_fails_the_static_assert_naming_the_rule(tmp_path, family, filename, entry, rule):
    includes = {"matmul": MATMUL, "attention": ATTENTION}.get(family, [*HEADERS, cu(family, filename)])
    res = nvcc(tmp_path, "bad", includes, instantiate(entry), "-cubin", "-o", "bad.cubin")
    assert res.returncode != 0, entry
    asserts = re.findall(r'static assertion failed with "(\w+):', res.stderr)
    assert asserts == [rule], (entry, res.stderr[-2000:])


def test_python_rules_refuse_what_the_static_asserts_refuse():
    """The illegal matmul instantiations above are illegal in Python too, for the same first rule."""
    for family, _, entry, rule in ILLEGAL:
        if family != "matmul" or "<3," in entry or "reduce" in entry or "prep" in entry:  # no Python config
            continue
        vals = [int(v) for v in entry.split("<")[1].rstrip(">").split(",")]
        kind = entry.split("<")[0].removeprefix("nf4_mm_").removesuffix("_cluster")  # wgr's SR 2 kernel
        if kind in ("ring", "wgr", "ws", "wg"):  # the norm is the prologue's: no NORM argument
            vals.insert(2, 0)
        fmt = {v: k for k, v in mm.FMT_CODE.items()}[vals[0]]
        epi = mm.EPILOGUES[vals[1]]
        tpl = mm.CudaMatmul(kind, fmt, epi, bool(vals[2]))
        names = {"mma": mm.MMA_PARAMS, "splitk": mm.SPLITK_PARAMS, "pipe": mm.PIPE_PARAMS, "ring": mm.RING_PARAMS,
                 "wg": mm.WG_PARAMS, "ws": mm.WS_PARAMS, "wgr": mm.WGR_PARAMS, "rows": mm.ROWS_PARAMS}[kind]
        cfg = tpl.space().config(dict(zip(names, vals[3:])))
        why = tpl.space().why_illegal(cfg)
        assert why and why[0].split(":")[0] == rule, (entry, why)


@pytest.mark.parametrize("kind", ["mma", "splitk", "pipe", "ring"])
def test_cpp_mma_rules_agree_with_python_rules(tmp_path, kind):
    rng = random.Random(5)
    pick = [16, 24, 32, 48, 64, 96, 128] if kind not in ("pipe", "ring") else [16, 32, 32, 48, 64, 64, 128]

    def tail() -> tuple[int, ...]:  # pipe / ring: ST, KS, MB; mma: PIPE; splitk: PIPE, KS, SR
        if kind in ("pipe", "ring"):
            return rng.choice([1, 2, 3, 4, 4, 6, 8, 9]), rng.choice([1, 1, 2, 3, 4, 8]), rng.choice([1, 2, 2, 3])
        ks = (rng.choice([1, 2, 3, 4, 4, 8, 8, 16]), rng.choice([0, 0, 1, 1, 2, 2, 3])) if kind == "splitk" else ()
        return rng.choice([1, 2, 2, 3]), *ks

    norms = [0] if kind == "ring" else [0, 1]  # the ring kind's norm is its prologue's: no NORM argument
    tuples = [(rng.choice([0, 1, 2]), rng.choice([0, 1, 2]), *([rng.choice(norms)] if kind != "ring" else []),
               *(rng.choice(pick) for _ in range(5)), *tail()) for _ in range(3500)]
    width = len(tuples[0])
    rows = ",\n".join("{" + ", ".join(map(str, t)) + "}" for t in tuples)
    call = ", ".join(f"t[{i}]" for i in range(width))
    body = (f"#include <cstdio>\nstatic const int T[][{width}] = {{\n{rows}\n}};\n"
            f"int main() {{ for (const auto &t : T) printf(\"%d\\n\", {kind}_first_failure({call})); }}\n")
    res = nvcc(tmp_path, "host", MATMUL, body, "-o", "host")
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "host")], capture_output=True, text=True, check=True).stdout.split()
    names = None  # the rule order of the format and epilogue at hand (pipe's smem rule depends on both)
    params = {"mma": mm.MMA_PARAMS, "splitk": mm.SPLITK_PARAMS, "pipe": mm.PIPE_PARAMS, "ring": mm.RING_PARAMS}[kind]
    seen_legal = 0
    for t, fail in zip(tuples, map(int, out)):
        if kind == "ring":
            t = (*t[:2], 0, *t[2:])
        tpl = mm.CudaMatmul(kind, ("nf4", "f16", "f32")[t[0]], mm.EPILOGUES[t[1]], bool(t[2]))
        space = tpl.space()
        why = [w for w in space.why_illegal(space.config(dict(zip(params, t[3:]))))]
        names = [r.name for r in space.rules if not r.needs_limits]
        assert (fail == 0) == (not why), (t, fail, why)
        if why:
            assert names[fail - 2] == why[0].split(":")[0], (t, fail, why)  # C++ rule 1 is `variant`
        seen_legal += not why
    assert seen_legal > 50


def cpp_rules_and_smem(tmp_path, tuples, first_failure: str, smem: str) -> list[tuple[int, int]]:
    """(first failing rule, smem bytes) per tuple from the C++ functions, calls written over `t[i]`."""
    width = len(tuples[0])
    rows = ",\n".join("{" + ", ".join(map(str, t)) + "}" for t in tuples)
    body = (f"#include <cstdio>\nstatic const int T[][{width}] = {{\n{rows}\n}};\n"
            "int main() { for (const auto &t : T) printf(\"%d %d\\n\", " + first_failure + ", " + smem + "); }\n")
    res = nvcc(tmp_path, "host", MATMUL, body, "-o", "host")
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "host")], capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(tuples)
    return [tuple(map(int, line.split())) for line in out]


def assert_rules_agree(kind, params, tuples, cpp, smem_bytes) -> None:
    """The C++ verdicts `cpp` against the Python space of `kind` on each (FMT, EPI, *params) tuple: legal alike,
    the same first rule (C++ rule 1 is `variant`), the same shared memory; enough legal tuples to mean something."""
    seen_legal = 0
    for t, (fail, smem) in zip(tuples, cpp, strict=True):
        tpl = mm.CudaMatmul(kind, ("nf4", "f16", "f32")[t[0]], mm.EPILOGUES[t[1]], False)
        space = tpl.space()
        cfg = space.config(dict(zip(params, t[2:])))
        why = space.why_illegal(cfg)
        names = [r.name for r in space.rules if not r.needs_limits]
        assert (fail == 0) == (not why), (t, fail, why)
        if why:
            assert names[fail - 2] == why[0].split(":")[0], (t, fail, why)
        assert smem == smem_bytes(cfg, tpl.fmt, tpl.sets), t
        seen_legal += not why
    assert seen_legal > 100


@pytest.mark.parametrize("kind", ["wg", "wgt", "ws"])
def test_cpp_wg_rules_and_smem_agree_with_python(tmp_path, kind):
    """`wg_first_failure` (TX 0 and 1) / `ws_first_failure` and their smem bytes in C++ against the Python rules and
    arithmetic, on random tuples of (FMT, EPI, BM, BN, MT, ST, KS, MB[, PW]) around the legal values."""
    rng = random.Random(7)
    pw = kind == "ws"
    tuples = [(rng.choice([0, 1, 2]), rng.choice([0, 0, 1, 2]), rng.choice([64, 64, 96, 128, 128, 192, 256, 384, 640]),
               rng.choice([16, 32, 32, 64, 64, 96, 128, 256]), rng.choice([1, 1, 2, 3]), rng.choice([3, 4, 4, 5, 6, 7]),
               rng.choice([1, 1, 2, 3, 4, 8]), rng.choice([1, 1, 2, 3]), *([rng.choice([1, 1, 2, 3])] if pw else []))
              for _ in range(3000)]
    call = ", ".join(f"t[{i}]" for i in range(len(tuples[0])))
    fn, tx = ("wg", ", 1") if kind == "wgt" else (kind, "")
    cpp = cpp_rules_and_smem(tmp_path, tuples, f"{fn}_first_failure({call}{tx})",
                             f"{fn}_smem_bytes(t[0], t[1], t[2], t[3], t[5]{tx})")
    smem = ((lambda c, f, s: mm.wg_smem_bytes(c, f, s, tma=True)) if kind == "wgt"
            else {"wg": mm.wg_smem_bytes, "ws": mm.ws_smem_bytes}[kind])
    assert_rules_agree(kind, mm.WS_PARAMS if pw else mm.WG_PARAMS, tuples, cpp, smem)


def test_cpp_wgr_rules_and_smem_agree_with_python(tmp_path):
    """`wgr_first_failure` and `wgr_smem_bytes` in C++ against the Python rules and arithmetic, on random tuples of
    (FMT, EPI, BF, BT, ST, KS, MB, DEC, SR) around the legal values."""
    rng = random.Random(11)
    tuples = [(rng.choice([0, 0, 1, 2]), rng.choice([0, 0, 1, 2]), rng.choice([32, 64, 96, 128, 128, 192, 256, 320]),
               rng.choice([4, 16, 60, 64, 88, 88, 120, 128, 136, 176, 256, 264]), rng.choice([2, 3, 4, 4, 5, 6, 7]),
               rng.choice([1, 1, 2, 3, 4, 8]), rng.choice([1, 1, 2, 3]), rng.choice([0, 0, 1, 1, 2, 3, 4]),
               rng.choice([0, 0, 1, 1, 2, 2, 3])) for _ in range(3000)]
    call = ", ".join(f"t[{i}]" for i in range(9))
    cpp = cpp_rules_and_smem(tmp_path, tuples, f"wgr_first_failure({call})",
                             "wgr_smem_bytes(t[0], t[1], t[2], t[3], t[4], t[5], t[7], t[8])")
    assert_rules_agree("wgr", mm.WGR_PARAMS, tuples, cpp, mm.wgr_smem_bytes)


def test_the_register_table_decode_is_nf4_only_and_costs_eight_registers():
    """DEC 1 (the f16 code table in registers) and DEC 2, 3 (the pair table) are refused for f16 and f32 weights by
    `dec_nf4`; where DEC 0 leaves exactly the spare registers the rule asks for, DEC 1 is refused by
    `registers_spare` naming 56 and the pair tables, held in shared memory, are not."""
    for fmt in ("f16", "f32"):
        tpl = mm.CudaMatmul("wgr", fmt, "none", False)
        for dec in (1, 2, 3):
            why = tpl.why_illegal(tpl.config_of({**mm.DEFAULT_WGR, "DEC": dec}), SM90, (346, 1024, 1024))
            assert why and why[0].startswith("dec_nf4:") and fmt in why[0], why
    tpl = mm.CudaMatmul("wgr", "nf4", "none", False)
    tight = {"BF": 256, "BT": 96, "ST": 4, "KS": 1, "MB": 1, "SR": 0}  # 512 threads: 128 - 48 - 32 = 48 spare
    for dec in (0, 2, 3):
        assert tpl.why_illegal(tpl.config_of({**tight, "DEC": dec}), SM90, (346, 1024, 1024)) == []
    why = tpl.why_illegal(tpl.config_of({**tight, "DEC": 1}), SM90, (346, 1024, 1024))
    assert why and why[0].startswith("registers_spare:") and "< 56" in why[0], why
    seeds = legal(tpl.space("seed"))
    assert {c["DEC"] for c in seeds} == {0, 1, 2, 3}  # every decode races in a seed tune


def test_the_pair_tables_take_their_copies_in_shared_memory():
    """DEC 2 and 3 add 256 f16 pairs in 8 and 32 copies (8 and 32 KB) to a block's shared memory, so a ring that
    fits with DEC 1 can be refused by `smem_227k` with DEC 3, naming the bytes."""
    tpl = mm.CudaMatmul("wgr", "nf4", "none", True)
    cfg = {"BF": 64, "BT": 256, "ST": 6, "KS": 1, "MB": 1, "SR": 0}
    sizes = {d: mm.wgr_smem_bytes(tpl.config_of({**cfg, "DEC": d}), "nf4", 1) for d in (0, 1, 2, 3)}
    assert sizes[0] == sizes[1] and sizes[2] - sizes[1] == 8192 and sizes[3] - sizes[1] == 32768
    for dec in (1, 2):
        assert tpl.why_illegal(tpl.config_of({**cfg, "DEC": dec}), SM90, (346, 3072, 1024)) == []
    why = tpl.why_illegal(tpl.config_of({**cfg, "DEC": 3}), SM90, (346, 3072, 1024))
    assert why and "smem" in why[0] and str(sizes[3]) in why[0], why


def test_the_heads_weight_loads_of_several_columns_share_one_block(tmp_path):
    """head<256>'s PTX has a basic block holding four columns' weight loads for all 8 scores: a branch between the
    loads (the `l0 + j < L` guard put one before each) makes every load wait for the one before it."""
    res = nvcc(tmp_path, "head", [*HEADERS, cu("rowops", "rowops.cu")], instantiate("head<256>"), "-ptx", "-o",
               "head.ptx")
    assert res.returncode == 0, res.stderr[-3000:]
    ptx = (tmp_path / "head.ptx").read_text()
    body = ptx[ptx.index(".entry _Z4headILi256EE"):]
    blocks = re.split(r"^\$L__\w+:$|^.*\bbra(?:\.uni)?\b.*$", body, flags=re.M)
    assert max(b.count("ld.global") for b in blocks) >= 4 * 8
