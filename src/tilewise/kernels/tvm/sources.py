"""A directory of TVM-emitted CUDA sources, so a machine without TVM can run the TVM-scheduled CUDA templates.

TVM emits CUDA C++ without a GPU; the GPU machine compiles it with NVRTC without TVM. The store joins the two:

    TILEWISE_TVM_CUDA_SOURCES=DIR     one `.cu` file per (template, config, shape, arch)

Each file is named `<template>-<arch>-<digest>.cu`, the digest a hash of the key, and starts with one header line

    // tilewise-tvm-cuda-source {"template": ..., "config": {...}, "shape": [...], "arch": "sm_90", "tvm": "0.27.0",
                                 "sha256": <hash of the source below the header>, "digest": ...}

followed by the source exactly as TVM emitted it. `emitted_source` is the policy the templates' `compile` and
`source` use:

* TVM importable: emit; when the variable is set, also write the file (a temporary file, then `os.replace`).
* TVM not importable: read the file; a missing file is a `DeviceUnavailable` naming the key and the command that
  emits it (`tools/tvm_cuda_emit.py`, run where TVM is installed).
* A file whose header does not match its key, or whose source does not match the header's hash, is a
  `ConfigError` naming the file: it is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilewise import files
from tilewise.errors import ConfigError, DeviceUnavailable

ENV = "TILEWISE_TVM_CUDA_SOURCES"
HEADER = "// tilewise-tvm-cuda-source "
EMIT_SCRIPT = "tools/tvm_cuda_emit.py"
INDEX = "index.json"
#: the templates whose kernels TVM emits, as `tools/tvm_cuda_emit.py --template` names them
TEMPLATES = ("conv1d", "gemm-tvm", "dwsep-conv2d")


@dataclass(frozen=True)
class SourceKey:
    """What an emitted source depends on: template name, config, shape (the kernels are specialised) and arch."""

    template: str
    config: tuple[tuple[str, Any], ...]  # (name, value) in the space's parameter order
    shape: tuple[int, ...]
    arch: str

    @classmethod
    def make(cls, template: str, config: Mapping[str, Any], shape: Sequence[int], arch: str) -> SourceKey:
        return cls(str(template), tuple((str(k), v) for k, v in config.items()), tuple(int(s) for s in shape),
                   str(arch))

    def as_dict(self) -> dict[str, Any]:
        return {"template": self.template, "config": dict(self.config), "shape": list(self.shape), "arch": self.arch}

    @property
    def digest(self) -> str:
        """A stable hash of the key (config order does not matter)."""
        payload = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:20]

    @property
    def filename(self) -> str:
        return f"{self.template}-{self.arch}-{self.digest}.cu"

    def config_text(self) -> str:
        """`NT=64,TPT=4,RK=8,STAGE=local` (the store key form of a config)."""
        return ",".join(f"{k}={v}" for k, v in self.config)

    def describe(self) -> str:
        return (f"{self.template} {self.config_text()} at shape {','.join(map(str, self.shape))} "
                f"for {self.arch}")

    def emit_command(self, out: str = "DIR") -> str:
        """The command that emits exactly this key into `out` (on a machine with TVM)."""
        return (f"python {EMIT_SCRIPT} --arch {self.arch} --out {out} --template {self.template} "
                f"--shapes {','.join(map(str, self.shape))} --config {self.config_text()}")


def store_dir() -> Path | None:
    """The store named by TILEWISE_TVM_CUDA_SOURCES, or None when the variable is unset or empty."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def tvm_version() -> str | None:
    """The importable TVM's version, or None when TVM cannot be imported (never raises)."""
    from tilewise.devices.tvm_llvm import import_tvm

    try:
        tvm = import_tvm()
    except DeviceUnavailable:
        return None
    return str(getattr(tvm, "__version__", "unknown"))


def tvm_available() -> bool:
    return tvm_version() is not None


def _body_hash(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def render(key: SourceKey, source: str, tvm: str | None) -> str:
    """The file text for `key`: the header line, then the source as emitted."""
    meta = {**key.as_dict(), "tvm": tvm or "unknown", "sha256": _body_hash(source), "digest": key.digest}
    return HEADER + json.dumps(meta) + "\n" + source  # the config keeps its parameter order


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, making its folder first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, text)


def write(store: Path, key: SourceKey, source: str, tvm: str | None) -> tuple[Path, bool]:
    """Store `source` for `key`; returns (path, whether the file changed). An identical file is left alone."""
    path = Path(store) / key.filename
    text = render(key, source, tvm)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path, False
    except (OSError, UnicodeDecodeError):
        pass
    write_atomic(path, text)
    return path, True


def _corrupt(path: Path, why: str) -> ConfigError:
    return ConfigError(f"TVM-CUDA source store file {path} is unusable: {why}",
                       f"delete it and emit it again with TVM (python {EMIT_SCRIPT} --arch ARCH --out "
                       f"{path.parent}), or point {ENV} at another store")


