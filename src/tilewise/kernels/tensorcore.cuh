// tensorcore.cuh - f16 tensor-core pieces in PTX, shared by the model's matmul and attention kernels: f32 pairs ->
// f16x2, the m16n8k16 mma.sync step and ldmatrix fragment loads from shared memory (sm_80+). PTX, not cuda_fp16.h
// or mma.h: NVRTC compiles the model's sources with no CUDA include path. Prepended to every model source after
// pdl.cuh (`cudasrc.model_source`).
#ifndef TILEWISE_TENSORCORE
#define TILEWISE_TENSORCORE

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  // one cvt.rn.f16x2.f32 (sm_80+) rounds both halves: the first operand lands in the upper half
  unsigned h;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo));
  return h;
}

// one value rounded to f16 as pack2 rounds each half
__device__ __forceinline__ unsigned short f16_bits(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
}

__device__ __forceinline__ void mma_16816(float *d, const unsigned *a, const unsigned *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned smem_addr(const void *p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// four 8x8 f16 matrices; lane l gives the address of row l % 8 of matrix l / 8
__device__ __forceinline__ void ldmatrix_x4(unsigned *r, const unsigned short *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// the same with .trans: lane l's row address, each 8x8 matrix delivered transposed (a row-major K x N tile as the
// col-major B operand)
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned *r, const unsigned short *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

#endif
