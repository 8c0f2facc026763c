// matmul_rows.cu - the short-row matmul (few rows); compiled after matmul.cu (its helpers).
//
// nf4_mm_rows<FMT, EPI, NORM, NT, RM>: the short-row path (few rows): one warp per output column and RM rows, the
// lanes split K in words of 8 weights, f32 arithmetic, a warp reduction; grid (ceil(N / (NT/32)), ceil(M / RM)).

// eight consecutive weights of row n starting at column k (k % 8 == 0), as f32
template <int FMT>
__device__ __forceinline__ void load8(const unsigned *w, const float *absmax, const float *lut, int n, int k, int K,
                                      float *v) {
  const size_t e = (size_t)n * K + k;
  if (FMT == 0) {
    const unsigned word = w[e / 8];
    const float s = absmax[e / 64];
#pragma unroll
    for (int b = 0; b < 4; ++b) {  // byte b of the little-endian word: weights 2b (high nibble), 2b+1 (low)
      const unsigned byte = (word >> (8 * b)) & 0xffu;
      v[2 * b] = lut[byte >> 4] * s;
      v[2 * b + 1] = lut[byte & 0xfu] * s;
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

__host__ __device__ constexpr int rows_first_failure(int FMT, int EPI, int NORM, int NT, int RM) {
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2 || NORM < 0 || NORM > 1) return 1;  // variant
  if (NT % WARPSIZE != 0 || NT < WARPSIZE || NT > 1024) return 2;                // whole_warps
  if (RM < 1 || RM > 16) return 3;                                               // rows_1_16
  return 0;
}

template <int FMT, int EPI, int NORM, int NT, int RM>
__global__ void __launch_bounds__(NT, 1)
nf4_mm_rows(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w, const float *__restrict__ absmax,
            const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
            float eps, float *__restrict__ out, int M, int N, int K) {
  PDL_BEGIN();
  constexpr int FAIL = rows_first_failure(FMT, EPI, NORM, NT, RM);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu), NORM 0/1");
  static_assert(FAIL != 2, "whole_warps: NT must be a whole number of warps, 32..1024");
  static_assert(FAIL != 3, "rows_1_16: RM (rows per block) must be 1..16");
  constexpr int SETS = EPI == 2 ? 2 : 1;
  __shared__ float rs[RM];
  __shared__ float lut[16];  // the NF4 code: a constant-memory table serializes on a warp's different indices
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE;
  const int m0 = blockIdx.y * RM;
  if (threadIdx.x < 16) lut[threadIdx.x] = NF4_CODE[threadIdx.x];
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
    load8<FMT>(w, absmax, lut, n, k, K, wv[0]);
    if (SETS == 2) load8<FMT>(w_up, absmax_up, lut, n, k, K, wv[SETS - 1]);
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
