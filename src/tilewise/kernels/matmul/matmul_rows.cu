// matmul_rows.cu - the short-row matmul (few rows); compiled after matmul.cu (its helpers).
//
// nf4_mm_rows<FMT, EPI, NORM, NT, RM, WK, CW>: the short-row path (few rows): WK warps per group of CW output columns
// and RM rows, the lanes of the group's warps split K in words of 8 weights (interleaved: warp w of a group takes
// words w, w + WK, ... of each lane's run), f32 arithmetic, a warp reduction, then (WK > 1) the group's warps' sums
// added in warp order through shared memory; grid (ceil(N / (NT / 32 / WK * CW)), ceil(M / RM)). A few iterations of
// the K loop are unrolled so that their weight loads are in flight together: with one row, the loop is a chain of
// loads. CW > 1 issues the words of CW columns before any arithmetic and shares each x and norm load among them:
// more weight bytes in flight a warp and fewer blocks, so fewer waves; each column adds in the order CW 1 does (the
// same bits).
// NORM: each row's sum of squares is added up from the x values the K loop loads anyway (reduced as the sums are),
// so the weight loads start at once instead of after a pass over x and a barrier; 1 / rms only scales the outputs.

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

__host__ __device__ constexpr int rows_first_failure(int FMT, int EPI, int NORM, int NT, int RM, int WK, int CW) {
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2 || NORM < 0 || NORM > 1) return 1;  // variant
  if (NT % WARPSIZE != 0 || NT < WARPSIZE || NT > 1024) return 2;                // whole_warps
  if (RM < 1 || RM > 16) return 3;                                               // rows_1_16
  if (WK != 1 && WK != 2 && WK != 4 && WK != 8) return 4;                        // column_warps_1_2_4_8
  if ((NT / WARPSIZE) % WK != 0) return 5;                                       // column_warps_divide_warps
  if (CW != 1 && CW != 2 && CW != 4) return 6;                                   // warp_columns_1_2_4
  if (CW > 1 && RM > 4) return 7;                                                // warp_columns_rows_4
  return 0;
}

template <int FMT, int EPI, int NORM, int NT, int RM, int WK, int CW>
__global__ void __launch_bounds__(NT, 1)
nf4_mm_rows(const float *__restrict__ x, int x_row0, const unsigned *__restrict__ w, const float *__restrict__ absmax,
            const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, const float *__restrict__ norm_w,
            float eps, float *__restrict__ out, int M, int N, int K) {
  PDL_BEGIN();
  constexpr int FAIL = rows_first_failure(FMT, EPI, NORM, NT, RM, WK, CW);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu), NORM 0/1");
  static_assert(FAIL != 2, "whole_warps: NT must be a whole number of warps, 32..1024");
  static_assert(FAIL != 3, "rows_1_16: RM (rows per block) must be 1..16");
  static_assert(FAIL != 4, "column_warps_1_2_4_8: WK (warps per output column) must be 1, 2, 4 or 8");
  static_assert(FAIL != 5, "column_warps_divide_warps: NT / 32 warps must be whole groups of WK");
  static_assert(FAIL != 6, "warp_columns_1_2_4: CW (columns a warp) must be 1, 2 or 4");
  static_assert(FAIL != 7, "warp_columns_rows_4: CW > 1 holds CW x RM sums a set: RM must be 1..4");
  constexpr int SETS = EPI == 2 ? 2 : 1;
  // loads of this many K iterations in flight together; with many rows the x loads would hold too many registers
  // (CW's columns hold raw words until their arithmetic: one register per 8 weights)
  constexpr int UNROLL = RM <= 2 ? 4 : RM <= 4 ? 2 : 1;
  __shared__ float lut[16];  // the NF4 code: a constant-memory table serializes on a warp's different indices
  // WK > 1: each warp's sums (the sets' dot products of each column, then the rows' sums of squares)
  __shared__ float part[WK > 1 ? NT / WARPSIZE : 1][CW * SETS + NORM][RM];
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE, kw = warp % WK;
  const int m0 = blockIdx.y * RM;
  if (threadIdx.x < 16) lut[threadIdx.x] = NF4_CODE[threadIdx.x];
  const int rows = min(RM, M - m0);
  const float *xb = x + ((size_t)x_row0 + m0) * K;
  __syncthreads();  // the code table
  const int n0 = (blockIdx.x * (NT / WARPSIZE / WK) + warp / WK) * CW;
  const bool active = n0 < N;  // every warp of a group agrees; no warp returns before the merge's barrier
  if (WK == 1 && !active) return;
  float acc[CW][SETS][RM];  // (columns, weight sets, rows)
  float sq[RM];             // NORM: the rows' sums of squares
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    sq[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < CW; ++c)
#pragma unroll
      for (int s = 0; s < SETS; ++s) acc[c][s][r] = 0.0f;
  }
  const int k_end = active ? K : 0;
