// gemm.cu - fp32 warp-tiled SGEMM (seed 003's kernel: "kernel 10 / warptiling"), row-major:
//
//   C (M, N) = alpha * A (M, K) @ B (K, N) + beta * C (M, N)
//
// Variants: one template, nine parameters (tilewise instantiates them through NVRTC name expressions,
// e.g. `sgemm_warptile<128, 64, 16, 64, 32, 2, 4, 4, 128>`):
//   BM, BN, BK   block tile: BM x BN outputs per block, K consumed BK at a time through shared memory
//   WM, WN       warp tile: each warp owns a WM x WN rectangle of the block tile
//   WNITER       the warp tile is walked as WMITER x WNITER sub-tiles (WMITER = WM*WN / (32*TM*TN*WNITER))
//   TM, TN       per-thread register tile inside one sub-tile
//   NT           threads per block
//
// Design: float4 global loads; the A tile is stored transposed in shared memory (As is BK x BM) so that
// the inner loop reads both operands along contiguous rows; each thread keeps WMITER*TM x WNITER*TN
// accumulators in registers. The next K-slab is fetched from global memory into registers while the
// current one is multiplied (register-staged prefetch: no extra shared memory, so seed 003's 48 KB rule
// is unchanged).
//
// Shapes admitted (checked up front by the Python template, `shape_problems`):
//   M >= 1 any value (partial row tiles are bounds-guarded),
//   N % 4 == 0 and K % 4 == 0 (a float4 never straddles the matrix edge; partial column and K tiles
//   are bounds-guarded and zero-filled), A, B, C 16-byte aligned (CuPy allocations are 256-byte aligned),
//   ceil(M / BM) <= 65535 (grid y).
// beta == 0 never reads C (BLAS semantics: NaN in C does not leak into the result).
//
// Legality: `cfg_valid` is seed 003's function, check for check in its order; `cfg_first_failure` is the
// same walk returning which check failed, so that the kernel's static_asserts name the broken assumption.
// An illegal instantiation cannot compile. The Python rules (kernels/gemm/cuda.py) mirror these one to one.

#ifndef WARPSIZE
#define WARPSIZE 32
#endif

__host__ __device__ constexpr bool cfg_valid(int BM, int BN, int BK, int WM, int WN, int WNITER,
                                             int TM, int TN, int NT) {
  // block must be a whole number of warps, tiled evenly by warp tiles
  if (NT % WARPSIZE != 0) return false;
  if (BM % WM != 0 || BN % WN != 0) return false;
  if ((BM / WM) * (BN / WN) != NT / WARPSIZE) return false;

  // a warp's WM x WN rectangle must decompose into whole WMITER x WNITER steps
  const int denom = WARPSIZE * TM * TN * WNITER;
  if (denom <= 0 || (WM * WN) % denom != 0) return false;
  const int WMITER = (WM * WN) / denom;
  if (WMITER < 1 || WM % WMITER != 0 || WN % WNITER != 0) return false;

  // each sub-tile must be covered by exactly 32 threads
  const int WSUBM = WM / WMITER, WSUBN = WN / WNITER;
  if (WSUBM % TM != 0 || WSUBN % TN != 0) return false;
  if ((WSUBM / TM) * (WSUBN / TN) != WARPSIZE) return false;

  // float4 vectorization requires 4-element alignment everywhere
  if (BK % 4 != 0 || BN % 4 != 0 || TN % 4 != 0) return false;

  // the SMEM load loops must tile each cache exactly, with no thread
  // computing an out-of-range innerRow
  if ((NT * 4) % BK != 0) return false;
  const int rowStrideA = (NT * 4) / BK;
  if (rowStrideA < 1 || BM % rowStrideA != 0) return false;
  if (NT % (BN / 4) != 0) return false;
  const int rowStrideB = NT / (BN / 4);
  if (rowStrideB < 1 || BK % rowStrideB != 0) return false;

  // every output element must be owned by exactly one thread
  if ((long)NT * WMITER * TM * WNITER * TN != (long)BM * BN) return false;

  // static __shared__ is capped at 48KB without an opt-in
  if ((BM * BK + BK * BN) * 4 > 48 * 1024) return false;
  // accumulators alone above ~128 registers guarantees spilling
  if (WMITER * TM * WNITER * TN > 128) return false;

  return true;
}

