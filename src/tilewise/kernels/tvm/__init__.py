"""What the TVM-scheduled templates share: `sources` (the store of pre-emitted CUDA sources, for machines without
TVM) and `cuda` (lowering a schedule to CUDA C++, reading the emitted kernel, and the emit/compile/launch path of
the TVM-CUDA templates of every family)."""
