// matmul.cu - the classifier's weight matmuls on CUDA: y = epilogue(norm(x) @ W^T), W stored (N, K) in a weight
// format, x (M, K) f32 row-major starting at row x_row0, out (M, N) f32 row-major.
//
// Template arguments every kernel of the family shares:
//   FMT  0 nf4 (bitsandbytes: byte i holds weights 2i (high nibble) and 2i+1 (low), one f32 absmax per 64
//        consecutive weights of the flattened (N, K) tensor), 1 f16, 2 f32
//   EPI  0 none (out = y), 1 residual (out += y), 2 swiglu (out = silu(x Wg^T) * (x Wu^T); w_up/absmax_up used)
//   NORM 1: RMSNorm of each x row fused in front (x / rms(x) * norm_w), the row's 1/rms computed in the block
//
// nf4_mm_mma<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE>: tensor cores through inline PTX `mma.sync.m16n8k16`
// f16 x f16 -> f32 (no headers: NVRTC needs no CUDA include path). Per K step the block stages x (BM x BK, normed
// and rounded to f16) and decodes W (BN x BK, each NF4 word once, the code read from shared memory) into one of PIPE
// shared-memory buffers; the next step's global words are loaded into registers before the tensor cores run on the
// current buffer, so their latency hides behind the math (PIPE 2: one barrier per step; PIPE 1: two, half the
// shared memory). Each warp multiplies its WM x WN tile in m16n8 steps, its fragments loaded with `ldmatrix`; the
// epilogue reads the accumulators directly, bounds-guarded. Threads = (BM/WM) * (BN/WN) * 32. The main loop is
// `mma_main`, written once and shared with split-K.
// nf4_mm_splitk<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE, KS, SR>: the same main loop over slice blockIdx.z of KS
// (K / KS columns), grid (ceil(N / BN), ceil(M / BM), KS), for shapes with few output tiles (N = 1024 at a few
// hundred rows); it writes raw f32 accumulators (both weight sets for swiglu) to partial (KS, SETS, M, N). With
// NORM each slice still computes its rows' 1/rms over the whole row. nf4_mm_splitk_reduce<EPI, NT> then sums the
// KS slices in a fixed order (deterministic: graph replays stay bit-identical) and applies the epilogue; with SR 1
// the last of a tile's blocks does that instead (`serial_reduce`), with no reduction launch; with SR 2 (Hopper,
// nf4_mm_splitk_cluster) the tile's KS blocks are one cluster and sum each other's raw sums from shared memory.
// The fused RMSNorm: where a block covers all of K (mma, pipe KS 1) it gathers each row's sum of squares while it
// stages x, rounds x * norm_w to f16 and scales the accumulators by 1/rms at the end (exact in real arithmetic:
// the 1/rms is per row); split-K slices read their rows once more in a prologue instead. x * norm_w must stay in
// f16's range (|.| < 65504), as the normed value always did.
// matmul_reduce.cu (the ways split-K's slices are summed), matmul_mma.cu (the kernels above),
// matmul_pipe.cu (the cp.async-fed kind), matmul_ring.cu, the wgmma kinds' files and matmul_rows.cu (the short-row
// kind) follow this file in one source (`SOURCE_FILES`, `matmul_source` in cuda.py): they use its helpers, and
// NVRTC compiles them as one text.
//
// The matrix kernels declare __launch_bounds__(threads, 1): with the default bound ptxas capped some variants at 64
// registers and spilled; one resident block's worth is the budget the rules assume.
//
// Shapes admitted (Python's `config_problems`): K % BK == 0 (mma), K % (KS * BK) == 0 (splitk) or K % 8 == 0
// (rows), K % 64 == 0 for nf4; any M >= 1 and N >= 1 (partial tiles are guarded). The static_asserts mirror the
// Python rules, by name.

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

// __fdividef: the IEEE division's range check and slow path were most of an unrolled epilogue's code (within 2
// ulp; its quotient is 0 where 1 + e^-g passes 2^126, as silu(g) is there to f32's precision)
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

