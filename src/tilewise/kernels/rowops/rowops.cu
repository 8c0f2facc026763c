// rowops.cu - row-wise ops of the classifier on CUDA: RMSNorm, the embedding gather, the final norm + head, and a
// word copy (K/V prefix rows, the last residual row). f32 row-major everywhere.
//
//   rmsnorm<NT>(x, weight, out, M, H, eps)            grid (M): one block per row
//   embed<FMT, NT>(ids, w, absmax, out, M, H)          grid (ceil(H / NT), M); FMT 0 nf4 (bitsandbytes nibbles, one
//                                                      absmax per 64 weights), 1 f16, 2 f32
//   head<NT>(x, row, norm_w, head_w, out, H, L, eps)  grid (1): out[0..H) = the normed row `row` of x, then the L
//                                                      scores head_w (L, H) @ that row, HEAD_LABELS a pass
//   copy_words<NT>(src, src_word, dst, dst_word, n)   grid (ceil(n / NT))
//   copy_pairs<NT>(s0, d0, ..., s7, d7, n)            grid (ceil(n / NT), P): pair y < P <= 8 copies words 0..n-1
//                                                      of s_y to d_y (one launch for every K/V prefix of a decision)
// NT is a power of two, 32..1024 (the static_asserts below mirror kernels/rowops/cuda.py's rules).

#ifndef WARPSIZE
#define WARPSIZE 32
#endif

__host__ __device__ constexpr int rowops_first_failure(int NT) {
  if (NT < WARPSIZE || NT > 1024) return 1;  // threads_32_1024
  if ((NT & (NT - 1)) != 0) return 2;        // pow2
  return 0;
}

#define ROWOPS_ASSERTS(NT)                                                                                 \
  static_assert(rowops_first_failure(NT) != 1, "threads_32_1024: NT must be 32..1024 threads");            \
  static_assert(rowops_first_failure(NT) != 2, "pow2: NT must be a power of two (tree reductions)")

__device__ __constant__ float ROW_NF4_CODE[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f};

// the sums of each v[j] over the block (every thread gets them, in v), each through one tree: the warp's shuffles,
// then the warps' sums in warp order; `red` holds N x NT / 32 floats
template <int NT, int N>
__device__ __forceinline__ void block_sums(float (&v)[N], float (*red)[NT / WARPSIZE]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE;
  __syncthreads();  // `red` may still be read by a previous reduction
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) red[j][warp] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    v[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < NT / WARPSIZE; ++i) v[j] += red[j][i];
  }
}

// the sum of v over the block (every thread gets it); `red` holds NT / 32 floats
template <int NT>
__device__ __forceinline__ float block_sum(float v, float *red) {
  float a[1] = {v};
  block_sums<NT, 1>(a, reinterpret_cast<float (*)[NT / WARPSIZE]>(red));
  return a[0];
}

template <int NT>
__global__ void __launch_bounds__(NT) rmsnorm(const float *__restrict__ x, const float *__restrict__ weight,
                                              float *__restrict__ out, int M, int H, float eps) {
  PDL_BEGIN();
  ROWOPS_ASSERTS(NT);
  __shared__ float red[NT / WARPSIZE];
  const float *xr = x + (size_t)blockIdx.x * H;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < H; c += NT) ss += xr[c] * xr[c];
  const float r = rsqrtf(block_sum<NT>(ss, red) / (float)H + eps);
  for (int c = threadIdx.x; c < H; c += NT) out[(size_t)blockIdx.x * H + c] = xr[c] * r * weight[c];
}

template <int FMT, int NT>
__global__ void __launch_bounds__(NT) embed(const int *__restrict__ ids, const unsigned *__restrict__ w,
                                            const float *__restrict__ absmax, float *__restrict__ out, int M, int H) {
  PDL_BEGIN();
  ROWOPS_ASSERTS(NT);
  const int c = blockIdx.x * NT + threadIdx.x, m = blockIdx.y;
  if (c >= H) return;
  const size_t e = (size_t)ids[m] * H + c;
  float v;
  if (FMT == 0) {
    const unsigned byte = reinterpret_cast<const unsigned char *>(w)[e / 2];
    v = ROW_NF4_CODE[(e & 1) ? (byte & 0xfu) : (byte >> 4)] * absmax[e / 64];
  } else if (FMT == 1) {
    float f;  // f16 bits -> f32 in PTX (no cuda_fp16.h: NVRTC needs no include path)
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(reinterpret_cast<const unsigned short *>(w)[e]));
    v = f;
  } else {
    v = reinterpret_cast<const float *>(w)[e];
  }
  out[(size_t)m * H + c] = v;
}

