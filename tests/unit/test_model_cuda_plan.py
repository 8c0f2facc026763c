"""The CUDA executor's decision plans without a GPU: a recording device stands in for CuPy, and every launch is
checked against the C++ signature of the kernel it instantiates (argument count and kinds parsed from the `.cu`
sources), its block size and grid; the prefix cache's promise is checked on the plan itself (a base state's buffers
are never bound where a kernel writes)."""

from __future__ import annotations

import dataclasses
import re
from importlib import resources

import numpy as np
import pytest

from tilewise.devices.base import Buffer, Device, DeviceInfo, Launch, Program
from tilewise.devices.profiles import get_profile
from tilewise.kernels.attention.cuda import SOURCE_FILES as ATTENTION_FILES
from tilewise.kernels.matmul.cuda import NULL, SOURCE_FILES
from tilewise.model.checkpoint import Checkpoint, random_tensors
from tilewise.model.config import PRESETS
from tilewise.model.cuda import CUDAExecutor

SOURCES = [*(("matmul", f) for f in SOURCE_FILES), ("rowops", "rowops.cu"), ("shortconv", "shortconv.cu"),
           *(("attention", f) for f in ATTENTION_FILES)]


def global_kernels(text: str) -> list[tuple[str, list[str], int]]:
    """(name, parameter declarations, index of the body's opening brace) of every `__global__ void` kernel."""
    out = []
    for k in re.finditer(r"__global__ void", text):
        brace = text.index("{", k.end())
        head = re.sub(r"//[^\n]*", "", text[k.end():brace]).strip()  # declaration up to the body
        m = re.search(r"(\w+)\(([^()]*)\)$", head)
        assert m, head
        out.append((m.group(1), [p.strip() for p in m.group(2).split(",")], brace))
    return out


def kernel_signatures() -> dict[str, list[tuple[str, bool]]]:
    """kernel name -> [(kind, written)] per parameter: kind `ptr`, `int` or `float`; written for non-const pointers."""
    sigs: dict[str, list[tuple[str, bool]]] = {}
    for family, name in SOURCES:
        text = resources.files(f"tilewise.kernels.{family}").joinpath(name).read_text()
        for kernel, decls, _ in global_kernels(text):
            sigs[kernel] = [("ptr", not p.startswith("const")) if "*" in p else (p.split()[0], False) for p in decls]
    return sigs