// 1/rms of x row `row` (K values), reduced by one warp
__device__ __forceinline__ float row_rsqrt_warp(const float *x, int K, float eps, int lane) {
  float ss = 0.0f;
  if (K % 4 == 0) {  // float4 loads: a quarter of the dependent round trips (every tensor-core K qualifies)
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (int k = lane; k < K / 4; k += WARPSIZE) {
      const float4 v = x4[k];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int k = lane; k < K; k += WARPSIZE) ss += x[k] * x[k];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return rsqrtf(ss / (float)K + eps);
}

// ---- legality: the Python rules of kernels/matmul/cuda.py, in order (0 = legal) -------------------------------
__host__ __device__ constexpr int mma_smem_bytes(int EPI, int BM, int BN, int BK, int PIPE) {
  const int sets = EPI == 2 ? 2 : 1;
  // PIPE operand buffers of the x tile + W tile(s) in f16, rows padded by 8, then the rows' 1/rms, then the NF4 code
  return PIPE * (BM + sets * BN) * (BK + 8) * 2 + BM * 4 + 16 * 4;
}

// accumulators plus the registers that hold the next K step's words (and with NORM their norm weights and the late
// norm's sums): above 160 ptxas spilled (it also needs registers for addresses and fragments)
__host__ __device__ constexpr int mma_held_registers(int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM,
                                                      int WN) {
  const int sets = EPI == 2 ? 2 : 1, nt = (BM / WM) * (BN / WN) * WARPSIZE;
  const int xpt = (BM * BK / 4 + nt - 1) / nt, wpt = (sets * BN * BK / 8 + nt - 1) / nt;
  return sets * (WM / 16) * (WN / 8) * 4 + xpt * 4 + wpt * (FMT == 2 ? 8 : FMT == 1 ? 4 : 2) +
         (NORM ? 8 + xpt : 0);  // the norm weights ahead (a float4, and its products), the late norm's sums
}

__host__ __device__ constexpr int mma_first_failure(int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM,
                                                     int WN, int PIPE) {
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2 || NORM < 0 || NORM > 1) return 1;  // variant
  if (WM % 16 != 0 || WN % 16 != 0 || BK % 16 != 0 || WM < 16 || WN < 16 || BK < 16) return 2;  // fragments_16
  if (BM % WM != 0 || BN % WN != 0) return 3;                                      // warp_tiles_divide
  if ((BM / WM) * (BN / WN) * WARPSIZE > 1024) return 4;                           // threads_1024
  if (mma_smem_bytes(EPI, BM, BN, BK, PIPE) > 48 * 1024) return 5;                // smem_48k
  if ((WM / 16) * (WN / 16) * (EPI == 2 ? 2 : 1) > 16) return 6;                    // fragments_per_warp_16
  if (PIPE < 1 || PIPE > 2) return 7;                                              // pipe_1_2
  if (mma_held_registers(FMT, EPI, NORM, BM, BN, BK, WM, WN) > 160) return 8;      // registers_160
  return 0;
}

// SR 2's tile of raw sums, (SETS, BM, BN + 4) f32, beside the main loop's buffers in static shared memory
__host__ __device__ constexpr int splitk_cluster_tile_bytes(int EPI, int BM, int BN) {
  return (EPI == 2 ? 2 : 1) * BM * (BN + 4) * 4;
}

__host__ __device__ constexpr int splitk_first_failure(int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM,
                                                        int WN, int PIPE, int KS, int SR) {
  const int mma = mma_first_failure(FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE);
  if (mma) return mma;
  if (KS != 2 && KS != 4 && KS != 8) return 9;  // ks_2_4_8
  if (SR < 0 || SR > 2) return 10;              // sr_0_1_2
  if (SR == 2 && mma_smem_bytes(EPI, BM, BN, BK, PIPE) + splitk_cluster_tile_bytes(EPI, BM, BN) > 48 * 1024)
    return 11;                                  // cluster_tile_48k
  return 0;
}

