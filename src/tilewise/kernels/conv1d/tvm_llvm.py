"""fp32 1D convolution on the CPU through Apache TVM: the problem's TE definition (`conv1d.problem.conv1d_te`), a
schedule function whose choices are a Space.

    Apad (Mp + N - 1) = a (M) with N-1 zeros on the left (and enough on the right for the padded output)
    out[n] = sum_k Apad[n + N - 1 - k] * w[k]       n < Mp, the output length rounded up to XO
                                                      (= np.convolve(a, w) on its first M + N - 1 values)

Variants (seed 000's CPU schedule, each choice a parameter of `schedule`):

    XO     split factor of the output axis n -> (n_o, n_i); 1 = no split
    KI     split factor of the reduction axis k -> (k_o, k_i); must divide N (no predicated reduction)
    ORDER  "n_k": n_o, n_i, k_o, k_i (reduction innermost: each output a dot product, input walked backwards)
           "k_n": n_o, k_o, k_i, n_i (outputs innermost: the inner loop walks contiguous inputs and outputs)
    VEC    vectorize n_i (legal only when n_i is the innermost loop)
    CACHE  cache_write the output into a local accumulator tile, written back once per n_o
    PAD    where the padded intermediate Apad lives:
             "root"        computed whole, before the convolution (a full round trip through memory)
             "compute_at"  compute_at(Apad, n_o): the producer moves into the consumer's loop nest, so only the
                           window one output tile reads is written, and it is still in cache when read
             "inline"      compute_inline(Apad): no intermediate, a bounds select at every read

The output is computed over Mp = ceil((M+N-1)/XO)*XO positions so that the output split never needs a predicate
(a predicated n_i defeats vectorization); the extra positions read only padding and are dropped by `read_output`.
TVM is imported lazily; without it every entry point raises the install command.
"""

from __future__ import annotations

from typing import Any

from tilewise.devices.base import Device, Launch, Program
from tilewise.errors import ConfigError
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.conv1d.problem import CONV1D, conv1d_te
from tilewise.kernels.space import Config, Rule, Space

OUT_ALIGN = 256  # the output buffer is padded to this multiple, which every XO divides
PARAMS: dict[str, list[Any]] = {
    "XO": [1, 8, 16, 32, 64, 128, 256],
    "KI": [1, 4, 8, 16, 32, 64],
    "ORDER": ["n_k", "k_n"],
    "VEC": [False, True],
    "CACHE": [False, True],
    "PAD": ["root", "compute_at", "inline"],
}
DEFAULT_SHAPE = (16384, 64)  # what `source(config)` shows when no shape is given


def fmt(c: Config) -> str:
    """`n/32 k/8 k_n vec cache pad@compute_at`."""
    return (f"n/{c['XO']} k/{c['KI']} {c['ORDER']}{' vec' if c['VEC'] else ''}{' cache' if c['CACHE'] else ''} "
            f"pad@{c['PAD']}")


def _rules() -> list[Rule]:
    return [
        Rule("order", lambda c, L: c.ORDER in ("n_k", "k_n"),
             lambda c, L: f"ORDER = {c.ORDER!r} is not n_k or k_n"),
        Rule("pad", lambda c, L: c.PAD in ("root", "compute_at", "inline"),
             lambda c, L: f"PAD = {c.PAD!r} is not root, compute_at or inline"),
        Rule("vectorize_innermost", lambda c, L: not c.VEC or (c.ORDER == "k_n" and c.XO > 1),
             lambda c, L: f"VEC needs n_i innermost and longer than 1: ORDER = {c.ORDER}, XO = {c.XO}",
             doc="TVM vectorizes one loop, and only the innermost one becomes vector lanes"),
        Rule("compute_at_needs_split", lambda c, L: c.PAD != "compute_at" or c.XO > 1,
             lambda c, L: "PAD = compute_at with XO = 1 recomputes N-1 padded inputs per output "
                          "(no output tile to attach to)"),
        Rule("cache_needs_split", lambda c, L: not c.CACHE or c.XO > 1,
             lambda c, L: "CACHE with XO = 1 caches one output (no tile to accumulate)"),
    ]


