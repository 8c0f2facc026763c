"""The one evaluation engine: every compile -> verify -> time -> store loop in tilewise runs here.

Work items (kernel, config, shape) go in; one outcome per item comes out and is stored:

    illegal        a rule or the shape refuses it (never compiled; the message names the rule and its numbers)
    compile_error  the compiler's first error line
    launch_error   the run raised
    timeout        the first (verification) run took longer than `timeout_s`
    wrong          some output value is off (NaN-poisoned output, float64 reference, per-dtype tolerance)
    ok             verified, then timed interleaved with the other ok items of its shape

`tune`, `sweep`, `tilewise tune model`, the ladders and the bench scripts all call `Engine.evaluate` and
`Engine.race`; nothing else compiles, verifies and times candidates.

What it shares between items, and why:
- programs, by the kernel's `program_key` (a pipeline whose sizes come in a uniform serves every shape);
- verifications, by (program, verify shape): a program checked once at its `verify_shape` is not checked again
  for the other shapes it is timed at;
- input buffers: a verification's buffers serve timing at the same shape, and a kernel's `rebind` lets buffers
  uploaded for a larger shape serve a smaller one (quantized weights cost more to make than a candidate);
- shape groups run largest first, so that those buffers are the first ones made.
A batch's results are stored one by one as they finish, so an interrupted run resumes where it stopped; a
stored result is reused unless `force` (a stored timeout only while it is longer than the current timeout).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.errors import ConfigError, DeviceLost, ShaderCompileError
from tilewise.kernels.base import DeviceBuffers, KernelTemplate, Shape
from tilewise.tune.measure import DEFAULT_MEASURE, Stats, check_measure_kw, measure
from tilewise.tune.outcome import Item, Outcome, Race, first_line, item_source_hash
from tilewise.tune.store import Result, Store, shape_key
from tilewise.tune.verify import Check, Verifier

Progress = Callable[[str, int, "int | None"], None]

KEEP_INPUT_SETS = 8  # input sets kept per kernel (most recently used first out); verifiers the same
_VERIFIED_AT = re.compile(r"^verified at (\d+(?:x\d+)*): ")
_FIRST_RUN = re.compile(r"first run took ([0-9.]+) s")


@dataclass
class _Verified:
    check: Check | None
    first_s: float
    error: str = ""  # a launch error of the verification run


class Engine:
    """Evaluates items on one device, keeping what items can share (see the module docstring).

    Args:
        device: where everything runs.
        store: results store to resume from and write to (None: keep nothing).
        force: re-measure items the store already holds.
        seed: inputs, measurement order and bootstrap.
        timeout_s: a first (verification) run longer than this is `timeout` and not timed.
        measure_kw: arguments of `measure` for the per-batch timing (warmup, min_rounds, max_rounds, budget_s).
        progress: callback(stage, done, total) for long runs.
    """

    def __init__(self, device: Device, store: Store | None = None, *, force: bool = False, seed: int = 0,
                 timeout_s: float = 30.0, measure_kw: dict[str, Any] | None = None,
                 progress: Progress | None = None) -> None:
        self.device, self.store, self.force, self.timeout_s = device, store, force, timeout_s
        if not timeout_s > 0:
            raise ConfigError(f"timeout {timeout_s!r} s stops every run", "give a timeout above 0 seconds")
        self.rng = np.random.default_rng(seed)
        self.measure_kw = check_measure_kw({**DEFAULT_MEASURE, **(measure_kw or {})})
        self.progress = progress
        # the store's key for this engine's timings: a device timing under other conditions (CUDA with L2 kept)
        # names them, so its results never mix with the default ones
        self.fingerprint = device.info.fingerprint + getattr(device, "timing_tag", "")
        #: wall-clock seconds spent per stage (compile, verify, inputs, measure), summed over every call
        self.seconds: dict[str, float] = {"compile": 0.0, "verify": 0.0, "inputs": 0.0, "measure": 0.0}
        self._programs: dict[tuple[int, Hashable], Program | Exception] = {}
        self._verified: dict[tuple[int, Hashable, Shape], _Verified] = {}
        self._verifiers: OrderedDict[tuple[int, Shape], Verifier] = OrderedDict()
        self._inputs: OrderedDict[tuple[int, Shape], DeviceBuffers] = OrderedDict()
        self._hashes: dict[Item, str] = {}
        self._peers: dict[int, Program | None] = {}
        self._done = 0

    # ---- the main loop -----------------------------------------------------------------------------------------
    def evaluate(self, items: Sequence[Item], *, batch: int | None = 16, timed: bool = True,
                 total: int | None = None) -> list[Outcome]:
        """Outcomes of `items`, in their order; each one is stored as soon as it is known.

        Args:
            items: the candidates.
            batch: items compiled, verified, timed and stored together; None: one batch per shape (every item of
                a shape timed in the same interleaved rounds), largest shape first.
            timed: False verifies without timing (ok outcomes carry no stats; `race` times them later).
            total: the count progress reports against (default: len(items)).
        """
        total = len(items) if total is None else total
        out, todo = self._triage(items, total)
        for chunk in self._chunks(todo, batch):
            for i, oc in zip((i for i, _ in chunk), self._run_chunk([it for _, it in chunk], timed, total)):
                out[i] = oc
        return [out[i] for i in range(len(items))]

    def _triage(self, items: Sequence[Item], total: int) -> tuple[dict[int, Outcome], list[tuple[int, Item]]]:
        """(outcomes known without running: illegal ones, stored, by index; the (index, item)s left to run)."""
        out: dict[int, Outcome] = {}
        todo: list[tuple[int, Item]] = []
        for i, it in enumerate(items):
            why = it.kernel.why_illegal(it.config, self.device.info.limits, it.shape)
            if why:
                out[i] = self._record(Outcome(it, "illegal", "; ".join(why)))
                continue
            old = None if self.force else self._stored(it)
            if old is not None:
                out[i] = old
                self._say("stored", total)
                continue
            todo.append((i, it))
        return out, todo

    @staticmethod
    def _chunks(todo: list[tuple[int, Item]], batch: int | None) -> list[list[tuple[int, Item]]]:
        """Batches of `batch` in order, or (None) one per shape, largest shape first."""
        if batch is None:
            groups: dict[Shape, list[tuple[int, Item]]] = {}
            for pair in todo:
                groups.setdefault(pair[1].shape, []).append(pair)
            chunks = [groups[s] for s in sorted(groups, key=lambda s: -int(np.prod(s, dtype=np.int64)))]
        else:
            chunks = [todo[j:j + batch] for j in range(0, len(todo), max(1, batch))]
        return chunks

    def illegal(self, item: Item, reasons: Sequence[str]) -> Outcome:
        """Store an item a caller found illegal under its own space's rules (never compiled)."""
        return self._record(Outcome(item, "illegal", "; ".join(reasons)))

    def _run_chunk(self, items: list[Item], timed: bool, total: int) -> list[Outcome]:
        self._precompile(items)
        results: dict[Item, Outcome] = {}
        good: list[tuple[Item, Check, Shape]] = []
        for it in items:
            self._say(f"compile+verify {it.kernel.describe(it.config)}", total)
            waste = it.kernel.tile_waste(it.config, it.shape)
            prog = self.program(it)
            if isinstance(prog, Exception):
                msg = (first_line(prog.problem) if isinstance(prog, ShaderCompileError)
                       else f"{type(prog).__name__}: {first_line(str(prog))}")
                results[it] = self._record(Outcome(it, "compile_error", msg, tile_waste=waste))
                continue
            vshape = self._verify_shape(it)
            try:
                ver = self._verify(it, prog, vshape)
            except DeviceLost as exc:  # every earlier item's check synchronized: this config lost the device
                self._record(Outcome(it, "launch_error", f"the device was lost running this config: "
                                     f"{first_line(str(exc))} (a re-run skips it; --force runs it again)",
                                     tile_waste=waste))
                raise
            at = f" (at {shape_key(vshape)})" if vshape != it.shape else ""
            if ver.error:
                results[it] = self._record(Outcome(it, "launch_error", ver.error, tile_waste=waste))
            elif ver.first_s > self.timeout_s:
                results[it] = self._record(Outcome(
                    it, "timeout", f"first run took {ver.first_s:.1f} s > timeout {self.timeout_s:g} s{at}",
                    rel_err=ver.check.rel_err if ver.check else None, tile_waste=waste, verified_shape=vshape))
            elif ver.check is not None and not ver.check.ok:
                results[it] = self._record(Outcome(
                    it, "wrong", f"verified at {shape_key(vshape)}: {ver.check.message}", rel_err=ver.check.rel_err,
                    max_abs_err=ver.check.max_abs_err, tile_waste=waste, verified_shape=vshape))
            else:
                assert ver.check is not None
                good.append((it, ver.check, vshape))
        if good and not timed:
            for it, check, vshape in good:
                results[it] = Outcome(it, "ok", f"verified at {shape_key(vshape)}: {check.message}",
                                      rel_err=check.rel_err, max_abs_err=check.max_abs_err,
                                      tile_waste=it.kernel.tile_waste(it.config, it.shape), verified_shape=vshape)
        elif good:
            by_shape: dict[Shape, list[tuple[Item, Check, Shape]]] = {}
            for g in good:
                by_shape.setdefault(g[0].shape, []).append(g)
            for group in by_shape.values():
                results.update(self._time_group(group, total))
        return [results[it] for it in items]

    def _time_group(self, group: list[tuple[Item, Check, Shape]], total: int) -> dict[Item, Outcome]:
        """Time one shape's verified items interleaved; a launch that fails sinks only its own item."""
        launches = {it: self.launches(it) for it, _, _ in group}
        self._say(f"timing {len(launches)} candidates at {shape_key(group[0][0].shape)}", total, advance=False)
        out: dict[Item, Outcome] = {}
        try:
            stats = self._measure(launches, self.measure_kw).stats
        except DeviceLost:
            raise
        except Exception:  # one bad launch must not sink the batch: time them one at a time to find it
            stats = {}
            for it in launches:
                try:
                    stats.update(self._measure({it: launches[it]}, self.measure_kw).stats)
                except DeviceLost:
                    raise
                except Exception as exc:
                    out[it] = self._record(Outcome(it, "launch_error", first_line(str(exc)) or type(exc).__name__,
                                                   tile_waste=it.kernel.tile_waste(it.config, it.shape)))
        for it, check, vshape in group:
            if it in stats:
                st = stats[it]
                out[it] = self._record(Outcome(
                    it, "ok", f"verified at {shape_key(vshape)}: {check.message}", st, self._gflops(it, st),
                    check.rel_err, check.max_abs_err, it.kernel.tile_waste(it.config, it.shape),
                    verified_shape=vshape))
        return out

    # ---- races -------------------------------------------------------------------------------------------------
    def race(self, items: Sequence[Item], *, peer: bool = False, measure_kw: dict[str, Any] | None = None,
             outcomes: Sequence[Outcome] = ()) -> Race:
        """Time `items` (verified ok before) together in one interleaved measurement, with the first item's peer
        when `peer` (then every item must have the same shape). An item listed twice is timed twice (it must tie
        with itself). The new stats replace the stored ones, and any of `outcomes` whose item raced gets them too
        (its `cached` flag cleared, `pct_of_peer` set)."""
        result = self.race_stats(items, peer=peer, measure_kw=measure_kw)
        self.apply_race(items, result, outcomes)
        return result

    def race_stats(self, items: Sequence[Item], *, peer: bool = False,
                   measure_kw: dict[str, Any] | None = None) -> Race:
        """The measurement of `race`, storing nothing."""
        mkw = check_measure_kw({**self.measure_kw, **(measure_kw or {})})
        launches: dict[Any, list[Launch]] = {i: self.launches(it) for i, it in enumerate(items)}
        result = Race([])
        peer_key = _PeerKey()
        prog = self.peer_program(items[0].kernel) if peer and items else None
        if prog is not None:
            first = items[0]
            result.peer_name = first.kernel.peer_name or "peer"
            try:
                launches[peer_key] = first.kernel.peer_launches(prog, self.timing_buffers(first), first.shape)
                m = self._measure(launches, mkw)
            except DeviceLost:
                raise
            except Exception as exc:  # the peer failing must not cost the run its race
                result.peer_error = f"{type(exc).__name__}: {first_line(str(exc))}"
                launches.pop(peer_key, None)
                m = self._measure(launches, mkw)
        else:
            m = self._measure(launches, mkw)
        result.rounds = m.rounds
        result.peer = m.stats.get(peer_key)
        result.stats = [m.stats[i] for i in range(len(items))]
        return result

    def apply_race(self, items: Sequence[Item], result: Race, outcomes: Sequence[Outcome] = (),
                   worker: str | None = None) -> None:
        """Give the raced `outcomes` their new stats and store them (measured by `worker`)."""
        first_stats = {}
        for it, st in zip(items, result.stats):
            first_stats.setdefault(it, st)
        for oc in outcomes:
            st = first_stats.get(oc.item)
            if st is None:
                continue
            oc.stats, oc.gflops, oc.cached, oc.worker = st, self._gflops(oc.item, st), False, worker
            if result.peer is not None:
                oc.pct_of_peer = 100.0 * result.peer.median_ms / st.median_ms
            self._record(oc)

    def peer_program(self, kernel: KernelTemplate) -> Program | None:
        """The kernel's peer (asked once; a refusal such as cuBLAS with TF32 on raises here, before any work)."""
        if id(kernel) not in self._peers:
            self._peers[id(kernel)] = kernel.peer_program(self.device)
        return self._peers[id(kernel)]

    # ---- the shared parts ------------------------------------------------------------------------------------
    def program(self, item: Item) -> Program | Exception:
        """The compiled program of an item (or the exception compiling it raised), compiled at most once."""
        key = (id(item.kernel), item.kernel.program_key(item.config, item.shape))
        if key not in self._programs:
            t0 = time.perf_counter()
            try:
                self._programs[key] = item.kernel.compile(self.device, item.config, item.shape)
            except DeviceLost:
                raise  # not this config's fault: stop, keep what is stored, resume later
            except Exception as exc:  # a sweep never dies on one config
                self._programs[key] = exc
            self.seconds["compile"] += time.perf_counter() - t0
        return self._programs[key]

    def launches(self, item: Item) -> list[Launch]:
        """The launches of one verified item on the timing buffers of its shape."""
        prog = self.program(item)
        if isinstance(prog, Exception):
            raise prog
        return item.kernel.launches(prog, self.timing_buffers(item), item.config, item.shape)

    def timing_buffers(self, item: Item) -> DeviceBuffers:
        """Input and output buffers at the item's shape: a verification's when it ran there, else buffers another
        shape's upload can serve (`rebind`), else fresh random inputs (uploaded once, no reference computed)."""
        k, shape = item.kernel, item.shape
        ver = self._verifiers.get((id(k), shape))
        if ver is not None:
            return ver.buffers()
        key = (id(k), shape)
        bufs = self._inputs.get(key)
        if bufs is None:
            for (kid, have), other in list(self._inputs.items()):
                if kid == id(k) and (bufs := k.rebind(self.device, other, have, shape)) is not None:
                    self._inputs.move_to_end((kid, have))
                    break
            if bufs is None:
                t0 = time.perf_counter()
                bufs = k.upload(self.device, k.make_inputs(shape, self.rng), shape)
                self.seconds["inputs"] += time.perf_counter() - t0
            self._inputs[key] = bufs
            _trim(self._inputs, id(k))
        self._inputs.move_to_end(key)
        return bufs

    def _precompile(self, items: Sequence[Item]) -> None:
        """Each kernel's batch compile (`precompile`) for the items whose programs are not compiled yet."""
        groups: dict[tuple[int, Shape], list[Item]] = {}
        for it in items:
            if (id(it.kernel), it.kernel.program_key(it.config, it.shape)) not in self._programs:
                groups.setdefault((id(it.kernel), it.shape), []).append(it)
        for group in groups.values():
            k, shape = group[0].kernel, group[0].shape
            configs = list(dict.fromkeys(it.config for it in group))
            default = getattr(k.precompile, "__func__", None) is KernelTemplate.precompile
            if default and (len(configs) < 2 or not self.device.compiles_in_parallel()):
                continue  # nothing to gain: each config compiles on its own
            self._say(f"compiling {len(configs)} configs", None, advance=False)
            t0 = time.perf_counter()
            try:
                got = k.precompile(self.device, configs, shape) or {}
            except DeviceLost:
                raise
            except Exception:  # a failing batch compile falls back to one compile per config, which keeps each error
                got = {}
            self.seconds["compile"] += time.perf_counter() - t0
            for c, prog in got.items():
                self._programs[(id(k), k.program_key(c, shape))] = prog

    def _verify_shape(self, item: Item) -> Shape:
        k, shape = item.kernel, item.shape
        vshape = tuple(int(s) for s in k.verify_shape(item.config, shape))
        # a shape the config refuses would fail for the wrong reason: check at the real shape instead
        if vshape != shape and (len(vshape) != len(shape) or k.shape_problems(item.config, vshape)):
            return shape
        return vshape

    def _verify(self, item: Item, prog: Program, vshape: Shape) -> _Verified:
        k = item.kernel
        key = (id(k), k.program_key(item.config, item.shape), vshape)
        done = self._verified.get(key)
        if done is not None:
            return done
        vkey = (id(k), vshape)
        ver = self._verifiers.get(vkey)
        if ver is None:
            ver = self._verifiers[vkey] = Verifier(k, self.device, vshape, self.rng, reuse=k.verify_reuse)
            _trim(self._verifiers, id(k))
        self._verifiers.move_to_end(vkey)
        t0 = time.perf_counter()
        try:
            check = ver.check(prog, item.config)
            done = _Verified(check, time.perf_counter() - t0)
        except DeviceLost:
            raise
        except Exception as exc:
            done = _Verified(None, time.perf_counter() - t0, first_line(str(exc)) or type(exc).__name__)
        self.seconds["verify"] += time.perf_counter() - t0
        self._verified[key] = done
        return done

    def _measure(self, launches: dict[Any, list[Launch]], mkw: dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return measure(self.device, launches, rng=self.rng, **mkw)
        finally:
            self.seconds["measure"] += time.perf_counter() - t0

    def _gflops(self, item: Item, st: Stats) -> float:
        return item.kernel.flops(item.shape) / (st.median_ms * 1e6)

    # ---- the store -------------------------------------------------------------------------------------------
    def source_hash(self, item: Item) -> str:
        if item not in self._hashes:
            self._hashes[item] = item_source_hash(item)
        return self._hashes[item]

    def _record(self, oc: Outcome) -> Outcome:
        """Store one outcome (the only place a `Result` is assembled) and count it for the progress line."""
        if self.store is not None:
            it, s = oc.item, oc.stats
            self.store.put(Result(
                self.fingerprint, it.kernel.name, self.source_hash(it), shape_key(it.shape), it.config.key(),
                oc.status, oc.reason, s.median_ms if s else None, s.p20_ms if s else None, s.p80_ms if s else None,
                s.ci95_ms[0] if s else None, s.ci95_ms[1] if s else None, s.n if s else None, oc.rel_err,
                oc.max_abs_err, oc.gflops, oc.tile_waste, worker=oc.worker))
        return oc

    def _stored(self, item: Item) -> Outcome | None:
        if self.store is None:
            return None
        old = self.store.get(self.fingerprint, item.kernel.name, self.source_hash(item), shape_key(item.shape),
                             item.config.key())
        if old is None:
            return None
        if old.status == "timeout":  # a longer timeout than the stored run's first run deserves another try
            took = _FIRST_RUN.search(old.message or "")
            if took is None or float(took.group(1)) <= self.timeout_s:
                return None
        stats = None
        if old.median_ms is not None:
            lo = old.ci_lo_ms if old.ci_lo_ms is not None else old.median_ms
            hi = old.ci_hi_ms if old.ci_hi_ms is not None else old.median_ms
            stats = Stats(old.median_ms, old.p20_ms or old.median_ms, old.p80_ms or old.median_ms, (lo, hi),
                          np.full(old.samples or 0, old.median_ms))
        where = _VERIFIED_AT.match(old.message or "")
        vshape = tuple(int(s) for s in where.group(1).split("x")) if where else None
        return Outcome(item, old.status, old.message, stats, old.gflops, old.rel_err, old.max_abs_err, old.tile_waste,
                       cached=True, verified_shape=vshape, worker=old.worker)

    def _say(self, stage: str, total: int | None, advance: bool = True) -> None:
        """Report a stage with the count of items started before it; `advance` counts this item as started."""
        if self.progress is not None:
            self.progress(stage, self._done, total)
        if advance:
            self._done += 1


class _PeerKey:
    """The peer's key in a race's candidate mapping (never equal to an item)."""

    def __repr__(self) -> str:
        return "<peer>"


def _trim(cache: OrderedDict[Any, Any], kernel_id: int, keep: int = KEEP_INPUT_SETS) -> None:
    """Drop a kernel's least recently used entries beyond `keep` (buffers stay alive while a device's bind-group
    cache holds them, so dropping them here cannot hand a stale id to a new buffer)."""
    mine = [k for k in cache if k[0] == kernel_id]
    for k in mine[:-keep] if len(mine) > keep else []:
        del cache[k]


__all__ = ["DEFAULT_MEASURE", "Engine", "Item", "Outcome", "Race", "first_line", "item_source_hash"]