__host__ __device__ constexpr int reduce_first_failure(int EPI, int NT) {
  if (EPI < 0 || EPI > 2) return 1;                                              // variant
  if (NT % WARPSIZE != 0 || NT < WARPSIZE || NT > 1024) return 2;                // whole_warps
  return 0;
}

// pack2, mma_16816, smem_addr and ldmatrix_x4 come from tensorcore.cuh, which precedes this file (model_source)

// vector values without vector_functions.h (NVRTC has the types, not the make_ functions)
__device__ __forceinline__ uint4 u4(unsigned a, unsigned b, unsigned c, unsigned d) {
  uint4 v;
  v.x = a; v.y = b; v.z = c; v.w = d;
  return v;
}

__device__ __forceinline__ float4 f4(float a, float b, float c, float d) {
  float4 v;
  v.x = a; v.y = b; v.z = c; v.w = d;
  return v;
}

// the raw global words of one K step a thread stages (loaded a step ahead, decoded when stored)
template <int FMT>
struct WRaw {
  uint4 q[FMT == 2 ? 2 : 1];  // nf4: q[0].x is one word of 8 weights; f16: 8 halves; f32: 8 floats
  float s;                    // nf4: the absmax of the word's 64-weight block
};

template <int FMT>
__device__ __forceinline__ void load_raw(const unsigned *w, const float *absmax, int n, int k, int K, WRaw<FMT> &r) {
  const size_t e = (size_t)n * K + k;
  if (FMT == 0) {
    r.q[0].x = w[e / 8];
    r.s = absmax[e / 64];
  } else if (FMT == 1) {
    r.q[0] = reinterpret_cast<const uint4 *>(w)[e / 8];
  } else {
    const uint4 *p = reinterpret_cast<const uint4 *>(reinterpret_cast<const float *>(w) + e);
    r.q[0] = p[0];
    r.q[FMT == 2 ? 1 : 0] = p[1];
  }
}

// eight decoded weights as f16 pairs, in k order (the lower half of a pair is the earlier weight)
template <int FMT>
__device__ __forceinline__ uint4 decode8(const WRaw<FMT> &r, const float *lut) {
  if (FMT == 1) return r.q[0];
  unsigned h[4];
  if (FMT == 0) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {  // byte b of the little-endian word: weights 2b (high nibble), 2b+1 (low)
      const unsigned byte = (r.q[0].x >> (8 * b)) & 0xffu;
      h[b] = pack2(lut[byte >> 4] * r.s, lut[byte & 0xfu] * r.s);
    }
  } else {
    const float *f = reinterpret_cast<const float *>(r.q);
#pragma unroll
    for (int b = 0; b < 4; ++b) h[b] = pack2(f[2 * b], f[2 * b + 1]);
  }
  return u4(h[0], h[1], h[2], h[3]);
}

// ---- the pieces both tensor-core main loops share ---------------------------------------------------------------
// The operand buffer of one K step (halves): x (BM, LDA) normed and rounded to f16, then SETS W tiles (BN, LDA)
// decoded to f16, rows padded by 8 halves so that ldmatrix's eight row addresses land in distinct banks.
template <int BK>
struct Lda {
  static constexpr int value = BK + 8;
};

// the NF4 code into shared memory (a constant-memory table serializes on a warp's 16 different indices) and each
// of the block's BM rows' 1/rms (1 without NORM, or past M), over the whole row of K values
template <int NORM, int BM, int NT>
__device__ __forceinline__ void stage_rows(const float *xb, int m0, int M, int K, float eps, float *rs, float *lut) {
  const int tid = threadIdx.x, warp = tid / WARPSIZE, lane = tid % WARPSIZE;
  if (tid < 16) lut[tid] = NF4_CODE[tid];
  for (int r = warp; r < BM; r += NT / WARPSIZE) {
    float v = 1.0f;
    if (NORM && m0 + r < M) v = row_rsqrt_warp(xb + (size_t)(m0 + r) * K, K, eps, lane);
    if (lane == 0) rs[r] = v;
  }
}

