// matmul_ring.cu - the tensor-core matmul on x rounded to f16 once; compiled after matmul.cu and matmul_pipe.cu
// (their helpers: pack2, mma_16816, ldmatrix_x4, the cp.async wrappers, store_epilogue, store_partial).
//
// Two launches (three with split-K):
// nf4_mm_prep<NORM, NT>: xh (M, K) f16 = x rows x_row0.. rounded to f16 (NORM: x / rms(x) * norm_w first), one
//   block of NT threads per row. Every column tile of the matmul then reads f16 x as it is: the other kinds
//   convert (and norm) the f32 x once per column tile. nf4_mm_reduce_prep<NORM, NT> is the same prologue fused
//   with the residual split-K reduction that wrote its rows (the executor's choice).
// nf4_mm_ring<FMT, EPI, BM, BN, BK, WM, WN, ST, KS, MB>: a ring of ST stages in dynamic shared memory, each one
//   K step's x tile (f16) and W tile(s) as stored, filled by cp.async ST - 1 steps ahead with one barrier a step;
//   nothing is converted in shared memory. x fragments come by ldmatrix; W's: f16 by ldmatrix, nf4 decoded in
//   registers from the raw bytes (the NF4 code in shared memory, times the row's absmax, rounded once to f16), f32
//   rounded to f16 in registers. KS 1 applies the epilogue; KS > 1 writes slice blockIdx.z's raw sums to partial
//   for nf4_mm_splitk_reduce. MB is the launch bound's blocks per SM.
// Shapes: K % BK == 0 (K % (KS * BK) with KS > 1), K % 64 == 0 for nf4 (one absmax per row per step: BK 32 or 64);
// any M and N (rows past them are zero-filled by cp.async and never stored).

// one ring stage: x (BM, BK + 8) f16, then SETS W tiles: f16 (BN, BK + 8), nf4 raw (BN, BK / 2) bytes and the rows'
// absmax (BN,), f32 (BN, BK + 4); the padding puts ldmatrix's and the fragment loads' rows in distinct banks
__host__ __device__ constexpr int ring_w_tile_bytes(int FMT, int BN, int BK) {
  return FMT == 1 ? BN * (BK + 8) * 2 : FMT == 0 ? BN * (BK / 2) + BN * 4 : BN * (BK + 4) * 4;
}
__host__ __device__ constexpr int ring_stage_bytes(int FMT, int EPI, int BM, int BN, int BK) {
  return BM * (BK + 8) * 2 + (EPI == 2 ? 2 : 1) * ring_w_tile_bytes(FMT, BN, BK);
}
__host__ __device__ constexpr int ring_smem_bytes(int FMT, int EPI, int BM, int BN, int BK, int ST) {
  return ST * ring_stage_bytes(FMT, EPI, BM, BN, BK) + 16 * 4;  // + the NF4 code
}
// registers a thread may use under the launch bound
__host__ __device__ constexpr int ring_register_cap(int BM, int BN, int WM, int WN, int MB) {
  return 65536 / ((BM / WM) * (BN / WN) * WARPSIZE * MB) < 255 ? 65536 / ((BM / WM) * (BN / WN) * WARPSIZE * MB)
                                                                : 255;
}

// registers needed beside the accumulators: fragments, addresses and the decode
__host__ __device__ constexpr int ring_spare_needed(int FMT, int BK) { return 64; }
// nf4 at BK 64 with under 128 registers to spare spilled with the K step's four m16n8k16 steps unrolled (the decode
// holds them all live); two at a time compile clean
__host__ __device__ constexpr int ring_kk_unroll(int FMT, int EPI, int BM, int BN, int BK, int WM, int WN, int MB) {
  return FMT == 0 && BK == 64 &&
                 ring_register_cap(BM, BN, WM, WN, MB) - (EPI == 2 ? 2 : 1) * (WM / 16) * (WN / 8) * 4 < 128
             ? 2
             : BK / 16;
}