#pragma unroll UNROLL
  for (int k = (kw * WARPSIZE + lane) * 8; k < k_end; k += WK * WARPSIZE * 8) {
    float wv[CW][SETS][8];
#pragma unroll
    for (int c = 0; c < CW; ++c) {  // a column past N (the last group's) loads column n0's words again, unused
      const int n = n0 + c < N ? n0 + c : n0;
      load8<FMT>(w, absmax, lut, n, k, K, wv[c][0]);
      if (SETS == 2) load8<FMT>(w_up, absmax_up, lut, n, k, K, wv[c][SETS - 1]);
    }
    if (NORM) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float g = norm_w[k + i];
#pragma unroll
        for (int c = 0; c < CW; ++c)
#pragma unroll
          for (int s = 0; s < SETS; ++s) wv[c][s][i] *= g;
      }
    }
#pragma unroll
    for (int r = 0; r < RM; ++r) {
      if (r < rows) {
        const float4 *xp = reinterpret_cast<const float4 *>(xb + (size_t)r * K + k);
        const float4 a = xp[0], b = xp[1];
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int c = 0; c < CW; ++c)
#pragma unroll
          for (int s = 0; s < SETS; ++s)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[c][s][r] += xv[i] * wv[c][s][i];
        if (NORM) {
#pragma unroll
          for (int i = 0; i < 8; ++i) sq[r] += xv[i] * xv[i];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RM; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int c = 0; c < CW; ++c)
#pragma unroll
        for (int s = 0; s < SETS; ++s) acc[c][s][r] += __shfl_xor_sync(0xffffffffu, acc[c][s][r], o);
      if (NORM) sq[r] += __shfl_xor_sync(0xffffffffu, sq[r], o);
    }
  }
  if constexpr (WK > 1) {  // the group's first warp adds the others' sums, in warp order
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < RM; ++r) {
#pragma unroll
        for (int c = 0; c < CW; ++c)
#pragma unroll
          for (int s = 0; s < SETS; ++s) part[warp][c * SETS + s][r] = acc[c][s][r];
        if (NORM) part[warp][CW * SETS][r] = sq[r];
      }
    }
    __syncthreads();
    if (kw != 0 || lane != 0) return;
#pragma unroll
    for (int r = 0; r < RM; ++r) {
#pragma unroll
      for (int j = 1; j < WK; ++j) {
#pragma unroll
        for (int c = 0; c < CW; ++c)
#pragma unroll
          for (int s = 0; s < SETS; ++s) acc[c][s][r] += part[warp + j][c * SETS + s][r];
        if (NORM) sq[r] += part[warp + j][CW * SETS][r];
      }
    }
  }
  if (lane != 0 || !active) return;
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    if (r < rows) {
      const float rs = NORM ? rsqrtf(sq[r] / (float)K + eps) : 1.0f;
#pragma unroll
      for (int c = 0; c < CW; ++c) {
        if (n0 + c < N) {
          float *o = out + (size_t)(m0 + r) * N + n0 + c;
          const float y = acc[c][0][r] * rs;
          if (EPI == 0) *o = y;
          else if (EPI == 1) *o += y;
          else *o = silu(y) * acc[c][SETS - 1][r] * rs;
        }
      }
    }
  }
}
