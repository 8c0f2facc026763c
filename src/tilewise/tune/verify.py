"""Verification: every output value against a float64 reference, on fresh random inputs, with poisoned outputs.

- Fresh inputs per check (never zeros: a kernel that skips work looks right on zeros).
- The output buffer is filled with NaN before the run, so an element no invocation writes fails the check.
- Errors: relative Frobenius error ||out - ref|| / ||ref|| and max abs error, against tolerances per dtype.
  Every value counts; a correct argmax proves nothing (seed 001's sideways matrices).
- Guard regions: on a device that does not bounds-check memory (`Device.unchecked`, Dawn without robustness), and
  wherever `TILEWISE_GUARD_OUTPUTS=1` asks for it, each output (and each scratch buffer the template names in
  `scratch_buffers`) is bound as a window of a larger buffer with random canary words before and after it. The
  words after it sit inside the binding, so even a bounds-checked device catches a kernel that writes past the end
  of its output; a changed canary makes the config `wrong` ("wrote out of bounds").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.space import Config


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted relative Frobenius error, and max abs error as a fraction of max |reference|."""

    rel_fro: float
    max_abs_rel: float


#: per-dtype tolerances (DESIGN.md: fp32 far under 1e-3; f16 staging ~1e-3..1e-2; NF4 vs dequantized ~1e-5)
TOLERANCES: dict[str, Tolerance] = {
    "f32": Tolerance(1e-4, 1e-3),
    "tf32": Tolerance(5e-3, 2e-2),
    "f16": Tolerance(1e-2, 3e-2),
    "bf16": Tolerance(2e-2, 6e-2),
    "nf4": Tolerance(1e-5, 1e-4),
}


@dataclass
class Check:
    """The outcome of one verification."""

    ok: bool
    rel_err: float
    max_abs_err: float
    nan_count: int
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "rel_err": self.rel_err, "max_abs_err": self.max_abs_err, "nan_count": self.nan_count,
                "message": self.message}


def compare(out: np.ndarray, ref: np.ndarray, dtype: str = "f32") -> Check:
    """Compare an output with its float64 reference under the tolerance for `dtype`.

    Args:
        out: what the kernel produced.
        ref: the float64 reference, same shape.
        dtype: tolerance key (see `TOLERANCES`).

    Returns:
        A `Check`; `ok` is False on any NaN/inf, shape mismatch or tolerance breach.
    """
    tol = TOLERANCES.get(dtype)
    if tol is None:
        raise KeyError(f"no tolerance for dtype {dtype!r}; known: {', '.join(TOLERANCES)}")
    if out.shape != ref.shape:
        return Check(False, float("inf"), float("inf"), 0, f"output shape {out.shape} != reference {ref.shape}")
    o = out.astype(np.float64)
    bad = ~np.isfinite(o)
    nan_count = int(bad.sum())
    if nan_count:
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        return Check(False, float("inf"), float("inf"), nan_count,
                     f"{nan_count} of {o.size} outputs not finite (first at {first}): unwritten or overflowed")
    diff = o - ref
    ref_norm = float(np.linalg.norm(ref)) or 1.0
    rel = float(np.linalg.norm(diff)) / ref_norm
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 1.0
    ok = rel <= tol.rel_fro and max_abs <= tol.max_abs_rel * max(scale, 1e-30)
    msg = (f"rel_err {rel:.2e} (tol {tol.rel_fro:.0e}), max_abs_err {max_abs:.2e} "
           f"(tol {tol.max_abs_rel * scale:.2e})")
    if not ok:
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(diff))), diff.shape))
        msg += f"; worst at {worst}: {o[worst]:.6g} vs {ref[worst]:.6g}"
    return Check(ok, rel, max_abs, 0, msg)


GUARD_BYTES = 256  # canary bytes on each side: WebGPU aligns storage-binding offsets to 256 bytes