__host__ __device__ constexpr int ring_first_failure(int FMT, int EPI, int BM, int BN, int BK, int WM, int WN, int ST,
                                                      int KS, int MB) {
  const int sets = EPI == 2 ? 2 : 1;
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2) return 1;                           // variant
  if (WM % 16 != 0 || WN % 16 != 0 || WM < 16 || WN < 16) return 2;                // fragments_16
  if (BK != 32 && BK != 64) return 3;                                              // bk_32_64
  if (BM % WM != 0 || BN % WN != 0) return 4;                                      // warp_tiles_divide
  if ((BM / WM) * (BN / WN) * WARPSIZE > 1024) return 5;                           // threads_1024
  if ((WM / 16) * (WN / 16) * sets > 16) return 6;                                 // fragments_per_warp_16
  if (MB < 1 || MB > 2) return 7;                                                  // mb_1_2
  if (ring_register_cap(BM, BN, WM, WN, MB) - sets * (WM / 16) * (WN / 8) * 4 < ring_spare_needed(FMT, BK))
    return 8;                                                                      // registers_spare
  if (ST < 2 || ST > 6) return 9;                                                  // stages_2_6
  if (KS != 1 && KS != 2 && KS != 4 && KS != 8) return 10;                         // ks_1_2_4_8
  if (ring_smem_bytes(FMT, EPI, BM, BN, BK, ST) > PIPE_SMEM_MAX) return 11;        // smem_227k
  return 0;
}

// A row of x (K f32) into f16 (NORM: normed first) by a block of NT threads, thread t owning float4s t, t + NT, ...;
// nf4_mm_prep and nf4_mm_reduce_prep both go through prep_regs, so fusing the two launches changes no bit.
// PREP_RV: float4s a thread holds in registers (rows up to NT * PREP_RV * 4 values); longer rows are read again
// from memory for the norm and the conversion.
#define PREP_RV 8

__device__ __forceinline__ float prep_sumsq(float ss, float4 v) {
  return ss + (v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
}

// 1/rms of the row from each thread's partial sum of squares: one order in every thread
template <int NT>
__device__ __forceinline__ float prep_inv_rms(float ss, int K, float eps) {
  static_assert(NT % WARPSIZE == 0 && NT >= WARPSIZE && NT <= 1024,
                "whole_warps: NT must be a whole number of warps, 32..1024");
  __shared__ float part[NT / WARPSIZE];  // one sum of squares per warp
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
  if (threadIdx.x % WARPSIZE == 0) part[threadIdx.x / WARPSIZE] = ss;
  __syncthreads();
  ss = 0.0f;
#pragma unroll
  for (int i = 0; i < NT / WARPSIZE; ++i) ss += part[i];
  return rsqrtf(ss / (float)K + eps);
}

template <int NORM>
__device__ __forceinline__ uint2 prep_pack(float4 v, float q, const float *__restrict__ norm_w, int k) {
  if (NORM) {
    const float4 g = reinterpret_cast<const float4 *>(norm_w)[k];
    v = f4(v.x * q * g.x, v.y * q * g.y, v.z * q * g.z, v.w * q * g.w);
  }
  uint2 h;
  h.x = pack2(v.x, v.y);
  h.y = pack2(v.z, v.w);
  return h;
}

// the row's float4s already in the threads' registers (v[j] is float4 threadIdx.x + j * NT; K / 4 <= NT * PREP_RV)
template <int NORM, int NT>
__device__ __forceinline__ void prep_regs(const float4 (&v)[PREP_RV], const float *__restrict__ norm_w, float eps,
                                          unsigned short *__restrict__ xh_row, int K) {
  float q = 1.0f;
  if (NORM) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < PREP_RV; ++j)
      if (threadIdx.x + j * NT < K / 4) ss = prep_sumsq(ss, v[j]);
    q = prep_inv_rms<NT>(ss, K, eps);
  }
  uint2 *o = reinterpret_cast<uint2 *>(xh_row);
#pragma unroll
  for (int j = 0; j < PREP_RV; ++j) {
    const int k = threadIdx.x + j * NT;
    if (k < K / 4) o[k] = prep_pack<NORM>(v[j], q, norm_w, k);
  }
}

