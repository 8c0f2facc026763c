// cuda_tc.cu - an experiment apart from the kernel family: what an mma.sync matmul fed by a cp.async ring reaches
// when x arrives in f16 (converted once, in a prologue kernel) instead of f32 converted by every column tile.
// Driven by experiments/cuda_tc.py. (The family's `ring` kind, kernels/matmul/matmul_ring.cu, grew out of it.)
//
// Variants (template arguments):
//   WFMT 1  W f16 (N, K): both operands straight from the ring by ldmatrix, no conversion pass at all;
//   WFMT 0  W nf4 (bitsandbytes layout, absmax per 64): the raw nibbles ride the ring (a quarter of f16's bytes)
//           and each warp decodes its B fragments in registers (f32 code table in shared memory, one rounding);
//   BM x BN block tile, BK per step, WM x WN per warp, ST ring stages, MB blocks per SM in the launch bound.
// prep_x16<NORM>: xh (M, K) f16 = x (times 1/rms(x) * norm_w with NORM), one block per row.

#define WARPSIZE 32

__device__ __constant__ float NF4_CODE_TC[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f};

__device__ __forceinline__ unsigned pk2(float lo, float hi) {
  unsigned h;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo));
  return h;
}

__device__ __forceinline__ unsigned saddr(const void *p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

__device__ __forceinline__ void ldm_x4(unsigned *r, const unsigned short *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(saddr(p)));
}

__device__ __forceinline__ void mma16816(float *d, const unsigned *a, const unsigned *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cpa16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cpa4(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(saddr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cpa_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// bytes of one ring stage: x (BM, BK + 8) f16, then W: f16 (BN, BK + 8) or nf4 raw (BN, BK / 2) + absmax (BN,)
__host__ __device__ constexpr int tc_stage_bytes(int WFMT, int BM, int BN, int BK) {
  return BM * (BK + 8) * 2 + (WFMT == 1 ? BN * (BK + 8) * 2 : BN * (BK / 2) + BN * 4);
}
__host__ __device__ constexpr int tc_smem_bytes(int WFMT, int BM, int BN, int BK, int ST) {
  return ST * tc_stage_bytes(WFMT, BM, BN, BK) + 16 * 4;
}

// the kernel body; cuda_tc.py emits one extern "C" __global__ wrapper per config (with its launch bound), so a
// cubin built ahead of time by nvcc has plain entry names
template <int WFMT, int BM, int BN, int BK, int WM, int WN, int ST>
__device__ __forceinline__ void tc_mm(const unsigned short *__restrict__ xh, const unsigned char *__restrict__ w, const float *__restrict__ absmax,
      float *__restrict__ out, int M, int N, int K) {
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 32 == 0 && BK <= 64, "tiles");
  constexpr int NT = (BM / WM) * (BN / WN) * WARPSIZE, LDA = BK + 8, FM = WM / 16, FN = WN / 8;
  constexpr int STAGE = tc_stage_bytes(WFMT, BM, BN, BK);
  extern __shared__ __align__(16) unsigned char smem[];
  float *lut = reinterpret_cast<float *>(smem + ST * STAGE);
  const int tid = threadIdx.x, warp = tid / WARPSIZE, lane = tid % WARPSIZE;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int wm = (warp / (BN / WN)) * WM, wn = (warp % (BN / WN)) * WN;
  if (WFMT == 0 && tid < 16) lut[tid] = NF4_CODE_TC[tid];

  auto load = [&](int slot, int k0) {
    unsigned char *st = smem + slot * STAGE;
    unsigned short *as = reinterpret_cast<unsigned short *>(st);
    for (int c = tid; c < BM * BK / 8; c += NT) {
      const int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
      const bool ok = m0 + r < M;
      cpa16(as + r * LDA + col, ok ? xh + (size_t)(m0 + r) * K + k0 + col : xh, ok);
    }
    unsigned char *bs = st + BM * LDA * 2;
    if (WFMT == 1) {
      const unsigned short *wh = reinterpret_cast<const unsigned short *>(w);
      unsigned short *b = reinterpret_cast<unsigned short *>(bs);
      for (int c = tid; c < BN * BK / 8; c += NT) {
        const int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
        const bool ok = n0 + r < N;
        cpa16(b + r * LDA + col, ok ? wh + (size_t)(n0 + r) * K + k0 + col : wh, ok);
      }
    } else {
      for (int c = tid; c < BN * BK / 32; c += NT) {
        const int r = c / (BK / 32), col = (c % (BK / 32)) * 16;
        const bool ok = n0 + r < N;
        cpa16(bs + r * (BK / 2) + col, ok ? w + ((size_t)(n0 + r) * K + k0) / 2 + col : w, ok);
      }
      float *sa = reinterpret_cast<float *>(bs + BN * (BK / 2));
      for (int r = tid; r < BN; r += NT) {
        const bool ok = n0 + r < N;
        cpa4(sa + r, ok ? absmax + ((size_t)(n0 + r) * K + k0) / 64 : absmax, ok);
      }
    }
  };

  float acc[FM][FN][4];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

  const int steps = K / BK;
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < steps) load(s, s * BK);
    cpa_commit();
  }
  const int g = lane >> 2, t = lane & 3;
  for (int kt = 0; kt < steps; ++kt) {
    cpa_wait<ST - 2>();
    __syncthreads();  // stage kt landed for everyone; every warp is done with stage kt - 1's slot
    if (kt + ST - 1 < steps) load((kt + ST - 1) % ST, (kt + ST - 1) * BK);
    cpa_commit();
    const unsigned char *st = smem + (kt % ST) * STAGE;
    const unsigned short *as = reinterpret_cast<const unsigned short *>(st);
    const unsigned char *bs = st + BM * LDA * 2;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[FM][4];
#pragma unroll
      for (int i = 0; i < FM; ++i) ldm_x4(a[i], as + (wm + 16 * i + (lane & 15)) * LDA + kk + (lane >> 4) * 8);
      if (WFMT == 1) {
        const unsigned short *b = reinterpret_cast<const unsigned short *>(bs);
#pragma unroll
        for (int j = 0; j < FN; j += 2) {
          unsigned bf[4];
          ldm_x4(bf, b + (wn + 8 * j + (lane & 7) + (lane >> 4) * 8) * LDA + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int i = 0; i < FM; ++i) {
            mma16816(acc[i][j], a[i], bf);
            mma16816(acc[i][j + 1], a[i], bf + 2);
          }
        }
      } else {
        const float *sa = reinterpret_cast<const float *>(bs + BN * (BK / 2));
#pragma unroll
        for (int j = 0; j < FN; ++j) {
          const int row = wn + 8 * j + g;
          const uint2 q = *reinterpret_cast<const uint2 *>(bs + row * (BK / 2) + kk / 2);  // bytes kk/2 .. +7
          const float s = sa[row];
          const unsigned b0 = (q.x >> (8 * t)) & 0xffu, b1 = (q.y >> (8 * t)) & 0xffu;
          unsigned bf[2];
          bf[0] = pk2(lut[b0 >> 4] * s, lut[b0 & 15u] * s);
          bf[1] = pk2(lut[b1 >> 4] * s, lut[b1 & 15u] * s);
#pragma unroll
          for (int i = 0; i < FM; ++i) mma16816(acc[i][j], a[i], bf);
        }
      }
    }
  }
  cpa_wait<0>();
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + wm + 16 * i + g + 8 * h;
      if (r >= M) continue;
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        const int c = n0 + wn + 8 * j + 2 * t;
        if (c + 1 < N) {
          *reinterpret_cast<float2 *>(out + (size_t)r * N + c) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else if (c < N) {
          out[(size_t)r * N + c] = acc[i][j][2 * h];
        }
      }
    }
}

