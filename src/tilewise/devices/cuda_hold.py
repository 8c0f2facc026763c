"""Holding the GPU while the host enqueues a timed batch, so that no sample contains the host's launch time.

A Python launch takes the host several microseconds, longer than many of the model's kernels run. Timed one after
another, each kernel's start event would reach the GPU before the host had enqueued the kernel, and the sample
would hold the host's time, not the kernel's. A decision (one graph replay) never waits for the host, so such
samples rank small kernels by an overhead the model does not pay. `CUDADevice.time` therefore launches a hold
kernel first: it spins on a word of page-locked host memory until the host has enqueued the batch and written the
batch's ticket there, then every kernel and event of the batch runs back to back (nvbench's blocking kernel does
the same). The hold gives up after `HOLD_TIMEOUT_S`, so a full launch queue can never deadlock the host against
it; `Hold.timeouts` counts such batches, and a batch is at most `HOLD_LAUNCHES` launches so that it fits CUDA's
queue.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

HOLD_LAUNCHES = 64  # launches (each with its two events and perhaps an L2 flush) enqueued behind one hold
HOLD_TIMEOUT_S = 2.0

_SOURCE = r"""
extern "C" __global__ void tilewise_hold(unsigned long long flag_addr, int ticket, unsigned long long timeout_ns) {
  // flag[0]: the ticket the host has released; flag[1]: set when a hold gave up waiting
  volatile int *flag = reinterpret_cast<volatile int *>(flag_addr);
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (flag[0] < ticket) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > timeout_ns) {
      flag[1] = 1;
      __threadfence_system();
      return;
    }
    __nanosleep(2000);
  }
}
"""


class Hold:
    """One device's hold kernel and its host word; `hold()` launches it on the current stream, `release()` lets
    it finish. Host memory allocated by cudaHostAlloc is addressable from the GPU at the same address (unified
    addressing, every 64-bit platform CUDA supports)."""

    def __init__(self, cupy: Any) -> None:
        import cupyx

        self._kernel = cupy.RawKernel(_SOURCE, "tilewise_hold")
        self._flag = cupyx.empty_pinned((2,), np.int32)
        self._flag[:] = 0
        self._ticket = 0
        self.timeouts = 0  # batches whose hold gave up before the host released it

    def hold(self) -> None:
        self._ticket += 1
        self._kernel((1,), (1,), (np.uint64(self._flag.ctypes.data), np.int32(self._ticket),
                                  np.uint64(int(HOLD_TIMEOUT_S * 1e9))))

    def release(self) -> None:
        self._flag[0] = self._ticket

    def check(self) -> None:
        """After the batch has finished: count a hold that gave up, and say so (its samples may hold host time)."""
        if self._flag[1]:
            self.timeouts += 1
            self._flag[1] = 0
            warnings.warn(f"a timed batch waited {HOLD_TIMEOUT_S:g} s for the host to enqueue it; its samples may "
                          "include the host's launch time (another process holding the GPU or the host is the "
                          "usual cause)", stacklevel=3)


def batches(n: int, runs: set[int] | None) -> list[tuple[int, int]]:
    """[start, end) launch ranges of at most about `HOLD_LAUNCHES` each, cut only where a run starts (a candidate's
    launches stay behind one hold); `runs` None means every launch starts a run."""
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, n):
        if i - start >= HOLD_LAUNCHES and (runs is None or i in runs):
            out.append((start, i))
            start = i
    if n:
        out.append((start, n))
    return out
