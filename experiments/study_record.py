"""What the matmul studies in experiments/ record: a header naming the run, the JSON rewritten after each op (an
interrupted run keeps what it measured), and a markdown table closed by the command that made it."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any


def header(dev: Any, preset: str, **fields: Any) -> dict[str, Any]:
    """The record's first keys: date, device, fingerprint, preset, the study's own `fields`, command, python."""
    return {"date": time.strftime("%Y-%m-%d"), "device": dev.info.name, "fingerprint": dev.info.fingerprint,
            "preset": preset, **fields, "command": " ".join(sys.argv), "python": platform.python_version(), "ops": {}}


def save_op(path: Path, report: dict[str, Any], label: str, entry: dict[str, Any]) -> None:
    """Add one op's results to the record and rewrite its JSON."""
    report["ops"][label] = entry
    path.write_text(json.dumps(report, indent=1, default=str))


def finish(path: Path, lines: list[str], report: dict[str, Any], note: str) -> None:
    """Write and print the markdown table, closed by the run's command, its date and `note`."""
    lines = [*lines, "", f"Command: `{report['command']}`; {report['date']}{note}"]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
