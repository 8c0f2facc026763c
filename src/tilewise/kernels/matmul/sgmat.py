"""The classifier's weight matmuls on subgroup matrices (Dawn's tensor cores from WGSL): kind `sgmat` of
`MatmulProblem`, y = epilogue(norm(x) @ W^T), weights nf4 / f16 / f32, epilogues none / residual / swiglu, the
fused RMSNorm; any M (partial tiles padded with zeros in workgroup memory). It needs `--device dawn`.

Variants (the WGSL is generated per config by `tilewise.kernels.matmul.sgmat_wgsl`):

    FRAG     fragment shape M x N x K, one the adapter offers for f16 -> f32 (gemm-f16's rule, reused)
    SG       invocations per subgroup the kernel assumes (the fragment's subgroup size, 32 on NVIDIA); the
             workgroup's x size SM * SN * SG must be a multiple of the adapter's max subgroup size (rule
             workgroup_x, gemm-f16's)
    SM, SN   subgroups per workgroup along M and N
    FM, FN   result fragments per subgroup along M and N (block tile BM = SM*FM*m, BN = SN*FN*n); swiglu holds
             two accumulators per fragment (gate and up)
    BK       K step: 16, 32 or 64 (a multiple of the fragment's k; NF4 words of 8 weights are decoded one at a
             time with their block's absmax, so BK need not be a whole NF4 block)
    WL       the decoded W tile's layout: "nk" (W's own (N, K) rows; the right operand is loaded col_major) or
             "kn" (stored transposed; loaded row_major): both are offered, measurement picks
    PIPE     1: stage a K step, barrier, multiply, barrier; 2: two buffers of each tile, and each invocation loads
             (and decodes) its share of the next step into registers before this step's multiplies and stores it
             into the other buffer after them, one barrier per step (rule pipe_registers bounds what waits in
             registers); 3: the same two buffers and two sets of registers, so each step's loads are issued two
             steps ahead and land during two steps' multiplies (twice the registers of 2)
    PAD      halves of padding per staged row (0 or 8): x rows BK + PAD apart, W rows BK + PAD (nk) or BN + PAD
             (kn) apart, so that a fragment load's rows fall into different banks; 0 generates the unpadded WGSL
    VS       0: staged tiles are `array<f16>`, stored one half at a time; 1: `array<vec4<u32>>`, each invocation
             packs 8 halves (8 consecutive k of an x row; a chunk of 8 along K of a W row, or in layout kn 8
             columns' chunks transposed into 8 rows of 8) and stores them at once, an eighth of the store
             instructions; the fragment loads read the same tiles in units of 8 halves (Dawn's subgroup-matrix
             loads take arrays of any 32-bit element); same values and rounding, so the same bits as VS = 0
    EP       result fragments per subgroup (and set) the epilogue passes through workgroup memory between two
             barriers: 1, 2 or 4 along N (a divisor of FN); more take more workgroup memory and fewer barriers, the
             same values written
    KS       split-K: 1, or 2 / 4 / 8 slices of K (grid z), their raw sums into the FMA split-K kernel's f32
             scratch and one more launch (`wgsl_rows.splitk_reduce_source`, the FMA kind's) adding them with the
             norm and the epilogue; more workgroups for the narrow, long-K down and out projections at 346 rows
             (swiglu takes at most 4: its scratch holds two sums per output)

Precision: x (after the norm weight) and the weights are rounded to f16 once, products accumulate in f32, so
the tolerance label is `f16` (`tune.verify.TOLERANCES`: relative Frobenius error 1e-2). The rounding error is
relative and does not grow with K (about 4e-4 at K = 4608; `tests/unit/test_matmul_sgmat_space.py` checks it
against a float64 emulation, and that one dropped NF4 block out of 72 fails the tolerance). Inputs must be
within f16's range (|x * g| < 65504): the residual stream of a trained model is, far from it.

Split-K costs a second launch and an M x N (x2 for swiglu) f32 scratch round trip; measurement decides where it
pays, against the FMA split-K kernel too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

from tilewise.devices.base import Device, Launch, Limits, Program
from tilewise.errors import ConfigError
from tilewise.kernels.base import Shape
from tilewise.kernels.gemm import sgmat as gemm_sg
from tilewise.kernels.gemm.sgmat_wgsl import frag
from tilewise.kernels.matmul.problem import EPILOGUES, MatmulProblem
from tilewise.kernels.matmul.sgmat_stage import mm_tile, norm_registers, pipe_registers, pipe_slots, x_slots, x_width
from tilewise.kernels.matmul.sgmat_wgsl import WEIGHT_LAYOUTS, mm_fmt, mm_storage_bytes, sgmat_matmul_source
from tilewise.kernels.matmul.webgpu import MatmulTemplate
from tilewise.kernels.matmul.wgsl import SPLITK_WG, splitk_scratch_bytes
from tilewise.kernels.matmul.wgsl_rows import splitk_reduce_source
from tilewise.kernels.space import Config, Rule, Space
from tilewise.quant.nf4 import FORMATS, KERNEL_BLOCKSIZE

SUBGROUP_MATRIX = gemm_sg.SUBGROUP_MATRIX
KIND = "sgmat"
MAX_NORM_SLOTS = 16  # the fused norm keeps one f32 sum of squares per staged x vec4 in a register
PARAMS: dict[str, list[Any]] = {
    "FRAG": list(gemm_sg.PARAMS["FRAG"]),
    "SG": list(gemm_sg.PARAMS["SG"]),
    "SM": list(gemm_sg.PARAMS["SM"]),
    "SN": list(gemm_sg.PARAMS["SN"]),
    "FM": [1, 2, 3, 4, 6, 8],  # 3 and 6: 384-row tiles (SM 4 x FM 6 x 16), one tile for a 346-row decision
    "FN": [1, 2, 4, 8],
    "BK": [16, 32, 64],
    "WL": list(WEIGHT_LAYOUTS),
    "KS": [1, 2, 4, 8],
    "PAD": [0, 8],
    "PIPE": [1, 2, 3],
    "VS": [0, 1],
    "EP": [1, 2, 4],
}
PAIRED_KS = [1, 2, 4]  # swiglu's scratch holds two sums per output: KS 8 at 512 rows of 4608 would be 151 MB
# a 64x64 tile: 2x2 subgroups of 2x2 16x16x16 fragments, K step 32
BASE: dict[str, Any] = {"FRAG": "16x16x16", "SG": 32, "SM": 2, "SN": 2, "FM": 2, "FN": 2, "BK": 32, "WL": "nk",
                        "KS": 1, "PAD": 0, "PIPE": 1, "VS": 0,
                        "EP": 1}
# hand-picked points, most likely first (`tilewise tune model --budget B` keeps the first B - 1 after the default):
# the fastest measured at a decision's row count first, then tiles that cover 346 rows in one or two row tiles
# (each weight tile is decoded and staged once per row tile: at 128 rows three times)
_TALL = {"FRAG": "16x8x16", "SM": 4, "SN": 4, "FM": 6, "FN": 2, "BK": 16, "WL": "kn", "PAD": 8}  # 384x64
_WIDE = {"FRAG": "16x8x16", "SM": 4, "SN": 4, "FM": 2, "FN": 4, "BK": 16, "WL": "kn", "PAD": 8}  # 128x128
_DOWN = {"FRAG": "16x8x8", "SM": 2, "SN": 2, "FM": 6, "FN": 4, "BK": 16, "PIPE": 2, "KS": 8}  # 192x64, 8 slices
# the decision tune's picks at 346 rows (2026-12-05): gate/up 128x128, in_proj 96x64
_GATE = {"FRAG": "16x8x16", "SM": 4, "SN": 2, "FM": 2, "FN": 8, "BK": 16, "WL": "kn", "PAD": 8, "PIPE": 2}
_INPROJ = {"FM": 3, "PAD": 8, "WL": "kn"}
# lfm2-350m's climbs at 346 rows on an H200 and an H100 (2026-12-05) ended on these: gate/up's 128x128 tile at K
# step 32 with packed stores (0.074 and 0.072 ms against 0.083 for _GATE), and a 96x64 tile in 4 slices for both
# residual projections (down and out_proj). A climb reaches them only from a start a step or two away (one from
# _GATE in kn stopped after 24 steps at 0.084 ms and decided 15% slower), so they are seeds, ahead of the rest.
_GATE32 = {**_GATE, "BK": 32, "WL": "nk", "VS": 1, "PIPE": 1}
_SLICED = {"FM": 3, "KS": 4, "VS": 1, "PAD": 8}
# the measured winners first (each shape's pick, so that a small budget keeps them), then their packed-store twins
# (VS 1), mostly in layout nk: there a chunk of 8 along K is one 16-byte store by one invocation; kn's packed unit
# (8 columns x 8 k) puts a tile's staging on an eighth of the invocations, and with PIPE 2 SwiGLU's two sets of it
# outgrow the prefetch registers; then the twins loading two steps ahead (PIPE 3)
_SEED_VARIANTS: tuple[dict[str, Any], ...] = (
    _GATE32,
    _SLICED,
    {**_INPROJ, "FRAG": "16x8x16"},  # in_proj's pick from 300 rows
    _GATE,
    _DOWN,
    _INPROJ,
    {"PAD": 8, "WL": "kn"},
    {**_GATE, "WL": "nk", "VS": 1},
    {**_DOWN, "VS": 1},
    {**_INPROJ, "VS": 1},
    {**_GATE, "WL": "nk", "VS": 1, "PIPE": 3},
    {**_DOWN, "VS": 1, "PIPE": 3},
    # gate/up's 128x128 tile as 2x4 subgroups of 4x4 fragments: the same 128 accumulator floats (two sets) as
    # 4x2 of 2x8, but 12 fragment loads from workgroup memory per 32 multiplies instead of 18
    {**_GATE, "SM": 2, "SN": 4, "FM": 4, "FN": 4, "WL": "nk", "VS": 1, "PIPE": 3},
    {**_GATE, "SM": 2, "SN": 4, "FM": 4, "FN": 4},
    {**_DOWN, "EP": 4},  # 24 result fragments a subgroup: 6 barrier pairs instead of 24
    {**_GATE, "EP": 2},
    {**_INPROJ, "EP": 2},
    {"PAD": 8, "VS": 1},
    {**_WIDE, "PIPE": 2},
    {**_WIDE, "WL": "nk", "PIPE": 2, "PAD": 0, "VS": 1},  # unpadded: a padded nk tile outgrows 48 KiB (swiglu)
    {**_GATE, "VS": 1, "PIPE": 1},
    {"PAD": 8, "KS": 4},
    {"PAD": 8, "KS": 4, "VS": 1},
    {"SM": 2, "SN": 4, "PIPE": 2, "PAD": 8},
    _WIDE,
    _TALL,
    {**_TALL, "SM": 2, "BK": 32},  # 192x64
    {**_TALL, "KS": 2},
    {**_TALL, "FN": 1},  # 384x32: twice the workgroups
    {"WL": "kn"},
    {"SM": 2, "SN": 4},  # 64x128
    {"FM": 4, "FN": 2},  # 128x64
    {"KS": 4},  # split-K for the narrow long-K projections (N = 1024 at 346 rows: 6 x 16 tiles of 64x64)
    {"PAD": 8},  # rows 16 bytes apart: the fragment loads' rows across banks (gemm-f16's best tiles pad)
    {"PIPE": 2, "PAD": 8},  # the next step's loads in flight during this step's multiplies, one barrier a step
    {"BK": 64},
    {"FM": 1},  # 32x64: more workgroups at few rows
    {"FM": 4, "FN": 4},  # 128x128 (not with swiglu: 256 accumulator floats)
    {"SM": 4, "SN": 2, "FM": 1, "FN": 4, "WL": "kn"},  # 64x128
    {"FRAG": "16x8x16", "FN": 4},
    {"SM": 1, "SN": 4, "FM": 1, "FN": 1},  # 16x64
    {"BK": 16, "FM": 1, "FN": 1},  # 32x32
    {"FRAG": "16x8x8", "FN": 4, "BK": 64},
    {"SM": 4, "SN": 1, "FM": 1, "FN": 2},  # 64x32
    {"KS": 2, "WL": "kn"},
    {"FM": 1, "KS": 4},  # 32x64, 4 slices
    {"FM": 4, "FN": 2, "KS": 4},  # 128x64, 4 slices
    {"BK": 64, "KS": 8},
    {"SM": 2, "SN": 4, "PAD": 8},
    {"FM": 4, "FN": 2, "PAD": 8},
    {"PIPE": 2},
    {"PIPE": 2, "PAD": 8, "KS": 4},
    {"PIPE": 2, "PAD": 8, "WL": "kn"},
)
SEEDS: tuple[dict[str, Any], ...] = tuple({**BASE, **v} for v in _SEED_VARIANTS)


def _acc_floats(c: Config, sets: int) -> float:
    m, n, _ = frag(c)
    return sets * c.FM * c.FN * m * n / c.SG


def sgmat_rules(fmt: str, paired: bool, norm: bool) -> list[Rule]:
    """The rules of one (format, epilogue, norm) variant, device limits included."""
    sets = 2 if paired else 1
    rules = [gemm_sg.rule("fragment_offered"), gemm_sg.rule("workgroup_x"), gemm_sg.rule("fragment_subgroup_size"),
             Rule("k_step", lambda c, _: c.BK % frag(c)[2] == 0,
                  lambda c, _: f"BK={c.BK} is not a multiple of the fragment's k={frag(c)[2]}"),
             Rule("accumulators", lambda c, _: _acc_floats(c, sets) <= gemm_sg.MAX_ACCUMULATOR_FLOATS,
                  lambda c, _: f"accumulators = {sets}*FM*FN*m*n/SG = {sets}*{c.FM}*{c.FN}*{frag(c)[0]}*"
                               f"{frag(c)[1]}/{c.SG} = {_acc_floats(c, sets):g} floats per invocation > "
                               f"{gemm_sg.MAX_ACCUMULATOR_FLOATS} (certain spill)")]
    rules.append(Rule("epilogue_batch", lambda c, _: c.FN % c.EP == 0,
                      lambda c, _: f"EP={c.EP} does not divide FN={c.FN}: the epilogue takes whole batches of a "
                                   "subgroup's fragments along N"))
    rules.append(Rule("pipe_registers",
                      lambda c, _: c.PIPE == 1 or pipe_registers(c, sets) <= gemm_sg.MAX_PREFETCH_WORDS,
                      lambda c, _: f"PIPE={c.PIPE} holds {'2 x (' if c.PIPE == 3 else ''}{pipe_slots(c)[0]} x slots "
                                   f"+ {sets}*{pipe_slots(c)[1]} W units{')' if c.PIPE == 3 else ''} = "
                                   f"{pipe_registers(c, sets)} words per invocation for the "
                                   f"{'next two steps' if c.PIPE == 3 else 'next step'} > "
                                   f"{gemm_sg.MAX_PREFETCH_WORDS}"))
    ks_values = PAIRED_KS if paired else PARAMS["KS"]
    rules.append(Rule("scratch_ks", lambda c, _: c.KS in ks_values,
                      lambda c, _: f"KS={c.KS} is not one of {ks_values}: the split-K scratch holds at most "
                                   f"KS={max(ks_values)} slices of {'2 (paired) ' if paired else ''}M x N"))
    if norm:
        rules.append(Rule("norm_slots", lambda c, _: norm_registers(c) <= MAX_NORM_SLOTS,
                          lambda c, _: f"x slots = ceil(BM*BK/{x_width(c)} / (SM*SN*SG)) = {x_slots(c)}, "
                                       f"{norm_registers(c)} sums of squares > {MAX_NORM_SLOTS} registers of the "
                                       "fused norm"))
    rules += [gemm_sg.rule("invocations"),
              Rule("workgroup_storage", lambda c, L: mm_storage_bytes(c, fmt, paired, norm)
                   <= L.max_workgroup_storage_bytes,
                   lambda c, L: "workgroup storage = " + ("2*(" if c.PIPE > 1 else "")
                                + (f"2*BM*BK + {2 * sets}*BN*BK" if not c.PAD else
                                   f"2*BM*(BK+PAD) + {2 * sets}*" + ("BN*(BK+PAD)" if c.WL == "nk" else "BK*(BN+PAD)"))
                                + (f") [two buffers, PIPE={c.PIPE}]" if c.PIPE > 1 else "")
                                + f" + {4 * sets}*SM*SN*m*n{'*EP' if c.EP > 1 else ''}"
                                f"{' + 64' if fmt == 'nf4' else ''}{' + BM*BK' if norm else ''} = "
                                f"{mm_storage_bytes(c, fmt, paired, norm)} bytes > max_workgroup_storage_bytes "
                                f"{L.max_workgroup_storage_bytes} (BMxBNxBK = {'x'.join(map(str, mm_tile(c)))})",
                   needs_limits=True)]
    return rules


@functools.cache
def sgmat_matmul_space(fmt: str = "nf4", paired: bool = False, norm: bool = False) -> Space:
    """The grid of `PARAMS` under `sgmat_rules`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}")
    return Space(f"{fmt}_matmul.sgmat" + (".paired" if paired else "") + (".norm" if norm else ""),
                 {k: list(v) for k, v in PARAMS.items()}, sgmat_rules(fmt, paired, norm), mm_fmt)


