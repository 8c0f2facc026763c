// shortconv.cu - LFM2's gated depthwise causal conv on CUDA: Bx = B * x, conv over time with L taps, y = C * conv.
//
//   shortconv<NT, L, RT>(bcx, state_in, weight, y, state_out, M, H, y_h)   grid (ceil(H / NT), ceil(M / RT))
// bcx (M, 3H) holds B, C and x side by side; state_in (L-1, H) is Bx of the previous L-1 positions, oldest first
// (zeros at the start of a prompt); weight (H, L); y (M, H); state_out (L-1, H), another buffer than state_in, gets
// the last L-1 Bx rows (so a cached prefix state is never written). y_h, where not null: y stored as f16 rows there
// instead (f16_bits, as the out projection's prologue would round it). Rules mirrored from kernels/shortconv/cuda.py.
// A thread owns one channel of RT consecutive rows and slides the last L-1 Bx values along in registers: each B and
// x is read once instead of L times, and a 346-row prompt takes RT times fewer blocks. Every output is summed in
// the same order (taps 0..L-1) whatever RT is, so all RT give the same bits.

#ifndef WARPSIZE
#define WARPSIZE 32
#endif

__host__ __device__ constexpr int shortconv_first_failure(int NT, int L, int RT) {
  if (NT < WARPSIZE || NT > 1024 || NT % WARPSIZE != 0) return 1;  // whole_warps
  if (L < 2 || L > 8) return 2;                                    // taps_2_8
  if (RT < 1 || RT > 64) return 3;                                 // rows_1_64
  return 0;
}

template <int NT, int L, int RT>
__global__ void __launch_bounds__(NT) shortconv(const float *__restrict__ bcx, const float *__restrict__ state_in,
                                                const float *__restrict__ weight, float *__restrict__ y,
                                                float *__restrict__ state_out, int M, int H,
                                                unsigned short *__restrict__ y_h) {
  PDL_BEGIN();
  static_assert(shortconv_first_failure(NT, L, RT) != 1, "whole_warps: NT must be a whole number of warps, 32..1024");
  static_assert(shortconv_first_failure(NT, L, RT) != 2, "taps_2_8: L (conv_L_cache) must be 2..8");
  static_assert(shortconv_first_failure(NT, L, RT) != 3, "rows_1_64: RT (rows per thread) must be 1..64");
  const int c = blockIdx.x * NT + threadIdx.x, t0 = blockIdx.y * RT;
  if (c >= H) return;
  auto bx = [&](int s) -> float {  // Bx at chunk row s (s < 0: from the state)
    if (s < 0) return state_in[(size_t)(L - 1 + s) * H + c];
    const size_t base = (size_t)s * 3 * H;
    return bcx[base + c] * bcx[base + 2 * H + c];
  };
  float w[L], win[L - 1];  // the taps; Bx of the L-1 rows before the current one, oldest first
#pragma unroll
  for (int j = 0; j < L; ++j) w[j] = weight[(size_t)c * L + j];
#pragma unroll
  for (int j = 0; j < L - 1; ++j) win[j] = bx(t0 - (L - 1) + j);
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const int t = t0 + r;
    if (t >= M) break;
    const float cur = bx(t);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < L - 1; ++j) acc += w[j] * win[j];
    acc += w[L - 1] * cur;
#pragma unroll
    for (int j = 0; j + 1 < L - 1; ++j) win[j] = win[j + 1];
    win[L - 2] = cur;
    const float v = bcx[(size_t)t * 3 * H + H + c] * acc;
    if (y_h) y_h[(size_t)t * H + c] = f16_bits(v);
    else y[(size_t)t * H + c] = v;
  }
  if (blockIdx.y == 0) {
#pragma unroll
    for (int i = 0; i < L - 1; ++i) state_out[(size_t)i * H + c] = bx(M - (L - 1) + i);
  }
}