// The same walk as cfg_valid, returning the number of the first rule that fails (0: legal). The numbers
// are the Python rules' positions: 1 whole_warps, 2 warp_tiles_divide, 3 warps_count, 4 wmiter_integral,
// 5 subtile_32_threads, 6 float4_alignment, 7 load_strides, 8 output_owned_once, 9 static_smem_48k,
// 10 accumulators_128. Every guard still protects the divisions below it.
__host__ __device__ constexpr int cfg_first_failure(int BM, int BN, int BK, int WM, int WN, int WNITER, int TM, int TN, int NT) {
  if (NT % WARPSIZE != 0) return 1;
  if (WM <= 0 || WN <= 0 || BM % WM != 0 || BN % WN != 0) return 2;
  if ((BM / WM) * (BN / WN) != NT / WARPSIZE) return 3;
  const int denom = WARPSIZE * TM * TN * WNITER;
  if (denom <= 0 || (WM * WN) % denom != 0) return 4;
  const int WMITER = (WM * WN) / denom;
  if (WMITER < 1 || WM % WMITER != 0 || WN % WNITER != 0) return 4;
  const int WSUBM = WM / WMITER, WSUBN = WN / WNITER;
  if (WSUBM % TM != 0 || WSUBN % TN != 0) return 5;
  if ((WSUBM / TM) * (WSUBN / TN) != WARPSIZE) return 5;
  if (BK % 4 != 0 || BN % 4 != 0 || TN % 4 != 0) return 6;
  if (BK <= 0 || (NT * 4) % BK != 0) return 7;
  const int rowStrideA = (NT * 4) / BK;
  if (rowStrideA < 1 || BM % rowStrideA != 0) return 7;
  if (BN < 4 || NT % (BN / 4) != 0) return 7;
  const int rowStrideB = NT / (BN / 4);
  if (rowStrideB < 1 || BK % rowStrideB != 0) return 7;
  if ((long)NT * WMITER * TM * WNITER * TN != (long)BM * BN) return 8;
  if ((BM * BK + BK * BN) * 4 > 48 * 1024) return 9;
  if (WMITER * TM * WNITER * TN > 128) return 10;
  return 0;
}

