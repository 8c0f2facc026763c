"""Programmatic dependent launch without a GPU: every kernel of the model's sources waits for its predecessor before
it touches memory another launch writes (a kernel launched with PDL that did not would race), the ctypes structs
match cuda.h byte for byte, the kernel-parameter array points at each argument's bytes, and the device launches
with PDL exactly the kernels that follow a kernel and wait."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tests.unit.test_model_cuda_plan import global_kernels

from tilewise.devices.base import Launch, Program
from tilewise.devices.cuda import CUDADevice, HostCopy
from tilewise.devices.cuda_pdl import (
    PROGRAMMATIC_STREAM_SERIALIZATION,
    LaunchAttribute,
    LaunchConfig,
    kernel_params,
    supports_pdl,
)
from tilewise.kernels.attention.cuda import SOURCE_FILES as ATTENTION_FILES
from tilewise.kernels.cudasrc import model_source
from tilewise.kernels.matmul.cuda import SOURCE_FILES

SOURCES = {"matmul": SOURCE_FILES, "rowops": ("rowops.cu",), "shortconv": ("shortconv.cu",),
           "attention": ATTENTION_FILES}
#: what no launch writes: a kernel may read these before its wait (a matmul's first weight stages)
WEIGHTS = {"w", "absmax", "w_up", "absmax_up"}
#: calls that read only a tensor map's own bytes (a kernel parameter), not the tensor it describes
DESCRIPTOR_ONLY = re.compile(r"tma_prefetch_map\(&\w+\)")


def braced(text: str, start: int) -> int:
    """Index just past the brace block that opens at or after `start`."""
    depth, i = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return i


def device_bodies(text: str) -> dict[str, tuple[list[str], int]]:
    """name -> (parameter declarations, index of the body's brace) of every `__device__ __forceinline__ void`
    function: a kernel whose body is one call of such a function (nf4_mm_wgr and its cluster twin) is checked on
    that function's body."""
    out = {}
    for f in re.finditer(r"__device__ __forceinline__ void (\w+)\(", text):
        close = text.index(")", f.end())
        while text.count("(", f.end(), close) > text[f.end():close].count(")"):  # past nested parentheses
            close = text.index(")", close + 1)
        out[f.group(1)] = ([p.strip() for p in text[f.end():close].split(",")], text.index("{", close))
    return out


def kernels(text: str) -> dict[str, tuple[list[str], str]]:
    """kernel name -> (names of its parameters that carry data other launches write, its body)."""
    out, helpers = {}, device_bodies(text)
    for name, decls, brace in global_kernels(text):
        body = text[brace:braced(text, brace)]
        if "PDL_" not in body and (call := re.search(r"\b(\w+)<[^;]*>\(", body)) and call.group(1) in helpers:
            decls, brace = helpers[call.group(1)]
            body = text[brace:braced(text, brace)]
        data = [p.split()[-1].lstrip("*&") for p in decls if "*" in p or "TmaMap" in p]
        out[name] = ([d for d in data if d not in WEIGHTS], body)
    return out


def touches_before_wait(data: list[str], body: str) -> list[str]:
    """What `body` does with `data` before its first PDL_BEGIN / PDL_WAIT: data names used outside lambda
    definitions, and calls of lambdas whose bodies use data: empty when nothing, ['no wait'] when it never waits."""
    m = re.search(r"PDL_(BEGIN|WAIT)\(\)", body)
    if m is None:
        return ["no wait"]
    pre, lambdas = DESCRIPTOR_ONLY.sub("", body[:m.start()]), {}
    while (d := re.search(r"auto (\w+) = \[&\]\([^)]*\)\s*\{", pre)) is not None:
        end = braced(pre, d.end() - 1)
        lambdas[d.group(1)] = [n for n in data if re.search(rf"\b{n}\b", pre[d.end():end])]
        pre = pre[:d.start()] + pre[end:]
    bad = [n for n in data if re.search(rf"\b{n}\b", pre)]
    return bad + [f"{name}() uses {uses}" for name, uses in lambdas.items() if uses and re.search(rf"\b{name}\(", pre)]


def all_kernels() -> dict[str, tuple[list[str], str]]:
    found: dict[str, tuple[list[str], str]] = {}
    for family, files in SOURCES.items():
        found.update(kernels(model_source(family, *files)))
    return found


def test_every_model_kernel_waits_before_it_touches_what_other_launches_write():
    found = all_kernels()
    assert {"nf4_mm_wgr", "nf4_mm_wg", "nf4_mm_prep", "nf4_mm_reduce_prep", "nf4_mm_splitk_reduce", "embed", "head",
            "copy_words", "copy_pairs", "shortconv", "qknorm_rope", "attention", "attention_tiled",
            "attention_mma"} <= set(found)
    assert len(found) == 24
    for name, (data, body) in found.items():
        assert data, name  # every kernel reads or writes activations
        assert touches_before_wait(data, body) == [], name
    early = {n for n, (_, body) in found.items() if not re.match(r"\{\s*PDL_BEGIN\(\);", body)}
    assert early == {"nf4_mm_wgr", "nf4_mm_wgr_cluster"}  # the one body that copies weights first


def test_the_check_catches_a_kernel_that_reads_x_before_its_wait():
    data, body = all_kernels()["nf4_mm_wgr"]
    loop = "for (int g = 0; g < AHEAD; ++g) issue_x(g);"
    assert loop in body
    moved = body.replace(loop, "").replace("PDL_BEGIN();", loop + "\n  PDL_BEGIN();")
    assert touches_before_wait(data, moved) == ["issue_x() uses ['xmap']"]
    assert touches_before_wait(data, body.replace("PDL_BEGIN();", "")) == ["no wait"]
    assert "tma_prefetch_map(&xmap)" in body  # allowed before the wait: the map's bytes, not the rows
    assert touches_before_wait(data, body.replace("tma_prefetch_map(&xmap)", "tma_box(0, &xmap, 0, 0, 0)")) \
        == ["xmap"]
    _, prep = all_kernels()["nf4_mm_prep"]
    assert touches_before_wait(["x", "xh"], prep.replace("PDL_BEGIN();", "const float y = x[0];\n  PDL_BEGIN();")) \
        == ["x"]


def cuda_h() -> Path | None:
    for root in ("/usr/local/cuda/include", "/usr/include"):
        if (Path(root) / "cuda.h").is_file():
            return Path(root)
    return None


@pytest.mark.skipif(cuda_h() is None or shutil.which("cc") is None, reason="needs cuda.h and a C compiler")
def test_the_launch_structs_match_cuda_h(tmp_path):
    prog = tmp_path / "layout.c"
    prog.write_text(r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu %zu\n", sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, sharedMemBytes),
         offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
         sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value));
  printf("%d\n", (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  return 0;
}
""")
    subprocess.run(["cc", f"-I{cuda_h()}", str(prog), "-o", str(tmp_path / "layout")], check=True)
    lines = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.split("\n")
    want = [int(v) for v in lines[0].split()]
    got = [ctypes.sizeof(LaunchConfig), LaunchConfig.sharedMemBytes.offset, LaunchConfig.hStream.offset,
           LaunchConfig.attrs.offset, LaunchConfig.numAttrs.offset, ctypes.sizeof(LaunchAttribute),
           LaunchAttribute.value.offset]
    assert got == want
    assert int(lines[1]) == PROGRAMMATIC_STREAM_SERIALIZATION


def test_each_kernel_parameter_points_at_its_arguments_bytes(rng):
    ptr = int(rng.integers(1, 2**62))
    n, x = np.int32(rng.integers(-2**31, 2**31)), np.float32(rng.standard_normal())
    tmap = np.frombuffer(rng.bytes(128), dtype=np.dtype((np.void, 128))).copy()
    params, held = kernel_params([ctypes.c_void_p(ptr), n, x, tmap])
    assert ctypes.c_uint64.from_address(params[0]).value == ptr
    assert ctypes.c_int32.from_address(params[1]).value == int(n)
    assert ctypes.c_float.from_address(params[2]).value == float(x)
    assert ctypes.string_at(params[3], 128) == tmap.tobytes()
    assert len(held) == 4
    with pytest.raises(Exception, match="cannot be passed to cuLaunchKernelEx"):
        kernel_params([3.5])


@pytest.mark.parametrize(("cc", "ok"), [(None, False), ("8.6", False), ("8.9", False), ("9.0", True),
                                        ("10.0", True), ("12.1", True)])
def test_pdl_needs_compute_capability_9(cc, ok):
    assert supports_pdl(cc) is ok


def recorded_steps(steps, pdl: bool, device_pdl: bool = True) -> list[bool]:
    """The PDL flag `CUDADevice` launches each step with (no GPU: `_step` is replaced by a recorder)."""
    dev = object.__new__(CUDADevice)
    dev.pdl = device_pdl
    flags: list[bool] = []

    def step(s, use):
        flags.append(use)
        return not isinstance(s, Launch) or all(g > 0 for g in s.grid)

    dev._step = step
    dev._steps(steps, pdl)
    return flags


def test_pdl_goes_to_waiting_kernels_that_follow_a_kernel():
    buf = np.zeros(4, np.int32)

    def kernel(pdl=True, grid=(4, 1, 1), callable_=False):
        meta = {"pdl": pdl, "block": (32, 1, 1), **({"callable": True} if callable_ else {})}
        return Launch(Program("k", None, "h", meta=meta), grid, [])

    copy = HostCopy(buf, None, 16)  # a host copy: never preceded by a kernel's trigger
    steps = [copy, kernel(), kernel(), kernel(pdl=False), kernel(), kernel(callable_=True), kernel(), kernel(),
             kernel(grid=(0, 1, 1)), kernel(), copy]
    assert recorded_steps(steps, True) == [False, False, True, False, True, False, False, True, True, True, False]
    assert not any(recorded_steps(steps, False))
    assert not any(recorded_steps(steps, True, device_pdl=False))  # a GPU without griddepcontrol
