// matmul_pipe.cu - the tensor-core matmul fed by a cp.async pipeline; compiled after matmul.cu (its helpers).
//
// nf4_mm_pipe<FMT, EPI, NORM, BM, BN, BK, WM, WN, ST, KS, MB>: the same tiles and tensor-core steps fed by a cp.async
// ring of ST raw stages (x f32, W as stored, nf4's absmax) filled up to ST - 1 steps ahead, converted into two f16
// operand buffers with one barrier a step (`pipe_main`); KS 1 writes the epilogue, KS > 1 split-K partials.
// Launched with pipe_smem_bytes of dynamic shared memory (opted in above 48 KB by the host).

// the pipe kernel's shared memory: ST raw stages (x f32, W as stored, nf4's absmax per row, the step's norm
// weights), two f16 operand buffers, the rows' 1/rms and the NF4 code
__host__ __device__ constexpr int pipe_row_bytes(int FMT, int BK) {
  return FMT == 0 ? BK / 2 : FMT == 1 ? BK * 2 : BK * 4;
}
__host__ __device__ constexpr int pipe_absmax_per_row(int FMT, int BK) {
  return FMT == 0 ? (BK >= 64 ? BK / 64 : 1) : 0;
}
__host__ __device__ constexpr int pipe_raw_stage_bytes(int FMT, int EPI, int BM, int BN, int BK) {
  const int sets = EPI == 2 ? 2 : 1;
  return BM * BK * 4 + sets * BN * pipe_row_bytes(FMT, BK) + sets * BN * pipe_absmax_per_row(FMT, BK) * 4 + BK * 4;
}
__host__ __device__ constexpr int pipe_smem_bytes(int FMT, int EPI, int BM, int BN, int BK, int ST) {
  const int sets = EPI == 2 ? 2 : 1;
  return ST * pipe_raw_stage_bytes(FMT, EPI, BM, BN, BK) + 2 * (BM + sets * BN) * (BK + 8) * 2 + BM * 4 + 16 * 4;
}
// the most dynamic shared memory a block may opt into on sm_80..sm_90 (227 KB); a device rule checks the GPU's own
#define PIPE_SMEM_MAX (227 * 1024)

__host__ __device__ constexpr int pipe_first_failure(int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM,
                                                      int WN, int ST, int KS, int MB) {
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2 || NORM < 0 || NORM > 1) return 1;  // variant
  if (WM % 16 != 0 || WN % 16 != 0 || BK % 16 != 0 || WM < 16 || WN < 16 || BK < 16) return 2;  // fragments_16
  if (BM % WM != 0 || BN % WN != 0) return 3;                                      // warp_tiles_divide
  if ((BM / WM) * (BN / WN) * WARPSIZE > 1024) return 4;                           // threads_1024
  if ((WM / 16) * (WN / 16) * (EPI == 2 ? 2 : 1) > 16) return 5;                    // fragments_per_warp_16
  if (WM * WN > 2048) return 6;                                                    // warp_tile_2048
  if (BK % 32 != 0) return 7;                                                      // raw_rows_16b
  if (ST < 3 || ST > 8) return 8;                                                  // stages_3_8
  if (KS != 1 && KS != 2 && KS != 4 && KS != 8) return 9;                          // ks_1_2_4_8
  if (MB < 1 || MB > 2) return 10;                                                 // mb_1_2
  if (pipe_smem_bytes(FMT, EPI, BM, BN, BK, ST) > PIPE_SMEM_MAX) return 11;        // smem_227k
  return 0;
}

