"""An NVIDIA GPU's SM clock and utilization sampled beside a benchmark, and each traced call set next to the sample
nearest its start: whether a slow stretch of a timed series ran at a low clock.

`ClockLog(path)` runs `nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu,power.draw -lms 50` into `path`
while it is open (nothing where nvidia-smi is missing: `available` says so). `joined(trace, samples)` pairs every
(Unix start, ms, timed) entry of `model.bench.time_calls`' trace with the nearest sample.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path
from typing import Any

QUERY = "timestamp,clocks.sm,utilization.gpu,power.draw"


class ClockLog:
    def __init__(self, path: Path, interval_ms: int = 50) -> None:
        self.path, self.interval_ms = Path(path), interval_ms
        self.available = shutil.which("nvidia-smi") is not None
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ClockLog:
        if self.available:
            self._file = self.path.open("wb")
            self._proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                           f"-lms={self.interval_ms}"], stdout=self._file,
                                          stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._file.close()

    def samples(self) -> list[tuple[float, float, float]]:
        """(Unix time, SM MHz, utilization %) per line; nvidia-smi's timestamp is the host's local time."""
        out = []
        if not self.path.exists():
            return out
        for line in self.path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((t, float(parts[1]), float(parts[2])))
            except (ValueError, IndexError):  # a header, or a line cut short when the log stopped
                continue
        return out


def joined(trace: list[dict[str, Any]], samples: list[tuple[float, float, float]]) -> list[dict[str, Any]]:
    """Each traced call with the SM clock and utilization of the sample nearest its start (None without samples)."""
    rows = []
    for e in trace:
        near = min(samples, key=lambda s: abs(s[0] - e["unix_s"])) if samples else None
        rows.append({**e, "sm_mhz": near[1] if near else None, "util_pct": near[2] if near else None,
                     "sample_offset_s": round(near[0] - e["unix_s"], 3) if near else None})
    return rows