// x tile element (r, c..c+3) normed and rounded to f16 into the operand buffer; returns its sum of squares.
// LATE: the row's 1/rms is not known yet (it is applied to the accumulators after the K loop, `late_rms`), so only
// the norm weights scale the element here; otherwise rs[r] from the prologue does too.
// nw: the norm weights of columns c..c+3, loaded with the x words (a load here would stall the staging).
template <int NORM, int LATE, int BK>
__device__ __forceinline__ float store_x4(float4 v, float4 nw, int r, int c, unsigned short *buf, const float *rs) {
  const float ss = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  if (NORM) {
    const float q = LATE ? 1.0f : rs[r];
    v = f4(v.x * q * nw.x, v.y * q * nw.y, v.z * q * nw.z, v.w * q * nw.w);
  }
  uint2 hv;
  hv.x = pack2(v.x, v.y);
  hv.y = pack2(v.z, v.w);
  *reinterpret_cast<uint2 *>(buf + r * Lda<BK>::value + c) = hv;
  return ss;
}

// The late norm, after the last K step: each row's 1/rms from the sums of squares the threads gathered while staging
// x (ss[i]: x tile element tid + i * NT's row; BK/4 neighbouring lanes share a row and all its K), into rs, then
// every accumulator scaled by its row's: norm(x) W^T = diag(1/rms) (x * norm_w) W^T. Saves the prologue's second
// pass over the block's rows of x.
template <int BM, int BN, int BK, int WM, int WN, int NT, int SETS>
__device__ __forceinline__ void late_rms(const float *ss, float *rs, int K, float eps,
                                         float (&acc)[SETS][WM / 16][WN / 8][4]) {
  constexpr int XQ = BM * BK / 4;
  const int tid = threadIdx.x, warp = tid / WARPSIZE, lane = tid % WARPSIZE;
#pragma unroll
  for (int i = 0; i < (XQ + NT - 1) / NT; ++i) {
    float v = ss[i];
#pragma unroll
    for (int o = BK / 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);  // within the row's BK/4 lanes
    const int e = tid + i * NT;
    if (e < XQ && e % (BK / 4) == 0) rs[e / (BK / 4)] = rsqrtf(v / (float)K + eps);
  }
  __syncthreads();
  const int wm = (warp / (BN / WN)) * WM, g = lane >> 2;
#pragma unroll
  for (int i = 0; i < WM / 16; ++i) {
    const float lo = rs[wm + 16 * i + g], hi = rs[wm + 16 * i + g + 8];  // accumulator rows g and g + 8
#pragma unroll
    for (int s = 0; s < SETS; ++s)
#pragma unroll
      for (int j = 0; j < WN / 8; ++j) {
        acc[s][i][j][0] *= lo;
        acc[s][i][j][1] *= lo;
        acc[s][i][j][2] *= hi;
        acc[s][i][j][3] *= hi;
      }
  }
}

// One K step's words in registers -> the operand buffer: x normed and rounded to f16, W decoded to f16 (rows past N
// as zeros). xr[i] holds the float4 of x tile element e = tid + i * NT, wr[i] the raw W word(s) of word e.
// nw: the norm weights of this thread's x columns (the same for every element it stages), loaded with x.
template <int FMT, int NORM, int LATE, int BM, int BN, int BK, int NT, int SETS>
__device__ __forceinline__ void store_ops(const float4 *xr, float4 nw, const WRaw<FMT> *wr, unsigned short *buf,
                                          const float *rs, const float *lut, int n0, int N, float *ss) {
  static_assert(NT % (BK / 4) == 0, "a thread's x columns must not change with the element");
  constexpr int XQ = BM * BK / 4, WQ = SETS * BN * BK / 8;
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < (XQ + NT - 1) / NT; ++i) {
    const int e = tid + i * NT;
    if (e < XQ) ss[i] += store_x4<NORM, LATE, BK>(xr[i], nw, e / (BK / 4), (e % (BK / 4)) * 4, buf, rs);
  }
