"""A CUDA model tune's whole-run conditions: L2 kept or evicted while it times (`l2_timing`), and the executor's
whole-model settings, raced on whole decisions at the end of `tilewise tune model` (`tune_settings`).

A kernel's config is measured alone; these settings change how a decision's launches run together, so only a whole
decision can measure them:

- `pdl`: programmatic dependent launch (each kernel may start while the one before it finishes);
- `fuse_preps`: a matmul's f16 prologue joined to the launch before it (one launch fewer, the same bits);
- `serial_reduce`: split-K slices summed in each tile's last block instead of a reduction launch (the same bits);
- `fold_norm`: a residual matmul that sums in its own launch (wgr, or split-K in a cluster) hands the next (normed)
  wgr matmul its rows unnormed, as f16 (h * g), with their sums of squares, and that matmul scales its output rows
  by 1 / rms(h): a launch fewer where it applies, rounded differently (within the f16 tolerance, not the same bits);
- `fuse_rope`: the q/k/v matmul (wgr summing in its own launch) norms and rotates q and k into attention's inputs in
  its epilogue instead of a launch after it: each head's sum of squares added in another order (not the same bits);
- `zero_copy`: the embedding reads the token ids from pinned host memory and the head writes the result row there,
  instead of a copy step in and out of device buffers at each end of the graph (the same bits).

Which side wins depends on the model as well as the GPU (PDL has sped one model up and slowed another down on the
same GPU; docs/journal/model.md). So the tune races each setting on the tuned table, in alternating rounds of graph
replays (`race_modes`), one setting at a time in the order above, each later race with the earlier choices applied.
A setting leaves its default only where both sides agree on the last hidden row (the same bits; `fold_norm`
within `INEXACT_SETTINGS`' tolerance) and the 99% interval of its speed-up, taken round by round (`race_verdict`:
the GPU's clock can step by a few percent for many rounds at a time), excludes 1; a tie keeps the default. The
choices go into the dispatch table under `settings`, keyed by the model's shape signature (`model_signature`), with
the kernel versions they ran on; the executor applies them where neither its caller nor `TILEWISE_CUDA_PDL` chose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilewise.errors import ConfigError
from tilewise.kernels.matmul.problem import WEIGHT_BYTES
from tilewise.model.dispatch import CUDA_SETTINGS, model_signature
from tilewise.tune.dispatch import DispatchTable

L2_MODES = ("auto", "cold", "warm")


def l2_timing(dev: Any, cfg: Any, fmt: str, l2: str = "auto", local: bool = True) -> tuple[bool, str]:
    """(time with L2 kept between samples?, the line that says why) for a model tune on `dev`.

    A CUDA device evicts L2 before every sample, as a layer of a model too big for L2 finds it. A decision of a
    model whose weights fit in L2 reads them (and each launch's input rows) from there, and kernels timed cold are
    ranked for memory the decision never waits for. `auto` keeps L2 where the weights without the embedding take
    at most half of it (the activations and the KV cache share the rest). Other devices have no such setting.
    """
    if l2 not in L2_MODES:
        raise ConfigError(f"--l2 {l2!r} is not a timing mode", "use --l2 auto, cold or warm")
    if not hasattr(dev, "flush_l2"):
        if l2 == "warm":
            raise ConfigError("--l2 warm needs a CUDA device: WebGPU timings cannot evict or keep L2",
                              "use --device cuda, or leave --l2 out")
        return False, ""
    if not local:
        if l2 == "warm":
            raise ConfigError("--l2 warm does not reach a Ray cluster's workers (they time with L2 evicted)",
                              "tune without --ray, or leave --l2 out")
        return False, "timing with L2 evicted before every sample (the cluster workers' setting)"
    l2_bytes = int(dev.info.extra.get("l2_cache_bytes") or 0)
    weights = cfg.parameter_count(with_embeddings=False) * WEIGHT_BYTES[fmt]  # bytes
    keep = 0 < weights <= l2_bytes / 2 if l2 == "auto" else l2 == "warm"
    why = (f"--l2 {l2}" if l2 != "auto" else f"the model's {weights / 2**20:.1f} MiB of {fmt} weights "
           f"{'fit in' if keep else 'exceed'} half of L2 ({l2_bytes / 2**20:.0f} MiB); --l2 cold or warm decides")
    return keep, f"timing with L2 {'kept' if keep else 'evicted'} between samples ({why})"


#: alternating rounds, and decisions per setting per round (120 timed decisions a setting): short rounds, so that
#: a clock step seldom falls inside one round, and enough of them for an interval over rounds (`race_verdict`)
ROUNDS = 20
PER_ROUND = 3
#: the confidence a setting needs to leave its default: five settings raced at 95% would leave one on noise in
#: about one tune in five
LEVEL = 0.99
#: prompts the race cycles over (random ids, a fixed prefix, as the game's prompts share theirs)
PROMPTS = 8


#: settings that change the rounding, and how far apart their two sides' outputs may be, as a share of the largest
#: magnitude (a decision's f16 tolerance against float64 in the executor's tests); every other setting must give
#: the same bits
INEXACT_SETTINGS = {"fold_norm": 1e-2, "fuse_rope": 1e-3}


def outputs_agree(name: str, on: np.ndarray, off: np.ndarray) -> bool:
    """Whether setting `name`'s two sides gave the same output: the same bits, or within its tolerance."""
    on, off = np.asarray(on, np.float64), np.asarray(off, np.float64)
    if name not in INEXACT_SETTINGS or on.shape != off.shape:
        return bool(np.array_equal(on, off))
    scale = max(1.0, float(np.abs(off).max(initial=0.0)))
    return bool(np.all(np.isfinite(on)) and np.abs(on - off).max(initial=0.0) <= INEXACT_SETTINGS[name] * scale)


def choose(default: bool, verdict: str, agree: bool) -> bool:
    """The value a race leaves: `on` where it was faster ("faster": the on side's median interval below the off
    side's), `off` where slower, the default on a tie, on noise, or where the two sides' outputs disagree."""
    if not agree or verdict not in ("faster", "slower"):
        return default
    return verdict == "faster"


def race_setting(ex: Any, name: str, decide: Callable[[int], Any], output: Callable[[], Any], rounds: int,
                 per_round: int) -> tuple[bool, dict[str, list[float]]]:
    """The executor's boolean setting `name` on against off: whether `output()` (an array) agrees both ways (the same
    bits, or within the tolerance of an inexact setting: `outputs_agree`), and each side's wall-clock ms of
    `decide(i)` over `rounds` alternating rounds of `per_round` calls (`race_modes`, keys "on" and "off"). The
    setting is as before afterwards."""
    from tilewise.model.bench import race_modes

    before = getattr(ex, name)
    try:
        got = []
        for value in (True, False):
            setattr(ex, name, value)
            got.append(np.asarray(output()))
        samples = race_modes(decide, lambda m: setattr(ex, name, m == "on"), ["on", "off"], rounds, per_round)
    finally:
        setattr(ex, name, before)
    return outputs_agree(name, got[0], got[1]), samples


def race_settings(model: Any, seq: int, rounds: int = ROUNDS, per_round: int = PER_ROUND,
                  log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Race every setting the executor of `model` has (PDL only where the device has it) on `seq`-token decisions;
    leaves the executor with the chosen values. Both sides of a race must agree on the final-normed last row (the
    same bits, or within an inexact setting's tolerance: "exact" says which). Returns {setting: {"value",
    "default", "verdict", "ratio", "ratio_interval", "level", "on_ms", "off_ms", "on_ci95_ms", "off_ci95_ms",
    "outputs_agree", "exact", "decisions"}}: "ratio" is off over on, round by round (`race_verdict`), the medians
    pooled."""
    from tilewise.model.bench import PREFIX_TOKENS, prompts, race_verdict, verdict_text
    from tilewise.tune.measure import summarize

    ex = model.executor
    _, full = prompts(model.config.vocab_size, seq, PROMPTS, min(PREFIX_TOKENS, seq - 1), seed=2)  # seq >= 2

    def decide(i: int) -> None:  # the executor's work of a decision; the head's 8 dot products run on the host
        model.prefill(full[i % len(full)])

    out: dict[str, dict[str, Any]] = {}
    for name, default in CUDA_SETTINGS.items():
        if name == "pdl" and not getattr(ex.dev, "pdl", False):
            log("settings: pdl not raced (this GPU has no programmatic dependent launch)")
            continue
        same, samples = race_setting(ex, name, decide, lambda: model.prefill(full[0]).last_hidden,  # (hidden,)
                                     rounds, per_round)
        on, off = summarize(samples["on"]), summarize(samples["off"])
        verdict = race_verdict(samples, per_round, "off", "on", level=LEVEL)
        value = choose(default, verdict.verdict, same)
        setattr(ex, name, value)
        out[name] = {"value": value, "default": default, "verdict": verdict.verdict, "ratio": verdict.ratio,
                     "ratio_interval": list(verdict.interval) if verdict.interval else None, "level": LEVEL,
                     "on_ms": on.median_ms, "off_ms": off.median_ms, "on_ci95_ms": list(on.ci95_ms),
                     "off_ci95_ms": list(off.ci95_ms), "outputs_agree": same,
                     "exact": name not in INEXACT_SETTINGS, "decisions": len(samples["on"])}
        ranked = verdict.verdict in ("faster", "slower")
        why = ("the outputs differ" if not same else verdict_text(verdict) if ranked
               else f"a {verdict_text(verdict)}: the default stays")
        log(f"settings: {name} {'on' if value else 'off'} (on {on.median_ms:.4f} ms, off {off.median_ms:.4f} ms "
            f"p50 over {len(samples['on'])} decisions each; {why})")
    return out


def tune_settings(dev: Any, cfg: Any, name: str, fmt: str, seq: int, table: DispatchTable, path: Any,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Load model `name` (`default`, a preset, a folder) onto CUDA device `dev` with the tuned `table`, race its
    settings and save them into the table at `path`. Returns the table's new `settings` record for the model."""
    from tilewise.model.cuda import CUDAExecutor
    from tilewise.model.runtime import Model, open_checkpoint

    if dev.info.backend != "cuda":
        raise ValueError(f"the settings race needs a CUDA device, not {dev.info.backend}")
    log(f"settings: racing {', '.join(CUDA_SETTINGS)} on whole {seq}-token decisions of {name} "
        f"(loading its {fmt} weights)")
    ck = open_checkpoint(name, fmt)
    model = Model(ck, CUDAExecutor(ck, dev, quiet=True, dispatch=table), None)  # races read the hidden row
    raced = race_settings(model, seq, log=log)
    record = {"values": {k: v["value"] for k, v in raced.items()}, "versions": dict(table.versions),
              "seq": seq, "raced": raced}
    table.settings[model_signature(cfg, fmt)] = record
    table.save(path)
    return record
