// attention.cu - the classifier's attention on CUDA: per-head q/k RMSNorm + RoPE into the KV cache, then causal
// GQA attention (flash-style: one pass over the keys with an online softmax, no score matrix).
//
//   qknorm_rope<D>(qkv, q_norm, k_norm, cos, sin, q, k_cache, v_cache, M, start, HQ, HKV, eps)
//       grid (HQ + 2 HKV, M), D threads: head h of row m of qkv (M, (HQ + 2 HKV) D); q heads are normed and
//       rotated into q (M, HQ D), k heads normed and rotated into k_cache row start + m, v heads copied to v_cache.
//       RoPE pairs (d, d + D/2); D a multiple of 16, cos/sin tables (positions, D/2) built in float64 on the host.
//   attention<D, NW>(q, k_cache, v_cache, out, M, P, first, HQ, HKV)
//       grid (M, HQ), NW warps: query i (row first + i of q, at position P + first + i) of head h over keys
//       0 .. P + first + i, written to row i of out;
//       warp w takes keys w, w + NW, ...; each lane holds ceil(D / 32) of q and of the running output; the warps' partial
//       (max, sum, output) are merged in shared memory. out (M, HQ D).
// Rules mirrored from kernels/attention/cuda.py.

#ifndef WARPSIZE
#define WARPSIZE 32
#endif

// -infinity without <math.h> (NVRTC compiles this file with no include path)
#define ATTN_NEG_INF (-__int_as_float(0x7f800000))

__host__ __device__ constexpr int rope_first_failure(int D) {
  if (D < 16 || D > 1024 || D % 16 != 0) return 1;  // head_dim_16_1024
  return 0;
}

__host__ __device__ constexpr int attention_first_failure(int D, int NW) {
  if (D < 16 || D > 256 || D % 16 != 0) return 1;  // head_dim_16_256
  if (NW < 1 || NW > 32) return 2;                       // warps_1_32
  return 0;
}

template <int D>
__global__ void __launch_bounds__(D) qknorm_rope(const float *__restrict__ qkv, const float *__restrict__ q_norm,
                                                 const float *__restrict__ k_norm, const float *__restrict__ cos_t,
                                                 const float *__restrict__ sin_t, float *__restrict__ q,
                                                 float *__restrict__ k_cache, float *__restrict__ v_cache, int M,
                                                 int start, int HQ, int HKV, float eps) {
  static_assert(rope_first_failure(D) != 1, "head_dim_16_1024: D must be a multiple of 16, 16..1024");
  __shared__ float vals[D];
  const int h = blockIdx.x, m = blockIdx.y, d = threadIdx.x;
  const int heads = HQ + 2 * HKV;
  const float v = qkv[((size_t)m * heads + h) * D + d];
  if (h >= HQ + HKV) {  // a value head: copied as it is
    v_cache[((size_t)(start + m) * HKV + (h - HQ - HKV)) * D + d] = v;
    return;
  }
  vals[d] = v * v;  // every thread sums the D squares itself: D is small, and any D works (no partial warps)
  __syncthreads();
  float tot = 0.0f;
  for (int i = 0; i < D; ++i) tot += vals[i];
  __syncthreads();
  const bool is_q = h < HQ;
  const float nv = v * rsqrtf(tot / (float)D + eps) * (is_q ? q_norm[d] : k_norm[d]);
  vals[d] = nv;
  __syncthreads();
  const int half = D / 2, j = d % half, pos = start + m;
  const float c = cos_t[(size_t)pos * half + j], s = sin_t[(size_t)pos * half + j];
  const float rot = d < half ? -vals[d + half] : vals[d - half];
  const float r = nv * c + rot * s;
  if (is_q) q[((size_t)m * HQ + h) * D + d] = r;
  else k_cache[((size_t)(start + m) * HKV + (h - HQ)) * D + d] = r;
}

template <int D, int NW>
__global__ void __launch_bounds__(NW * WARPSIZE) attention(const float *__restrict__ q,
                                                            const float *__restrict__ k_cache,
                                                            const float *__restrict__ v_cache,
                                                            float *__restrict__ out, int M, int P, int first,
                                                            int HQ, int HKV) {
  static_assert(attention_first_failure(D, NW) != 1, "head_dim_16_256: D must be a multiple of 16, 16..256");
  static_assert(attention_first_failure(D, NW) != 2, "warps_1_32: NW (warps per block) must be 1..32");
  constexpr int E = (D + WARPSIZE - 1) / WARPSIZE;  // elements of a head per lane (the last may be partial)
  __shared__ float s_max[NW], s_sum[NW];
  __shared__ float s_out[NW][E * WARPSIZE];
  const int i = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE;
  const int kvh = h / (HQ / HKV);
  const int keys = P + first + i + 1;
  const float scale = rsqrtf((float)D);
  float qv[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = e * WARPSIZE + lane;
    qv[e] = c < D ? q[((size_t)(first + i) * HQ + h) * D + c] * scale : 0.0f;
    acc[e] = 0.0f;
  }
  float mx = ATTN_NEG_INF, sum = 0.0f;
  for (int t = warp; t < keys; t += NW) {
    const float *kr = k_cache + ((size_t)t * HKV + kvh) * D;
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) dot += e * WARPSIZE + lane < D ? qv[e] * kr[e * WARPSIZE + lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float nm = fmaxf(mx, dot);
    const float corr = __expf(mx - nm), p = __expf(dot - nm);
    const float *vr = v_cache + ((size_t)t * HKV + kvh) * D;
    sum = sum * corr + p;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = acc[e] * corr + (e * WARPSIZE + lane < D ? p * vr[e * WARPSIZE + lane] : 0.0f);
    mx = nm;
  }
  if (lane == 0) {
    s_max[warp] = mx;
    s_sum[warp] = sum;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) s_out[warp][e * WARPSIZE + lane] = acc[e];
  __syncthreads();
  if (warp != 0) return;
  float gm = ATTN_NEG_INF;
#pragma unroll
  for (int w = 0; w < NW; ++w) gm = fmaxf(gm, s_max[w]);
  float tot = 0.0f, o[E];
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = 0.0f;
  for (int w = 0; w < NW; ++w) {
    if (s_max[w] == ATTN_NEG_INF) continue;  // a warp that saw no key
    const float f = __expf(s_max[w] - gm);
    tot += s_sum[w] * f;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] += s_out[w][e * WARPSIZE + lane] * f;
  }
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e * WARPSIZE + lane < D) out[((size_t)i * HQ + h) * D + e * WARPSIZE + lane] = o[e] / tot;
}