#pragma unroll
  for (int i = 0; i < (WQ + NT - 1) / NT; ++i) {
    const int e = tid + i * NT, s = e / (BN * (BK / 8)), rem = e % (BN * (BK / 8));
    const int r = rem / (BK / 8), c = (rem % (BK / 8)) * 8;
    if (e >= WQ) continue;
    const uint4 v = n0 + r < N ? decode8<FMT>(wr[i], lut) : u4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4 *>(buf + (BM + s * BN + r) * Lda<BK>::value + c) = v;
  }
}

// The tensor cores over one operand buffer: each warp's WM x WN tile in m16n8k16 steps, fragments by ldmatrix
template <int BM, int BN, int BK, int WM, int WN, int SETS>
__device__ __forceinline__ void mma_ops(const unsigned short *cur, float (&acc)[SETS][WM / 16][WN / 8][4]) {
  constexpr int LDA = Lda<BK>::value, FM = WM / 16, FN = WN / 8;
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE;
  const int wm = (warp / (BN / WN)) * WM, wn = (warp % (BN / WN)) * WN;
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    unsigned a[FM][4];
#pragma unroll
    for (int i = 0; i < FM; ++i)  // A 16x16: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
      ldmatrix_x4(a[i], cur + (wm + 16 * i + (lane & 15)) * LDA + kk + (lane >> 4) * 8);
#pragma unroll
    for (int s = 0; s < SETS; ++s)
#pragma unroll
      for (int j = 0; j < FN; j += 2) {
        // B for n8 tiles j and j+1: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        unsigned b[4];
        ldmatrix_x4(b, cur + (BM + s * BN + wn + 8 * j + (lane & 7) + (lane >> 4) * 8) * LDA + kk +
                           ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int i = 0; i < FM; ++i) {
          mma_16816(acc[s][i][j], a[i], b);
          mma_16816(acc[s][i][j + 1], a[i], b + 2);
        }
      }
  }
}

template <int SETS, int FM, int FN>
__device__ __forceinline__ void zero_acc(float (&acc)[SETS][FM][FN][4]) {
#pragma unroll
  for (int s = 0; s < SETS; ++s)
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[s][i][j][q] = 0.0f;
}