class RecordingDevice(Device):
    """A CUDA-shaped device that allocates nothing and runs nothing; it keeps what it was asked to compile."""

    def __init__(self) -> None:
        lim = get_profile("sm_90")
        self.info = DeviceInfo(backend="cuda", name="recording", adapter_type="discrete", api="CUDA", driver="0",
                               vendor="NVIDIA", limits=lim)
        self.entries: list[str] = []
        self.written: dict[int, bytes] = {}  # the last bytes written into each buffer (by id)

    def allocate(self, nbytes: int, *, uniform: bool = False) -> Buffer:
        return Buffer(self, None, max(4, int(nbytes)), uniform)

    def write(self, buffer: Buffer, array: np.ndarray, offset_bytes: int = 0) -> None:
        assert offset_bytes + np.asarray(array).nbytes <= buffer.nbytes
        self.written[id(buffer)] = np.ascontiguousarray(array).tobytes()

    def address(self, buffer: Buffer) -> int:
        return 0x7F0000000000 + 256 * (id(buffer) % 2**28)  # a stand-in, one per buffer

    def download(self, buffer, dtype=np.float32, shape=None, offset_bytes=0):
        return np.zeros(shape or (buffer.nbytes // np.dtype(dtype).itemsize,), dtype)

    def compile(self, source, entry="main", constants=None, name=None) -> Program:
        assert f"{entry.split('<')[0]}(" in source
        self.entries.append(entry)
        return Program(name or entry, None, entry, {}, {"entry": entry})

    def allow_dynamic_shared(self, program: Program, nbytes: int) -> None:
        program.meta["dynamic_shared_bytes"] = int(nbytes)

    def run(self, launches, pdl=False) -> None:
        pass

    def time(self, launches) -> np.ndarray:
        return np.zeros(len(launches))

    def synchronize(self) -> None:
        pass


@pytest.fixture(scope="module")
def executor():
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    return CUDAExecutor(ck, device=RecordingDevice())


def check_launch(launch: Launch, sigs) -> None:
    entry = launch.program.meta["entry"]
    sig = sigs[entry.split("<")[0]]
    assert len(launch.buffers) == len(sig), entry
    for arg, (kind, _) in zip(launch.buffers, sig):
        want = {"ptr": Buffer, "int": np.int32, "float": np.float32, "const": object}[kind]  # const: a TMA map
        assert isinstance(arg, want) or (kind == "ptr" and arg is NULL), (entry, arg, kind)
    block = launch.program.meta["block"]
    assert 1 <= int(np.prod(block)) <= 1024, entry
    assert all(g >= 1 for g in launch.grid) and launch.grid[1] <= 65535 and launch.grid[2] <= 65535, entry


@pytest.mark.parametrize("n", [1, 3, 31, 32, 70])
def test_every_launch_matches_its_kernels_signature(executor, rng, n):
    sigs = kernel_signatures()
    assert {"nf4_mm_mma", "nf4_mm_rows", "nf4_mm_splitk", "nf4_mm_splitk_reduce", "embed", "head", "copy_words",
            "shortconv", "qknorm_rope", "attention"} <= set(sigs)
    ids = rng.integers(0, 512, n)
    for slicing in (True, False):
        plan, _ = executor.plan(ids, 0, None, slicing)
        for launch in plan.launches:
            check_launch(launch, sigs)
    labels = set(plan.labels)
    assert {"embed", "conv", "attention", "attn.qknorm_rope", "ffn.gate_up", "ffn.down", "head"} <= labels


def test_a_base_states_buffers_are_never_written_by_an_extend(executor, rng):
    sigs = kernel_signatures()
    _, base = executor.plan(rng.integers(0, 512, 40), 0, None, True)
    base_bufs = {id(b) for kv in base.kv.values() for b in kv} | {id(b) for b in base.conv.values()}
    for m in (1, 5, 33):
        plan, new = executor.plan(rng.integers(0, 512, m), 40, base, True)
        assert not base_bufs & ({id(b) for kv in new.kv.values() for b in kv} | {id(b) for b in new.conv.values()})
        read = 0
        for launch in plan.launches:
            check_launch(launch, sigs)
            sig = sigs[launch.program.meta["entry"].split("<")[0]]
            for arg, (_, written) in zip(launch.buffers, sig):
                if isinstance(arg, Buffer) and id(arg) in base_bufs:
                    assert not written, launch.program.meta["entry"]
                    read += 1
        n_attn = sum(t == "full_attention" for t in executor.cfg.layer_types)
        n_conv = len(executor.cfg.layer_types) - n_attn
        # one launch copies eight buffers: every layer's K and V into the new state's, with the prefix's words
        copies = [ln for ln, lab in zip(plan.launches, plan.labels) if lab == "copy.kv_prefix"]
        assert len(copies) == -(-2 * n_attn // 8)
        pairs = [(id(ln.buffers[2 * j]), id(ln.buffers[2 * j + 1])) for ln in copies for j in range(ln.grid[1])]
        assert sorted(pairs) == sorted((id(o), id(w)) for i, olds in base.kv.items() for o, w in zip(olds, new.kv[i]))
        hkv, d = executor.cfg.num_key_value_heads, executor.cfg.head_dim
        assert all(int(ln.buffers[-1]) == 40 * hkv * d and ln.grid[0] * 256 >= 40 * hkv * d for ln in copies)
        assert read == 2 * n_attn + n_conv  # K and V prefix copies read the base, the conv reads its state


def test_final_row_slicing_runs_the_last_blocks_ffn_on_one_row_with_the_short_row_kernel(executor, rng):
    plan, _ = executor.plan(rng.integers(0, 512, 70), 0, None, True)
    entries = [launch.program.meta["entry"] for launch in plan.launches]
    last_ffn = [e for e, lab in zip(entries, plan.labels) if lab.startswith("ffn.")][-2:]
    assert all(e.startswith("nf4_mm_rows") for e in last_ffn)
    grid_rows = [launch.grid[1] for launch, lab in zip(plan.launches, plan.labels) if lab.startswith("ffn.")]
    assert grid_rows[-2:] == [1, 1]
    first_ffn = next(e for e, lab in zip(entries, plan.labels) if lab == "ffn.gate_up")
    assert first_ffn.startswith("nf4_mm_mma<0, 2, 1,")  # nf4, swiglu, fused norm on the tensor cores
    full, _ = executor.plan(rng.integers(0, 512, 70), 0, None, False)
    assert len(plan.launches) == len(full.launches) + 1  # + the copy of the last residual row


def test_a_repeated_decision_shape_reuses_its_plan(executor, rng):
    a, sa = executor.plan(rng.integers(0, 512, 12), 0, None, True)
    del sa  # its caches go back to the pool, and the next decision takes them
    b, _ = executor.plan(rng.integers(0, 512, 12), 0, None, True)
    assert a is b


def test_head_dim_the_kernels_cannot_run_is_refused_with_one_error():
    import dataclasses

    from tilewise.errors import ConfigError

    cfg = dataclasses.replace(PRESETS["tiny"], head_dim=8, num_attention_heads=8)
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:bad")
    with pytest.raises(ConfigError, match="head_dim 8 must be a multiple of 16"):
        CUDAExecutor(ck, device=RecordingDevice())


def _table_for(cfg, fp: str, ffn_mma: dict, ffn_rows: dict, attn_nw: int, kind: str = "mma"):
    from tilewise.kernels.attention.cuda import CudaAttention
    from tilewise.kernels.matmul.cuda import CudaMatmul
    from tilewise.model.dispatch import attention_key, matmul_key
    from tilewise.tune.dispatch import DispatchTable, Entry

    H, F = cfg.hidden_size, cfg.ffn_dim
    table = DispatchTable(fp)
    mma, rows = CudaMatmul(kind, "nf4", "residual"), CudaMatmul("rows", "nf4", "residual")
    table.put(matmul_key("nf4", "residual", H, F), Entry([
        {"m_min": 1, "m_max": 7, "kernel": rows.name, "config": ffn_rows},
        {"m_min": 8, "m_max": None, "kernel": mma.name, "config": ffn_mma}]), mma)
    table.put(attention_key(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim), Entry([
        {"m_min": 1, "m_max": None, "kernel": "attention", "config": {"QT": 1, "NW": attn_nw, "TC": 0}}]),
        CudaAttention())
    return table


def test_a_dispatch_tables_choices_are_what_the_plan_launches(rng):
    """ffn.down takes the table's tensor-core tile from 8 rows and its short-row config below; attention its NW."""
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    mma = {"BM": 32, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "PIPE": 1}
    rows = {"NT": 64, "RM": 2}
    ex = CUDAExecutor(ck, device=dev, dispatch=_table_for(cfg, dev.info.fingerprint, mma, rows, 2))
    for n, want in ((40, "nf4_mm_mma<0, 1, 0, 32, 64, 64, 16, 32, 1>"), (5, "nf4_mm_rows<0, 1, 0, 64, 2, 1, 1>")):
        plan, _ = ex.plan(rng.integers(0, 512, n), 0, None, False)
        entries = [launch.program.meta["entry"] for launch in plan.launches]
        downs = {e for e, lab in zip(entries, plan.labels) if lab == "ffn.down"}
        assert downs == {want}, (n, downs)
        attn = {e for e, lab in zip(entries, plan.labels) if lab == "attention"}
        assert attn and all(e.endswith(", 2>") for e in attn), attn
        others = {e for e, lab in zip(entries, plan.labels) if lab == "ffn.gate_up"}
        assert all(", 64, 64, 32, 32, 32, 2>" in e for e in others if e.startswith("nf4_mm_mma"))  # the default


def test_the_tables_short_conv_config_is_what_the_plan_launches_at_every_length(rng):
    """The conv takes the table's NT and RT (grid y: runs of RT rows, the last one partial), the default without
    an entry, and the final-row-sliced last block its L rows with the same config."""
    from tilewise.kernels.shortconv.cuda import CudaShortConv
    from tilewise.model.dispatch import conv_key
    from tilewise.tune.dispatch import Entry

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    table = _table_for(cfg, dev.info.fingerprint, {"BM": 32, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "PIPE": 1},
                       {"NT": 64, "RM": 2}, 2)
    conv = CudaShortConv()
    nt, rt = int(rng.choice([32, 64])), int(rng.choice([2, 4, 8, 16]))
    table.put(conv_key(cfg), Entry([{"m_min": 1, "m_max": None, "kernel": conv.name,
                                     "config": {"NT": nt, "RT": rt}}]), conv)
    tuned, plain = CUDAExecutor(ck, device=dev, dispatch=table), CUDAExecutor(ck, device=RecordingDevice())
    H, L = cfg.hidden_size, cfg.conv_L_cache
    for n in (1, int(rng.integers(2, 40)), 41):
        for ex, (want_nt, want_rt) in ((tuned, (nt, rt)), (plain, (128, 1))):
            plan, _ = ex.plan(rng.integers(0, 512, n), 0, None, True)
            convs = [ln for ln, lab in zip(plan.launches, plan.labels) if lab == "conv"]
            assert len(convs) == sum(t == "conv" for t in cfg.layer_types) > 0
            for i, ln in enumerate(convs):
                rows = min(n, L) if i == len(convs) - 1 and cfg.layer_types[-1] == "conv" else n
                assert ln.program.meta["entry"] == f"shortconv<{want_nt}, {L}, {want_rt}>"
                assert ln.grid == (-(-H // want_nt), -(-rows // want_rt), 1) and int(ln.buffers[5]) == rows


def test_a_split_k_choice_launches_the_slices_into_the_partial_buffer_then_the_reduction(rng):
    """ffn.down on split-K: two launches per layer, grid z = KS, the executor's partial buffer written by the first
    and read by the second, sized for KS slices at the row capacity; the other matmuls stay one launch."""
    from tilewise.model.cuda import MIN_ROW_CAPACITY

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    split = {"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "PIPE": 2, "KS": 2}
    ex = CUDAExecutor(ck, device=dev, dispatch=_table_for(cfg, dev.info.fingerprint, split, {"NT": 64, "RM": 2}, 4,
                                                          kind="splitk"))
    sigs = kernel_signatures()
    n = 40
    plan, _ = ex.plan(rng.integers(0, 512, n), 0, None, False)
    downs = [launch for launch, lab in zip(plan.launches, plan.labels) if lab == "ffn.down"]
    assert len(downs) == 2 * len(cfg.layer_types)
    H = cfg.hidden_size
    for main, red in zip(downs[::2], downs[1::2]):
        check_launch(main, sigs)
        check_launch(red, sigs)
        assert main.program.meta["entry"] == "nf4_mm_splitk<0, 1, 0, 32, 64, 32, 16, 32, 2, 2, 0>"
        assert red.program.meta["entry"] == "nf4_mm_splitk_reduce<1, 256>"
        assert main.grid == (1, 2, 2)  # ceil(64 / 64) column tiles, ceil(40 / 32) row tiles, KS = 2 slices
        partial = main.buffers[8]
        assert partial is ex._scratch["partial"] and red.buffers[0] is partial and red.buffers[1] == 2
        assert red.buffers[2] is ex.act["x"] and int(red.buffers[3]) == n and int(red.buffers[4]) == H
        assert partial.nbytes >= 4 * 2 * MIN_ROW_CAPACITY * H  # KS slices at the row capacity
        assert red.grid == (-(-n * H // 256), 1, 1)
    others = [lab for lab in plan.labels if lab.startswith("ffn.gate_up")]
    assert len(others) == len(cfg.layer_types)  # one launch each


def test_a_split_k_choice_with_sr_sums_the_slices_in_its_own_launch(rng):
    """ffn.down on split-K with SR 1: one launch per layer, no reduction; it writes the partial buffer, sums into
    the residual rows itself and counts tiles in the executor's zeroed `counters` scratch (one word per tile)."""
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    writes: list[tuple[Buffer, bool]] = []  # (buffer, all zeros) of every write
    record = dev.write

    def write(buffer: Buffer, array: np.ndarray, offset_bytes: int = 0) -> None:
        writes.append((buffer, not np.asarray(array).any()))
        record(buffer, array, offset_bytes)

    dev.write = write  # type: ignore[method-assign]
    split = {"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "PIPE": 2, "KS": 2, "SR": 1}
    ex = CUDAExecutor(ck, device=dev, dispatch=_table_for(cfg, dev.info.fingerprint, split, {"NT": 64, "RM": 2}, 4,
                                                          kind="splitk"))
    sigs = kernel_signatures()
    plan, _ = ex.plan(rng.integers(0, 512, 40), 0, None, False)
    downs = [launch for launch, lab in zip(plan.launches, plan.labels) if lab == "ffn.down"]
    assert len(downs) == len(cfg.layer_types)
    assert not any(launch.program.meta["entry"].startswith("nf4_mm_splitk_reduce") for launch in plan.launches)
    counters = ex._scratch["counters"]
    for main in downs:
        check_launch(main, sigs)
        assert main.program.meta["entry"] == "nf4_mm_splitk<0, 1, 0, 32, 64, 32, 16, 32, 2, 2, 1>"
        assert main.buffers[8] is ex._scratch["partial"] and main.buffers[12] is ex.act["x"]
        assert main.buffers[13] is counters
    assert counters.nbytes >= 4 * 2  # 2 tiles at 40 rows (and more at the row capacity)
    assert [z for b, z in writes if b is counters] == [True]  # zeroed once, when it was made


@pytest.mark.parametrize("kind", ["ring", "wg", "ws"])
@pytest.mark.parametrize("ks", [1, 2])
def test_a_ring_or_wg_choice_rounds_x_to_f16_once_then_runs_on_it(rng, ks, kind):
    """ffn.down on the ring, wg or ws kind: the prologue writes the executor's `xh` scratch (one block per row, from the
    row the matmul reads), the main kernel reads it and writes out (KS 1) or the partial sums the reduction then adds
    (KS 2)."""
    from tilewise.kernels.matmul.cuda import PREP_NT
    from tilewise.model.cuda import MIN_ROW_CAPACITY

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    choice = ({"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "ST": 3, "KS": ks, "MB": 2} if kind == "ring" else
              {"BM": 64, "BN": 64, "MT": 1, "ST": 4, "KS": ks, "MB": 1, **({"PW": 1} if kind == "ws" else {})})
    ex = CUDAExecutor(ck, device=dev, dispatch=_table_for(cfg, dev.info.fingerprint, choice, {"NT": 64, "RM": 2}, 4,
                                                          kind=kind))
    sigs = kernel_signatures()
    n, H, F = 40, cfg.hidden_size, cfg.ffn_dim
    plan, _ = ex.plan(rng.integers(0, 512, n), 0, None, False)
    downs = [launch for launch, lab in zip(plan.launches, plan.labels) if lab == "ffn.down"]
    per = 2 + (ks > 1)
    assert len(downs) == per * len(cfg.layer_types)
    pair = [ex._scratch["xh"], ex._scratch["xh2"]]  # taken in turn by the matmuls that prep
    assert all(xh.nbytes >= 2 * MIN_ROW_CAPACITY * F for xh in pair)  # f16 rows of the widest K read
    entry, grid = {"ring": (f"nf4_mm_ring<0, 1, 32, 64, 32, 16, 32, 3, {ks}, 2>", (1, 2, ks)),
                   "wg": (f"nf4_mm_wg<0, 1, 64, 64, 1, 4, {ks}, 1>", (1, 1, ks)),
                   "ws": (f"nf4_mm_ws<0, 1, 64, 64, 1, 4, {ks}, 1, 1>", (1, 1, ks))}[kind]
    for i in range(0, len(downs), per):
        prep, main = downs[i], downs[i + 1]
        xh = pair[i // per % 2]
        for launch in downs[i:i + per]:
            check_launch(launch, sigs)
        assert prep.program.meta["entry"] == "nf4_mm_prep<0, 128>" and prep.program.meta["block"] == (PREP_NT, 1, 1)
        assert prep.grid == (n, 1, 1) and prep.buffers[4] is xh and int(prep.buffers[5]) == F
        assert main.program.meta["entry"] == entry
        assert main.buffers[0] is xh and main.grid == grid
        if kind in ("wg", "ws"):  # ws: one consumer warpgroup and the producer
            assert main.program.meta["block"] == ({"wg": 128, "ws": 256}[kind], 1, 1)
        if ks == 1:
            assert main.buffers[5] is ex.act["x"]  # the residual epilogue in place
        else:
            red = downs[i + 2]
            assert main.buffers[5] is ex._scratch["partial"] is red.buffers[0] and red.buffers[2] is ex.act["x"]
        assert (int(main.buffers[6]), int(main.buffers[7]), int(main.buffers[8])) == (n, H, F)


def _fusing_table(cfg, fp: str):
    """ffn.down on the wg kind in two slices (a residual reduction), the normed in_proj and qkv on wg reading f16
    rows: each down's reduction is followed by the next layer's prologue of the same rows."""
    from tilewise.kernels.matmul.cuda import CudaMatmul
    from tilewise.model.dispatch import matmul_key
    from tilewise.tune.dispatch import Entry

    table = _table_for(cfg, fp, {"BM": 64, "BN": 64, "MT": 1, "ST": 4, "KS": 2, "MB": 1}, {"NT": 64, "RM": 2}, 4,
                       kind="wg")
    H, qkv_n = cfg.hidden_size, (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    for n in (3 * H, qkv_n):
        tpl = CudaMatmul("wg", "nf4", "none", True)
        table.put(matmul_key("nf4", "none", n, H, True), Entry([{"m_min": 1, "m_max": None, "kernel": tpl.name,
                                                                 "config": {"BM": 64, "BN": 64, "MT": 1, "ST": 4,
                                                                            "KS": 1, "MB": 1}}]), tpl)
    return table


def test_a_reduction_followed_by_the_prologue_of_its_rows_is_one_launch(rng):
    """With fusing on, each ffn.down reduction that the next layer's normed prologue reads becomes one
    nf4_mm_reduce_prep launch: the reduction's partial sums, slices and output, the prologue's norm weights and f16
    rows, one block per row; the prologue launch is gone and the plan is exactly that many launches shorter."""
    from tilewise.kernels.matmul.cuda import PREP_NT

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    ex = CUDAExecutor(ck, device=dev, dispatch=_fusing_table(cfg, dev.info.fingerprint))
    sigs = kernel_signatures()
    n, L, H = 40, len(cfg.layer_types), cfg.hidden_size
    ids = rng.integers(0, 512, n)
    ex.fuse_preps = False
    apart, _ = ex.plan(ids, 0, None, False)
    ex.fuse_preps = True
    fused, _ = ex.plan(ids, 0, None, False)
    assert apart is not fused  # the setting is part of the plan's key
    entries = [launch.program.meta["entry"] for launch in fused.launches]
    assert "nf4_mm_reduce_prep" not in " ".join(launch.program.meta["entry"] for launch in apart.launches)
    joined = [i for i, e in enumerate(entries) if e.startswith("nf4_mm_reduce_prep")]
    assert len(joined) == L - 1  # every down but the last one's (the head follows it)
    assert len(apart.launches) == len(fused.launches) + L - 1
    for i in joined:
        launch, nxt = fused.launches[i], fused.launches[i + 1]
        check_launch(launch, sigs)
        assert launch.program.meta["entry"] == f"nf4_mm_reduce_prep<1, {PREP_NT}>"
        assert fused.labels[i] == "ffn.down" and launch.grid == (n, 1, 1)
        partial, ks, out, m, width, norm_w, _, xh = launch.buffers
        assert partial is ex._scratch["partial"] and int(ks) == 2 and out is ex.act["x"]
        assert (int(m), int(width)) == (n, H) and xh in (ex._scratch["xh"], ex._scratch["xh2"])
        assert nxt.buffers[0] is xh and nxt.program.meta["entry"].startswith("nf4_mm_wg<0, 0,")  # reads those rows
        layer = ex.layers[sum(lab == "ffn.down" and e.startswith("nf4_mm_reduce_prep")
                              for lab, e in zip(fused.labels[:i], entries[:i])) + 1]
        assert norm_w is layer["operator_norm"]  # the next layer's norm
    # the first layer's prologue has no reduction before it, and no gate/up prologue follows a split-K reduction
    assert sum(e.startswith("nf4_mm_prep<1,") for e in entries) == 1


def _wgr_executor(monkeypatch, choices, cfg=None):
    """The executor of `cfg` (default: the tiny preset) on a recording device, with a table holding each (epilogue,
    N, K, norm, config[, kind]) of `choices` on wgr (or that kind) from 8 rows (TMA maps stubbed: no driver to encode
    one)."""
    from tilewise.kernels.matmul import cuda as mm
    from tilewise.kernels.matmul.cuda import CudaMatmul
    from tilewise.model.dispatch import matmul_key
    from tilewise.tune.dispatch import DispatchTable, Entry

    monkeypatch.setattr(mm, "f16_rows_map", lambda buf, *_: ("tma map of", buf))
    cfg = cfg or PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    table = DispatchTable(dev.info.fingerprint)
    for epi, n, k, norm, config, *kind in choices:
        tpl = CudaMatmul(kind[0] if kind else "wgr", "nf4", epi, norm)
        table.put(matmul_key("nf4", epi, n, k, norm), Entry([{"m_min": 8, "m_max": None, "kernel": tpl.name,
                                                               "config": config}]), tpl)
    return CUDAExecutor(ck, device=dev, dispatch=table)


def test_a_wgr_swiglu_launch_stores_the_f16_rows_ffn_down_reads_in_place_of_its_prologue(rng, monkeypatch):
    """gate/up, ffn.down and the out projections on wgr: gate/up's launch gets out_h = the f16 rows down's main
    launch reads (the other buffer of the pair, not the one gate/up itself reads), down's prologue launch is gone, and
    the f32 output gate/up no longer writes is rewritten before anything reads it again; the short conv and
    attention likewise store f16 rows for their out projection; fusing off keeps out_h null."""
    from tilewise.kernels.matmul.cuda import DEFAULT_WGR

    cfg = PRESETS["tiny"]
    H, F = cfg.hidden_size, cfg.ffn_dim
    ex = _wgr_executor(monkeypatch, [("swiglu", F, H, True, DEFAULT_WGR), ("residual", H, F, False, DEFAULT_WGR),
                                     ("residual", H, H, False, DEFAULT_WGR)])
    sigs = kernel_signatures()
    n, L = 40, len(cfg.layer_types)
    ids = rng.integers(0, 512, n)
    ex.fuse_preps = False
    apart, _ = ex.plan(ids, 0, None, False)
    assert all(p.buffers[12] is NULL for p in apart.launches if p.program.meta["entry"].startswith("nf4_mm_wgr"))
    ex.fuse_preps = True
    plan, _ = ex.plan(ids, 0, None, False)
    assert len(apart.launches) == len(plan.launches) + 2 * L  # + each mixer's out projection prologue
    for i in (i for i, lab in enumerate(plan.labels) if lab in ("conv", "attention")):
        mixer, proj = plan.launches[i], plan.launches[i + 1]
        check_launch(mixer, sigs)
        out_h = mixer.buffers[7 if plan.labels[i] == "conv" else 9]
        assert plan.labels[i + 1].endswith(".out_proj") and out_h is proj.buffers[0]  # its output as f16 rows
    ups = [i for i, lab in enumerate(plan.labels) if lab == "ffn.gate_up"]
    assert len(ups) == 2 * L  # gate/up's prologue (normed: nothing before it to join) and its main launch
    for i in ups[1::2]:
        up, down = plan.launches[i], plan.launches[i + 1]
        check_launch(up, sigs)
        check_launch(down, sigs)
        assert up.program.meta["entry"].startswith("nf4_mm_wgr<0, 2,")
        assert down.program.meta["entry"].startswith("nf4_mm_wgr<0, 1,") and plan.labels[i + 1] == "ffn.down"
        out_h = up.buffers[12]
        assert out_h is down.buffers[0] and out_h is not up.buffers[0] and down.buffers[9][1] is out_h
        assert {id(out_h), id(up.buffers[0])} == {id(ex._scratch["xh"]), id(ex._scratch["xh2"])}
        big = up.buffers[5]
        later = [j for j in range(i + 1, len(plan.launches)) if any(b is big for b in plan.launches[j].buffers)]
        if later:  # the next use writes it whole (the next block's input projection, epilogue none)
            assert plan.labels[later[0]] in ("conv.in_proj", "attn.qkv")
            assert plan.launches[later[0]].program.meta["entry"].split("<")[1].startswith("0, 0,")


def test_a_given_table_breaking_a_kernel_rule_is_refused_before_anything_compiles():
    from tilewise.errors import ConfigError

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    bad = {"BM": 128, "BN": 256, "BK": 64, "WM": 64, "WN": 64, "PIPE": 2}  # smem_48k
    with pytest.raises(ConfigError, match="smem_48k"):
        CUDAExecutor(ck, device=dev, dispatch=_table_for(cfg, dev.info.fingerprint, bad, {"NT": 64, "RM": 2}, 4))
    assert dev.entries == []


def test_a_split_k_table_whose_slices_do_not_divide_k_is_refused_before_anything_compiles():
    from tilewise.errors import ConfigError

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    bad = {"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "PIPE": 2, "KS": 8}  # ffn.down's K = 128 = 8 x 16
    with pytest.raises(ConfigError, match="k_slices: K = 128 is not KS = 8 slices of whole BK = 32 steps"):
        CUDAExecutor(ck, device=dev, dispatch=_table_for(cfg, dev.info.fingerprint, bad, {"NT": 64, "RM": 2}, 4,
                                                         kind="splitk"))
    assert dev.entries == []


def test_tune_model_on_cuda_offers_the_cuda_kernels_with_their_seeds():
    from tilewise.kernels.matmul.cuda import MMA_SEED, ROWS_SEED, CudaMatmul
    from tilewise.model import tune as model_tune

    dev = RecordingDevice()
    cands = model_tune.matmul_candidates(dev, "nf4", "swiglu", [1, 346], 4, 0, norm=True)
    kinds = {t.kind for t, _ in cands}
    assert kinds == {"mma", "rows", "splitk", "pipe", "ring", "wg", "wgt", "ws", "wgr"}
    assert all(isinstance(t, CudaMatmul) for t, _ in cands)
    few = model_tune.matmul_candidates(dev, "nf4", "swiglu", [1, 8], 4, 0, norm=True)
    assert {t.kind for t, _ in few} == {"mma", "rows"}  # split-K and the cp.async kinds only from 32 rows
    mma = next(t for t, _ in cands if t.kind == "mma")
    got = [c for t, c in cands if t.kind == "mma"]
    assert got[0] == mma.default_config()
    legal_seeds = [mma.config_of(v) for v in MMA_SEED if mma.space().is_legal(mma.config_of(v), dev.info.limits)]
    assert legal_seeds and all(c in got for c in legal_seeds)
    assert all(mma.space().is_legal(c, dev.info.limits) for c in got)  # illegal seeds never reach the engine
    rows = next(t for t, _ in cands if t.kind == "rows")  # the short-row kernel: its default, then its seeds
    got_rows = [c for t, c in cands if t.kind == "rows"]
    assert got_rows[:4] == [rows.default_config(), *(rows.config_of(v) for v in ROWS_SEED[:3])]
    assert {c["WK"] for c in got_rows} == {1, 2, 4, 8}
    assert model_tune.attention_template(dev).backend == "cuda"
    attn = model_tune.attention_candidates(dev, 6, (346, 0, 16, 8, 64))  # the default, then the seeds:
    assert [(c["QT"], c["NW"], c["TC"], c["KW"], c["PF"]) for c in attn] == [  # tensor cores, then the key split
        (64, 4, 1, 1, 0), (32, 2, 1, 1, 0), (16, 1, 1, 1, 0), (32, 8, 1, 4, 0), (32, 8, 1, 4, 1), (64, 8, 1, 2, 1)]
    more = model_tune.attention_candidates(dev, 14, (346, 0, 16, 8, 64))[6:]  # more splits, then the tiled kernel's
    assert [(c["QT"], c["NW"], c["TC"], c["KW"], c["PF"]) for c in more] == [
        (64, 4, 1, 1, 1), (16, 4, 1, 4, 1), (16, 4, 1, 4, 0), (32, 4, 1, 2, 0), (16, 2, 1, 2, 0), (32, 4, 1, 2, 1),
        (32, 4, 0, 1, 0), (32, 8, 0, 1, 0)]
    big = model_tune.attention_candidates(dev, 3, (346, 0, 16, 8, 128))  # 64 queries of D 128 exceed 48 KB
    assert [(c["QT"], c["NW"], c["TC"]) for c in big] == [(32, 2, 1), (64, 4, 1), (16, 1, 1)]


def test_tune_model_on_cuda_tunes_the_short_conv_and_puts_its_pick_in_the_table(tmp_path, monkeypatch):
    """The conv's candidates are its default and then its whole legal space (NT x RT); the pick goes into the table
    under `shortconv:HxL` for every row count, and a table that has it is not tuned again without force."""
    from tilewise.kernels.attention.cuda import CudaAttention
    from tilewise.kernels.shortconv.cuda import CudaShortConv
    from tilewise.model import tune as model_tune
    from tilewise.model.dispatch import conv_key

    dev = RecordingDevice()
    conv = CudaShortConv()
    cands = model_tune.conv_candidates(dev, None)
    assert cands[0] == conv.default_config() and len(cands) == len(set(cands)) == 25
    assert [(c["NT"], c["RT"]) for c in model_tune.conv_candidates(dev, 6)] == [
        (128, 1), (128, 16), (128, 8), (128, 4), (128, 2), (32, 16)]  # a small budget still races every RT
    cfg = PRESETS["tiny"]
    calls: list[int] = []

    def fake_conv(dev, cfg, seq, seed, **kw):
        calls.append(seq)
        assert kw["what"] == f"short conv ({conv_key(cfg)}, {seq} rows)"
        return conv, {"NT": 64, "RT": 8}, 0.004

    attn = CudaAttention()
    monkeypatch.setattr(model_tune, "model_matmuls", lambda cfg: {})
    acfg = {"QT": 64, "NW": 4, "TC": 1, "KW": 1, "PF": 0}
    monkeypatch.setattr("tilewise.model.tune_attention.tune_attention", lambda *a, **kw: (attn, acfg, 0.01))
    monkeypatch.setattr(model_tune, "tune_conv", fake_conv)
    lines: list[str] = []
    path = tmp_path / "t.json"
    table = model_tune.tune_model(dev, cfg, 40, "nf4", path=path, log=lines.append)
    assert calls == [40] and not table.partial
    assert table.pick(conv_key(cfg), 1) == table.pick(conv_key(cfg), 4000) == ("shortconv", {"NT": 64, "RT": 8})
    assert any(line.startswith("short conv at 40 rows: shortconv") for line in lines)
    model_tune.tune_model(dev, cfg, 40, "nf4", path=path, log=lines.append)
    assert calls == [40]  # already in the table
    model_tune.tune_model(dev, cfg, 40, "nf4", path=path, log=lines.append, force=True)
    assert calls == [40, 40]


def test_a_gpu_older_than_ampere_is_refused_by_name_with_the_fix():
    import dataclasses

    from tilewise.errors import DeviceUnavailable

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    dev.info = dataclasses.replace(dev.info, name="T4", limits=dataclasses.replace(dev.info.limits,
                                                                                   compute_capability="7.5"))
    with pytest.raises(DeviceUnavailable, match=r"T4 has compute capability 7\.5") as err:
        CUDAExecutor(ck, device=dev)
    assert "--device webgpu" in err.value.fix and dev.entries == []


def test_tune_model_offers_no_wgmma_candidate_off_hopper():
    """The wg kind's `wgmma_sm90` rule refuses every config on another compute capability, so `tune model` measures
    nothing of it there; the other kinds keep their candidates."""
    import dataclasses

    from tilewise.model import tune as model_tune

    dev = RecordingDevice()
    dev.info = dataclasses.replace(dev.info, limits=dataclasses.replace(dev.info.limits, compute_capability="8.9"))
    kinds = {t.kind for t, _ in model_tune.matmul_candidates(dev, "nf4", "swiglu", [1, 346], 4, 0, norm=True)}
    assert kinds == {"mma", "rows", "splitk", "pipe", "ring"}


@pytest.mark.parametrize(("d", "cc", "want"), [(64, "9.0", (64, 4, 1)), (128, "9.0", (32, 2, 1)),
                                               (256, "9.0", (1, 4, 0)), (64, "7.5", (1, 4, 0))])
def test_an_untuned_device_gets_the_first_attention_default_its_rules_allow(d, cc, want):
    """Tensor cores where the head size and the GPU allow them (measured fastest at 346 queries on an H200), the
    per-query kernel elsewhere."""
    import dataclasses

    from tilewise.kernels.attention.cuda import default_attention

    limits = dataclasses.replace(get_profile("sm_90"), compute_capability=cc)
    got = default_attention(limits, (346, 0, 16, 8, d))
    assert (got["QT"], got["NW"], got["TC"]) == want


def test_the_executor_without_a_table_launches_the_default_attention(executor, rng):
    plan, _ = executor.plan(rng.integers(0, 512, 40), 0, None, True)
    attn = [launch.program.meta["entry"] for launch, lab in zip(plan.launches, plan.labels) if lab == "attention"]
    d = executor.cfg.head_dim
    assert attn and set(attn) == {f"attention_mma<{d}, 4, 1, 0>"}


def test_absmax_by_step_puts_a_k_steps_scales_of_every_row_side_by_side(rng):
    """(N * K / 64,) row-major scales -> (K / 64, N): entry (kb, n) is row n's scale of block kb, on random values."""
    from tilewise.kernels.matmul.cuda import absmax_by_step

    n, blocks = 37, 5
    absmax = rng.random(n * blocks).astype(np.float32)
    got = absmax_by_step(absmax, n)
    assert got.shape == (blocks, n) and got.flags.c_contiguous
    for kb in range(blocks):
        for row in range(n):
            assert got[kb, row] == absmax[row * blocks + kb]


def test_every_wgr_launch_reads_its_matrixs_scales_stored_by_step(rng, monkeypatch):
    """The executor uploads each nf4 matmul's absmax a second time, (K / 64, N), and binds that copy (and the up
    projection's) to every wgr launch; the other kinds keep the row-major one."""
    from tilewise.kernels.matmul import cuda as mm
    from tilewise.kernels.matmul.cuda import DEFAULT_WGR, CudaMatmul
    from tilewise.model.dispatch import matmul_key
    from tilewise.tune.dispatch import DispatchTable, Entry

    monkeypatch.setattr(mm, "f16_rows_map", lambda buf, *_: ("tma map of", buf))
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    H, F = cfg.hidden_size, cfg.ffn_dim
    table = DispatchTable(dev.info.fingerprint)
    for epi, n, k, norm in (("swiglu", F, H, True), ("residual", H, F, False)):
        tpl = CudaMatmul("wgr", "nf4", epi, norm)
        table.put(matmul_key("nf4", epi, n, k, norm), Entry([{"m_min": 8, "m_max": None, "kernel": tpl.name,
                                                               "config": DEFAULT_WGR}]), tpl)
    ex = CUDAExecutor(ck, device=dev, dispatch=table)
    plan, _ = ex.plan(rng.integers(0, 512, 40), 0, None, False)
    mats = [m for lay in ex.layers for m in lay.values() if isinstance(m, dict) and "absmax" in m]
    by_step = {id(m[a]) for m in mats for a in ("absmax_t", "absmax_up_t") if a in m}
    row_major = {id(m[a]) for m in mats for a in ("absmax", "absmax_up") if a in m}
    assert len(by_step) == len(row_major)  # every matmul's scales in both layouts
    wgr = [ln for ln in plan.launches if ln.program.meta["entry"].startswith("nf4_mm_wgr<")]
    assert len(wgr) == 2 * len(cfg.layer_types)
    for ln in wgr:
        up = ln.program.meta["entry"].startswith("nf4_mm_wgr<0, 2,")
        assert id(ln.buffers[2]) in by_step and (not up or id(ln.buffers[4]) in by_step)
    others = [ln for ln in plan.launches if ln.program.meta["entry"].startswith("nf4_mm_")
              and not ln.program.meta["entry"].startswith("nf4_mm_wgr<")]
    assert any(id(b) in row_major for ln in others for b in ln.buffers)  # the short-row kinds read the row-major ones
    assert not any(id(b) in by_step for ln in others for b in ln.buffers)


def test_the_scales_by_step_are_uploaded_only_where_wgr_can_run():
    """An Ampere GPU never launches wgr (wgmma is Hopper's), so its executor keeps one copy of the scales."""
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    import dataclasses

    hopper, ampere = RecordingDevice(), RecordingDevice()
    ampere.info = dataclasses.replace(ampere.info, name="A100", limits=dataclasses.replace(ampere.info.limits,
                                                                                          compute_capability="8.0"))
    for dev, want in ((hopper, True), (ampere, False)):
        ex = CUDAExecutor(ck, device=dev)
        mats = [m for lay in ex.layers for m in lay.values() if isinstance(m, dict) and "absmax" in m]
        assert mats and all(("absmax_t" in m) == want for m in mats), dev.info.limits.compute_capability


def _splitk_executor(split: dict):
    """(config, checkpoint, device, executor) of the tiny preset with ffn.down on splitk `split` from 8 rows."""
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = RecordingDevice()
    ex = CUDAExecutor(ck, device=dev, dispatch=_table_for(cfg, dev.info.fingerprint, split, {"NT": 64, "RM": 2}, 2,
                                                          kind="splitk"))
    return cfg, ck, dev, ex


def test_serial_reduce_sums_split_k_in_the_matmul_and_drops_each_reduction_launch(rng, monkeypatch):
    """`serial_reduce` turns the table's split-K SR 0 config into SR 1 (the last block of each tile sums the
    slices): the reduction launches are gone, nothing else changes, the setting is part of the plan's key; where SR 1
    does not compile the table's config stays."""
    from tilewise.errors import ShaderCompileError

    split = {"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "PIPE": 1, "KS": 2, "SR": 0}
    cfg, ck, dev, ex = _splitk_executor(split)
    sigs = kernel_signatures()
    L, n = len(cfg.layer_types), 40
    ids = rng.integers(0, 512, n)
    apart, _ = ex.plan(ids, 0, None, False)
    ex.serial_reduce = True
    serial, _ = ex.plan(ids, 0, None, False)
    assert serial is not apart  # part of the plan's key

    def downs(plan):
        return [launch.program.meta["entry"] for launch, lab in zip(plan.launches, plan.labels) if lab == "ffn.down"]

    assert downs(apart) == ["nf4_mm_splitk<0, 1, 0, 32, 64, 32, 16, 32, 1, 2, 0>", "nf4_mm_splitk_reduce<1, 256>"] * L
    assert downs(serial) == ["nf4_mm_splitk<0, 1, 0, 32, 64, 32, 16, 32, 1, 2, 1>"] * L
    assert len(apart.launches) == len(serial.launches) + L
    def others(plan):
        return [x.program.meta["entry"] for x, lab in zip(plan.launches, plan.labels) if lab != "ffn.down"]

    assert others(serial) == others(apart)
    for launch in serial.launches:
        check_launch(launch, sigs)

    fresh = CUDAExecutor(ck, device=RecordingDevice(), dispatch=_table_for(cfg, dev.info.fingerprint, split,
                                                                           {"NT": 64, "RM": 2}, 2, kind="splitk"))
    fresh.serial_reduce = True
    compile_ = fresh.dev.compile

    def refuse_serial(source, entry="main", constants=None, name=None):
        if entry.startswith("nf4_mm_splitk<") and entry.endswith(", 1>"):
            raise ShaderCompileError("too many registers", "pick another config")
        return compile_(source, entry, constants, name)

    monkeypatch.setattr(fresh.dev, "compile", refuse_serial)
    kept, _ = fresh.plan(ids, 0, None, False)
    assert downs(kept) == downs(apart)


def test_a_wgr_cluster_choice_sums_its_slices_in_its_own_launch_with_no_scratch(rng, monkeypatch):
    """ffn.down on wgr with KS 2 and SR 2 (a tile's blocks one cluster): one launch of `nf4_mm_wgr_cluster` a layer,
    writing the residual rows themselves (no partial sums, no counters, no reduction or reduce-prologue launch); a
    swiglu SR 2 config applies its own epilogue, so it offers the next matmul its f16 rows, which SR 0 cannot."""
    from tilewise.kernels.matmul.cuda import DEFAULT_WGR, CudaMatmul

    cfg = PRESETS["tiny"]
    H, F = cfg.hidden_size, cfg.ffn_dim
    cluster = {**DEFAULT_WGR, "KS": 2, "SR": 2}
    ex = _wgr_executor(monkeypatch, [("swiglu", F, H, True, DEFAULT_WGR), ("residual", H, F, False, cluster)])
    sigs = kernel_signatures()
    plan, _ = ex.plan(rng.integers(0, 512, 40), 0, None, False)
    entries = [launch.program.meta["entry"] for launch in plan.launches]
    assert not any("reduce" in e for e in entries)
    downs = [launch for launch, lab in zip(plan.launches, plan.labels) if lab == "ffn.down"]
    assert len(downs) == len(cfg.layer_types)
    for down in downs:
        check_launch(down, sigs)
        assert down.program.meta["entry"] == "nf4_mm_wgr_cluster<0, 1, 64, 64, 3, 2, 1, 0, 2>"
        assert down.grid[2] == 2  # the cluster (1, 1, KS) the kernel declares
        assert down.buffers[5] is ex.act["x"] and down.buffers[10] is ex.act["x"]  # the residual rows, summed into
    assert "partial" not in ex._scratch and "counters" not in ex._scratch
    assert CudaMatmul("wgr", "nf4", "residual").scratch_bytes(cluster, 40, H, F) == {"xh": 2 * 40 * F}

    swiglu = CudaMatmul("wgr", "nf4", "swiglu", True)
    shape = (40, 256, 256)
    on = swiglu.compile(RecordingDevice(), swiglu.config_of({**DEFAULT_WGR, "KS": 2, "SR": 2}), shape)
    off = swiglu.compile(RecordingDevice(), swiglu.config_of({**DEFAULT_WGR, "KS": 2, "SR": 0}), shape)
    assert "f16_out" in on.meta and "reduce" not in on.meta
    assert "f16_out" not in off.meta and "reduce" in off.meta


def test_a_splitk_cluster_choice_writes_the_rows_itself_with_no_scratch(rng):
    """ffn.down on splitk with SR 2: one `nf4_mm_splitk_cluster` launch a layer, grid z = KS (its cluster), summing
    into the residual rows (partial's and final_out's places both hold them), with no partial sums or counters."""
    cfg, _, _, ex = _splitk_executor({"BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "PIPE": 2, "KS": 2, "SR": 2})
    sigs = kernel_signatures()
    plan, _ = ex.plan(rng.integers(0, 512, 40), 0, None, False)
    assert not any("reduce" in launch.program.meta["entry"] for launch in plan.launches)
    downs = [launch for launch, lab in zip(plan.launches, plan.labels) if lab == "ffn.down"]
    assert len(downs) == len(cfg.layer_types)
    for main in downs:
        check_launch(main, sigs)
        assert main.program.meta["entry"] == "nf4_mm_splitk_cluster<0, 1, 0, 32, 64, 32, 16, 32, 2, 2, 2>"
        assert main.grid[2] == 2 and main.buffers[8] is ex.act["x"] and main.buffers[12] is ex.act["x"]
    assert "partial" not in ex._scratch and "counters" not in ex._scratch


@pytest.mark.parametrize("case", ["wgr", "wgr-cluster-down", "splitk-cluster-out", "wgr-split-down",
                                  "cluster-consumers", "split-qkv"])
def test_the_norm_fold_drops_the_normed_prologue_after_every_residual_matmul_that_sums_in_its_launch(
        rng, monkeypatch, case):
    """fold_norm: every residual launch that sums in the kernel (wgr KS 1 or SR 2; splitk SR 2) stores the next
    normed wgr matmul's rows as f16 (h * g) into that matmul's x rows (not its own), with g the next norm's weight,
    and their sums of squares into one scratch buffer the next matmul reads with the model's eps: the prologue
    between them is gone. The next matmul may be KS 1 or a cluster's sum (cluster-consumers: in_proj, qkv and
    gate/up on KS 2, SR 2); one whose slices a reduction launch sums (split-qkv) keeps its prologue. A split config
    the table sums in a reduction launch (wgr-split-down) is left as it is, with its fused reduction and prologue:
    the fold never changes a config. Only the first block's normed prologue (after the embedding) is always left."""
    from tilewise.kernels.matmul.cuda import DEFAULT_SPLITK, DEFAULT_WGR

    # K = H must hold two slices of 64 for the split consumers: the tiny preset twice as wide (F = 256, not H)
    cfg = dataclasses.replace(PRESETS["tiny"], hidden_size=128, intermediate_size=384, head_dim=32, name="tiny-wide")
    H, F, d = cfg.hidden_size, cfg.ffn_dim, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    down = {**DEFAULT_WGR, "KS": 2, "SR": 2 if case == "wgr-cluster-down" else 0} if "down" in case else DEFAULT_WGR
    out = ({**DEFAULT_SPLITK, "BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "KS": 2, "SR": 2}, "splitk") \
        if case == "splitk-cluster-out" else (DEFAULT_WGR, "wgr")
    cons = {**DEFAULT_WGR, "KS": 2, "SR": 2} if case == "cluster-consumers" else DEFAULT_WGR
    qkv_cfg = {**DEFAULT_WGR, "KS": 2, "SR": 0} if case == "split-qkv" else cons
    ex = _wgr_executor(monkeypatch, [("none", 3 * H, H, True, cons), ("none", qkv, H, True, qkv_cfg),
                                     ("residual", H, H, False, *out), ("swiglu", F, H, True, cons),
                                     ("residual", H, F, False, down)], cfg)
    sigs = kernel_signatures()
    n, L = int(rng.integers(9, 60)), len(cfg.layer_types)
    ids = rng.integers(0, 512, n)
    apart, _ = ex.plan(ids, 0, None, False)
    ex.fold_norm = True
    plan, _ = ex.plan(ids, 0, None, False)
    folds_down = case != "wgr-split-down"
    # the next block's mixer input, where down folds into it (split-qkv: not into an attention block's qkv)
    into_next = [folds_down and i + 1 < L and not (case == "split-qkv" and cfg.layer_types[i + 1] != "conv")
                 for i in range(L)]
    assert len(apart.launches) == len(plan.launches) + L + sum(into_next)
    entries = [launch.program.meta["entry"] for launch in plan.launches]
    assert sum(e.startswith("nf4_mm_prep") for e in entries) == 1 + (L - 1) * folds_down - sum(into_next)
    assert sum("reduce" in e for e in entries) == (0 if folds_down else L) + (case == "split-qkv") * sum(
        t != "conv" for t in cfg.layer_types)
    ss = ex._scratch["ss"]
    # each block's gate/up, then (where down folds) the next block's mixer input
    norms = [g for i, lay in enumerate(ex.layers) for g in (lay["ffn_norm"], *(
        [ex.layers[i + 1]["operator_norm"]] if into_next[i] else []))]

    def folded(launch):
        at = launch.program.meta.get("fold_from")
        return at is not None and launch.buffers[at["fold_g"]] is not NULL

    pairs = [(plan.launches[i - 1], plan.launches[i]) for i, lab in enumerate(plan.labels)
             if lab in ("ffn.gate_up", "conv.in_proj", "attn.qkv") and folded(plan.launches[i - 1])]
    assert len(pairs) == len(norms) == L + sum(into_next)
    assert any(t != "conv" for t in cfg.layer_types[1:]) and any(t == "conv" for t in cfg.layer_types[1:])
    producers = ("nf4_mm_splitk_cluster<0, 1,",) if case == "splitk-cluster-out" else ()
    for (prev, main), g in zip(pairs, norms):
        check_launch(prev, sigs)
        check_launch(main, sigs)
        at = prev.program.meta["fold_from"]
        assert prev.program.meta["entry"].startswith(("nf4_mm_wgr<0, 1,", "nf4_mm_wgr_cluster<0, 1,", *producers))
        assert main.program.meta["entry"].startswith(
            "nf4_mm_wgr_cluster<" if case == "cluster-consumers" else "nf4_mm_wgr<")
        assert prev.buffers[at["final_out"]] is ex.act["x"] and prev.buffers[at["fold_g"]] is g
        assert prev.buffers[at["ss_out"]] is ss
        xh = prev.buffers[at["out_h"]]
        assert xh is main.buffers[0] and main.buffers[9][1] is xh and xh is not prev.buffers[0]
        assert main.buffers[13] is ss and float(main.buffers[14]) == np.float32(cfg.norm_eps)
        assert ss.nbytes >= 4 * n * (H // 64)
    outs = [e for e, lab in zip(entries, plan.labels) if lab in ("conv.out_proj", "attn.out_proj")]
    assert outs and all(e.startswith("nf4_mm_splitk_cluster<" if producers else "nf4_mm_wgr<") for e in outs)
    downs = [e for e, lab in zip(entries, plan.labels) if lab == "ffn.down" and "reduce" not in e]
    assert downs and all(e.startswith("nf4_mm_wgr_cluster<" if case == "wgr-cluster-down" else "nf4_mm_wgr<")
                         for e in downs)


def test_the_blocks_after_the_last_attention_block_run_on_the_rows_the_last_row_reaches(rng):
    cfg = dataclasses.replace(PRESETS["tiny"], layer_types=("conv", "full_attention", "conv"))
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 4), "f32", "preset:tail").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=RecordingDevice())
    calls = []
    matmul, copy = ex._matmul, ex._copy
    ex._matmul = lambda plan, label, epi, x, row0, rows, w, out, *a, **kw: (
        calls.append((label, x, row0, rows, out)), matmul(plan, label, epi, x, row0, rows, w, out, *a, **kw))
    ex._copy = lambda plan, label, src, src_word, dst, dst_word, words: (
        calls.append((label, src, src_word, words, dst)), copy(plan, label, src, src_word, dst, dst_word, words))
    n, H = 70, cfg.hidden_size
    plan, _ = ex.plan(rng.integers(0, 512, n), 0, None, True)
    for launch in plan.launches:
        check_launch(launch, kernel_signatures())
    a = ex.act
    x, x1, x2, g1 = a["x"], a["x1"], a["x2"], a["g1"]
    assert calls == [
        ("conv.in_proj", x, 0, n, a["big"]), ("conv.out_proj", a["y"], 0, n, x),
        ("ffn.gate_up", x, 0, n, a["big"]), ("ffn.down", a["big"], 0, n, x),
        ("attn.qkv", x, 0, n, a["big"]),  # every row: K and V go into the cache
        ("copy.last_rows", x, (n - 3) * H, 3 * H, x1),  # the 3 rows the last conv reaches back to
        ("attn.out_proj", a["y"], 0, 3, x1), ("ffn.gate_up", x1, 0, 3, g1), ("ffn.down", g1, 0, 3, x1),
        ("conv.in_proj", x1, 0, 3, a["big"]),
        ("copy.last_rows", x1, 2 * H, H, x2), ("conv.out_proj", a["y"], 2, 1, x2),
        ("ffn.gate_up", x2, 0, 1, g1), ("ffn.down", g1, 0, 1, x2)]
    assert x1.nbytes >= 4 * 3 * H and x2.nbytes >= 4 * 3 * H and g1.nbytes >= 4 * 3 * cfg.ffn_dim
    attention = [ln for ln, lab in zip(plan.launches, plan.labels) if lab == "attention"]
    assert len(attention) == 1  # the queries of the last 3 rows only: (q, k, v, out, M, P, first, ...)
    assert [int(attention[0].buffers[i]) for i in (4, 6)] == [3, n - 3]
    assert plan.launches[-1].buffers[0] is x2  # the head reads the last row's residual


def test_the_tail_attention_is_tuned_at_its_own_queries_and_the_plan_launches_that_tile(tmp_path, monkeypatch, rng):
    """`tilewise tune model` tunes attention at the decision length, then at each query count of the sliced tail
    (`tail_queries`: a model ending in attention asks 1) with the earlier keys cached and the first pick raced
    first; the table runs the tail's tile up to its query count and the other above, and the executor's plan
    launches each attention block with the tile of its own query count."""
    from tilewise.kernels.attention.cuda import CudaAttention
    from tilewise.kernels.shortconv.cuda import CudaShortConv
    from tilewise.model import tune as model_tune
    from tilewise.model.dispatch import attention_key
    from tilewise.model.tune_attention import tail_queries

    cfg = PRESETS["tiny"]
    assert tail_queries(cfg, 40) == [1] and tail_queries(PRESETS["lfm2-350m"], 346) == [3]
    assert tail_queries(dataclasses.replace(cfg, layer_types=["conv"] * 4), 40) == []
    attn = CudaAttention()
    whole = {"QT": 64, "NW": 4, "TC": 1, "KW": 1, "PF": 0}
    tail = {"QT": 1, "NW": 8, "TC": 0, "KW": 1, "PF": 0}
    calls: list[tuple[int | None, list]] = []

    def fake_attention(dev, cfg, seq, seed, queries=None, first=(), **kw):
        calls.append((queries, [(t.name, dict(c)) for t, c in first]))
        return attn, dict(tail if queries else whole), 0.01

    monkeypatch.setattr(model_tune, "model_matmuls", lambda cfg: {})
    monkeypatch.setattr("tilewise.model.tune_attention.tune_attention", fake_attention)
    monkeypatch.setattr(model_tune, "tune_conv", lambda *a, **kw: (CudaShortConv(), {"NT": 64, "RT": 8}, 0.004))
    dev = RecordingDevice()
    lines: list[str] = []
    table = model_tune.tune_model(dev, cfg, 40, "nf4", path=tmp_path / "t.json", log=lines.append)
    assert calls == [(None, []), (1, [("attention", whole)])]
    akey = attention_key(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    assert table.pick(akey, 1) == ("attention", tail)
    assert table.pick(akey, 2) == table.pick(akey, 40) == table.pick(akey, 4000) == ("attention", whole)
    assert any(line.startswith("attention at 1 queries after 39 cached: attention") for line in lines)
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=dev, dispatch=table)
    plan, _ = ex.plan(rng.integers(0, 512, 40), 0, None, True)
    entries = [launch.program.meta["entry"] for launch, lab in zip(plan.launches, plan.labels) if lab == "attention"]
    d = cfg.head_dim
    assert entries == [attn.entry(attn.config_of(whole), d), attn.entry(attn.config_of(tail), d)]


@pytest.mark.parametrize("qkv_case", ["ks1", "cluster", "reduced"])
def test_the_qkv_launch_norms_and_rotates_q_and_k_itself_where_it_sums_in_its_launch(rng, monkeypatch, qkv_case):
    """fuse_rope: with qkv on wgr summing in its own launch (KS 1, or KS 2 in a cluster) and heads of 64, the plan
    has no q/k norm + RoPE launch; each qkv launch's `rope` argument is a 72-byte buffer of its own, written with the
    device addresses of that layer's q/k norm weights, the RoPE tables, q and the new state's K and V cache, then
    the decision's start, HQ, HKV and eps (matmul_reduce.cu's RopeOut); everything else in the plan is unchanged.
    Where a reduction launch sums qkv's slices (SR 0), or fuse_rope is off, the launch stays and the argument is
    null."""
    from tilewise.kernels.matmul.cuda import DEFAULT_WGR
    from tilewise.kernels.matmul.cuda_fuse import ROPE_OUT
    from tilewise.kernels.matmul.cuda_source import WGR_ARGS

    cfg = dataclasses.replace(PRESETS["tiny"], hidden_size=128, intermediate_size=384, head_dim=64,
                              num_attention_heads=2, num_key_value_heads=1, name="tiny-d64")
    H, d = cfg.hidden_size, cfg.head_dim
    qkv_n = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    qkv_cfg = {"ks1": DEFAULT_WGR, "cluster": {**DEFAULT_WGR, "KS": 2, "SR": 2},
               "reduced": {**DEFAULT_WGR, "KS": 2, "SR": 0}}[qkv_case]
    ex = _wgr_executor(monkeypatch, [("none", qkv_n, H, True, qkv_cfg)], cfg)
    sigs = kernel_signatures()
    n, start = int(rng.integers(9, 60)), 0
    ids = rng.integers(0, 512, n)
    apart, _ = ex.plan(ids, start, None, False)
    ex.fuse_rope = True
    plan, new = ex.plan(ids, start, None, False)
    attn_layers = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    if qkv_case == "reduced":
        assert plan.labels == apart.labels and plan.labels.count("attn.qknorm_rope") == len(attn_layers)
        return
    assert "attn.qknorm_rope" not in plan.labels and apart.labels.count("attn.qknorm_rope") == len(attn_layers)
    assert [lab for lab in apart.labels if lab != "attn.qknorm_rope"] == plan.labels
    qkvs = [launch for launch, lab in zip(plan.launches, plan.labels)
            if lab == "attn.qkv" and launch.program.meta["entry"].startswith("nf4_mm_wgr")]
    assert len(qkvs) == len(attn_layers)
    descs = set()
    for launch, i in zip(qkvs, attn_layers):
        check_launch(launch, sigs)
        assert launch.program.meta["entry"].startswith("nf4_mm_wgr_cluster<0, 0," if qkv_case == "cluster"
                                                       else "nf4_mm_wgr<0, 0,")
        desc = launch.buffers[WGR_ARGS["rope"]]
        assert desc is not NULL and desc.nbytes >= ROPE_OUT.itemsize == 72 and id(desc) not in descs
        descs.add(id(desc))
        rec = np.frombuffer(ex.dev.written[id(desc)], ROPE_OUT)[0]
        lay = ex.layers[i]
        k_c, v_c = new.kv[i]
        want = [lay["q_norm"], lay["k_norm"], ex.rope[0], ex.rope[1], ex.act["q"], k_c, v_c]
        assert list(rec["ptr"]) == [ex.dev.address(b) for b in want]
        assert (int(rec["start"]), int(rec["hq"]), int(rec["hkv"])) == (start, cfg.num_attention_heads,
                                                                         cfg.num_key_value_heads)
        assert np.float32(rec["eps"]) == np.float32(cfg.norm_eps)
    ex.fuse_rope = False
    again, _ = ex.plan(ids, start, None, False)
    assert again.labels == apart.labels
    assert all(launch.buffers[WGR_ARGS["rope"]] is NULL for launch, lab in zip(again.launches, again.labels)
               if lab == "attn.qkv" and launch.program.meta["entry"].startswith("nf4_mm_wgr"))