// xh (M, K) f16 = x rounded (NORM: x / rms(x) * norm_w), one block of NT threads per row, float4 in, 4 halves out
template <int NORM, int NT>
__device__ __forceinline__ void prep_x16(const float *__restrict__ x, const float *__restrict__ norm_w,
                                                float eps, unsigned short *__restrict__ xh, int K) {
  const float4 *xr = reinterpret_cast<const float4 *>(x + (size_t)blockIdx.x * K);
  uint2 *o = reinterpret_cast<uint2 *>(xh + (size_t)blockIdx.x * K);
  float q = 1.0f;
  if (NORM) {
    __shared__ float part[NT / WARPSIZE];  // one per warp
    float ss = 0.0f;
    for (int k = threadIdx.x; k < K / 4; k += NT) {
      const float4 v = xr[k];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
    if (threadIdx.x % WARPSIZE == 0) part[threadIdx.x / WARPSIZE] = ss;
    __syncthreads();
    ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NT / WARPSIZE; ++i) ss += part[i];
    q = rsqrtf(ss / (float)K + eps);
  }
  for (int k = threadIdx.x; k < K / 4; k += NT) {
    float4 v = xr[k];
    if (NORM) {
      const float4 g = reinterpret_cast<const float4 *>(norm_w)[k];
      v = make_float4(v.x * q * g.x, v.y * q * g.y, v.z * q * g.z, v.w * q * g.w);
    }
    uint2 h;
    h.x = pk2(v.x, v.y);
    h.y = pk2(v.z, v.w);
    o[k] = h;
  }
}