// The register-prefetch main loop of one BM x BN output tile (blockIdx.x, blockIdx.y) over `steps` K steps from
// column k_begin, into the accumulators; the rows' 1/rms (NORM) always covers the whole row of K values: LATE 1
// (the whole of K in this block) gathers it while staging x and scales the accumulators at the end (`late_rms`),
// LATE 0 (a slice of K) reads each row once more in a prologue. Shared by the mma kernel (LATE = NORM) and the
// split-K kernel (one slice of K per blockIdx.z, LATE 0).
template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN, int PIPE, int LATE>
__device__ __forceinline__ void mma_main(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w,
                                         const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
                                         const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
                                         float eps, int M, int N, int K, int k_begin, int steps,
                                         float (&acc)[EPI == 2 ? 2 : 1][WM / 16][WN / 8][4]) {
  constexpr int FAIL = mma_first_failure(FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu), NORM 0/1");
  static_assert(FAIL != 2, "fragments_16: WM, WN and BK must be multiples of 16 (m16n8k16 tensor-core steps)");
  static_assert(FAIL != 3, "warp_tiles_divide: BM % WM and BN % WN must be 0");
  static_assert(FAIL != 4, "threads_1024: (BM/WM)*(BN/WN) warps must be at most 1024 threads");
  static_assert(FAIL != 5, "smem_48k: the PIPE operand buffers exceed 48 KB of static shared memory");
  static_assert(FAIL != 6, "fragments_per_warp_16: at most 16 accumulator 16x16 tiles per warp (register spilling)");
  static_assert(FAIL != 7, "pipe_1_2: PIPE (operand buffers in shared memory) must be 1 or 2");
  static_assert(FAIL != 8, "registers_160: accumulators + next-step words above 160 registers per thread spill");
  constexpr int NT = (BM / WM) * (BN / WN) * WARPSIZE;
  constexpr int SETS = EPI == 2 ? 2 : 1;
  constexpr int XQ = BM * BK / 4;         // float4s of the x tile
  constexpr int WQ = SETS * BN * BK / 8;  // words of 8 weights of the W tile(s)
  constexpr int XPT = (XQ + NT - 1) / NT, WPT = (WQ + NT - 1) / NT;
  constexpr int STAGE = (BM + SETS * BN) * Lda<BK>::value;  // halves of one operand buffer
  __shared__ __align__(16) unsigned char smem[mma_smem_bytes(EPI, BM, BN, BK, PIPE)];
  unsigned short *ops = reinterpret_cast<unsigned short *>(smem);  // PIPE operand buffers
  float *rs = reinterpret_cast<float *>(smem + PIPE * STAGE * 2);   // (BM,) 1/rms
  float *lut = rs + BM;                                              // (16,) the NF4 code
  const int tid = threadIdx.x, m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const float *xb = x + (size_t)x_row0 * K;
  stage_rows<NORM && !LATE, BM, NT>(xb, m0, M, K, eps, rs, lut);
  __syncthreads();

  float ss[XPT];  // LATE: sums of squares of this thread's x rows
#pragma unroll
  for (int i = 0; i < XPT; ++i) ss[i] = 0.0f;
  // the norm weights ride with the x words a step ahead: one float4, since NT is a multiple of BK / 4, so every x
  // element a thread stages has the same columns (tid % (BK / 4)) * 4..
  float4 xr[XPT], nwr = f4(0.0f, 0.0f, 0.0f, 0.0f);
  WRaw<FMT> wr[WPT];
  auto load = [&](int k0) {  // one K step's global words into registers (rows past M / N read nothing)
#pragma unroll
    for (int i = 0; i < XPT; ++i) {
      const int e = tid + i * NT, r = e / (BK / 4), c = (e % (BK / 4)) * 4;
      xr[i] = f4(0.0f, 0.0f, 0.0f, 0.0f);
      if (e < XQ && m0 + r < M) xr[i] = *reinterpret_cast<const float4 *>(xb + (size_t)(m0 + r) * K + k0 + c);
    }
    if (NORM) nwr = *reinterpret_cast<const float4 *>(norm_w + k0 + (tid % (BK / 4)) * 4);
#pragma unroll
    for (int i = 0; i < WPT; ++i) {
      const int e = tid + i * NT, s = e / (BN * (BK / 8)), rem = e % (BN * (BK / 8));
      const int r = rem / (BK / 8), c = (rem % (BK / 8)) * 8;
      if (e < WQ && n0 + r < N) load_raw<FMT>(s ? w_up : w, s ? absmax_up : absmax, n0 + r, k0 + c, K, wr[i]);
    }
  };
  auto store = [&](int k0, unsigned short *buf) {
    store_ops<FMT, NORM, LATE, BM, BN, BK, NT, SETS>(xr, nwr, wr, buf, rs, lut, n0, N, ss);
  };

  zero_acc(acc);
  load(k_begin);
  store(k_begin, ops);
  __syncthreads();
  for (int kt = 0; kt < steps; ++kt) {
    const unsigned short *cur = ops + (PIPE == 2 ? (kt & 1) * STAGE : 0);
    if (kt + 1 < steps) load(k_begin + (kt + 1) * BK);  // the next step's global loads fly while the tensor cores work
    mma_ops<BM, BN, BK, WM, WN, SETS>(cur, acc);
    if (kt + 1 < steps) {
      if (PIPE == 1) __syncthreads();  // one buffer: every warp is done reading it before it is overwritten
      store(k_begin + (kt + 1) * BK, ops + (PIPE == 2 ? ((kt + 1) & 1) * STAGE : 0));
    }
    __syncthreads();
  }
  if (NORM && LATE) late_rms<BM, BN, BK, WM, WN, NT, SETS>(ss, rs, K, eps, acc);
}