RULES = _rules()


def tvm_conv1d_space(which: str = "full") -> Space:
    """The named spaces: "full" (the grid; "seed" is the same grid), "small" (a quick grid for CI)."""
    if which in ("full", "seed"):
        return Space(which, {k: list(v) for k, v in PARAMS.items()}, list(RULES), fmt)
    if which == "small":
        return Space("small", {"XO": [1, 32], "KI": [1, 8], "ORDER": ["n_k", "k_n"], "VEC": [False, True],
                               "CACHE": [False, True], "PAD": ["root", "compute_at", "inline"]}, list(RULES), fmt)
    raise ConfigError(f"unknown space {which!r} for conv1d (tvm-llvm)", "use --space full or --space small")


def padded_length(M: int, N: int, XO: int) -> int:
    """Output positions computed: M + N - 1 rounded up to a multiple of XO."""
    return -(-(M + N - 1) // XO) * XO


def alloc_length(M: int, N: int) -> int:
    """Output buffer length: M + N - 1 rounded up to OUT_ALIGN (holds every config's padded output)."""
    return padded_length(M, N, OUT_ALIGN)


def schedule(c: Config, M: int, N: int) -> Any:
    """The scheduled TIR module of one config at input length M and kernel length N.

    Args:
        c: a legal config of this template's space.
        M: input length.
        N: kernel length (N <= M).

    Returns:
        `tvm.IRModule` with `main(A (M,), W (N,), B (Mp,))`.
    """
    from tilewise.devices.tvm_llvm import import_tvm

    tvm = import_tvm()
    from tvm import te

    A, W, B = conv1d_te(tvm, M, N, padded_length(M, N, c["XO"]))
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, W, B]))
    blk = sch.get_sblock("B")
    n, kk = sch.get_loops(blk)
    n_o, n_i = sch.split(n, factors=[None, c["XO"]])
    k_o, k_i = sch.split(kk, factors=[None, c["KI"]])
    if c["ORDER"] == "n_k":
        sch.reorder(n_o, n_i, k_o, k_i)
    else:
        sch.reorder(n_o, k_o, k_i, n_i)
    if c["CACHE"]:
        acc = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(acc, n_o)
    if c["VEC"]:
        sch.vectorize(n_i)
    if c["PAD"] == "compute_at":
        sch.compute_at(sch.get_sblock("Apad"), n_o)
    elif c["PAD"] == "inline":
        sch.compute_inline(sch.get_sblock("Apad"))
    return sch.mod


class TvmConv1d(KernelTemplate):
    """Full 1D convolution on the host CPU, scheduled with TVM and built with LLVM (device `tvm-llvm`)."""

    problem = CONV1D
    backend = "tvm-llvm"

    make_space = tvm_conv1d_space
    spaces = ("seed", "full", "small")

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        N = shape[1]
        if N % config["KI"]:
            return [f"reduction_split: N % KI = {N} % {config['KI']} = {N % config['KI']} != 0 "
                    "(a predicated reduction loop)"]
        return []

    def source(self, config: Config, shape: Shape | None = None) -> str:
        M, N = self.problem.check_shape(shape or DEFAULT_SHAPE)
        return str(schedule(config, M, N).script())

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        M, N = self.problem.check_shape(shape)
        return device.compile(schedule(config, M, N), "main", name=f"conv1d-tvm {fmt(config)}")

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N = self.problem.check_shape(shape)
        return {"a": device.upload(host["a"]), "w": device.upload(host["w"]),
                "out": device.allocate(4 * alloc_length(M, N))}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        return [Launch(program, (1, 1, 1), [bufs["a"], bufs["w"], bufs["out"]])]

    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N = self.problem.check_shape(shape)
        return padded_length(M, N, config["XO"]) / (M + N - 1)

    def describe(self, config: Config) -> str:
        return fmt(config)
