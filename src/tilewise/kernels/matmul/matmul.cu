// matmul.cu - the classifier's weight matmuls on CUDA: y = epilogue(norm(x) @ W^T), W stored (N, K) in a weight
// format, x (M, K) f32 row-major starting at row x_row0, out (M, N) f32 row-major.
//
// Template arguments shared by both kernels:
//   FMT  0 nf4 (bitsandbytes: byte i holds weights 2i (high nibble) and 2i+1 (low), one f32 absmax per 64
//        consecutive weights of the flattened (N, K) tensor), 1 f16, 2 f32
//   EPI  0 none (out = y), 1 residual (out += y), 2 swiglu (out = silu(x Wg^T) * (x Wu^T); w_up/absmax_up used)
//   NORM 1: RMSNorm of each x row fused in front (x / rms(x) * norm_w), the row's 1/rms computed in the block
//
// nf4_mm_mma<FMT, EPI, NORM, BM, BN, BK, WM, WN>: tensor cores through inline PTX `mma.sync.m16n8k16` f16 x f16 ->
// f32 (no headers: NVRTC needs no CUDA include path). Per K step the block stages x (BM x BK, normed and rounded
// to f16) and decodes W (BN x BK, each NF4 word once) into shared memory; each warp multiplies its WM x WN tile in
// m16n8 steps, its A and B fragments read from shared memory as 32-bit pairs in the PTX fragment layout; the f32
// accumulators go through shared memory for a bounds-guarded epilogue. Threads = (BM/WM) * (BN/WN) * 32.
// nf4_mm_rows<FMT, EPI, NORM, NT, RM>: the short-row path (few rows): one warp per output column and RM rows, the
// lanes split K in words of 8 weights, f32 arithmetic, a warp reduction; grid (ceil(N / (NT/32)), ceil(M / RM)).
//
// Both declare __launch_bounds__(threads, 1): with the default bound ptxas capped some variants at 64 registers
// and spilled; one resident block's worth is the budget the rules assume.
//
// Shapes admitted (Python's `config_problems`): K % BK == 0 (mma) or K % 8 == 0 (rows), K % 64 == 0 for nf4;
// any M >= 1 and N >= 1 (partial tiles are guarded). The static_asserts mirror the Python rules, by name.

#ifndef WARPSIZE
#define WARPSIZE 32
#endif

__device__ __constant__ float NF4_CODE[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f};

