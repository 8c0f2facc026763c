"""Tuning on a Ray cluster: one actor per device runs the engine there; the driver triages, stores and races.

What runs where:
- the driver (the `tilewise` process) picks configs, refuses illegal ones, skips what the store holds, and writes
  every outcome to its store under the device fingerprint of the worker that measured it, as a local run would;
- each `DeviceWorker` actor owns one device (`num_gpus=1` on a GPU cluster) and a store-less `Engine` on it: it
  compiles, verifies and times the batches it is sent and sends the outcomes back;
- workers are grouped by fingerprint; a `RayEngine` spreads one group's batches over its workers, and a final race
  runs on one worker of the group, so times from different devices are never compared.

Compiles: on a CUDA group the driver asks each item's template which kernels it compiles (its `compile` run on a
`CompileProbe`, which records and builds nothing), compiles them to cubins in Ray CPU tasks (`num_cpus=1`, as
many at once as the cluster has CPUs beyond the workers'), and sends each batch with its cubins; the worker's
device (`Prebuilt`) loads them instead of compiling, and raises a shipped compile error as a local compile would.
A template whose compile the probe cannot run, or a CPU task that fails, leaves that kernel to the worker's own
compile. WebGPU pipelines are created where the device is, so other backends compile in the worker.

Faults: a worker that dies (or whose device is lost) loses only the batch it was running; that batch goes to
another live worker once, and fails as `launch_error` "worker died: ..." only when it dies there too. With no
live worker left the run stops with `DeviceLost`, storing nothing for the unfinished batches (a re-run resumes).
Ctrl-C cancels the batches under way, stops the workers and shuts a local cluster down (pressed again meanwhile, it
waits for that); every outcome stored before stays stored.
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import hashlib
import os
import signal
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilewise.devices.base import COMPILE_WORKERS_ENV, DeviceInfo
from tilewise.devices.cuda_nvrtc import CompiledCuda, CompileFailure, CompileProbe, CompileRequest, Prebuilt
from tilewise.errors import ConfigError, DeviceLost, DeviceUnavailable
from tilewise.kernels.space import Config
from tilewise.tune.engine import Engine, Item, Outcome, Race

LOCAL = "local"  # --ray with no address: start a cluster in this process (`ray.init()`)
RAY_FIX = "pip install 'tilewise[ray]' (in a clone: bash scripts/run extras ray)"


def _reduce_config(c: Config) -> tuple[Any, ...]:
    return Config, (c._items, c._fmt)  # a Config's state: its pairs, its format


copyreg.pickle(Config, _reduce_config)  # items travel to workers; the default reduction cannot rebuild a Config


def import_ray() -> Any:
    """The `ray` module, or `DeviceUnavailable` with the install line."""
    try:
        import ray
    except ImportError as exc:
        raise DeviceUnavailable(f"--ray needs Ray, which is not installed here ({exc})", RAY_FIX) from exc
    if not hasattr(ray, "init"):  # a folder named ray on the path imports as an empty namespace package
        raise DeviceUnavailable(f"--ray needs Ray, but `ray` here is not the Ray package (found at "
                                f"{list(getattr(ray, '__path__', [])) or ray}); a folder named ray shadows it", RAY_FIX)
    return ray


class DeviceWorker:
    """The body of one Ray actor: one device and its store-less engines (one per engine setting)."""

    def __init__(self, device: str, backends: Sequence[str], job: str, prefer: str | None = None,
                 compile_workers: int | None = None) -> None:
        from tilewise.devices import parse_device_name, resolve

        if compile_workers is not None:  # this process's batch compiles: the worker's share of the host's CPUs
            os.environ[COMPILE_WORKERS_ENV] = str(compile_workers)

        base, index = parse_device_name(device)
        if index is None and base in ("webgpu", "dawn") and _ray_gpu_ids():
            device = f"{base}:{_ray_gpu_ids()[0]}"  # assumes adapter order follows the GPU ids Ray hands out
        self.device = resolve(device, list(backends), job=job, prefer=prefer).device
        self.name = f"{socket.gethostname()}/{self.device.info.device_name}/{os.getpid()}"
        self._setup()

    def _setup(self) -> None:
        # a CUDA device loads the cubins a batch brings (compiled on CPU workers) instead of compiling them
        self.prebuilt = Prebuilt(self.device) if self.device.info.backend == "cuda" else None
        self._engines: dict[str, Engine] = {}
        self._kernels: dict[str, Any] = {}

    def describe(self) -> tuple[str, DeviceInfo, tuple[str, ...]]:
        """(worker name, device info, enabled features)."""
        return self.name, self.device.info, tuple(sorted(getattr(self.device, "enabled_features", ()) or ()))

    def evaluate(self, items: Sequence[Item], batch: int | None, timed: bool, engine_kw: dict[str, Any],
                 compiled: Shipped | None = None) -> tuple[str, list[Outcome], dict[str, float]]:
        """(fingerprint, the items' outcomes without their items, the engine's seconds so far). `compiled`: the
        batch's kernels compiled elsewhere, by `compile_key` (CUDA)."""
        eng = self._engine(engine_kw)
        if self.prebuilt is not None:
            self.prebuilt.shipped = compiled or {}
        try:
            got = eng.evaluate(self._canon(items), batch=batch, timed=timed)
        finally:
            if self.prebuilt is not None:
                self.prebuilt.shipped = {}  # the engine keeps the programs it loaded
        return eng.fingerprint, [dataclasses.replace(oc, item=None) for oc in got], dict(eng.seconds)  # type: ignore[arg-type]

    def compile_counts(self) -> dict[str, int]:
        """Kernels loaded from shipped cubins and kernels this worker compiled itself (CUDA; else zeros)."""
        pb = self.prebuilt
        return {"loaded": pb.loaded if pb else 0, "compiled": pb.compiled if pb else 0}

    def race(self, items: Sequence[Item], peer: bool, measure_kw: dict[str, Any] | None,
             engine_kw: dict[str, Any]) -> tuple[str, Race]:
        eng = self._engine(engine_kw)
        return eng.fingerprint, eng.race_stats(self._canon(items), peer=peer, measure_kw=measure_kw)

    def has_peer(self, kernel: Any, engine_kw: dict[str, Any]) -> bool:
        return self._engine(engine_kw).peer_program(self._kernel(kernel)) is not None

    def _engine(self, kw: dict[str, Any]) -> Engine:
        key = repr(sorted(kw.items()))
        if key not in self._engines:
            self._engines[key] = Engine(self.prebuilt or self.device, None, **kw)  # type: ignore[arg-type]
        return self._engines[key]

    def _canon(self, items: Sequence[Item]) -> list[Item]:
        """Items whose kernels are this worker's one object per template, so programs, checks and inputs are
        shared between batches (each batch arrives with fresh copies)."""
        return [Item(self._kernel(it.kernel), it.config, it.shape) for it in items]

    def _kernel(self, kernel: Any) -> Any:
        from ray import cloudpickle

        return self._kernels.setdefault(hashlib.sha256(cloudpickle.dumps(kernel)).hexdigest(), kernel)