// scores head() sums in one pass over the row: each pass ends in one block reduction, not one per score
#define HEAD_LABELS 8

template <int NT>
__global__ void __launch_bounds__(NT) head(const float *__restrict__ x, int row, const float *__restrict__ norm_w,
                                           const float *__restrict__ head_w, float *__restrict__ out, int H, int L,
                                           float eps) {
  PDL_BEGIN();
  ROWOPS_ASSERTS(NT);
  __shared__ float red[NT / WARPSIZE];
  __shared__ float reds[HEAD_LABELS][NT / WARPSIZE];
  const float *xr = x + (size_t)row * H;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < H; c += NT) ss += xr[c] * xr[c];
  const float r = rsqrtf(block_sum<NT>(ss, red) / (float)H + eps);
  for (int c = threadIdx.x; c < H; c += NT) out[c] = xr[c] * r * norm_w[c];
  for (int l0 = 0; l0 < L; l0 += HEAD_LABELS) {
    float d[HEAD_LABELS];
#pragma unroll
    for (int j = 0; j < HEAD_LABELS; ++j) d[j] = 0.0f;
    // a score past L reads row L - 1 (in bounds) and is dropped below: with no branch between them, a thread's
    // loads of several columns and all their rows are in flight together, not one latency per row
#pragma unroll 4
    for (int c = threadIdx.x; c < H; c += NT) {
      const float v = xr[c] * r * norm_w[c];
#pragma unroll
      for (int j = 0; j < HEAD_LABELS; ++j) d[j] += head_w[(size_t)min(l0 + j, L - 1) * H + c] * v;
    }
    block_sums<NT, HEAD_LABELS>(d, reds);
    if (threadIdx.x == 0) {
#pragma unroll
      for (int j = 0; j < HEAD_LABELS; ++j)
        if (l0 + j < L) out[H + l0 + j] = d[j];
    }
  }
}

template <int NT>
__global__ void __launch_bounds__(NT) copy_pairs(const unsigned *__restrict__ s0, unsigned *__restrict__ d0,
                                                 const unsigned *__restrict__ s1, unsigned *__restrict__ d1,
                                                 const unsigned *__restrict__ s2, unsigned *__restrict__ d2,
                                                 const unsigned *__restrict__ s3, unsigned *__restrict__ d3,
                                                 const unsigned *__restrict__ s4, unsigned *__restrict__ d4,
                                                 const unsigned *__restrict__ s5, unsigned *__restrict__ d5,
                                                 const unsigned *__restrict__ s6, unsigned *__restrict__ d6,
                                                 const unsigned *__restrict__ s7, unsigned *__restrict__ d7, int n) {
  PDL_BEGIN();
  ROWOPS_ASSERTS(NT);
  const unsigned *s = s0;
  unsigned *d = d0;
  switch (blockIdx.y) {  // a switch, not an array of the pointers: that would sit in local memory
    case 1: s = s1; d = d1; break;
    case 2: s = s2; d = d2; break;
    case 3: s = s3; d = d3; break;
    case 4: s = s4; d = d4; break;
    case 5: s = s5; d = d5; break;
    case 6: s = s6; d = d6; break;
    case 7: s = s7; d = d7; break;
    default: break;
  }
  const int i = blockIdx.x * NT + threadIdx.x;
  if (i < n) d[i] = s[i];
}

template <int NT>
__global__ void __launch_bounds__(NT) copy_words(const unsigned *__restrict__ src, int src_word,
                                                 unsigned *__restrict__ dst, int dst_word, int n) {
  PDL_BEGIN();
  ROWOPS_ASSERTS(NT);
  const int i = blockIdx.x * NT + threadIdx.x;
  if (i < n) dst[(size_t)dst_word + i] = src[(size_t)src_word + i];
}