// f16 bits -> f32 (PTX: no cuda_fp16.h needed)
__device__ __forceinline__ float h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// eight consecutive weights of row n starting at column k (k % 8 == 0), as f32
template <int FMT>
__device__ __forceinline__ void load8(const unsigned *w, const float *absmax, int n, int k, int K, float *v) {
  const size_t e = (size_t)n * K + k;
  if (FMT == 0) {
    const unsigned word = w[e / 8];
    const float s = absmax[e / 64];
#pragma unroll
    for (int b = 0; b < 4; ++b) {  // byte b of the little-endian word: weights 2b (high nibble), 2b+1 (low)
      const unsigned byte = (word >> (8 * b)) & 0xffu;
      v[2 * b] = NF4_CODE[byte >> 4] * s;
      v[2 * b + 1] = NF4_CODE[byte & 0xfu] * s;
    }
  } else if (FMT == 1) {
    const uint4 q = reinterpret_cast<const uint4 *>(w)[e / 8];
    const unsigned parts[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int b = 0; b < 4; ++b) {  // the lower half of a word is the earlier weight (little-endian)
      v[2 * b] = h2f((unsigned short)(parts[b] & 0xffffu));
      v[2 * b + 1] = h2f((unsigned short)(parts[b] >> 16));
    }
  } else {
    const float4 *p = reinterpret_cast<const float4 *>(reinterpret_cast<const float *>(w) + e);
    const float4 a = p[0], b = p[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

// 1/rms of x row `row` (K values), reduced by one warp
__device__ __forceinline__ float row_rsqrt_warp(const float *x, int K, float eps, int lane) {
  float ss = 0.0f;
  for (int k = lane; k < K; k += WARPSIZE) ss += x[k] * x[k];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return rsqrtf(ss / (float)K + eps);
}

// ---- legality: the Python rules of kernels/matmul/cuda.py, in order (0 = legal) -------------------------------
__host__ __device__ constexpr int mma_smem_bytes(int EPI, int BM, int BN, int BK) {
  const int sets = EPI == 2 ? 2 : 1;
  const int ops = BM * (BK + 8) * 2 + sets * BN * (BK + 8) * 2;  // x tile + W tile(s), f16, rows padded by 8
  const int res = sets * BM * (BN + 4) * 4;                       // the f32 result tile(s), rows padded by 4
  return ((ops > res ? ops : res) + 31) / 32 * 32 + BM * 4;       // + the rows' 1/rms
}

// ---- legality: the Python rules of kernels/matmul/cuda.py, in order (0 = legal) -------------------------------
__host__ __device__ constexpr int mma_first_failure(int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM,
                                                     int WN) {
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2 || NORM < 0 || NORM > 1) return 1;  // variant
  if (WM % 16 != 0 || WN % 16 != 0 || BK % 16 != 0 || WM < 16 || WN < 16 || BK < 16) return 2;  // fragments_16
  if (BM % WM != 0 || BN % WN != 0) return 3;                                      // warp_tiles_divide
  if ((BM / WM) * (BN / WN) * WARPSIZE > 1024) return 4;                           // threads_1024
  if (mma_smem_bytes(EPI, BM, BN, BK) > 48 * 1024) return 5;                      // smem_48k
  if ((WM / 16) * (WN / 16) * (EPI == 2 ? 2 : 1) > 16) return 6;                    // fragments_per_warp_16
  return 0;
}

__host__ __device__ constexpr int rows_first_failure(int FMT, int EPI, int NORM, int NT, int RM) {
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2 || NORM < 0 || NORM > 1) return 1;  // variant
  if (NT % WARPSIZE != 0 || NT < WARPSIZE || NT > 1024) return 2;                // whole_warps
  if (RM < 1 || RM > 16) return 3;                                               // rows_1_16
  return 0;
}

// f32 -> f16 bits (round to nearest even) and one m16n8k16 f16 x f16 -> f32 tensor-core step, in PTX: no header,
// so NVRTC compiles this file without a CUDA include path
__device__ __forceinline__ unsigned short f2h(float v) {
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

template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * WARPSIZE, 1)
nf4_mm_mma(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w, const float *__restrict__ absmax,
           const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
           float eps, float *__restrict__ out, int M, int N, int K) {
  constexpr int FAIL = mma_first_failure(FMT, EPI, NORM, BM, BN, BK, WM, WN);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu), NORM 0/1");
  static_assert(FAIL != 2, "fragments_16: WM, WN and BK must be multiples of 16 (m16n8k16 tensor-core steps)");
  static_assert(FAIL != 3, "warp_tiles_divide: BM % WM and BN % WN must be 0");
  static_assert(FAIL != 4, "threads_1024: (BM/WM)*(BN/WN) warps must be at most 1024 threads");
  static_assert(FAIL != 5, "smem_48k: the operand tiles or the result tile exceed 48 KB of static shared memory");
  static_assert(FAIL != 6, "fragments_per_warp_16: at most 16 accumulator 16x16 tiles per warp (register spilling)");
  constexpr int NT = (BM / WM) * (BN / WN) * WARPSIZE;
  constexpr int SETS = EPI == 2 ? 2 : 1;
  constexpr int LDA = BK + 8, LDC = BN + 4;  // row pads (halves, floats) against shared-memory bank conflicts
  constexpr int FM = WM / 16, FN = WN / 8;   // m16n8 tiles per warp
  __shared__ __align__(16) unsigned char smem[mma_smem_bytes(EPI, BM, BN, BK)];
  unsigned short *As = reinterpret_cast<unsigned short *>(smem);  // (BM, LDA) f16 bits
  unsigned short *Bs = As + BM * LDA;                              // SETS x (BN, LDA): W rows = B column-major
  float *Cs = reinterpret_cast<float *>(smem);                     // SETS x (BM, LDC), after the K loop
  float *rs = reinterpret_cast<float *>(smem + (mma_smem_bytes(EPI, BM, BN, BK) - BM * 4));  // (BM,) 1/rms
  const int tid = threadIdx.x, warp = tid / WARPSIZE, lane = tid % WARPSIZE;
  const int g = lane >> 2, t = lane & 3;  // the fragment layout's groupID and thread-in-group
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int wm = (warp / (BN / WN)) * WM, wn = (warp % (BN / WN)) * WN;
  const float *xb = x + (size_t)x_row0 * K;

  for (int r = warp; r < BM; r += NT / WARPSIZE) {
    float v = 1.0f;
    if (NORM && m0 + r < M) v = row_rsqrt_warp(xb + (size_t)(m0 + r) * K, K, eps, lane);
    if (lane == 0) rs[r] = v;
  }
  __syncthreads();

  float acc[SETS][FM][FN][4];
#pragma unroll
  for (int s = 0; s < SETS; ++s)
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[s][i][j][q] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += BK) {
    // x tile: BM x BK floats, normed, rounded to f16 (rows past M are zeros)
    for (int e = tid; e < BM * BK; e += NT) {
      const int r = e / BK, c = e % BK;
      float v = 0.0f;
      if (m0 + r < M) {
        v = xb[(size_t)(m0 + r) * K + k0 + c];
        if (NORM) v *= rs[r] * norm_w[k0 + c];
      }
      As[r * LDA + c] = f2h(v);
    }
    // W tiles: BN rows x BK, eight weights (one NF4 word) per thread step, decoded once
    for (int e = tid; e < SETS * BN * (BK / 8); e += NT) {
      const int s = e / (BN * (BK / 8)), rem = e % (BN * (BK / 8));
      const int r = rem / (BK / 8), c = (rem % (BK / 8)) * 8;
      float v[8];
      if (n0 + r < N) {
        load8<FMT>(s ? w_up : w, s ? absmax_up : absmax, n0 + r, k0 + c, K, v);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
      unsigned short *dst = Bs + s * BN * LDA + r * LDA + c;
#pragma unroll
      for (int i = 0; i < 8; ++i) dst[i] = f2h(v[i]);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      // A (16 x 16, row-major): {row g, k 2t..2t+1}, {row g+8, same k}, {row g, k +8}, {row g+8, k +8}
      unsigned a[FM][4];
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        const unsigned short *p = As + (wm + 16 * i + g) * LDA + kk + 2 * t;
        a[i][0] = *reinterpret_cast<const unsigned *>(p);
        a[i][1] = *reinterpret_cast<const unsigned *>(p + 8 * LDA);
        a[i][2] = *reinterpret_cast<const unsigned *>(p + 8);
        a[i][3] = *reinterpret_cast<const unsigned *>(p + 8 * LDA + 8);
      }
#pragma unroll
      for (int s = 0; s < SETS; ++s)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
          // B (16 x 8, column-major): column g, k 2t..2t+1 and k +8; a W row holds one column's k contiguously
          const unsigned short *p = Bs + s * BN * LDA + (wn + 8 * j + g) * LDA + kk + 2 * t;
          const unsigned b[2] = {*reinterpret_cast<const unsigned *>(p), *reinterpret_cast<const unsigned *>(p + 8)};
#pragma unroll
          for (int i = 0; i < FM; ++i) mma_16816(acc[s][i][j], a[i], b);
        }
    }
    __syncthreads();
  }
  // the result tile(s) through shared memory (the operands are dead): D rows g and g+8, columns 2t and 2t+1