// ---- the cp.async pipeline (sm_80+) ------------------------------------------------------------------------------
// 16 (or 4) bytes global -> shared without registers; `valid` false copies nothing and zero-fills the destination
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// The pipe main loop: ST raw stages of global words in shared memory (x as f32, W as stored, nf4's absmax), filled
// by cp.async up to ST - 1 steps ahead, and two operand buffers: in step kt the block converts raw stage kt + 1 into
// one operand buffer while the tensor cores run on the other, with one barrier a step. Nothing is held in registers
// across a step but the accumulators. Shared memory is dynamic (`pipe_smem_bytes`, above 48 KB by opt-in).
template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN, int ST, int LATE>
__device__ __forceinline__ void pipe_main(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w,
                                          const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
                                          const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
                                          float eps, int M, int N, int K, int k_begin, int steps,
                                          float (&acc)[EPI == 2 ? 2 : 1][WM / 16][WN / 8][4]) {
  constexpr int NT = (BM / WM) * (BN / WN) * WARPSIZE;
  constexpr int SETS = EPI == 2 ? 2 : 1;
  constexpr int RB = pipe_row_bytes(FMT, BK), AB = pipe_absmax_per_row(FMT, BK);
  constexpr int XQ = BM * BK / 4, WQ = SETS * BN * BK / 8;  // float4s of x, words of 8 weights of W
  constexpr int XC = XQ, WC = SETS * BN * RB / 16, AC = SETS * BN * AB;  // cp.async copies per raw stage
  constexpr int RAW = pipe_raw_stage_bytes(FMT, EPI, BM, BN, BK);
  constexpr int NWOFF = BM * BK * 4 + SETS * BN * RB + SETS * BN * AB * 4;  // the step's BK norm weights
  constexpr int OPS = (BM + SETS * BN) * Lda<BK>::value;  // halves of one operand buffer
  extern __shared__ __align__(16) unsigned char dsmem[];
  unsigned char *raw = dsmem;                                                   // ST x [x f32, W words, absmax]
  unsigned short *ops = reinterpret_cast<unsigned short *>(dsmem + ST * RAW);  // 2 operand buffers
  float *rs = reinterpret_cast<float *>(ops + 2 * OPS);                        // (BM,) 1/rms
  float *lut = rs + BM;                                                         // (16,) the NF4 code
  const int tid = threadIdx.x, m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const float *xb = x + (size_t)x_row0 * K;

  auto issue = [&](int kt) {  // step kt's global words -> raw stage kt % ST (rows past M / N: zero-filled)
    if (kt >= steps) return;
    const int k0 = k_begin + kt * BK;
    unsigned char *st = raw + (kt % ST) * RAW;
#pragma unroll
    for (int i = 0; i < (XC + NT - 1) / NT; ++i) {
      const int e = tid + i * NT, r = e / (BK / 4), c = (e % (BK / 4)) * 4;
      const bool ok = m0 + r < M;
      if (e < XC) cp_async16(st + (r * BK + c) * 4, ok ? xb + (size_t)(m0 + r) * K + k0 + c : xb, ok);
    }
#pragma unroll
    for (int i = 0; i < (WC + NT - 1) / NT; ++i) {
      const int e = tid + i * NT, s = e / (BN * (RB / 16)), rem = e % (BN * (RB / 16));
      const int r = rem / (RB / 16), c = (rem % (RB / 16)) * 16;
      const bool ok = n0 + r < N;
      const unsigned char *src = reinterpret_cast<const unsigned char *>(s ? w_up : w);
      if (e < WC)
        cp_async16(st + BM * BK * 4 + (s * BN + r) * RB + c,
                   ok ? src + ((size_t)(n0 + r) * K + k0) * RB / BK + c : src, ok);
    }
    if (FMT == 0) {
#pragma unroll
      for (int i = 0; i < (AC + NT - 1) / NT; ++i) {
        const int e = tid + i * NT, s = e / (BN * AB), rem = e % (BN * AB), r = rem / AB, j = rem % AB;
        const bool ok = n0 + r < N;
        const float *src = s ? absmax_up : absmax;
        if (e < AC)
          cp_async4(st + BM * BK * 4 + SETS * BN * RB + ((s * BN + r) * AB + j) * 4,
                    ok ? src + ((size_t)(n0 + r) * K + k0) / 64 + j : src, ok);
      }
    }
    if (NORM && tid < BK / 4) cp_async16(st + NWOFF + tid * 16, norm_w + k0 + tid * 4, true);
  };
  float ss[(XQ + NT - 1) / NT];  // LATE: sums of squares of this thread's x rows
#pragma unroll
  for (int i = 0; i < (XQ + NT - 1) / NT; ++i) ss[i] = 0.0f;
  auto convert = [&](int kt, unsigned short *buf) {  // raw stage kt % ST -> an operand buffer, a word at a time
    const unsigned char *st = raw + (kt % ST) * RAW;
    const float *am = reinterpret_cast<const float *>(st + BM * BK * 4 + SETS * BN * RB);  // (SETS, BN, AB)
#pragma unroll
    for (int i = 0; i < (XQ + NT - 1) / NT; ++i) {
      const int e = tid + i * NT;  // raw x is (BM, BK) f32: element e is row e / (BK/4), columns 4 (e % (BK/4))..
      if (e < XQ)
        ss[i] += store_x4<NORM, LATE, BK>(reinterpret_cast<const float4 *>(st)[e],
                                          reinterpret_cast<const float4 *>(st + NWOFF)[e % (BK / 4)],
                                          e / (BK / 4), (e % (BK / 4)) * 4, buf, rs);
    }
#pragma unroll
    for (int i = 0; i < (WQ + NT - 1) / NT; ++i) {
      const int e = tid + i * NT, s = e / (BN * (BK / 8)), rem = e % (BN * (BK / 8));
      const int r = rem / (BK / 8), c = (rem % (BK / 8)) * 8;
      if (e >= WQ) continue;
      const unsigned char *row = st + BM * BK * 4 + (s * BN + r) * RB;
      WRaw<FMT> wr;
      if (FMT == 0) {
        wr.q[0].x = reinterpret_cast<const unsigned *>(row)[c / 8];
        wr.s = am[(s * BN + r) * AB + c / 64];
      } else {
        const uint4 *q = reinterpret_cast<const uint4 *>(row) + c / (FMT == 1 ? 8 : 4);
        wr.q[0] = q[0];
        wr.q[FMT == 2 ? 1 : 0] = q[FMT == 2 ? 1 : 0];
      }
      // rows past N were zero-filled by cp.async: their decoded words are zeros too (absmax 0)
      *reinterpret_cast<uint4 *>(buf + (BM + s * BN + r) * Lda<BK>::value + c) = decode8<FMT>(wr, lut);
    }
  };

#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {  // the first ST - 1 steps' copies fly while the rows' 1/rms is computed
    issue(s);
    cp_async_commit();
  }
  stage_rows<NORM && !LATE, BM, NT>(xb, m0, M, K, eps, rs, lut);
  zero_acc(acc);
  cp_async_wait<ST - 2>();  // this thread's copies of step 0 have landed
  __syncthreads();          // ... everyone's, and rs / lut are written
  convert(0, ops);
  for (int kt = 0; kt < steps; ++kt) {
    issue(kt + ST - 1);  // into the stage step kt - 1 used: converted before the last barrier
    cp_async_commit();   // (an empty group past the last step keeps the count uniform)
    cp_async_wait<ST - 2>();  // step kt + 1 has landed
    __syncthreads();  // its raw stage is visible; every warp is done with operand buffer (kt + 1) & 1
    if (kt + 1 < steps) convert(kt + 1, ops + ((kt + 1) & 1) * OPS);
    mma_ops<BM, BN, BK, WM, WN, SETS>(ops + (kt & 1) * OPS, acc);
  }
  if (NORM && LATE) late_rms<BM, BN, BK, WM, WN, NT, SETS>(ss, rs, K, eps, acc);
}