class Guard:
    """A buffer of `nbytes` bound as a window of a larger allocation, with random canary words around it."""

    def __init__(self, device: Device, nbytes: int, rng: np.random.Generator) -> None:
        self.device, self.nbytes = device, (int(nbytes) + 3) // 4 * 4
        self.base = device.allocate(2 * GUARD_BYTES + self.nbytes)
        self.head = rng.integers(0, 2**32, GUARD_BYTES // 4, dtype=np.uint32)
        self.tail = rng.integers(0, 2**32, GUARD_BYTES // 4, dtype=np.uint32)
        self.window = Buffer(device, self.base.handle, self.nbytes, offset=GUARD_BYTES,
                             bind_nbytes=self.nbytes + GUARD_BYTES)

    def arm(self) -> None:
        """Write the canaries (before each check: a failed check may have overwritten them)."""
        self.device.write(self.base, self.head, 0)
        self.device.write(self.base, self.tail, GUARD_BYTES + self.nbytes)

    def changed(self) -> tuple[int, int]:
        """Canary words changed (before, after) the window."""
        head = self.device.download(self.base, np.uint32, (GUARD_BYTES // 4,))
        tail = self.device.download(self.base, np.uint32, (GUARD_BYTES // 4,), GUARD_BYTES + self.nbytes)
        return int(np.sum(head != self.head)), int(np.sum(tail != self.tail))


def guarding(device: Device) -> bool:
    """Whether verification on `device` runs with guard regions (see the module docstring)."""
    asked = os.environ.get("TILEWISE_GUARD_OUTPUTS", "").strip() == "1"
    return bool(device.supports_windows and (device.unchecked or asked))


class Verifier:
    """Runs checks for one template and shape; makes fresh inputs for every check.

    Large shapes make the float64 reference expensive (4096^3 is 137 GFLOP on the host): templates verify
    those at a smaller shape with the same edge structure (`KernelTemplate.verify_shape`) instead of
    sharing inputs between checks. `reuse` > 1 lets that many consecutive checks share one input set
    (outputs are still re-poisoned); `tilewise tune model` uses 8 for its matmul candidates, whose NF4
    weights cost more to make than a candidate costs to compile.
    """

    def __init__(self, template: KernelTemplate, device: Device, shape: Shape, rng: np.random.Generator,
                 reuse: int | None = None) -> None:
        self.template, self.device, self.shape, self.rng = template, device, shape, rng
        self.reuse = 1 if reuse is None else max(1, int(reuse))
        self._uses = 0
        self.guard = guarding(device)
        self._guards: dict[str, Guard] = {}
        self._host: HostInputs | None = None
        self._ref: np.ndarray | None = None
        self._bufs: DeviceBuffers | None = None
        # keep every buffer set alive: a backend may cache bindings by object identity, and a freed
        # buffer's id can come back for a new one
        self._keep: list[DeviceBuffers] = []

    def _fresh(self) -> None:
        t = self.template
        self._host = t.make_inputs(self.shape, self.rng)
        self._ref = t.reference(self._host, self.shape)
        self._bufs = t.upload(self.device, self._host, self.shape)
        if self.guard:
            self._guards = {}
            for key in ("out", *t.scratch_buffers):
                self._guards[key] = Guard(self.device, self._bufs[key].nbytes, self.rng)
                self._bufs[key] = self._guards[key].window
        self._keep.append(self._bufs)
        self._uses = 0

    def buffers(self) -> DeviceBuffers:
        """The current input/output buffers (timing reuses them after a check)."""
        if self._bufs is None:
            self._fresh()
        assert self._bufs is not None
        return self._bufs

    def check(self, program: Program, config: Config) -> Check:
        """Poison the output, run one config once, compare every value with the float64 reference."""
        if self._bufs is None or self._uses >= self.reuse:
            self._fresh()
        assert self._bufs is not None and self._ref is not None
        self._uses += 1
        t = self.template
        for guard in self._guards.values():
            guard.arm()
        t.poison(self.device, self._bufs, self.shape)
        self.device.run(t.launches(program, self._bufs, config, self.shape))
        broken = {k: g.changed() for k, g in self._guards.items()}
        broken = {k: c for k, c in broken.items() if sum(c)}
        if broken:
            where = "; ".join(f"{k}: {b} canary words before it, {a} after it changed" for k, (b, a) in broken.items())
            return Check(False, float("inf"), float("inf"), 0, f"wrote out of bounds ({where})")
        out = t.read_output(self.device, self._bufs, self.shape)
        return compare(out, self._ref, t.dtype_of(config))


def verify(template: KernelTemplate, device: Device, program: Program, config: Config, shape: Shape,
           rng: np.random.Generator) -> Check:
    """One check of one compiled config on fresh random inputs (see `Verifier` for batches)."""
    return Verifier(template, device, shape, rng, reuse=1).check(program, config)
