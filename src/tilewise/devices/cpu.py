"""The CPU device: numpy arrays as buffers, Python callables as programs, BLAS through numpy.

A CPU "kernel" is a callable `fn(buffers, grid, **constants)` that receives the buffers' raw byte
arrays (np.uint8, writable) and works on views of them. The CPU executor and the float64 references
build on this device; it is also what `auto` falls back to when no GPU adapter is usable.

The BLAS pool's size is chosen here (`set_threads`, `thread_setup`), as is the way torch shares the cores when it
runs in the same process (`quiet_torch_threads`, `match_torch_threads`).
"""

from __future__ import annotations

import inspect
import os
import platform
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, DeviceInfo, HostDevice, Launch, Limits, Program, source_hash
from tilewise.errors import ConfigError


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas_name() -> str:
    try:
        cfg = np.show_config(mode="dicts")  # numpy >= 1.25
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return f"numpy {np.__version__} {blas.get('name', 'blas')} {blas.get('version', '')}".strip()
    except Exception:
        return f"numpy {np.__version__}"


# ---- BLAS threads --------------------------------------------------------------------------------------------
# One BLAS pool serves the whole process, so the choice is process-wide: `set_threads` applies it, every CPUDevice
# reports it. More threads than physical cores (hyperthreads) or than the cores left by other work on a shared
# machine make a decision several times slower, so the count is chosen, never left to the library's default.
THREAD_ENV = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")  # the order OpenBLAS reads them
OMP_WAIT_ENV = "OMP_WAIT_POLICY"


@dataclass(frozen=True)
class ThreadSetup:
    """The BLAS pool of this process: how many threads, why that many, and which library took the setting."""

    threads: int
    source: str  # "threads=N" | "OPENBLAS_NUM_THREADS=N" | "physical cores" | ...
    library: str  # "scipy-openblas (threadpoolctl)" | "openblas (ctypes)" | "none found (not applied)"
    applied: bool

    def line(self) -> str:
        """One line for output headers: `BLAS threads: 2 (physical cores available; openblas (threadpoolctl))`."""
        note = "" if self.applied else ", not applied: no BLAS library found to set"
        return f"BLAS threads: {self.threads} ({self.source}; {self.library}{note})"


def physical_cores(sysfs: str | os.PathLike[str] = "/sys/devices/system/cpu") -> int:
    """Physical cores this process may run on: its CPU affinity, hyperthread siblings counted once (Linux sysfs
    topology under `sysfs`); without it, the CPUs of the affinity set (or `os.cpu_count()`)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores: set[str] = set()
    for cpu in cpus:
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                cores.add(Path(sysfs, f"cpu{cpu}", "topology", name).read_text().strip())
                break
            except OSError:
                continue
        else:
            cores.add(f"cpu{cpu}")  # topology unknown: count the CPU itself
    return max(1, len(cores))


def env_threads() -> tuple[int, str] | None:
    """(count, "VAR=N") from the first of OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, OMP_NUM_THREADS set to a positive
    whole number; None when the user set none of them."""
    for var in THREAD_ENV:
        text = os.environ.get(var, "").strip().split(",")[0]  # OMP allows a nested list "4,2": the outer level
        if text.isdigit() and int(text) > 0:
            return int(text), f"{var}={int(text)}"
    return None


def default_threads() -> tuple[int, str]:
    """The count a CPU device uses unless told: the user's environment variable, else the physical cores."""
    return env_threads() or (physical_cores(), "physical cores available")


_setup: ThreadSetup | None = None
_omp_set = False  # this process set OMP_WAIT_POLICY itself
_devices: weakref.WeakSet[CPUDevice] = weakref.WeakSet()


def set_threads(threads: int | None = None) -> ThreadSetup:
    """Set this process's BLAS pool to `threads` (None: `default_threads()`), and every CPU device's description.

    Uses threadpoolctl when it is installed; otherwise numpy's bundled OpenBLAS through its C API (the library
    numpy wheels ship). For `--threads N` options: call before loading a model.

    Raises:
        ConfigError: `threads` below 1.
    """
    global _setup
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads={threads!r}: the BLAS pool needs at least one thread", "give a whole number >= 1")
    count, source = (threads, f"threads={threads}") if threads is not None else default_threads()
    library = _apply_threads(count)
    _setup = ThreadSetup(count, source, library or "none found", library is not None)
    for dev in list(_devices):
        if dev.info.backend == "cpu":  # subclasses that pose as other backends keep their own description
            dev.info = dev._describe(_setup)
    return _setup


def thread_setup() -> ThreadSetup:
    """The current BLAS setup (the default one is applied on first use)."""
    return _setup if _setup is not None else set_threads(None)


