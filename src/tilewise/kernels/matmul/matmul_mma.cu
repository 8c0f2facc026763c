// matmul_mma.cu - the register-prefetched tensor-core kernel and split-K over it; compiled after matmul.cu (its main
// loop mma_main and the epilogues) and matmul_reduce.cu (serial_reduce, cluster_reduce).
template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN, int PIPE>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * WARPSIZE, 1)
nf4_mm_mma(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w, const float *__restrict__ absmax,
           const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
           float eps, float *__restrict__ out, int M, int N, int K) {
  PDL_BEGIN();
  constexpr int SETS = EPI == 2 ? 2 : 1;
  float acc[SETS][WM / 16][WN / 8][4];
  mma_main<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE, NORM>(x, x_row0, w, absmax, w_up, absmax_up, norm_w, eps, M, N,
                                                           K, 0, K / BK, acc);
  store_epilogue<EPI, BM, BN, WM, WN, SETS>(acc, out, M, N);
}

// split-K: slice blockIdx.z of KS covers K / KS columns; its raw accumulators (both weight sets for swiglu) go to
// partial (KS, SETS, M, N), and nf4_mm_splitk_reduce applies the epilogue to their sum (SR 0), or the last of the
// tile's blocks does, into final_out, counting in the zeroed `counters` (SR 1); SR 0 ignores both. SR 2 (Hopper,
// nf4_mm_splitk_cluster): the tile's KS blocks are one cluster; each stages its raw sums in shared memory and
// `cluster_reduce` sums them in order 0..KS-1 into final_out (the same bits as SR 0), with no partial sums in global
// memory, no counters and no reduction launch (partial and counters are not read); with fold_g not null (residual,
// BN % 64 == 0, whole 128-thread chunks: `fold_from` in cuda.py says where) it also stores the norm fold's f16 rows
// into out_h and their sums of squares into ss_out (`cluster_reduce`). The two kernels differ only in their cluster
// shape; the plain one ignores out_h, fold_g and ss_out.
template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN, int PIPE, int KS, int SR>
__device__ __forceinline__ void splitk_body(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w,
                                            const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
                                            const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
                                            float eps, float *__restrict__ partial, int M, int N, int K,
                                            float *__restrict__ final_out, unsigned *__restrict__ counters,
                                            unsigned short *__restrict__ out_h, const float *__restrict__ fold_g,
                                            float *__restrict__ ss_out) {
  PDL_BEGIN();
  constexpr int FAIL = splitk_first_failure(FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE, KS, SR);
  static_assert(FAIL != 9, "ks_2_4_8: KS (slices of K) must be 2, 4 or 8");
  static_assert(FAIL != 10, "sr_0_1_2: SR (who sums the slices) must be 0, 1 or 2");
  static_assert(FAIL != 11, "cluster_tile_48k: the main loop's buffers and SR 2's tile exceed 48 KB");
  constexpr int SETS = EPI == 2 ? 2 : 1, NT = (BM / WM) * (BN / WN) * WARPSIZE;
  const int slice = K / KS, r0 = blockIdx.y * BM, c0 = blockIdx.x * BN;
  float acc[SETS][WM / 16][WN / 8][4];
  mma_main<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE, 0>(x, x_row0, w, absmax, w_up, absmax_up, norm_w, eps, M, N, K,
                                                     blockIdx.z * slice, slice / BK, acc);
  if constexpr (SR == 2) {
    constexpr int TS = BN + 4;
    __shared__ __align__(16) float tile[SETS * BM * TS];  // beside mma_main's buffers: cluster_tile_48k
    const int2 o = warp_origin<BM, BN, WM, WN>();
    each_output_at<WM, WN>(o.x, o.y, M, N, [&](int i, int j, int e, int r, int c) {
#pragma unroll
      for (int s = 0; s < SETS; ++s) tile[(s * BM + r - r0) * TS + c - c0] = acc[s][i][j][e];
    });
    cluster_reduce<EPI, KS, NT, BM, BN>(smem_addr(tile), final_out, out_h, M, N, r0, c0, fold_g, ss_out);
  } else {
    store_partial<BM, BN, WM, WN, SETS>(acc, partial, M, N);
    if constexpr (SR == 1) {
      __shared__ unsigned last;  // 4 bytes beside mma_main's buffers: the largest legal tile leaves room (a unit test)
      serial_reduce<EPI, KS, NT, BM, BN>(partial, final_out, nullptr, counters, &last, M, N, r0, c0);
    }
  }
}

template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN, int PIPE, int KS, int SR>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * WARPSIZE, 1)
nf4_mm_splitk(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w,
              const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
              const float *__restrict__ absmax_up, const float *__restrict__ norm_w, float eps,
              float *__restrict__ partial, int M, int N, int K, float *__restrict__ final_out,
              unsigned *__restrict__ counters, unsigned short *__restrict__ out_h, const float *__restrict__ fold_g,
              float *__restrict__ ss_out) {
  static_assert(SR != 2, "SR 2 (a cluster per tile) is launched as nf4_mm_splitk_cluster");
  splitk_body<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE, KS, SR>(x, x_row0, w, absmax, w_up, absmax_up, norm_w, eps,
                                                                partial, M, N, K, final_out, counters, out_h, fold_g,
                                                                ss_out);
}

template <int FMT, int EPI, int NORM, int BM, int BN, int BK, int WM, int WN, int PIPE, int KS, int SR>
__global__ void __cluster_dims__(1, 1, KS) __launch_bounds__((BM / WM) * (BN / WN) * WARPSIZE, 1)
nf4_mm_splitk_cluster(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w,
                      const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
                      const float *__restrict__ absmax_up, const float *__restrict__ norm_w, float eps,
                      float *__restrict__ partial, int M, int N, int K, float *__restrict__ final_out,
                      unsigned *__restrict__ counters, unsigned short *__restrict__ out_h,
                      const float *__restrict__ fold_g, float *__restrict__ ss_out) {
  static_assert(SR == 2, "nf4_mm_splitk_cluster sums the slices in a cluster: SR 2");
  splitk_body<FMT, EPI, NORM, BM, BN, BK, WM, WN, PIPE, KS, SR>(x, x_row0, w, absmax, w_up, absmax_up, norm_w, eps,
                                                                partial, M, N, K, final_out, counters, out_h, fold_g,
                                                                ss_out);
}