// the same from memory, for rows longer than the registers hold
template <int NORM, int NT>
__device__ __forceinline__ void prep_mem(const float *__restrict__ x_row, const float *__restrict__ norm_w, float eps,
                                         unsigned short *__restrict__ xh_row, int K) {
  const float4 *xr = reinterpret_cast<const float4 *>(x_row);
  float q = 1.0f;
  if (NORM) {
    float ss = 0.0f;
    for (int k = threadIdx.x; k < K / 4; k += NT) ss = prep_sumsq(ss, xr[k]);
    q = prep_inv_rms<NT>(ss, K, eps);
  }
  uint2 *o = reinterpret_cast<uint2 *>(xh_row);
  for (int k = threadIdx.x; k < K / 4; k += NT) o[k] = prep_pack<NORM>(xr[k], q, norm_w, k);
}

template <int NORM, int NT>
__global__ void __launch_bounds__(NT)
nf4_mm_prep(const float *__restrict__ x, int x_row0, const float *__restrict__ norm_w, float eps,
            unsigned short *__restrict__ xh, int K) {
  PDL_BEGIN();
  const float *x_row = x + (size_t)(x_row0 + blockIdx.x) * K;
  unsigned short *xh_row = xh + (size_t)blockIdx.x * K;
  if (K / 4 > NT * PREP_RV) {
    prep_mem<NORM, NT>(x_row, norm_w, eps, xh_row, K);
    return;
  }
  const float4 *xr = reinterpret_cast<const float4 *>(x_row);
  float4 v[PREP_RV];
#pragma unroll
  for (int j = 0; j < PREP_RV; ++j) {  // every load in flight at once
    const int k = threadIdx.x + j * NT;
    v[j] = k < K / 4 ? xr[k] : f4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  prep_regs<NORM, NT>(v, norm_w, eps, xh_row, K);
}

// a residual matmul's split-K reduction (nf4_mm_splitk_reduce<1, ...>: out += the ks slices, added in order) and
// the next matmul's prologue (nf4_mm_prep<NORM, NT> of the rows just written) in one launch, one block per row:
// the executor fuses the two where the prologue reads exactly the reduction's output rows. The row's sums stay in
// registers for the prologue (rows of up to NT * PREP_RV * 4 values).
template <int NORM, int NT>
__global__ void __launch_bounds__(NT)
nf4_mm_reduce_prep(const float *__restrict__ partial, int ks, float *__restrict__ out, int M, int N,
                   const float *__restrict__ norm_w, float eps, unsigned short *__restrict__ xh) {
  PDL_BEGIN();
  const size_t mn4 = (size_t)M * N / 4, row0 = (size_t)blockIdx.x * N;  // N % 4 == 0, as the prologue's K
  const float4 *p4 = reinterpret_cast<const float4 *>(partial + row0);
  float4 *o4 = reinterpret_cast<float4 *>(out + row0);
  const bool regs = N / 4 <= NT * PREP_RV;
  float4 v[PREP_RV];
#pragma unroll
  for (int j = 0; j < PREP_RV; ++j) v[j] = f4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int k = threadIdx.x, j = 0; k < N / 4; k += NT, ++j) {
    float4 y = f4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int z0 = 0; z0 < ks; z0 += 8) {  // up to eight slices' loads in flight, then added in order
      float4 s[8];
#pragma unroll
      for (int z = 0; z < 8; ++z)
        if (z0 + z < ks) s[z] = p4[(z0 + z) * mn4 + k];
#pragma unroll
      for (int z = 0; z < 8; ++z)
        if (z0 + z < ks) y = f4(y.x + s[z].x, y.y + s[z].y, y.z + s[z].z, y.w + s[z].w);
    }
    const float4 o = o4[k];
    const float4 r = f4(o.x + y.x, o.y + y.y, o.z + y.z, o.w + y.w);
    o4[k] = r;
#pragma unroll
    for (int i = 0; i < PREP_RV; ++i)  // a constant index, so v stays in registers
      if (i == j) v[i] = r;
  }
  if (regs) {
    prep_regs<NORM, NT>(v, norm_w, eps, xh + row0, N);
  } else {
    __syncthreads();  // the row's sums, written by the block's other threads, before prep_mem reads them
    prep_mem<NORM, NT>(out + row0, norm_w, eps, xh + row0, N);
  }
}