// f(i, j, e, r, c) for each accumulator value acc[.][i][j][e] a thread holds inside the M x N output, for the warp
// tile at rows m0.., columns n0..: D rows g and g+8 of each m16 tile, columns 2t and 2t+1 of each n8 tile (the
// mma.sync accumulator layout, which a wgmma warpgroup's warps hold too)
template <int WM, int WN, typename F>
__device__ __forceinline__ void each_output_at(int m0, int n0, int M, int N, F f) {
  const int lane = threadIdx.x % WARPSIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < WM / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + 16 * i + g + 8 * h;
      if (r >= M) continue;
#pragma unroll
      for (int j = 0; j < WN / 8; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int c = n0 + 8 * j + 2 * t + q;
          if (c < N) f(i, j, 2 * h + q, r, c);
        }
    }
}

// The two ways a warp tile's accumulators (origin m0, n0) leave a block: the epilogue into out (M, N), or (split-K)
// the raw values of slice blockIdx.z into partial (KS, SETS, M, N) for nf4_mm_splitk_reduce
template <int EPI, int WM, int WN, int SETS>
__device__ __forceinline__ void store_epilogue_at(const float (&acc)[SETS][WM / 16][WN / 8][4], float *out, int M,
                                                  int N, int m0, int n0) {
  each_output_at<WM, WN>(m0, n0, M, N, [&](int i, int j, int e, int r, int c) {
    const float y = acc[0][i][j][e];
    float *o = out + (size_t)r * N + c;
    if (EPI == 0) *o = y;
    else if (EPI == 1) *o += y;
    else *o = silu(y) * acc[SETS - 1][i][j][e];
  });
}

template <int WM, int WN, int SETS>
__device__ __forceinline__ void store_partial_at(const float (&acc)[SETS][WM / 16][WN / 8][4], float *partial, int M,
                                                 int N, int m0, int n0) {
  const size_t mn = (size_t)M * N;
  float *p = partial + blockIdx.z * SETS * mn;
  each_output_at<WM, WN>(m0, n0, M, N, [&](int i, int j, int e, int r, int c) {
#pragma unroll
    for (int s = 0; s < SETS; ++s) p[s * mn + (size_t)r * N + c] = acc[s][i][j][e];
  });
}

// the origin of this warp's WM x WN tile in a BM x BN block tile of (BM/WM) x (BN/WN) warps
template <int BM, int BN, int WM, int WN>
__device__ __forceinline__ int2 warp_origin() {
  const int warp = threadIdx.x / WARPSIZE;
  int2 o;
  o.x = blockIdx.y * BM + (warp / (BN / WN)) * WM;
  o.y = blockIdx.x * BN + (warp % (BN / WN)) * WN;
  return o;
}

// Shared by every mma.sync kernel: the block's warp tiles through the two ways out
template <int EPI, int BM, int BN, int WM, int WN, int SETS>
__device__ __forceinline__ void store_epilogue(const float (&acc)[SETS][WM / 16][WN / 8][4], float *out, int M,
                                               int N) {
  const int2 o = warp_origin<BM, BN, WM, WN>();
  store_epilogue_at<EPI, WM, WN, SETS>(acc, out, M, N, o.x, o.y);
}

template <int BM, int BN, int WM, int WN, int SETS>
__device__ __forceinline__ void store_partial(const float (&acc)[SETS][WM / 16][WN / 8][4], float *partial, int M,
                                              int N) {
  const int2 o = warp_origin<BM, BN, WM, WN>();
  store_partial_at<WM, WN, SETS>(acc, partial, M, N, o.x, o.y);
}
