"""Seed 000's GPU tiling of the 1D convolution, which the WGSL and the TVM-CUDA templates both implement (each names
its staging scopes in its own language: WGSL's `workgroup`/`private`, TVM's `shared`/`local`):

    NT      threads per block (invocations per workgroup); one block computes TILE = NT * TPT consecutive outputs
    TPT     per-thread tile: each thread owns TPT consecutive outputs (TPT accumulators)
    RK      reduction split: the N taps are walked in steps of RK taps; each step is unrolled
    STAGE   where the operands of one step sit: global memory, the block's shared memory (the TILE + RK - 1
            inputs and RK taps of the step, between barriers) or the thread's registers (its own window of
            TPT + RK - 1 inputs and RK taps; each loaded input feeds up to min(TPT, RK) multiplies)

The counts below are those of this tiling, keyed by the backend's scope name.
"""

from __future__ import annotations

from typing import Any

from tilewise.kernels.space import Config, Rule

#: seed 000's question as (TPT, RK) at NT = 64, asked per staging scope: one output per thread without and with a
#: reduction split, then 4- and 8-output tiles, then a longer step
SEED_TILES = ((1, 1), (1, 8), (4, 8), (8, 8), (4, 16))


def fmt(c: Config) -> str:
    """`128t T4 RK8 private` (TILE = NT * TPT outputs per block)."""
    return f"{c['NT']}t T{c['TPT']} RK{c['RK']} {c['STAGE']}"


def tile(c: Config) -> int:
    """Outputs per block."""
    return c["NT"] * c["TPT"]


def seed_points(stages: tuple[str, ...]) -> list[dict[str, Any]]:
    """The seed space: every `SEED_TILES` entry at NT = 64 in each of the backend's staging scopes."""
    return [{"NT": 64, "TPT": t, "RK": r, "STAGE": s} for s in stages for t, r in SEED_TILES]


def stage_rule(stages: tuple[str, ...]) -> Rule:
    """STAGE is one of the backend's staging scopes."""
    return Rule("stage", lambda c, L: c.STAGE in stages,
                lambda c, L: f"STAGE = {c.STAGE!r} is not one of {', '.join(stages)}")


def registers(c: Config, private: str = "private") -> int:
    """f32 values one thread keeps live: accumulators, plus the register-staged window and taps.

    `private` names the register staging scope (`private` in WGSL, `local` in TVM's CUDA schedules).
    """
    if c["STAGE"] == private:
        return c["TPT"] + (c["TPT"] + c["RK"] - 1) + c["RK"]
    return c["TPT"]


def storage_bytes(c: Config, shared: str = "workgroup") -> int:
    """Shared bytes of one block: the input tile with its RK - 1 halo, plus the RK taps of one step.

    `shared` names the shared staging scope (`workgroup` in WGSL, `shared` in TVM's CUDA schedules).
    """
    return 4 * (tile(c) + c["RK"] - 1 + c["RK"]) if c["STAGE"] == shared else 0


def reduction_split(c: Config, N: int) -> list[str]:
    """The step reads RK taps with no guard, so RK must divide the kernel length N."""
    if N % c["RK"]:
        return [f"reduction_split: N % RK = {N} % {c['RK']} = {N % c['RK']} != 0 (each step reads RK taps unguarded)"]
    return []
