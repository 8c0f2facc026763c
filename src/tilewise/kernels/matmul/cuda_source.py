"""The CUDA matmul family's C++ text, the names of the instantiations NVRTC compiles from it, and the positions of
the launch arguments other code rewrites. `cuda.py` (the template) re-exports them."""

from __future__ import annotations

from tilewise.kernels.cudasrc import FMT_CODE, model_source, name_expression
from tilewise.kernels.matmul.cuda_space import (
    EPI_CODE,
    MMA_PARAMS,
    PIPE_PARAMS,
    PREP_NT,
    REDUCE_NT,
    RING_PARAMS,
    ROWS_PARAMS,
    SPLITK_PARAMS,
    WG_PARAMS,
    WGR_PARAMS,
    WS_PARAMS,
)
from tilewise.kernels.space import Config

#: the family's CUDA source files, compiled as one text in this order (the later ones use matmul.cu's helpers)
SOURCE_FILES = ("matmul.cu", "matmul_reduce.cu", "matmul_mma.cu", "matmul_pipe.cu", "matmul_ring.cu",
                "matmul_wgmma_ops.cu", "matmul_wg.cu", "matmul_ws.cu", "matmul_wgr_decode.cu", "matmul_wgr.cu",
                "matmul_rows.cu")

#: positions of the arguments other code sets in a launch of nf4_mm_wgr / nf4_mm_wgr_cluster (matmul_wgr.cu) and of
#: the split-K kernels (matmul_mma.cu): the f16 output (`offers_f16_out`), the norm fold (`cuda_fuse.fold_norm`) and
#: q/k norm + RoPE (`cuda_fuse.fuse_rope`)
WGR_ARGS = {"m": 6, "n": 7, "k": 8, "final_out": 10, "out_h": 12, "ss_in": 13, "eps": 14, "fold_g": 15, "ss_out": 16,
            "rope": 17}
SPLITK_ARGS = {"m": 9, "n": 10, "final_out": 12, "out_h": 14, "fold_g": 15, "ss_out": 16}


def matmul_source() -> str:
    """The family's CUDA C++ text: `SOURCE_FILES` joined."""
    return model_source("matmul", *SOURCE_FILES)


def entry_name(kind: str, fmt: str, epilogue: str, norm: bool, config: Config) -> str:
    """The main kernel's instantiation of one config of a kind, e.g. `nf4_mm_wgr<0, 2, 128, 120, 4, 1, 1, 3, 0>`."""
    head = (FMT_CODE[fmt], EPI_CODE[epilogue], int(norm))
    if kind == "rows":
        return name_expression("nf4_mm_rows", *head, *(config[p] for p in ROWS_PARAMS))
    if kind == "splitk":  # SR 2: the kernel declares its cluster (1, 1, KS)
        name = "nf4_mm_splitk_cluster" if config["SR"] == 2 else "nf4_mm_splitk"
        return name_expression(name, *head, *(config[p] for p in SPLITK_PARAMS))
    if kind == "pipe":
        return name_expression("nf4_mm_pipe", *head, *(config[p] for p in PIPE_PARAMS))
    if kind == "ring":  # the norm is the prologue's (`prep_entry_name`)
        return name_expression("nf4_mm_ring", *head[:2], *(config[p] for p in RING_PARAMS))
    if kind in ("wg", "wgt"):
        return name_expression(f"nf4_mm_{kind}", *head[:2], *(config[p] for p in WG_PARAMS))
    if kind == "ws":
        return name_expression("nf4_mm_ws", *head[:2], *(config[p] for p in WS_PARAMS))
    if kind == "wgr":  # SR 2: the kernel declares its cluster (1, 1, KS)
        name = "nf4_mm_wgr_cluster" if config["SR"] == 2 else "nf4_mm_wgr"
        return name_expression(name, *head[:2], *(config[p] for p in WGR_PARAMS))
    return name_expression("nf4_mm_mma", *head, *(config[p] for p in MMA_PARAMS))


def prep_entry_name(norm: bool) -> str:
    """The f16 prologue of the kinds that read x as f16 rows (normed first with the fused norm)."""
    return name_expression("nf4_mm_prep", int(norm), PREP_NT)


def reduce_entry_name(epilogue: str) -> str:
    """split-K's reduction launch: the slices' sum with the epilogue."""
    return name_expression("nf4_mm_splitk_reduce", EPI_CODE[epilogue], REDUCE_NT)