def parse(path: Path) -> tuple[dict[str, Any], str]:
    """(header, source) of one store file, checked against itself (the source against the header's hash).

    Raises:
        ConfigError: no header, an unreadable header, or a source whose hash differs from the header's.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _corrupt(Path(path), f"cannot read it ({exc})") from exc
    first, nl, body = text.partition("\n")
    if not first.startswith(HEADER) or not nl:
        raise _corrupt(Path(path), f"the first line is not a `{HEADER.strip()} {{...}}` header")
    try:
        meta = json.loads(first[len(HEADER):])
    except json.JSONDecodeError as exc:
        raise _corrupt(Path(path), f"its header is not JSON ({exc})") from exc
    if not isinstance(meta, dict) or not {"template", "config", "shape", "arch", "sha256"} <= set(meta):
        raise _corrupt(Path(path), "its header lacks template, config, shape, arch or sha256")
    if meta["sha256"] != _body_hash(body):
        raise _corrupt(Path(path), "the source does not match the sha256 in its header (truncated or edited)")
    return meta, body


def header_key(meta: Mapping[str, Any]) -> SourceKey:
    return SourceKey.make(meta["template"], meta["config"], meta["shape"], meta["arch"])


def read(store: Path, key: SourceKey) -> str | None:
    """The stored source for `key`, or None when its file does not exist.

    Raises:
        ConfigError: the file exists but is corrupt, or its header names another key (names the file).
    """
    path = Path(store) / key.filename
    if not path.exists():
        return None
    meta, body = parse(path)
    if header_key(meta).as_dict() != key.as_dict():
        raise _corrupt(path, f"its header is for {header_key(meta).describe()}, not {key.describe()}")
    return body


def entries(store: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(path, header) of every `.cu` file of the store, sorted by name; a corrupt file raises (naming it)."""
    root = Path(store)
    if not root.is_dir():
        return
    for path in sorted(root.glob("*.cu")):
        meta, _ = parse(path)
        if path.name != header_key(meta).filename:
            raise _corrupt(path, f"its header is for {header_key(meta).describe()}, stored as "
                                 f"{header_key(meta).filename}")
        yield path, meta


def stored_configs(template: str, shape: Sequence[int], arch: str, store: Path | None = None
                   ) -> list[dict[str, Any]]:
    """The configs stored for (template, shape, arch), sorted by their key text; [] without a store."""
    root = store if store is not None else store_dir()
    if root is None:
        return []
    want = (template, [int(s) for s in shape], arch)
    found = [meta["config"] for _, meta in entries(root)
             if (meta["template"], [int(s) for s in meta["shape"]], meta["arch"]) == want]
    return sorted(found, key=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))


def missing(keys: Sequence[SourceKey], store: Path | None = None) -> list[SourceKey]:
    """The keys that have no file in the store (every key when there is no store)."""
    root = store if store is not None else store_dir()
    if root is None:
        return list(keys)
    return [k for k in keys if not (Path(root) / k.filename).exists()]


def write_index(store: Path) -> Path:
    """Write `index.json` ({"sources": [{file, template, config, shape, arch, tvm}, ...]}) for people to read.

    The `.cu` headers are what `read` trusts; the index is a summary rebuilt from them.
    """
    rows = [{"file": p.name, **{k: meta.get(k) for k in ("template", "config", "shape", "arch", "tvm")}}
            for p, meta in entries(store)]
    path = Path(store) / INDEX
    write_atomic(path, json.dumps({"env": ENV, "sources": rows}, indent=1) + "\n")
    return path


def emitted_source(key: SourceKey, emit: Callable[[], str]) -> str:
    """The CUDA source for `key`: TVM's emission when TVM imports (stored too when TILEWISE_TVM_CUDA_SOURCES is
    set), else the stored file.

    Args:
        key: template, config, shape and arch of the kernel.
        emit: emits the source with TVM (called only when TVM imports).

    Raises:
        DeviceUnavailable: TVM is not importable and the store has no file for the key (names the key, the
            expected file and the command that emits it).
        ConfigError: the key's store file is corrupt or belongs to another key.
        ShaderCompileError: TVM could not lower the schedule.
    """
    from tilewise.devices.tvm_llvm import TVM_INSTALL

    store = store_dir()
    version = tvm_version()
    if version is not None:
        source = emit()
        if store is not None:
            write(store, key, source, version)
        return source
    if store is None:
        raise DeviceUnavailable(
            f"Apache TVM is not installed; the TVM-scheduled CUDA templates (conv1d, gemm-tvm and dwsep-conv2d on "
            f"cuda) need it to emit their kernels, and {ENV} is not set, so there is no pre-emitted source for "
            f"{key.describe()}",
            f"{TVM_INSTALL}; or, on a machine with TVM, run `python {EMIT_SCRIPT} --arch {key.arch} --out DIR` "
            f"and set {ENV}=DIR here")
    source = read(store, key)
    if source is None:
        raise DeviceUnavailable(
            f"Apache TVM is not installed and the TVM-CUDA source store {store} ({ENV}) has no source for "
            f"{key.describe()} (expected file {key.filename})",
            f"on a machine with TVM run `{key.emit_command(str(store))}` (or `python {EMIT_SCRIPT} --arch "
            f"{key.arch} --out {store}` for the configs and shapes the tests and ladders use) and copy the store "
            f"here; or {TVM_INSTALL}")
    return source