def has_subgroup_matrices(dev: Any) -> bool:
    """The device runs subgroup-matrix shaders (Dawn with the feature enabled and f16 -> f32 fragments)."""
    configs = getattr(dev.info.limits, "subgroup_matrix_configs", None) or ()
    return SUBGROUP_MATRIX in getattr(dev, "enabled_features", ()) and any(
        (c.component_type, c.result_component_type) == ("f16", "f32") for c in configs)


class SgmatMatmul(MatmulTemplate):
    """A `MatmulProblem` on subgroup matrices (see the module docstring); the executor launches it as it launches
    the FMA kernels (same buffers and `dims`, one launch, M from the uniform)."""

    prefer_runtime = "dawn"

    def __init__(self, fmt: str = "nf4", epilogue: str = "none", features: Iterable[str] | None = (),
                 norm: bool = False, eps: float = 1e-5) -> None:
        if fmt not in FORMATS or epilogue not in EPILOGUES:
            raise ValueError(f"unknown matmul variant kind={KIND} fmt={fmt} epilogue={epilogue}")
        self.problem = MatmulProblem(fmt, epilogue, norm, eps)
        self.norm, self.eps = norm, eps
        self.kind, self.fmt, self.epilogue = KIND, fmt, epilogue
        self.features = None if features is None else frozenset(features)
        self.f16_staging = self.f16_arith = False
        self.name = f"{fmt}_matmul.{KIND}.{epilogue}" + (".norm" if norm else "")
        self.scratch_buffers = ("part",)  # split-K's partial sums: poisoned and guarded like "out"
        self.dtype = "f16"  # x and W are rounded to f16 once (see the module docstring)

    def space(self, which: str = "full") -> Space:
        return sgmat_matmul_space(self.fmt, self.epilogue == "swiglu", self.norm)

    def default_config(self) -> Config:
        return self.space().config(BASE)

    def seed_configs(self, limits: Limits | None) -> list[Config]:
        """The default and `SEEDS` at the device's subgroup size (`gemm.sgmat.device_subgroup_size`), each fitted
        to what the device offers where it would be refused as written: its largest f16 -> f32 fragment for one it
        does not offer, and the nearest subgroup grid whose workgroup is a multiple of its max subgroup size (an
        adapter with 8-wide subgroups and a max of 128 needs 16 subgroups)."""
        sg = gemm_sg.device_subgroup_size(limits) if limits is not None else None
        out: list[Config] = []
        for v in (BASE, *SEEDS):
            c = self.space().config({**v, "SG": sg} if sg in PARAMS["SG"] else v)
            if limits is not None:
                c = gemm_sg.fit_to_device(c, limits)
            if c not in out:
                out.append(c)
        return out

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        k = shape[2]
        out = []
        if self.fmt == "nf4" and k % KERNEL_BLOCKSIZE:
            out.append(f"K={k} is not a multiple of {KERNEL_BLOCKSIZE} (one NF4 absmax block per 64 inputs of a row)")
        if config["KS"] == 1 and k % config["BK"]:
            out.append(f"K={k} is not a multiple of BK={config['BK']}: the K loop takes whole steps")
        elif k % (config["KS"] * config["BK"]):
            out.append(f"K={k} is not a multiple of KS*BK = {config['KS']}*{config['BK']}: the K slices take whole "
                       "steps")
        return out

    def source(self, config: Config, shape: Shape | None = None) -> str:
        _, n, k = shape or (1, 64, 64)
        return sgmat_matmul_source(config, self.fmt, self.epilogue, n, k, self.eps if self.norm else None)

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        gemm_sg.require_subgroup_matrices(device, self.name)
        prog = device.compile(self.source(config, shape), "main", name=f"{self.name}[{config}]")
        if config["KS"] > 1:
            eps = self.eps if self.norm else None
            prog.meta["reduce"] = device.compile(splitk_reduce_source(self.epilogue, shape[1], config["KS"], eps,
                                                                      shape[2]),
                                                 "main", name=f"{self.name}.reduce[KS={config['KS']}]")
        return prog

    def scratch_bytes(self, config: Config, m: int, n: int) -> int:
        """Bytes of the split-K scratch at m rows (0 without split-K)."""
        return splitk_scratch_bytes(config, self.epilogue, m, n, self.norm) if config["KS"] > 1 else 0

    def upload(self, device: Device, host: Any, shape: Shape) -> Any:
        """The FMA kernels' buffers plus the split-K scratch for the largest KS of the space (candidates of any KS
        share one input set; `scratch_buffers` poisons and guards it)."""
        bufs = super().upload(device, host, shape)
        m, n, _ = shape
        ks = max(self.space().params["KS"])
        bufs["part"] = device.allocate(splitk_scratch_bytes({"KS": ks}, self.epilogue, m, n, self.norm))
        return bufs

    def launches(self, program: Program, bufs: Any, config: Config, shape: Shape) -> list[Launch]:
        """One launch; with split-K the KS slices into `part` (bound where `out` is), then the reduction."""
        m, n, _ = shape
        bm, bn, _ = mm_tile(config)
        ks = int(config["KS"])
        order = [bufs["part" if b == "out" and ks > 1 else b] for b in self.binding_names()]
        main = Launch(program, (math.ceil(n / bn), math.ceil(m / bm), ks), order)
        if ks == 1:
            return [main]
        return [main, Launch(program.meta["reduce"], (math.ceil(m * n / SPLITK_WG), 1, 1),
                             [bufs["dims"], bufs["part"], bufs["out"]])]

    def tile_waste(self, config: Config, shape: Shape) -> float:
        m, n, _ = shape
        bm, bn, _ = mm_tile(config)
        return math.ceil(m / bm) * bm * math.ceil(n / bn) * bn / (m * n)


def sgmat_templates(dev: Any, fmt: str, epilogue: str, norm: bool = False, eps: float = 1e-5) -> list[SgmatMatmul]:
    """The subgroup-matrix matmul for one problem when `dev` has subgroup matrices, else none."""
    return [SgmatMatmul(fmt, epilogue, dev.enabled_features, norm, eps)] if has_subgroup_matrices(dev) else []


def from_parts(fmt: str, epilogue: str, flags: set[str], features: Iterable[str] | None, eps: float) -> SgmatMatmul:
    """The template a dispatch table's name `<fmt>_matmul.sgmat.<epilogue>[.norm]` stands for."""
    if flags - {"norm"}:
        raise ConfigError(f"{fmt}_matmul.{KIND}.{epilogue} takes no flags but .norm (got {sorted(flags)})",
                          f"expected e.g. nf4_matmul.{KIND}.swiglu.norm")
    try:
        return SgmatMatmul(fmt, epilogue, features, "norm" in flags, eps)
    except ValueError as exc:
        raise ConfigError(f"{fmt}_matmul.{KIND}.{epilogue} is not a matmul kernel name ({exc})",
                          f"expected e.g. nf4_matmul.{KIND}.none") from exc