template <int BM, int BN, int BK, int WM, int WN, int WNITER, int TM, int TN, int NT>
__global__ void __launch_bounds__(NT)
sgemm_warptile(int M, int N, int K, float alpha, const float *__restrict__ A, const float *__restrict__ B,
               float beta, float *__restrict__ C) {
  constexpr int FAIL = cfg_first_failure(BM, BN, BK, WM, WN, WNITER, TM, TN, NT);
  static_assert(FAIL != 1, "whole_warps: NT must be a multiple of the warp size 32");
  static_assert(FAIL != 2, "warp_tiles_divide: BM % WM and BN % WN must be 0");
  static_assert(FAIL != 3, "warps_count: (BM/WM)*(BN/WN) warp tiles must equal NT/32 warps");
  static_assert(FAIL != 4, "wmiter_integral: WMITER = WM*WN/(32*TM*TN*WNITER) must be a whole number >= 1 "
                           "dividing WM, and WNITER must divide WN");
  static_assert(FAIL != 5, "subtile_32_threads: each WSUBM x WSUBN sub-tile must hold exactly 32 TM x TN tiles");
  static_assert(FAIL != 6, "float4_alignment: BK, BN and TN must be multiples of 4");
  static_assert(FAIL != 7, "load_strides: the float4 load loops must tile As (BM rows) and Bs (BK rows) exactly");
  static_assert(FAIL != 8, "output_owned_once: NT*WMITER*TM*WNITER*TN must equal BM*BN");
  static_assert(FAIL != 9, "static_smem_48k: (BM*BK + BK*BN)*4 bytes of static shared memory must be <= 48 KB");
  static_assert(FAIL != 10, "accumulators_128: WMITER*TM*WNITER*TN accumulators must be <= 128");
  static_assert(cfg_valid(BM, BN, BK, WM, WN, WNITER, TM, TN, NT) == (FAIL == 0),
                "cfg_first_failure and cfg_valid disagree");
  static_assert(NT <= 1024, "threads_per_block: CUDA blocks have at most 1024 threads");
  if constexpr (FAIL == 0) {
    constexpr int WMITER = (WM * WN) / (WARPSIZE * TM * TN * WNITER);
    constexpr int WSUBM = WM / WMITER;  // sub-tile rows
    constexpr int WSUBN = WN / WNITER;  // sub-tile columns
    constexpr int ROW_STRIDE_A = (NT * 4) / BK;
    constexpr int ROW_STRIDE_B = NT / (BN / 4);
    constexpr int LOADS_A = BM / ROW_STRIDE_A;  // float4 loads of A per thread per K-slab
    constexpr int LOADS_B = BK / ROW_STRIDE_B;  // float4 loads of B per thread per K-slab

    __shared__ __align__(16) float As[BK * BM];  // (BK, BM): A tile transposed
    __shared__ __align__(16) float Bs[BK * BN];  // (BK, BN)

    const int row0 = blockIdx.y * BM;  // first output row of this block
    const int col0 = blockIdx.x * BN;  // first output column of this block
    const int warp = threadIdx.x / WARPSIZE;
    const int warpRow = warp / (BN / WN);
    const int warpCol = warp % (BN / WN);
    const int lane = threadIdx.x % WARPSIZE;
    const int tRow = lane / (WSUBN / TN);  // thread's row of TM x TN tiles inside a sub-tile
    const int tCol = lane % (WSUBN / TN);

    const int aRow = threadIdx.x / (BK / 4);        // row of the A tile this thread loads (plus i*stride)
    const int aCol = (threadIdx.x % (BK / 4)) * 4;  // column (k) of its float4
    const int bRow = threadIdx.x / (BN / 4);
    const int bCol = (threadIdx.x % (BN / 4)) * 4;

    // row validity of the A loads and column validity of the B loads do not change along K
    unsigned aRowOk = 0;
#pragma unroll
    for (int i = 0; i < LOADS_A; ++i) aRowOk |= (row0 + aRow + i * ROW_STRIDE_A < M ? 1u : 0u) << i;
    const bool bColOk = col0 + bCol < N;
    const float *Ablk = A + (size_t)(row0 + aRow) * K + aCol;
    const float *Bblk = B + (size_t)bRow * N + col0 + bCol;

    float4 stA[LOADS_A];  // next A slab, in flight while the current one is multiplied
    float4 stB[LOADS_B];
    float acc[WMITER * TM * WNITER * TN] = {0.0f};
    float regM[WMITER * TM];
    float regN[WNITER * TN];

    auto fetch = [&](int k0) {
      const bool kOk = k0 + aCol < K;
#pragma unroll
      for (int i = 0; i < LOADS_A; ++i) {
        stA[i] = ((aRowOk >> i) & 1u) && kOk
                     ? *reinterpret_cast<const float4 *>(Ablk + (size_t)i * ROW_STRIDE_A * K + k0)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int i = 0; i < LOADS_B; ++i) {
        stB[i] = bColOk && k0 + bRow + i * ROW_STRIDE_B < K
                     ? *reinterpret_cast<const float4 *>(Bblk + (size_t)(k0 + i * ROW_STRIDE_B) * N)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    };
    auto stash = [&]() {
#pragma unroll
      for (int i = 0; i < LOADS_A; ++i) {
        const int r = aRow + i * ROW_STRIDE_A;
        As[(aCol + 0) * BM + r] = stA[i].x;
        As[(aCol + 1) * BM + r] = stA[i].y;
        As[(aCol + 2) * BM + r] = stA[i].z;
        As[(aCol + 3) * BM + r] = stA[i].w;
      }
#pragma unroll
      for (int i = 0; i < LOADS_B; ++i)
        *reinterpret_cast<float4 *>(&Bs[(bRow + i * ROW_STRIDE_B) * BN + bCol]) = stB[i];
    };

    fetch(0);
    stash();
    __syncthreads();
    for (int k0 = 0; k0 < K; k0 += BK) {
      const bool more = k0 + BK < K;
      if (more) fetch(k0 + BK);
#pragma unroll
      for (int d = 0; d < BK; ++d) {
#pragma unroll
        for (int wm = 0; wm < WMITER; ++wm)
#pragma unroll
          for (int i = 0; i < TM; ++i)
            regM[wm * TM + i] = As[d * BM + warpRow * WM + wm * WSUBM + tRow * TM + i];
#pragma unroll
        for (int wn = 0; wn < WNITER; ++wn)
#pragma unroll
          for (int j = 0; j < TN; ++j)
            regN[wn * TN + j] = Bs[d * BN + warpCol * WN + wn * WSUBN + tCol * TN + j];
#pragma unroll
        for (int wm = 0; wm < WMITER; ++wm)
#pragma unroll
          for (int wn = 0; wn < WNITER; ++wn)
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
              for (int j = 0; j < TN; ++j)
                acc[(wm * TM + i) * (WNITER * TN) + wn * TN + j] += regM[wm * TM + i] * regN[wn * TN + j];
      }
      __syncthreads();
      if (more) {
        stash();
        __syncthreads();
      }
    }

#pragma unroll
    for (int wm = 0; wm < WMITER; ++wm)
#pragma unroll
      for (int wn = 0; wn < WNITER; ++wn)
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          const int r = row0 + warpRow * WM + wm * WSUBM + tRow * TM + i;
          if (r >= M) continue;
#pragma unroll
          for (int j = 0; j < TN; j += 4) {
            const int c = col0 + warpCol * WN + wn * WSUBN + tCol * TN + j;
            if (c >= N) continue;
            float4 *dst = reinterpret_cast<float4 *>(&C[(size_t)r * N + c]);
            const float *a = &acc[(wm * TM + i) * (WNITER * TN) + wn * TN + j];
            float4 out = make_float4(alpha * a[0], alpha * a[1], alpha * a[2], alpha * a[3]);
            if (beta != 0.0f) {
              const float4 old = *dst;
              out.x += beta * old.x;
              out.y += beta * old.y;
              out.z += beta * old.z;
              out.w += beta * old.w;
            }
            *dst = out;
          }
        }
  }
}