#pragma unroll
  for (int s = 0; s < SETS; ++s)
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        float *c = Cs + s * BM * LDC + (wm + 16 * i + g) * LDC + wn + 8 * j + 2 * t;
        c[0] = acc[s][i][j][0];
        c[1] = acc[s][i][j][1];
        c[8 * LDC] = acc[s][i][j][2];
        c[8 * LDC + 1] = acc[s][i][j][3];
      }
  __syncthreads();
  for (int e = tid; e < BM * BN; e += NT) {
    const int r = e / BN, c = e % BN;
    if (m0 + r >= M || n0 + c >= N) continue;
    const float y = Cs[r * LDC + c];
    float *o = out + (size_t)(m0 + r) * N + n0 + c;
    if (EPI == 0) *o = y;
    else if (EPI == 1) *o += y;
    else *o = silu(y) * Cs[BM * LDC + r * LDC + c];
  }
}

template <int FMT, int EPI, int NORM, int NT, int RM>
__global__ void __launch_bounds__(NT, 1)
nf4_mm_rows(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w, const float *__restrict__ absmax,
            const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
            float eps, float *__restrict__ out, int M, int N, int K) {
  constexpr int FAIL = rows_first_failure(FMT, EPI, NORM, NT, RM);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu), NORM 0/1");
  static_assert(FAIL != 2, "whole_warps: NT must be a whole number of warps, 32..1024");
  static_assert(FAIL != 3, "rows_1_16: RM (rows per block) must be 1..16");
  constexpr int SETS = EPI == 2 ? 2 : 1;
  __shared__ float rs[RM];
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE;
  const int m0 = blockIdx.y * RM;
  const int rows = min(RM, M - m0);
  const float *xb = x + ((size_t)x_row0 + m0) * K;
  for (int r = warp; r < RM; r += NT / WARPSIZE) {
    float v = 1.0f;
    if (NORM && r < rows) v = row_rsqrt_warp(xb + (size_t)r * K, K, eps, lane);
    if (lane == 0) rs[r] = v;
  }
  __syncthreads();
  const int n = blockIdx.x * (NT / WARPSIZE) + warp;
  if (n >= N) return;
  float acc[SETS][RM];
