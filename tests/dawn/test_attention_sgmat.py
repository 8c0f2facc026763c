"""Attention on subgroup matrices (`attention.sgmat`): every shader its space allows compiles on Dawn's Null backend
(the H200's and a lavapipe adapter's legal configs); on a real Dawn adapter with subgroup matrices every output
matches float64 (prefill, cached positions, partial query and key tiles, final-row slicing), and the tuner offers it
beside the FMA kernel."""

from __future__ import annotations

import numpy as np
import pytest
from dawn_support import null_device, real_dawn_device

from tilewise.devices.base import Launch
from tilewise.devices.profiles import get_profile
from tilewise.kernels.attention import webgpu as attention
from tilewise.kernels.attention.sgmat import SEEDS, SgmatAttention, storage_bytes
from tilewise.tune.verify import compare

pytestmark = pytest.mark.dawn


@pytest.mark.parametrize("profile", ["h200-dawn", "lavapipe-dawn-coopmat"])
def test_every_legal_config_compiles(profile):
    dev = null_device()
    t = SgmatAttention()
    legal = t.space().legal(get_profile(profile))
    assert len(legal) >= 5
    failed = []
    for cfg in legal:
        try:
            dev._dev.create_shader_module(code=t.source(cfg, (346, 0, 16, 8, 64)))
        except Exception as exc:
            failed.append(f"{cfg.key()}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    assert not failed, f"{len(failed)} of {len(legal)} failed, first: {failed[:3]}"


def test_rules_refuse_before_compiling_and_say_why():
    t = SgmatAttention()
    h200 = get_profile("h200-dawn")
    why = t.space().why_illegal(t.space().config({"FRAG": "8x8x8", "SG": 32, "NSG": 2, "BQ": 32, "BKV": 16}), h200)
    assert any("not offered" in w for w in why) and any("multiple of the adapter's max subgroup size" in w
                                                        for w in why)
    cfg = t.default_config()
    assert t.space().is_legal(cfg, h200)
    assert all(t.space().is_legal(t.config_of(s), h200) for s in SEEDS)  # the tuner's first picks exist there
    assert any("head_dim 40" in p for p in t.config_problems(cfg, (8, 0, 4, 2, 40)))
    assert storage_bytes(cfg, 64) <= h200.max_workgroup_storage_bytes


@pytest.fixture(scope="module")
def dev():
    return real_dawn_device()


def _cases(dev):
    small = dev.info.adapter_type == "cpu"
    return [(37, 0, 4, 2, 64), (5, 40, 4, 2, 64), (1, 50, 4, 1, 64)] + ([] if small else [(346, 0, 16, 8, 64)])


def test_every_output_matches_float64(dev, rng):
    t = SgmatAttention(dev.enabled_features)
    cfgs = t.space().legal(dev.info.limits)
    assert cfgs, t.space().why_illegal(t.default_config(), dev.info.limits)
    cfgs = cfgs[:: max(1, len(cfgs) // 6)]  # six spread over the space: fragments, tiles, subgroups
    bad = []
    for shape in _cases(dev):
        host = t.problem.make_inputs(shape, rng)
        ref = t.problem.reference(host, shape)
        for cfg in cfgs:
            if t.config_problems(cfg, shape):
                continue
            bufs = t.upload(dev, host, shape)
            t.poison(dev, bufs, shape)
            dev.run(t.launches(t.compile(dev, cfg, shape), bufs, cfg, shape))
            check = compare(t.read_output(dev, bufs, shape), ref, t.dtype)
            print(f"{t.name} {shape} [{cfg}] rel {check.rel_err:.2e} {'ok' if check.ok else 'WRONG'}")
            if not check.ok:
                bad.append(f"{cfg.key()} at {shape}: {check.message}")
    assert not bad, bad[:4]


def test_final_row_slicing_reads_the_query_row_it_is_given(dev, rng):
    """dims.r1 = the first query row: one query, the last of 21, against the full prefill's last row."""
    m, p, hq, hkv, d = 21, 3, 4, 2, 64
    t = SgmatAttention(dev.enabled_features)
    cfg = t.space().legal(dev.info.limits)[0]
    host = t.problem.make_inputs((m, p, hq, hkv, d), rng)
    ref = t.problem.reference(host, (m, p, hq, hkv, d))[-1:]
    bufs = {k: dev.upload(v) for k, v in host.items()}
    bufs["dims"] = dev.upload(np.array([1, p, m - 1, 0], np.uint32), uniform=True)
    bufs["out"] = dev.upload(np.full((1, hq * d), np.nan, np.float32))
    prog = t.compile(dev, cfg, (1, p, hq, hkv, d))
    dev.run([Launch(prog, attention.attention_grid(cfg, 1, hq), [bufs[k] for k in attention.ATTN_BINDINGS])])
    check = compare(dev.download(bufs["out"], np.float32, (1, hq * d)), ref, "f16")
    assert check.ok, check.message


def test_the_tuner_offers_it_beside_the_fma_kernel_and_verifies_it(dev):
    from tilewise.model.tune import attention_items
    from tilewise.tune.engine import Engine, Item
    from tilewise.tune.store import Store

    shape = (346, 0, 16, 8, 64) if dev.info.adapter_type != "cpu" else (40, 0, 4, 2, 64)
    items = attention_items(dev, 3, shape)
    names = [t.name for t, _ in items]
    t = SgmatAttention(dev.enabled_features)
    fit = [c for c in t.space().legal(dev.info.limits) if not t.config_problems(c, shape)]
    assert names.count("attention") == 3 and names.count("attention.sgmat") == min(3, len(fit)) > 0, names
    sg = [Item(t, c, shape) for t, c in items if t.name == "attention.sgmat"]
    outcomes = Engine(dev, Store()).evaluate(sg)
    assert [o.status for o in outcomes] == ["ok"] * len(sg), [f"{o.status}: {o.reason}" for o in outcomes]


def test_the_classifier_runs_on_sgmat_attention(dev, rng):
    """Every attention layer of the tiny model through `attention.sgmat` (a table naming it), against float64."""
    import warnings

    import tilewise
    from tilewise.model import reference
    from tilewise.model.dispatch import attention_key
    from tilewise.model.webgpu import WebGPUExecutor
    from tilewise.tune.dispatch import DispatchTable, Entry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no tuned table for this device: expected
        model = tilewise.load("tiny", device="dawn", weights="nf4", seed=5)
    cfgm = model.config
    t = SgmatAttention(dev.enabled_features)
    shape = (97, 0, cfgm.num_attention_heads, cfgm.num_key_value_heads, cfgm.head_dim)
    cfg = next(c for c in t.space().legal(dev.info.limits) if not t.config_problems(c, shape))
    table = DispatchTable(dev.info.fingerprint)
    table.put(attention_key(*shape[2:]), Entry([{"m_min": 1, "m_max": None, "kernel": t.name, "config": dict(cfg)}]),
              t)
    ex = WebGPUExecutor(model.checkpoint, device=dev, dispatch=table)
    dequant = {name: model.checkpoint.float32(name) for name in model.checkpoint.names()}
    for n in (1, 97):
        ids = np.asarray(rng.integers(0, cfgm.vocab_size, n))
        plan, _ = ex.plan(ids, 0, None, True)
        assert any(ln.program.name.startswith("attention.sgmat[") for ln in plan.launches)
        hidden, _ = ex.forward(ids, 0, None, True)
        ref, _ = reference.forward(cfgm, dequant, ids)
        rel = float(np.linalg.norm(hidden - ref[-1]) / np.linalg.norm(ref[-1]))
        print(f"classifier on sgmat attention, {n} tokens: hidden state relative error {rel:.2e}")
        assert rel < 1e-2
