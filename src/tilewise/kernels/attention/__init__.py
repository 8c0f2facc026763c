"""Attention of the classifier: `problem.py` (the math and float64 references), `webgpu.py` (the WGSL kernels)."""

from tilewise.kernels.attention.problem import AttentionProblem, attention_ref, qknorm_rope_ref, rope_table
from tilewise.kernels.attention.webgpu import (
    ATTN_BINDINGS,
    DEFAULT_ATTN,
    ROPE_BINDINGS,
    AttentionTemplate,
    attention_grid,
    attention_source,
    attention_space,
    attention_storage_bytes,
    qknorm_rope_source,
)

__all__ = ["ATTN_BINDINGS", "DEFAULT_ATTN", "ROPE_BINDINGS", "AttentionProblem", "AttentionTemplate",
           "attention_grid", "attention_ref", "attention_source", "attention_space", "attention_storage_bytes",
           "qknorm_rope_ref", "qknorm_rope_source", "rope_table"]
