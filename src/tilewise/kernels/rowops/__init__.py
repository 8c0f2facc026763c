"""Row-wise ops of the classifier (RMSNorm, embedding gather, final norm + head, word copies)."""

from tilewise.kernels.rowops.problem import EmbedProblem, HeadProblem, RMSNormProblem, rmsnorm_ref
from tilewise.kernels.rowops.webgpu import (
    BINDINGS,
    EmbedTemplate,
    HeadTemplate,
    RMSNormTemplate,
    copy2_source,
    copy_grid,
    copy_source,
    default_wg,
    embed_source,
    head_source,
    rmsnorm_source,
)

__all__ = ["BINDINGS", "EmbedProblem", "EmbedTemplate", "HeadProblem", "HeadTemplate", "RMSNormProblem",
           "RMSNormTemplate", "copy2_source", "copy_grid", "copy_source", "default_wg", "embed_source", "head_source",
           "rmsnorm_ref", "rmsnorm_source"]