// One K step of W (rows n0.., columns k0..) into a stage's W tile by cp.async (rows past N zero-filled)
template <int FMT, int BN, int BK, int NT>
__device__ __forceinline__ void ring_load_w(unsigned char *ws, const unsigned *w, const float *absmax, int n0, int N,
                                            int K, int k0) {
  const int tid = threadIdx.x;
  if (FMT == 0) {
    const unsigned char *wb = reinterpret_cast<const unsigned char *>(w);
    for (int c = tid; c < BN * BK / 32; c += NT) {  // 16 bytes = 32 weights a copy
      const int r = c / (BK / 32), col = (c % (BK / 32)) * 16;
      const bool ok = n0 + r < N;
      cp_async16(ws + r * (BK / 2) + col, ok ? wb + ((size_t)(n0 + r) * K + k0) / 2 + col : wb, ok);
    }
    float *sa = reinterpret_cast<float *>(ws + BN * (BK / 2));
    for (int r = tid; r < BN; r += NT) {
      const bool ok = n0 + r < N;
      cp_async4(sa + r, ok ? absmax + ((size_t)(n0 + r) * K + k0) / 64 : absmax, ok);
    }
  } else {
    constexpr int E = FMT == 1 ? 8 : 4, LD = FMT == 1 ? BK + 8 : BK + 4, SZ = FMT == 1 ? 2 : 4;  // per copy, row
    const unsigned char *wb = reinterpret_cast<const unsigned char *>(w);
    for (int c = tid; c < BN * BK / E; c += NT) {
      const int r = c / (BK / E), col = (c % (BK / E)) * E;
      const bool ok = n0 + r < N;
      cp_async16(ws + (r * LD + col) * SZ, ok ? wb + ((size_t)(n0 + r) * K + k0 + col) * SZ : wb, ok);
    }
  }
}

// The B fragment of n8 tile row `row` (of the W tile), k kk..kk+15, for nf4 / f32 weights (f16 uses ldmatrix)
template <int FMT, int BN, int BK>
__device__ __forceinline__ void ring_b_frag(const unsigned char *ws, int row, int kk, int t, const float *lut,
                                            unsigned *b) {
  if (FMT == 0) {
    // lane (g, t) needs k = kk + 2t, 2t + 1 (byte kk/2 + t) and kk + 8 + 2t, +1 (byte kk/2 + 4 + t); the high nibble
    // is the earlier weight, which goes in the lower half
    const uint2 q = *reinterpret_cast<const uint2 *>(ws + row * (BK / 2) + kk / 2);
    const float s = reinterpret_cast<const float *>(ws + BN * (BK / 2))[row];
    const unsigned b0 = (q.x >> (8 * t)) & 0xffu, b1 = (q.y >> (8 * t)) & 0xffu;
    b[0] = pack2(lut[b0 >> 4] * s, lut[b0 & 0xfu] * s);
    b[1] = pack2(lut[b1 >> 4] * s, lut[b1 & 0xfu] * s);
  } else {
    const float *r = reinterpret_cast<const float *>(ws) + row * (BK + 4) + kk + 2 * t;
    const float2 lo = *reinterpret_cast<const float2 *>(r), hi = *reinterpret_cast<const float2 *>(r + 8);
    b[0] = pack2(lo.x, lo.y);
    b[1] = pack2(hi.x, hi.y);
  }
}