#pragma unroll
  for (int s = 0; s < SETS; ++s)
#pragma unroll
    for (int r = 0; r < RM; ++r) acc[s][r] = 0.0f;
  for (int k = lane * 8; k < K; k += WARPSIZE * 8) {
    float wv[SETS][8];
    load8<FMT>(w, absmax, n, k, K, wv[0]);
    if (SETS == 2) load8<FMT>(w_up, absmax_up, n, k, K, wv[SETS - 1]);
    if (NORM) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float g = norm_w[k + i];
        wv[0][i] *= g;
        if (SETS == 2) wv[SETS - 1][i] *= g;
      }
    }
#pragma unroll
    for (int r = 0; r < RM; ++r) {
      if (r < rows) {
        const float4 *xp = reinterpret_cast<const float4 *>(xb + (size_t)r * K + k);
        const float4 a = xp[0], b = xp[1];
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int s = 0; s < SETS; ++s)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[s][r] += xv[i] * wv[s][i];
      }
    }
  }
#pragma unroll
  for (int s = 0; s < SETS; ++s)
#pragma unroll
    for (int r = 0; r < RM; ++r)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[s][r] += __shfl_xor_sync(0xffffffffu, acc[s][r], o);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    if (r < rows) {
      float *o = out + (size_t)(m0 + r) * N + n;
      const float y = acc[0][r] * rs[r];
      if (EPI == 0) *o = y;
      else if (EPI == 1) *o += y;
      else *o = silu(y) * acc[SETS - 1][r] * rs[r];
    }
  }
}
