"""The block tiling of the fused depthwise-separable conv2d that the WGSL and the TVM-CUDA templates both implement
(each names its staging scopes in its own language):

    BW, BO   block tile: one block computes BW consecutive pixels of one output row for BO output channels; the
             grid is (ceil(Wo/BW) pixel tiles, B * Ho rows, ceil(O/BO) channel tiles)
    TPX, TO  per-thread tile: TPX consecutive pixels x TO output channels (TPX*TO accumulators), so a block has
             NT = (BO/TO) * (BW/TPX) threads
    RC       reduction split: input channels are walked in steps of RC (unrolled), which must divide C

The depthwise result of a step never goes to global memory. Partial pixel and channel tiles are guarded.
"""

from __future__ import annotations

from typing import Any

from tilewise.kernels.dwsep_conv2d.problem import DwsepShape
from tilewise.kernels.space import Config, Rule

#: the tile values of both backends' grids (each adds its own staging scopes)
TILE_PARAMS: dict[str, list[Any]] = {
    "BW": [8, 16, 32, 64],
    "TPX": [1, 2, 4],
    "BO": [4, 8, 16, 32, 64],
    "TO": [1, 2, 4, 8],
    "RC": [1, 2, 4, 8],
}
SMALL_TILES: dict[str, list[Any]] = {"BW": [16], "TPX": [1, 4], "BO": [8], "TO": [1, 4], "RC": [1, 4]}  # quick


def fmt(c: Config) -> str:
    """`32px x 16oc T4x4 RC4 private` (block tile, per-thread pixels x channels, reduction step, staging)."""
    return f"{c['BW']}px x {c['BO']}oc T{c['TPX']}x{c['TO']} RC{c['RC']} {c['STAGE']}"


def threads(c: Config) -> int:
    """Threads per block: (BO/TO) channel groups x (BW/TPX) pixel strips (valid once the split rules pass)."""
    return (c["BO"] // c["TO"]) * (c["BW"] // c["TPX"])


def seed_points(stages: tuple[str, ...], tiles: tuple[tuple[int, ...], ...]) -> list[dict[str, Any]]:
    """Each (BW, TPX, BO, TO, RC) of `tiles` in each staging scope."""
    return [dict(zip(("BW", "TPX", "BO", "TO", "RC"), t), STAGE=s) for s in stages for t in tiles]


def tile_split_rules(stages: tuple[str, ...]) -> list[Rule]:
    """The staging choice (one of the backend's `stages`) and the tile splits."""
    return [
        Rule("stage", lambda c, L: c.STAGE in stages,
             lambda c, L: f"STAGE = {c.STAGE!r} is not one of {', '.join(stages)}"),
        Rule("pixel_split", lambda c, L: c.BW % c.TPX == 0,
             lambda c, L: f"BW % TPX = {c.BW} % {c.TPX} = {c.BW % c.TPX} != 0",
             doc="the pixel tile splits into whole per-thread strips"),
        Rule("channel_split", lambda c, L: c.BO % c.TO == 0,
             lambda c, L: f"BO % TO = {c.BO} % {c.TO} = {c.BO % c.TO} != 0",
             doc="the output-channel tile splits into whole per-thread groups"),
    ]


def split_problems(c: Config, d: DwsepShape, max_grid: int, rows: str, channels: str) -> list[str]:
    """What the tiling assumes of a shape: RC divides C (a step reads RC input channels with no guard), and the grid's
    rows (B * Ho) and channel tiles (ceil(O/BO)) fit the backend's `max_grid` blocks per dimension (`rows` and
    `channels` name them in the backend's words)."""
    problems = []
    if d.C % c["RC"]:
        problems.append(f"reduction_split: C % RC = {d.C} % {c['RC']} = {d.C % c['RC']} != 0 "
                        "(each step reads RC channels unguarded)")
    if d.B * d.Ho > max_grid:
        problems.append(f"grid_rows: B*Ho = {d.B}*{d.Ho} = {d.B * d.Ho} > {max_grid} {rows}")
    if -(-d.O // c["BO"]) > max_grid:
        problems.append(f"grid_channels: ceil(O/BO) = {-(-d.O // c['BO'])} > {max_grid}{channels}")
    return problems


def grid(c: Config, d: DwsepShape) -> tuple[int, int, int]:
    """(ceil(Wo/BW), B*Ho, ceil(O/BO)) blocks."""
    return -(-d.Wo // c["BW"]), d.B * d.Ho, -(-d.O // c["BO"])


def tile_waste(c: Config, d: DwsepShape) -> float:
    """Launched (pixels x channels) of a row over useful ones: the partial last pixel and channel tiles."""
    bw, bo = c["BW"], c["BO"]
    return (-(-d.Wo // bw) * bw * -(-d.O // bo) * bo) / (d.Wo * d.O)