template <int FMT, int EPI, int BM, int BN, int BK, int WM, int WN, int ST, int KS, int MB>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * WARPSIZE, MB)
nf4_mm_ring(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w, const float *__restrict__ absmax,
            const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, float *__restrict__ out, int M,
            int N, int K) {
  PDL_BEGIN();
  constexpr int FAIL = ring_first_failure(FMT, EPI, BM, BN, BK, WM, WN, ST, KS, MB);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu)");
  static_assert(FAIL != 2, "fragments_16: WM and WN must be multiples of 16 (m16n8k16 tensor-core steps)");
  static_assert(FAIL != 3, "bk_32_64: BK must be 32 or 64 (whole 16-byte nf4 copies, one absmax per row a step)");
  static_assert(FAIL != 4, "warp_tiles_divide: BM % WM and BN % WN must be 0");
  static_assert(FAIL != 5, "threads_1024: (BM/WM)*(BN/WN) warps must be at most 1024 threads");
  static_assert(FAIL != 6, "fragments_per_warp_16: at most 16 accumulator 16x16 tiles per warp");
  static_assert(FAIL != 7, "mb_1_2: MB (blocks per SM in the launch bound) must be 1 or 2");
  static_assert(FAIL != 8, "registers_spare: the launch bound leaves too few registers beside the accumulators");
  static_assert(FAIL != 9, "stages_2_6: ST (ring stages) must be in 2..6");
  static_assert(FAIL != 10, "ks_1_2_4_8: KS (slices of K) must be 1, 2, 4 or 8");
  static_assert(FAIL != 11, "smem_227k: the ring exceeds 227 KB of shared memory");
  constexpr int NT = (BM / WM) * (BN / WN) * WARPSIZE, SETS = EPI == 2 ? 2 : 1, LDA = BK + 8;
  constexpr int FM = WM / 16, FN = WN / 8, STAGE = ring_stage_bytes(FMT, EPI, BM, BN, BK);
  constexpr int WT = ring_w_tile_bytes(FMT, BN, BK);
  extern __shared__ __align__(16) unsigned char dsmem[];
  float *lut = reinterpret_cast<float *>(dsmem + ST * STAGE);
  const int tid = threadIdx.x, warp = tid / WARPSIZE, lane = tid % WARPSIZE, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int wm = (warp / (BN / WN)) * WM, wn = (warp % (BN / WN)) * WN;
  const int steps = K / KS / BK, k_begin = blockIdx.z * (K / KS);
  if (FMT == 0 && tid < 16) lut[tid] = NF4_CODE[tid];  // read after the first barrier below

  auto load = [&](int slot, int k0) {
    unsigned char *st = dsmem + slot * STAGE;
    unsigned short *as = reinterpret_cast<unsigned short *>(st);
    for (int c = tid; c < BM * BK / 8; c += NT) {
      const int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
      const bool ok = m0 + r < M;
      cp_async16(as + r * LDA + col, ok ? xh + (size_t)(m0 + r) * K + k0 + col : xh, ok);
    }
    ring_load_w<FMT, BN, BK, NT>(st + BM * LDA * 2, w, absmax, n0, N, K, k0);
    if (SETS == 2) ring_load_w<FMT, BN, BK, NT>(st + BM * LDA * 2 + WT, w_up, absmax_up, n0, N, K, k0);
  };

  float acc[SETS][FM][FN][4];
  zero_acc(acc);
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {  // always ST - 1 groups, empty past the last step, so the waits line up
    if (s < steps) load(s, k_begin + s * BK);
    cp_async_commit();
  }
  for (int kt = 0; kt < steps; ++kt) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // step kt landed for every thread, and every warp is done with step kt - 1's slot
    if (kt + ST - 1 < steps) load((kt + ST - 1) % ST, k_begin + (kt + ST - 1) * BK);
    cp_async_commit();
    const unsigned char *st = dsmem + (kt % ST) * STAGE;
    const unsigned short *as = reinterpret_cast<const unsigned short *>(st);
#pragma unroll(ring_kk_unroll(FMT, EPI, BM, BN, BK, WM, WN, MB))
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[FM][4];
#pragma unroll
      for (int i = 0; i < FM; ++i) ldmatrix_x4(a[i], as + (wm + 16 * i + (lane & 15)) * LDA + kk + (lane >> 4) * 8);
#pragma unroll
      for (int s = 0; s < SETS; ++s) {
        const unsigned char *ws = st + BM * LDA * 2 + s * WT;
        if (FMT == 1) {
          const unsigned short *b16 = reinterpret_cast<const unsigned short *>(ws);
#pragma unroll
          for (int j = 0; j < FN; j += 2) {  // n8 tiles j, j + 1 as in mma_ops
            unsigned b[4];
            ldmatrix_x4(b, b16 + (wn + 8 * j + (lane & 7) + (lane >> 4) * 8) * LDA + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int i = 0; i < FM; ++i) {
              mma_16816(acc[s][i][j], a[i], b);
              mma_16816(acc[s][i][j + 1], a[i], b + 2);
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < FN; ++j) {
            unsigned b[2];
            ring_b_frag<FMT, BN, BK>(ws, wn + 8 * j + g, kk, t, lut, b);
#pragma unroll
            for (int i = 0; i < FM; ++i) mma_16816(acc[s][i][j], a[i], b);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  if (KS == 1) store_epilogue<EPI, BM, BN, WM, WN, SETS>(acc, out, M, N);
  else store_partial<BM, BN, WM, WN, SETS>(acc, out, M, N);
}