def _apply_threads(count: int) -> str | None:
    """Set the BLAS pool; the library's name, or None when no library could be set."""
    try:
        import threadpoolctl
    except ImportError:
        threadpoolctl = None
    if threadpoolctl is not None:
        pools = threadpoolctl.threadpool_info()
        blas = [p for p in pools if p.get("user_api") == "blas"]
        if blas:
            threadpoolctl.threadpool_limits(limits=count, user_api="blas")  # stays in force: no context manager
            return f"{blas[0].get('internal_api', 'blas')} (threadpoolctl)"
    lib = _openblas()
    if lib is None:
        return None
    name, setter, _ = lib
    setter(count)
    return f"{name} (ctypes)"


def blas_threads_now() -> int | None:
    """Threads the BLAS library reports it uses now (None when it cannot be asked)."""
    try:
        import threadpoolctl

        blas = [p for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
        if blas:
            return int(blas[0]["num_threads"])
    except ImportError:
        pass
    lib = _openblas()
    return int(lib[2]()) if lib is not None else None


def _openblas() -> tuple[str, Any, Any] | None:
    """(name, set_num_threads, get_num_threads) of the OpenBLAS numpy loaded (Linux: found in /proc/self/maps)."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")):
            setter = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
            getter = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
                return ("scipy-openblas" if prefix else "openblas"), setter, getter
    return None


# ---- torch next to BLAS ----------------------------------------------------------------------------------------
def quiet_torch_threads() -> str:
    """Keep torch's OpenMP threads from slowing BLAS calls timed in the same process; call before importing torch.

    After a parallel region, OpenMP threads spin for a while by default, taking the cores the next BLAS call
    wants (30.3 ms p50 instead of 24.6 ms measured next to HF on a 2-core machine). This sets OMP_WAIT_POLICY=PASSIVE
    (threads sleep at once) unless the user set it; once torch is imported it gets as many intra-op threads as the
    BLAS pool (see `match_torch_threads`). Returns the line to print in an output header.
    """
    import sys

    global _omp_set
    user = os.environ.get(OMP_WAIT_ENV)
    if _omp_set and user == "PASSIVE":
        policy = f"{OMP_WAIT_ENV}=PASSIVE (set by tilewise)"
    elif "torch" in sys.modules and user is None:
        policy = "torch was imported first: its OpenMP threads may spin (set OMP_WAIT_POLICY=PASSIVE before it)"
    elif user is None:
        os.environ[OMP_WAIT_ENV] = "PASSIVE"
        _omp_set = True
        policy = f"{OMP_WAIT_ENV}=PASSIVE (set by tilewise)"
    else:
        policy = f"{OMP_WAIT_ENV}={user} (yours)"
    return f"OpenMP: {policy}"


def match_torch_threads(torch: Any) -> str:
    """Give torch as many intra-op threads as the BLAS pool, so neither pool oversubscribes the cores the other
    uses; returns `torch threads: N (matched to BLAS)`."""
    n = thread_setup().threads
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return f"torch threads: {torch.get_num_threads()} (matched to BLAS)"


class CPUDevice(HostDevice):
    """numpy-backed device; `time` is the host clock around each call (the work is synchronous).

    Args:
        threads: BLAS threads for the process (None: keep this process's setting, or choose one; see
            `set_threads`). The count is part of the api (`numpy, 2 threads`) and so of the fingerprint: timings
            at another count are other timings.
    """

    def __init__(self, threads: int | None = None) -> None:
        setup = set_threads(threads) if threads is not None else thread_setup()
        self.info = self._describe(setup)
        _devices.add(self)

    def _describe(self, setup: ThreadSetup) -> DeviceInfo:
        big = 2**62
        return DeviceInfo(
            backend="cpu",
            name=_cpu_name(),
            adapter_type="cpu",
            api=f"numpy, {setup.threads} thread{'' if setup.threads == 1 else 's'}",  # shown by every device line
            driver=_blas_name(),
            vendor=platform.machine(),
            limits=Limits(
                max_workgroup_storage_bytes=big,
                max_invocations_per_workgroup=1,
                max_workgroup_size=(1, 1, 1),
                max_workgroups_per_dimension=big,
                max_buffer_bytes=big,
                max_storage_binding_bytes=big,
            ),
            features=("float64",),
            extra={"threads": setup.threads, "threads_source": setup.source, "blas_library": setup.library,
                   "physical_cores": physical_cores()},
        )

    def allocate(self, nbytes: int, *, uniform: bool = False) -> Buffer:
        return Buffer(self, np.empty(int(nbytes), dtype=np.uint8), int(nbytes), uniform)

    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        if not callable(source):
            raise TypeError("the CPU device compiles Python callables fn(buffers, grid, **constants)")
        try:
            text = inspect.getsource(source)
        except (OSError, TypeError):
            text = repr(source)
        consts = dict(constants or {})
        return Program(name or getattr(source, "__name__", "cpu_kernel"), source,
                       source_hash(text, repr(sorted(consts.items()))), consts)

    def _call(self, launch: Launch) -> None:
        launch.program.handle([b.handle for b in launch.buffers], launch.grid, **launch.program.constants)
