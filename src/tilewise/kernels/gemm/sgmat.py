"""f16 GEMM on subgroup matrices (Dawn's tensor cores from WGSL): C (M, N) f32 = A (M, K) f16 @ B (K, N) f16, any
M, N, K. Family `gemm-f16`, backend webgpu; it needs `--device dawn` (the feature exists only there).

Variants (the WGSL is generated per config by `tilewise.kernels.gemm.sgmat_wgsl`):

    FRAG     fragment shape M x N x K of one subgroup-matrix multiply; must be one the adapter offers for
             f16 -> f32 (`Limits.subgroup_matrix_configs`; the H200 offers 16x16x16, 16x8x16 and 16x8x8)
    SG       invocations per subgroup the kernel assumes: one of the fragment's subgroup sizes (32 on NVIDIA). Dawn
             also needs the workgroup's x size (SM * SN * SG) to be a multiple of the adapter's maximum subgroup
             size, which WebGPU reports as 128 on an H200 (and Dawn's Null backend): rule workgroup_x
    SM, SN   subgroups per workgroup along M and N (the workgroup is SM * SN * SG invocations)
    FM, FN   result fragments per subgroup along M and N (block tile BM = SM*FM*m, BN = SN*FN*n)
    KF       fragments per K step (BK = KF * k)
    SA, SB   where A and B fragments come from on interior tiles: "direct" (subgroupMatrixLoad from storage) or
             "workgroup" (the tile is copied into workgroup memory first, then loaded from there)
    PIPE     interior tiles' staging: 1 = one tile per operand, two barriers per K step (copy, then multiply);
             2 = double-buffered: the next step's tile is loaded into registers (8 halves a load) before this
             step's multiplies and stored into the other half after them, one barrier per step; 3 = the same
             halves with two register sets: each step's loads are issued two steps ahead
    PAD      halves of padding per row of a staged interior tile (0 or 8: rows 16 bytes further apart, so that
             consecutive fragment rows fall into other banks)
    VS       0: staged tiles are `array<f16>`, each copied half stored alone; 1: `array<vec4<u32>>`, 8 halves a
             store (interior tiles copy the `vec4<u32>` they load as it is; edge tiles pack 8 guarded halves), and
             the fragment loads step in elements of 8 halves: the same values, so the same bits as VS = 0
    SPLITK   slices of K (grid z): each workgroup sums one slice (whole K steps) into a (SPLITK, M, N) f32
             partial buffer (`scratch_buffers`), a second launch adds the slices into C. For small M, where
             M/BM * N/BN tiles leave most of the GPU idle; refused where the partial buffer would pass
             `MAX_PARTIAL_BYTES`

PIPE = 1, PAD = 0, SPLITK = 1, VS = 0 generate the WGSL these parameters' absence generated (`LEGACY`); a config written
without them (an older dispatch table) takes those values.

Edge handling, the design: one shader, two K loops, picked per workgroup by a uniform flag. Interior tiles (the
block inside C, K a whole number of K steps, K and N multiples of 8 so fragment rows are 16-byte aligned) take the
configured staging and store straight to C. Every other tile stages both operands through workgroup memory with
zero padding and writes each result fragment through a per-subgroup scratch tile with guarded stores. So no
access ever leaves a tensor, any M, N, K is correct, and large aligned shapes run the fast loop everywhere but on
the last row and column of tiles. The cost is workgroup memory for the edge tiles in "direct" configs too (rule
`workgroup_storage` counts it). The alternative, a rule that refuses shapes that are not multiples of the tile,
would make the model's M=346 matmuls untunable.

Robustness: Dawn bounds-checks buffer accesses unless the device disables it (`DawnDevice(disable_robustness=True)`,
never by default); the kernel is correct either way since it never reads past a tensor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Limits, Program
from tilewise.errors import ConfigError, ShaderCompileError
from tilewise.kernels.base import DeviceBuffers, HostInputs, KernelTemplate, Shape
from tilewise.kernels.gemm.problem import GEMM_F16
from tilewise.kernels.gemm.sgmat_wgsl import (
    LEGACY,
    REDUCE_WG,
    fmt,
    frag,
    generate_wgsl,
    invocations,
    prefetch_loads,
    reduce_wgsl,
    storage_bytes,
    tile,
    tile_halves,
)
from tilewise.kernels.space import Config, Rule, Space

MAX_ACCUMULATOR_FLOATS = 128  # f32 result values per invocation above which the accumulators spill
FIX_DAWN = "use --device dawn (wgpudawn on a GPU with subgroup matrices)"
SUBGROUP_MATRIX = "chromium-experimental-subgroup-matrix"  # Dawn's feature name
PARAMS: dict[str, list[Any]] = {
    "FRAG": ["8x8x8", "8x16x16", "16x8x8", "16x8x16", "16x16x16"],
    "SG": [8, 16, 32, 64, 128],
    "SM": [1, 2, 4],
    "SN": [1, 2, 4],
    "FM": [1, 2, 4, 8],
    "FN": [1, 2, 4, 8],
    "KF": [1, 2, 4],
    "SA": ["direct", "workgroup"],
    "SB": ["direct", "workgroup"],
    "PIPE": [1, 2, 3],
    "PAD": [0, 8],
    "SPLITK": [1, 2, 4, 8],
    "VS": [0, 1],
}
BASE = {"FRAG": "16x16x16", "SG": 32, "SM": 2, "SN": 2, "FM": 4, "FN": 4, "KF": 2, "SA": "direct", "SB": "direct",
        **LEGACY}
MAX_PREFETCH_WORDS = 64  # 32-bit registers per invocation holding the next K step (PIPE = 2), beside accumulators
# the partial buffer is sized for the largest SPLITK (candidates share one input set) and must bind whole: WebGPU's
# default maxStorageBufferBindingSize
MAX_PARTIAL_BYTES = 128 * 2**20
# verified here instead of a large shape: interior tiles (fast loop) and edge tiles (guarded loop) for every tile
VERIFY_M, VERIFY_N, VERIFY_K = 517, 1032, 384


def _offered(c: Config, L: Limits | None) -> Any:
    """The adapter's f16 -> f32 config with the config's fragment shape, or None."""
    m, n, k = frag(c)
    for s in (L.subgroup_matrix_configs or ()) if L is not None else ():
        if (s.component_type, s.result_component_type, s.m, s.n, s.k) == ("f16", "f32", m, n, k):
            return s
    return None


def _explain_offered(c: Config, L: Limits | None) -> str:
    if L is None or L.subgroup_matrix_configs is None:
        return (f"this device has no subgroup matrices (Dawn's chromium-experimental-subgroup-matrix with shader-f16 "
                f"and subgroups), so {FIX_DAWN}")
    have = [s.label() for s in L.subgroup_matrix_configs if (s.component_type, s.result_component_type)
            == ("f16", "f32")]
    return f"fragment {c.FRAG} f16->f32 is not offered by this adapter (it offers: {', '.join(have) or 'none'})"


def _held_words(c: Config) -> int:
    """32-bit registers per invocation holding loaded K steps between their loads and their stores."""
    return 4 * sum(prefetch_loads(c)) * (2 if c["PIPE"] == 3 else 1)


def _acc_floats(c: Config) -> float:
    m, n, _ = frag(c)
    return c.FM * c.FN * m * n / c.SG


def device_subgroup_size(limits: Limits) -> int | None:
    """The SG a device runs: the one subgroup size its f16 -> f32 fragments share (32 on NVIDIA), else its maximum
    subgroup size (Dawn's Null backend offers a range)."""
    sizes = {(c.min_subgroup_size, c.max_subgroup_size) for c in limits.subgroup_matrix_configs or ()
             if c.component_type == "f16" and c.result_component_type == "f32"}
    if len(sizes) == 1 and len({*next(iter(sizes))}) == 1:
        return next(iter(sizes))[0]
    return limits.subgroup_size_max


def fit_to_device(c: Config, limits: Limits) -> Config:
    """`c` with the device's largest f16 -> f32 fragment where it names one the device does not offer, and the
    fewest subgroups (keeping SM : SN where it can) that make a workgroup a multiple of the device's max subgroup
    size where it is not; else `c` as it is. Seeds written for one GPU (16x16x16 in 2x2 subgroups of 32) then
    fit an adapter of 8x8x8 fragments in subgroups of 8 (16 subgroups a workgroup)."""
    offered = [f for f in PARAMS["FRAG"] if any((o.component_type, o.result_component_type, o.m, o.n, o.k)
                                                  == ("f16", "f32", *map(int, f.split("x")))
                                                  for o in limits.subgroup_matrix_configs or ())]
    if offered and c["FRAG"] not in offered:
        c = c.replace(FRAG=max(offered, key=lambda f: math.prod(map(int, f.split("x")))))
    top = limits.subgroup_size_max
    if top and (c["SM"] * c["SN"] * c["SG"]) % top:
        grids = [(a, b) for a in PARAMS["SM"] for b in PARAMS["SN"] if (a * b * c["SG"]) % top == 0]
        if grids:  # the fewest subgroups that fit, keeping the seed's SM : SN shape where it can
            a, b = min(grids, key=lambda g: (g[0] * g[1], abs(math.log2(g[0] / g[1]) - math.log2(c["SM"] / c["SN"]))))
            c = c.replace(SM=a, SN=b)
    return c


def _rules() -> list[Rule]:
    def r(name: str, check: Any, explain: Any, needs_limits: bool = False, doc: str = "") -> Rule:
        return Rule(name, check, explain, needs_limits, doc)

    return [
        r("fragment_offered", lambda c, L: _offered(c, L) is not None, _explain_offered, needs_limits=True,
          doc="the fragment shape is one the adapter multiplies (f16 inputs, f32 result)"),
        r("workgroup_x", lambda c, L: L.subgroup_size_max is not None and invocations(c) % L.subgroup_size_max == 0,
          lambda c, L: f"workgroup x = SM*SN*SG = {c.SM}*{c.SN}*{c.SG} = {invocations(c)} is not a multiple of the "
                       f"device's max subgroup size {L.subgroup_size_max} (Dawn's rule for subgroup matrices)",
          needs_limits=True),
        r("fragment_subgroup_size", lambda c, L: _offered(c, L) is None  # refused by fragment_offered already
          or _offered(c, L).min_subgroup_size <= c.SG <= _offered(c, L).max_subgroup_size,
          lambda c, L: f"SG = {c.SG} is outside the subgroup sizes {_offered(c, L).min_subgroup_size}.."
                       f"{_offered(c, L).max_subgroup_size} of fragment {c.FRAG}", needs_limits=True),
        r("accumulators", lambda c, L: _acc_floats(c) <= MAX_ACCUMULATOR_FLOATS,
          lambda c, L: f"accumulators = FM*FN*m*n/SG = {c.FM}*{c.FN}*{frag(c)[0]}*{frag(c)[1]}/{c.SG} = "
                       f"{_acc_floats(c):g} floats per invocation > {MAX_ACCUMULATOR_FLOATS} (certain spill)"),
        r("invocations", lambda c, L: invocations(c) <= min(L.max_invocations_per_workgroup, L.max_workgroup_size[0]),
          lambda c, L: f"SM*SN*SG = {c.SM}*{c.SN}*{c.SG} = {invocations(c)} > max_invocations_per_workgroup "
                       f"{min(L.max_invocations_per_workgroup, L.max_workgroup_size[0])}", needs_limits=True),
        r("pipe_staged", lambda c, L: (c.PIPE, c.PAD) == (1, 0) or "workgroup" in (c.SA, c.SB),
          lambda c, L: f"PIPE={c.PIPE} PAD={c.PAD} shape workgroup-staged tiles, but SA and SB are both direct "
                       "(use PIPE=1 PAD=0, or stage an operand)",
          doc="double buffering and padding act on staged operands only (else duplicates of the plain kernel)"),
        r("packed_staged", lambda c, L: c.get("VS", 0) == 0 or "workgroup" in (c.SA, c.SB),
          lambda c, L: "VS=1 packs workgroup-staged interior tiles, but SA and SB are both direct (use VS=0, or "
                       "stage an operand)",
          doc="with both operands direct only edge tiles stage, and they are few: VS would duplicate the plain kernel"),
        r("prefetch_registers", lambda c, L: _held_words(c) <= MAX_PREFETCH_WORDS,
          lambda c, L: ("PIPE=2 holds the next K step in 4*(ceil(BM*BK/8/WG) + ceil(BK*BN/8/WG)) = "
                        if c.PIPE == 2 else "PIPE=3 holds the next two K steps in 2*4*(ceil(BM*BK/8/WG) + "
                        "ceil(BK*BN/8/WG)) = ") +
                       f"{_held_words(c)} registers per invocation > {MAX_PREFETCH_WORDS} (BMxBNxBK = "
                       f"{'x'.join(map(str, tile(c)))}, WG = {invocations(c)})"),
        r("workgroup_storage", lambda c, L: storage_bytes(c) <= L.max_workgroup_storage_bytes,
          lambda c, L: f"workgroup storage = 2*(As + Bs) + 4*SM*SN*m*n = 2*({tile_halves(c)[0]} + "
                       f"{tile_halves(c)[1]}) + {4 * invocations(c) // c.SG * frag(c)[0] * frag(c)[1]} = "
                       f"{storage_bytes(c)} bytes > max_workgroup_storage_bytes {L.max_workgroup_storage_bytes} "
                       f"(BMxBNxBK = {'x'.join(map(str, tile(c)))}, PIPE={c.PIPE}, PAD={c.PAD})", needs_limits=True),
    ]


RULES = _rules()


def rule(name: str) -> Rule:
    """gemm-f16's rule of that name (fragment offered, workgroup x, subgroup size, invocations): the other
    subgroup-matrix kernels (the classifier's matmuls and attention) take them with the same meaning."""
    return next(r for r in RULES if r.name == name)


def require_subgroup_matrices(device: Any, kernel: str) -> None:
    """ShaderCompileError unless `device` enabled Dawn's subgroup matrices (checked before any WGSL is compiled)."""
    if SUBGROUP_MATRIX not in getattr(device, "enabled_features", ()):
        raise ShaderCompileError(f"{kernel} needs {SUBGROUP_MATRIX}, which {device.info.name} has not enabled",
                                 FIX_DAWN)


def _seed_configs() -> list[dict[str, Any]]:
    """Hand-picked points around the 128x128 tile (2x2 subgroups of 4x4 16x16 fragments) measured on the H200."""
    variants: list[dict[str, Any]] = [
        {},
        {"SA": "workgroup", "SB": "workgroup"},
        {"SA": "workgroup"},
        {"SB": "workgroup"},
        {"KF": 1},
        {"KF": 4},
        {"SM": 4, "FM": 2},
        {"SN": 4, "FN": 2},
        {"SM": 4, "SN": 4, "FM": 2, "FN": 2},
        {"FM": 2, "FN": 2},
        {"FRAG": "16x8x16", "FN": 8},
        {"FRAG": "16x8x16", "FN": 8, "SA": "workgroup", "SB": "workgroup"},
        {"FRAG": "16x8x8", "FN": 8, "KF": 4},
        {"FM": 8, "FN": 2, "SM": 1, "SN": 4},
        # double-buffered staging (one barrier per step, 8-half loads), padded rows, and each alone
        {"SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8},
        {"SA": "workgroup", "SB": "workgroup", "PIPE": 2},
        {"SA": "workgroup", "SB": "workgroup", "PAD": 8},
        {"SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "KF": 1},
        {"SB": "workgroup", "PIPE": 2, "PAD": 8},
        {"SA": "workgroup", "PIPE": 2, "PAD": 8},
        {"FRAG": "16x8x16", "FN": 8, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8},
        {"SM": 4, "FM": 2, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8},
        # the same with packed workgroup stores (8 halves a store): the 4096^3 winner (4x2 subgroups) first
        {"SM": 4, "FM": 2, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "VS": 1},
        {"SM": 4, "FM": 2, "SA": "workgroup", "SB": "workgroup", "PIPE": 3, "PAD": 8, "VS": 1},
        {"SM": 4, "FM": 2, "SA": "workgroup", "SB": "workgroup", "PIPE": 3, "PAD": 8},
        {"SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "VS": 1},
        {"FRAG": "16x8x16", "FN": 8, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "VS": 1},
        {"SA": "workgroup", "SB": "workgroup", "VS": 1},
        # the 4096^3 winner without robustness, climbed to from the points above: a 128x256 tile of 16x8x8
        # fragments in 2x4 subgroups, three stages (4 x 8 fragments: 128 accumulator floats, the most that fit)
        {"FRAG": "16x8x8", "SM": 2, "SN": 4, "FM": 4, "FN": 8, "SA": "workgroup", "SB": "workgroup", "PIPE": 3,
         "PAD": 8},
        {"FRAG": "16x8x8", "SM": 2, "SN": 4, "FM": 4, "FN": 8, "SA": "workgroup", "SB": "workgroup", "PIPE": 3,
         "PAD": 8, "VS": 1},
        # small M: the measured M=346 winners (64x32 and 64x64 tiles of 16x8x8 fragments) with K split, and
        # 64x64 / 128x128 tiles split
        {"FRAG": "16x8x8", "SM": 4, "SN": 4, "FM": 1, "FN": 1, "KF": 2, "SA": "workgroup", "SB": "workgroup",
         "SPLITK": 2},
        {"FRAG": "16x8x8", "SM": 4, "SN": 4, "FM": 1, "FN": 1, "KF": 2, "SA": "workgroup", "SB": "workgroup",
         "SPLITK": 4},
        {"FRAG": "16x8x8", "SM": 4, "SN": 4, "FM": 1, "FN": 2, "KF": 2, "SA": "workgroup", "SB": "workgroup",
         "PIPE": 2, "PAD": 8, "SPLITK": 4},
        {"FM": 2, "FN": 2, "SPLITK": 4},
        {"FM": 2, "FN": 2, "SPLITK": 8},
        {"FM": 2, "FN": 2, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "SPLITK": 4},
        {"FM": 2, "FN": 2, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "SPLITK": 4, "VS": 1},
        {"SPLITK": 2},
        {"SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8, "SPLITK": 4},
        # 32-row tiles (2 rows of subgroups of one 16-row fragment), direct and split
        {"SM": 2, "SN": 2, "FM": 1, "FN": 4, "SPLITK": 4},
        {"SM": 2, "SN": 2, "FM": 1, "FN": 4, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8},
    ]
    return [{**BASE, **v} for v in variants]


SPACES = ("seed", "full")


@functools.cache
def sgmat_space(which: str = "full") -> Space:
    """"seed" (the hand-picked points) or "full" (the grid); both under `RULES`."""
    if which == "full":
        return Space("full", {k: list(v) for k, v in PARAMS.items()}, list(RULES), fmt)
    if which == "seed":
        return Space("seed", {k: list(v) for k, v in PARAMS.items()}, list(RULES), fmt, points=_seed_configs())
    raise ConfigError(f"unknown space {which!r} for gemm-f16", f"use --space with one of: {', '.join(SPACES)}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def partial_bytes(M: int, N: int) -> int:
    """Bytes of the split-K partial buffer at the largest SPLITK."""
    return max(PARAMS["SPLITK"]) * M * N * 4


# Dawn sizes each storage binding's minimum from the fragments the shader loads or stores through it (512 bytes
# for a 16x16 f16 fragment, 1 KiB for an f32 one), so small matrices get buffers of at least this many bytes
MIN_BINDING_BYTES = 4096


def _upload_padded(device: Device, array: np.ndarray) -> Any:
    """An f16 matrix in a buffer rounded up to 16 bytes (so that it also binds as `array<vec4<f16>>`) and to at
    least `MIN_BINDING_BYTES`."""
    data = np.ascontiguousarray(array, dtype=np.float16)
    buf = device.allocate(max(MIN_BINDING_BYTES, -(-data.nbytes // 16) * 16))
    device.write(buf, data)
    return buf


class SgmatGemmF16(KernelTemplate):
    """f16 GEMM on Dawn's subgroup matrices, generated per config (see the module docstring)."""

    problem = GEMM_F16
    backend = "webgpu"
    prefer_runtime = "dawn"  # subgroup matrices exist only through Dawn

    make_space = sgmat_space
    spaces = SPACES
    #: verification guards this beside "out" (split-K configs write their slices there)
    scratch_buffers = ("partial",)

    def default_config(self) -> Config:
        """The 128x128 tile (2x2 subgroups of 4x4 16x16x16 fragments, loaded straight from storage)."""
        return sgmat_space("full").config(BASE)

    def verify_shape(self, config: Config, shape: Shape) -> Shape:
        """A cheaper shape with both loops: interior and edge tiles in M and N for every legal tile (BM, BN <= 512),
        K a multiple of every K step where the timed shape's is (else not, so the edge loop runs everywhere, as it
        will at the timed shape)."""
        _, N, K = (int(s) for s in shape)
        _, _, bk = tile(config)
        aligned_k = K % bk == 0 and K % 8 == 0
        small = (VERIFY_M, VERIFY_N if N % 8 == 0 else VERIFY_N - 2, VERIFY_K if aligned_k else VERIFY_K + 5)
        return shape if self.flops(shape) <= self.flops(small) else small

    def config_of(self, values: Mapping[str, Any]) -> Config:
        """A config from plain values; PIPE, PAD and SPLITK left out (written before they existed) take the values
        that generate the same WGSL."""
        return super().config_of({**{k: v for k, v in LEGACY.items() if k not in values}, **values})

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        M, N, _ = shape
        if config["SPLITK"] > 1 and partial_bytes(M, N) > MAX_PARTIAL_BYTES:
            return [f"splitk_partial: the partial buffer {max(PARAMS['SPLITK'])}*M*N*4 = {partial_bytes(M, N)} "
                    f"bytes at M={M}, N={N} > {MAX_PARTIAL_BYTES} (split K only for small M*N; use SPLITK=1)"]
        return []

    def sources(self, config: Config) -> list[str]:
        """The WGSL modules of one config: the GEMM, then (SPLITK > 1) the reduction of its slices."""
        return [generate_wgsl(config), *([reduce_wgsl(config)] if config["SPLITK"] > 1 else [])]

    def source(self, config: Config, shape: Shape | None = None) -> str:
        """The GEMM's WGSL; split-K configs append the reduction module after a `// ----` line."""
        return "\n// ---- second module: the split-K reduction ----\n".join(self.sources(config))

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        return config  # M, N and K come in a uniform

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        main, *rest = self.sources(config)
        prog = device.compile(main, "main", name=f"gemm-f16 {fmt(config)}")
        if rest:
            prog.meta["reduce"] = device.compile(rest[0], "main", name=f"gemm-f16 reduce splitk{config['SPLITK']}")
        return prog

    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        M, N, K = shape
        partial = partial_bytes(M, N)
        return {"a": _upload_padded(device, host["a"]), "b": _upload_padded(device, host["b"]),
                "out": device.allocate(max(MIN_BINDING_BYTES, 4 * M * N)),
                # for the largest SPLITK (one input set serves every candidate); unused where no split is legal
                "partial": device.allocate(max(MIN_BINDING_BYTES, partial if partial <= MAX_PARTIAL_BYTES else 0)),
                "dims": device.upload(np.array([M, N, K, 0], dtype=np.uint32), uniform=True)}

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        M, N, _ = shape
        bm, bn, _ = tile(config)
        split = config["SPLITK"] > 1
        order = [bufs["a"], bufs["b"], bufs["partial" if split else "out"], bufs["dims"]]
        order += [bufs["a"]] if config["SA"] == "workgroup" else []  # A4 / A8: A as vec4<f16> / vec4<u32>
        order += [bufs["b"]] if config["SB"] == "workgroup" else []
        main = Launch(program, (_ceil(N, bn), _ceil(M, bm), config["SPLITK"]), order)
        if not split:
            return [main]
        return [main, Launch(program.meta["reduce"], (_ceil(M * N, REDUCE_WG), 1, 1),
                             [bufs["dims"], bufs["partial"], bufs["out"]])]

    def tile_waste(self, config: Config, shape: Shape) -> float:
        M, N, _ = shape
        bm, bn, _ = tile(config)
        return (_ceil(M, bm) * bm * _ceil(N, bn) * bn) / (M * N)