Shipped = dict[tuple[str, str, tuple[str, ...]], "CompiledCuda | CompileFailure"]


def compile_on_cpu(request: CompileRequest) -> CompiledCuda | CompileFailure:
    """The body of one CPU compile task: NVRTC without a GPU (a refusal is a value, raised where it is loaded)."""
    from tilewise.devices.cuda_nvrtc import try_compile

    return try_compile(request.source, request.entry, request.options)


def _ray_gpu_ids() -> list[int]:
    try:
        import ray

        return [int(g) for g in ray.get_gpu_ids()]
    except Exception:
        return []


@dataclass
class Worker:
    """The driver's handle on one actor."""

    actor: Any
    name: str
    info: DeviceInfo
    enabled_features: tuple[str, ...] = ()
    alive: bool = True
    seconds: dict[str, float] = field(default_factory=dict)


class RemoteDevice:
    """What the driver knows of a worker's device: its info and features (nothing runs on it here)."""

    def __init__(self, info: DeviceInfo, enabled_features: Sequence[str] = ()) -> None:
        self.info = info
        self.enabled_features = set(enabled_features)


class Cluster:
    """A Ray connection and its device workers. `address` None starts a local cluster (`ray.init()`), which
    `close` shuts down; a Ray already initialized in this process (a test's) is used as it is."""

    def __init__(self, address: str | None = None, **init_kw: Any) -> None:
        self.ray = import_ray()
        self.owned = not self.ray.is_initialized()
        if self.owned:
            kw = {"include_dashboard": False, "log_to_driver": False, **init_kw}
            self.ray.init(address=address, **kw) if address else self.ray.init(**kw)
        self.workers: list[Worker] = []

    def start(self, device: str, backends: Sequence[str], job: str, prefer: str | None = None,
              count: int | None = None) -> list[Worker]:
        """Start `count` workers (default: one per GPU in the cluster, else one) and wait until each has opened
        its device; a worker that cannot open one raises its error here, before any work."""
        gpus = int(self.ray.cluster_resources().get("GPU", 0))
        on_gpu = gpus > 0 and not device.startswith("cpu")
        count = count or max(1, gpus if on_gpu else 1)
        cls = self.ray.remote(DeviceWorker).options(num_gpus=1 if on_gpu else 0, num_cpus=1, max_restarts=0,
                                                    max_task_retries=0)
        # each worker compiles its batches on its share of the CPUs, not on all of them at once
        share = max(1, int(self.ray.cluster_resources().get("CPU", os.cpu_count() or 1)) // count)
        actors = [cls.remote(device, list(backends), job, prefer, share) for _ in range(count)]
        for actor in actors:
            name, info, feats = self.get(actor.describe.remote())
            self.workers.append(Worker(actor, name, info, feats))
        return self.workers

    def groups(self) -> dict[str, list[Worker]]:
        """Live workers by device fingerprint (one results table each)."""
        out: dict[str, list[Worker]] = {}
        for w in self.workers:
            if w.alive:
                out.setdefault(w.info.fingerprint, []).append(w)
        return out

    def get(self, ref: Any) -> Any:
        """`ray.get`, with a task's own error (a ConfigError, say) raised as itself."""
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, BaseException) else exc) from None

    def close(self) -> None:
        """Stop every worker; shut a local cluster down (what the driver stored stays stored). A Ctrl-C pressed
        meanwhile waits until this is done, then raises `KeyboardInterrupt`."""
        with _ctrl_c_deferred():
            for w in self.workers:
                with contextlib.suppress(Exception):  # an actor already gone needs no stopping
                    self.ray.kill(w.actor)
            self.workers = []
            if self.owned and self.ray.is_initialized():
                self.ray.shutdown()

    def engine(self, fingerprint: str, store: Any = None, **kw: Any) -> RayEngine:
        return RayEngine(self, self.groups()[fingerprint], store, **kw)


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Hold SIGINT back for the block, then raise `KeyboardInterrupt` once if it came. Users press Ctrl-C again
    while the cluster stops: cut short, `ray.shutdown` is left to Ray's exit hook, which the next Ctrl-C turns
    into a traceback and a killed process instead of exit 130. The shutdown is bounded (Ray kills what does not
    stop in time), so holding Ctrl-C for it costs seconds."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    came: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if before is None else before)
    if came and callable(before):  # the handler that was there gets the held signal (Python's raises KeyboardInterrupt)
        before(signal.SIGINT, None)