// pipe: the cp.async main loop (`pipe_main`) over slice blockIdx.z of KS; KS 1 applies the epilogue to out, KS > 1
// writes partial (KS, SETS, M, N) for nf4_mm_splitk_reduce. Launched with pipe_smem_bytes of dynamic shared memory.
// MB is the launch bound's blocks per SM: 2 caps registers so that two blocks fit (one block's barrier wait then
// overlaps the other's work), 1 leaves ptxas all 255.
template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN, int ST, int KS, int MB>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * WARPSIZE, MB)
nf4_mm_pipe(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w, const float *__restrict__ absmax,
            const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
            float eps, float *__restrict__ out, int M, int N, int K) {
  PDL_BEGIN();
  constexpr int FAIL = pipe_first_failure(FMT, EPI, NORM, BM, BN, BK, WM, WN, ST, KS, MB);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu), NORM 0/1");
  static_assert(FAIL != 2, "fragments_16: WM, WN and BK must be multiples of 16 (m16n8k16 tensor-core steps)");
  static_assert(FAIL != 3, "warp_tiles_divide: BM % WM and BN % WN must be 0");
  static_assert(FAIL != 4, "threads_1024: (BM/WM)*(BN/WN) warps must be at most 1024 threads");
  static_assert(FAIL != 5, "fragments_per_warp_16: at most 16 accumulator 16x16 tiles per warp (register spilling)");
  static_assert(FAIL != 6, "warp_tile_2048: a 64x64 warp tile (128 accumulators, 8 B fragments) spills");
  static_assert(FAIL != 7, "raw_rows_16b: BK must be a multiple of 32 (a raw nf4 row of a step is whole 16 B copies)");
  static_assert(FAIL != 8, "stages_3_8: ST (raw stages in flight) must be 3..8");
  static_assert(FAIL != 9, "ks_1_2_4_8: KS (slices of K) must be 1, 2, 4 or 8");
  static_assert(FAIL != 10, "mb_1_2: MB (blocks per SM of the launch bound) must be 1 or 2");
  static_assert(FAIL != 11, "smem_227k: the raw stages and operand buffers exceed 227 KB of shared memory");
  constexpr int SETS = EPI == 2 ? 2 : 1;
  const int slice = K / KS;
  float acc[SETS][WM / 16][WN / 8][4];
  pipe_main<FMT, EPI, NORM, BM, BN, BK, WM, WN, ST, KS == 1>(x, x_row0, w, absmax, w_up, absmax_up, norm_w, eps, M, N,
                                                             K, blockIdx.z * slice, slice / BK, acc);
  if (KS == 1) store_epilogue<EPI, BM, BN, WM, WN, SETS>(acc, out, M, N);
  else store_partial<BM, BN, WM, WN, SETS>(acc, out, M, N);
}