#: batches a worker is handed at once while CPU tasks compile its kernels (see `RayEngine.width`)
COMPILE_AHEAD = 32


class RayEngine(Engine):
    """The engine for one fingerprint's workers: triage and storing here, batches on the workers (in parallel),
    races on the group's first live worker. `width` is how many batches run at once."""

    def __init__(self, cluster: Cluster, workers: Sequence[Worker], store: Any = None, **kw: Any) -> None:
        super().__init__(RemoteDevice(workers[0].info, workers[0].enabled_features), store, **kw)  # type: ignore[arg-type]
        self.cluster, self.workers = cluster, list(workers)
        self._kw = {"seed": kw.get("seed", 0), "timeout_s": self.timeout_s, "measure_kw": self.measure_kw}
        self._has_peer: dict[int, bool] = {}
        self.cpu_compiles = workers[0].info.backend == "cuda"  # compile in CPU tasks, load on the worker

    @property
    def width(self) -> int:
        """Batches per `evaluate` call: one per live worker, and `COMPILE_AHEAD` per worker while kernels compile in
        CPU tasks, so that the next batches compile while the workers measure (with one batch per call, compiling
        and measuring took turns and a one-GPU Ray run was no faster than a local one)."""
        return max(1, sum(w.alive for w in self.workers)) * (COMPILE_AHEAD if self.cpu_compiles else 1)

    @property  # type: ignore[override]
    def seconds(self) -> dict[str, float]:
        out: dict[str, float] = {"compile": 0.0, "verify": 0.0, "inputs": 0.0, "measure": 0.0}
        for w in getattr(self, "workers", ()):
            for k, v in w.seconds.items():
                out[k] = out.get(k, 0.0) + v
        return out

    @seconds.setter
    def seconds(self, _value: dict[str, float]) -> None:  # Engine.__init__ sets it; the workers' sums win
        pass

    def evaluate(self, items: Sequence[Item], *, batch: int | None = 16, timed: bool = True,
                 total: int | None = None) -> list[Outcome]:
        total = len(items) if total is None else total
        out, todo = self._triage(items, total)
        queue: deque[_Batch] = deque(_Batch(c, self._compile_requests(c)) for c in self._chunks(todo, batch))
        compiles = _Compiles(self, queue)
        running: dict[Any, tuple[Worker, _Batch]] = {}
        ray = self.cluster.ray
        try:
            while queue or running:
                compiles.submit()
                for w in self._idle(running):
                    job = next((j for j in queue if compiles.ready(j)), None)
                    if job is None:
                        break
                    queue.remove(job)
                    if job.shipped is None:
                        job.shipped = compiles.take(job)
                    self._say(f"{'loading' if job.shipped else 'compiling'} {len(job.chunk)} on {w.name}", total,
                              advance=False)
                    ref = w.actor.evaluate.remote([it for _, it in job.chunk], batch, timed, self._kw, job.shipped)
                    running[ref] = (w, job)
                if not self._live():
                    raise DeviceLost(f"every worker of {self.fingerprint} died; "
                                     f"{sum(len(j.chunk) for j in queue)} items were not measured (nothing was "
                                     "stored for them)",
                                     "check the workers' logs (`ray logs`), then run the same command again: it "
                                     "resumes from the store")
                ready, _ = ray.wait([*running, *compiles.running], num_returns=1)
                if ready[0] in compiles.running:
                    compiles.done(ready[0])
                    continue
                w, job = running.pop(ready[0])
                try:
                    fp, got, secs = self.cluster.get(ready[0])
                    if fp != self.fingerprint:
                        raise _Foreign(f"its device fingerprint is now {fp}, not {self.fingerprint}")
                except (ray.exceptions.RayActorError, DeviceLost, _Foreign) as exc:
                    self._lose(w, exc)
                    job.died.append(f"{w.name} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                    if len(job.died) < 2:
                        queue.appendleft(job)  # once more, on another worker
                        continue
                    for i, it in job.chunk:
                        out[i] = self._record(Outcome(it, "launch_error",
                                                      "worker died: " + "; then ".join(job.died)))
                    continue
                w.seconds = secs
                for (i, it), oc in zip(job.chunk, got):
                    oc.item, oc.worker = it, w.name
                    out[i] = self._record(oc)
                self._done += len(job.chunk)
                self._say(f"measured {len(job.chunk)} on {w.name}", total, advance=False)
        except BaseException:
            for ref in [*running, *compiles.running]:  # Ctrl-C or an error: stop the work under way
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            raise
        return [out[i] for i in range(len(items))]

    def _compile_requests(self, chunk: Sequence[tuple[int, Item]]) -> list[CompileRequest]:
        """The kernels a chunk's items compile, as their templates name them to a `CompileProbe` (CUDA only)."""
        if not self.cpu_compiles:
            return []
        found: dict[Any, CompileRequest] = {}
        for _, it in chunk:
            probe = CompileProbe(self.device.info, set(self.device.enabled_features))
            with contextlib.suppress(Exception):  # the worker's own compile gives such an item its outcome
                it.kernel.compile(probe, it.config, it.shape)
            found.update((r.key, r) for r in probe.requests)
        return list(found.values())

    @property
    def compile_slots(self) -> int:
        """CPU compile tasks in flight: the cluster's CPUs beyond those the device workers hold."""
        cpus = int(self.cluster.ray.cluster_resources().get("CPU", 1))
        return max(1, cpus - sum(w.alive for w in self.cluster.workers))

    def race(self, items: Sequence[Item], *, peer: bool = False, measure_kw: dict[str, Any] | None = None,
             outcomes: Sequence[Outcome] = ()) -> Race:
        """The final race on one worker (the group's first live one), stored as measured by it."""
        for w in self._live():
            try:
                fp, result = self.cluster.get(w.actor.race.remote(list(items), peer, measure_kw, self._kw))
            except (self.cluster.ray.exceptions.RayActorError, DeviceLost) as exc:
                self._lose(w, exc)
                continue
            if fp != self.fingerprint:
                self._lose(w, _Foreign(fp))
                continue
            self.apply_race(items, result, outcomes, worker=w.name)
            return result
        raise DeviceLost(f"no worker of {self.fingerprint} is left to run the final race",
                         "run the same command again: it resumes from the store")

    def peer_program(self, kernel: Any) -> Any:
        """True-ish when the first live worker's device has the kernel's peer (the program stays there)."""
        if id(kernel) not in self._has_peer:
            self._has_peer[id(kernel)] = bool(self.cluster.get(self._live()[0].actor.has_peer.remote(kernel,
                                                                                                   self._kw)))
        return True if self._has_peer[id(kernel)] else None

    def _live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    def _idle(self, running: dict[Any, tuple[Worker, Any]]) -> list[Worker]:
        busy = {id(w) for w, _ in running.values()}
        return [w for w in self._live() if id(w) not in busy]

    def _lose(self, w: Worker, exc: BaseException) -> None:
        w.alive = False
        with contextlib.suppress(Exception):  # already gone
            self.cluster.ray.kill(w.actor)


@dataclass
class _Batch:
    """One chunk of items on its way to a worker: the kernels it needs, then the cubins it carries."""

    chunk: list[tuple[int, Item]]
    requests: list[CompileRequest]
    shipped: Shipped | None = None
    died: list[str] = field(default_factory=list)


class _Compiles:
    """The CPU compile tasks of one `evaluate`: submitted in batch order, each kernel once, at most
    `compile_slots` at a time; a result is kept until the last batch needing it has taken it."""

    def __init__(self, engine: RayEngine, queue: Sequence[_Batch]) -> None:
        self.ray = engine.cluster.ray
        self.slots = engine.compile_slots if any(j.requests for j in queue) else 0
        self.pending: deque[CompileRequest] = deque()
        self.needed: dict[Any, int] = {}
        for job in queue:
            for r in job.requests:
                self.needed[r.key] = self.needed.get(r.key, 0) + 1
                if self.needed[r.key] == 1:
                    self.pending.append(r)
        self.results: dict[Any, CompiledCuda | CompileFailure | None] = {}
        self.running: dict[Any, CompileRequest] = {}
        self._task = self.ray.remote(num_cpus=1, max_retries=0)(compile_on_cpu) if self.pending else None

    def submit(self) -> None:
        while self.pending and len(self.running) < self.slots:
            r = self.pending.popleft()
            self.running[self._task.remote(r)] = r  # type: ignore[union-attr]

    def done(self, ref: Any) -> None:
        r = self.running.pop(ref)
        try:
            self.results[r.key] = self.ray.get(ref)
        except Exception:  # a CPU node without NVRTC, say: the worker compiles this kernel itself
            self.results[r.key] = None

    def ready(self, job: _Batch) -> bool:
        return job.shipped is not None or all(r.key in self.results for r in job.requests)

    def take(self, job: _Batch) -> Shipped:
        """The batch's compiled kernels (what failed on the CPU is left out: the worker compiles it)."""
        shipped: Shipped = {}
        for r in job.requests:
            got = self.results[r.key]
            self.needed[r.key] -= 1
            if self.needed[r.key] == 0:
                del self.results[r.key]
            if got is not None:
                shipped[r.key] = got
        return shipped


class _Foreign(Exception):
    """A worker answered for another device than the table's."""


def check_ray(args: Any) -> None:
    """Refuse --workers without --ray, and a missing Ray, before any work."""
    if getattr(args, "workers", None) and not getattr(args, "ray", None):
        raise ConfigError("--workers applies only with --ray", "add --ray (a local cluster) or drop --workers")
    if getattr(args, "ray", None):
        import_ray()


def start_cluster(args: Any, backends: Sequence[str], job: str, prefer: str | None = None) -> Any:
    """A `Cluster` with its workers started on `args.device` (close it when done, also on Ctrl-C)."""
    cluster = Cluster(None if args.ray == LOCAL else args.ray)
    try:
        cluster.start(args.device, backends, job, prefer, args.workers)
    except BaseException:
        cluster.close()
        raise
    return cluster


def group_line(fingerprint: str, workers: Sequence[Any]) -> str:
    names = ", ".join(w.name for w in workers[:3]) + (f" and {len(workers) - 3} more" if len(workers) > 3 else "")
    return f"ray: {len(workers)} worker{'s' * (len(workers) != 1)} on {workers[0].info.name} [{fingerprint}]: {names}"


def each_device(args: Any, backends: Sequence[str], job: str, prefer: str | None,
                run: Callable[[RemoteDevice, str, Callable[..., Engine]], Any]) -> list[Any]:
    """Start the cluster of `args.ray`, call `run(device, line, make_engine)` once per device fingerprint (its
    workers' device, a line naming them, and `make_engine(dev, store, **engine_kw)` building engines on them),
    and close the cluster, also on Ctrl-C or an error."""
    cluster = start_cluster(args, backends, job, prefer)
    out = []
    try:
        for fp, workers in cluster.groups().items():
            def make(_dev: Any, store: Any = None, fp: str = fp, **kw: Any) -> Engine:
                return cluster.engine(fp, store, **kw)
            out.append(run(RemoteDevice(workers[0].info, workers[0].enabled_features), group_line(fp, workers),
                           make))
    finally:
        cluster.close()
    return out


__all__ = ["LOCAL", "RAY_FIX", "Cluster", "DeviceWorker", "RayEngine", "RemoteDevice", "Worker", "check_ray",
           "each_device", "group_line", "import_ray", "start_cluster"]
