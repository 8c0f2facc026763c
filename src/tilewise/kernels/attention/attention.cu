// attention.cu - the classifier's attention on CUDA: per-head q/k RMSNorm + RoPE into the KV cache, then causal
// GQA attention (flash-style: one pass over the keys with an online softmax, no score matrix).
//
//   qknorm_rope<D>(qkv, q_norm, k_norm, cos, sin, q, k_cache, v_cache, M, start, HQ, HKV, eps)
//       grid (ceil(M (HQ + 2 HKV) / ROPE_WARPS)), one warp per head h of row m of qkv (M, (HQ + 2 HKV) D), task
//       m (HQ + 2 HKV) + h: each lane holds ceil(D / 32) of its values; q heads are normed and
//       rotated into q (M, HQ D), k heads normed and rotated into k_cache row start + m, v heads copied to v_cache.
//       RoPE pairs (d, d + D/2); D a multiple of 16, cos/sin tables (positions, D/2) built in float64 on the host.
//   attention<D, NW>(q, k_cache, v_cache, out, M, P, first, HQ, HKV, out_h)
//       grid (M, HQ), NW warps: query i (row first + i of q, at position P + first + i) of head h over keys
//       0 .. P + first + i, written to row i of out;
//       warp w takes keys w, w + NW, ...; each lane holds ceil(D / 32) of q and of the running output; the warps' partial
//       (max, sum, output) are merged in shared memory. out (M, HQ D).
//   attention_tiled<D, QT, NW>(same arguments)
//       grid (ceil(M / QT), HQ), NW warps: QT queries of head h share each 32-key tile of K and V staged in shared
//       memory (the per-query kernel reads every key from L2 once per query); warp w owns queries w, w + NW, ..: lane l
//       scores key t0 + l against all of them (each float4 of K read once), the warp keeps each query's online softmax
//       (max, sum) and each lane ceil(D / 32) of its output dims, adding the tile's 32 weighted values (each V row read
//       once for all the warp's queries, the weights broadcast by shuffles).
//   attention_mma<D, NW, KW, PF>: the tensor-core kernel, in attention_mma.cu (compiled after this file).
// Every attention kernel stores its output rows as f16 into out_h instead of f32 into out where out_h is not null
// (the out projection's f16 rows, its prologue launch saved). Rules mirrored from kernels/attention/cuda.py.

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

// the tiled kernel's rules after attention_first_failure's: QT whole queries per warp, at most 8 held per warp,
// its shared memory (the queries, a K tile padded by a float4 a row and a V tile of 32 keys) in the 48 KB of static
// shared memory
__host__ __device__ constexpr int tiled_smem_bytes(int D, int QT) {
  return 4 * (QT * D + 32 * (D + 4) + 32 * ((D + WARPSIZE - 1) / WARPSIZE) * WARPSIZE);
}
__host__ __device__ constexpr int tiled_first_failure(int D, int QT, int NW) {
  if (attention_first_failure(D, NW)) return attention_first_failure(D, NW);
  if (QT < NW || QT % NW != 0) return 3;              // queries_per_warp_whole
  if (QT / NW > 8) return 4;                          // queries_per_warp_8
  if (tiled_smem_bytes(D, QT) > 48 * 1024) return 5;  // smem_48k
  return 0;
}

// one warp per (row, head), ROPE_WARPS warps a block: a block of D threads per head spent most of its time in
// block scheduling and a serial sum over shared memory
#define ROPE_WARPS 8
// an attention output value: f32 into out, or (out_h not null) rounded to f16 into out_h, as the out projection's
// prologue would round it
__device__ __forceinline__ void store_out(float *out, unsigned short *out_h, size_t at, float v) {
  if (out_h) out_h[at] = f16_bits(v);
  else out[at] = v;
}

template <int D>
__global__ void __launch_bounds__(ROPE_WARPS * WARPSIZE) qknorm_rope(
    const float *__restrict__ qkv, const float *__restrict__ q_norm, const float *__restrict__ k_norm,
    const float *__restrict__ cos_t, const float *__restrict__ sin_t, float *__restrict__ q,
    float *__restrict__ k_cache, float *__restrict__ v_cache, int M, int start, int HQ, int HKV, float eps) {
  PDL_BEGIN();
  static_assert(rope_first_failure(D) != 1, "head_dim_16_1024: D must be a multiple of 16, 16..1024");
  constexpr int E = (D + WARPSIZE - 1) / WARPSIZE;  // elements of a head per lane (the last may be partial)
  __shared__ float vals[ROPE_WARPS][D];             // a warp's normed head, for the RoPE partners
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE;
  const int heads = HQ + 2 * HKV;
  const long long task = (long long)blockIdx.x * ROPE_WARPS + warp;
  if (task >= (long long)M * heads) return;  // whole warps only: no block-wide barrier below
  const int m = (int)(task / heads), h = (int)(task % heads);
  const float *src = qkv + ((size_t)m * heads + h) * D;
  float v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = e * WARPSIZE + lane < D ? src[e * WARPSIZE + lane] : 0.0f;
  if (h >= HQ + HKV) {  // a value head: copied as it is
    float *dst = v_cache + ((size_t)(start + m) * HKV + (h - HQ - HKV)) * D;
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (e * WARPSIZE + lane < D) dst[e * WARPSIZE + lane] = v[e];
    return;
  }
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) ss += v[e] * v[e];
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);  // every lane: the same sum
  const bool is_q = h < HQ;
  const float *g = is_q ? q_norm : k_norm;
  const float rms = rsqrtf(ss / (float)D + eps);
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e * WARPSIZE + lane < D) {
      v[e] = v[e] * rms * g[e * WARPSIZE + lane];
      vals[warp][e * WARPSIZE + lane] = v[e];
    }
  __syncwarp();
  const int half = D / 2, pos = start + m;
  float *dst = is_q ? q + ((size_t)m * HQ + h) * D : k_cache + ((size_t)(start + m) * HKV + (h - HQ)) * D;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int d = e * WARPSIZE + lane;
    if (d >= D) continue;
    const int j = d % half;
    const float c = cos_t[(size_t)pos * half + j], s = sin_t[(size_t)pos * half + j];
    const float rot = d < half ? -vals[warp][d + half] : vals[warp][d - half];
    dst[d] = v[e] * c + rot * s;
  }
}

template <int D, int NW>
__global__ void __launch_bounds__(NW * WARPSIZE) attention(const float *__restrict__ q,
                                                            const float *__restrict__ k_cache,
                                                            const float *__restrict__ v_cache,
                                                            float *__restrict__ out, int M, int P, int first,
                                                            int HQ, int HKV, unsigned short *__restrict__ out_h) {
  PDL_BEGIN();
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
    if (e * WARPSIZE + lane < D) store_out(out, out_h, ((size_t)i * HQ + h) * D + e * WARPSIZE + lane, o[e] / tot);
}

// the launch bound's one block per SM: with the default bound ptxas capped it at 64 registers and spilled
template <int D, int QT, int NW>
__global__ void __launch_bounds__(NW * WARPSIZE, 1) attention_tiled(const float *__restrict__ q,
                                                                     const float *__restrict__ k_cache,
                                                                     const float *__restrict__ v_cache,
                                                                     float *__restrict__ out, int M, int P, int first,
                                                                     int HQ, int HKV,
                                                                     unsigned short *__restrict__ out_h) {
  PDL_BEGIN();
  constexpr int FAIL = tiled_first_failure(D, QT, NW);
  static_assert(FAIL != 1, "head_dim_16_256: D must be a multiple of 16, 16..256");
  static_assert(FAIL != 2, "warps_1_32: NW (warps per block) must be 1..32");
  static_assert(FAIL != 3, "queries_per_warp_whole: QT must be a whole number (>= 1) of queries per warp");
  static_assert(FAIL != 4, "queries_per_warp_8: QT / NW above 8 queries held per warp");
  static_assert(FAIL != 5, "smem_48k: the queries and a K and V tile exceed 48 KB of static shared memory");
  constexpr int E = (D + WARPSIZE - 1) / WARPSIZE, QPW = QT / NW, TK = WARPSIZE;  // keys per tile
  constexpr int LK = D + 4;  // K rows padded by a float4: lane l's float4 loads of row l hit distinct banks
  __shared__ __align__(16) float s_q[QT][D];  // the block's queries, scaled by 1/sqrt(D)
  __shared__ __align__(16) float s_k[TK][LK];
  __shared__ float s_v[TK][E * WARPSIZE];      // columns past D stay zero
  const int i0 = blockIdx.x * QT, h = blockIdx.y, kvh = h / (HQ / HKV);
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE;
  const float scale = rsqrtf((float)D);
  for (int e = threadIdx.x; e < QT * D; e += NW * WARPSIZE) {
    const int r = e / D, c = e % D;
    s_q[r][c] = i0 + r < M ? q[((size_t)(first + i0 + r) * HQ + h) * D + c] * scale : 0.0f;
  }
  for (int e = threadIdx.x; e < TK * E * WARPSIZE; e += NW * WARPSIZE)
    s_v[e / (E * WARPSIZE)][e % (E * WARPSIZE)] = 0.0f;
  float mx[QPW], sum[QPW], acc[QPW][E];
#pragma unroll
  for (int j = 0; j < QPW; ++j) {
    mx[j] = ATTN_NEG_INF;
    sum[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[j][e] = 0.0f;
  }
  const int last = (i0 + QT < M ? i0 + QT : M) - 1;  // the block's last query: keys 0 .. P + first + last
  const int keys = P + first + last + 1;
  for (int t0 = 0; t0 < keys; t0 += TK) {
    __syncthreads();  // every warp is done with the previous tile (and s_q, s_v's zeros are written)
    for (int e = threadIdx.x; e < TK * D; e += NW * WARPSIZE) {
      const int r = e / D, c = e % D, t = t0 + r;
      const size_t off = ((size_t)t * HKV + kvh) * D + c;
      s_k[r][c] = t < keys ? k_cache[off] : 0.0f;
      s_v[r][c] = t < keys ? v_cache[off] : 0.0f;
    }
    __syncthreads();
    // lane l scores key t0 + l against each of the warp's queries: a float4 of K is read once for all of them
    float sc[QPW];
#pragma unroll
    for (int j = 0; j < QPW; ++j) sc[j] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < D; c += 4) {
      const float4 kv = *reinterpret_cast<const float4 *>(&s_k[lane][c]);
#pragma unroll
      for (int j = 0; j < QPW; ++j) {
        const float4 qv = *reinterpret_cast<const float4 *>(&s_q[warp + j * NW][c]);  // a broadcast
        sc[j] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
    }
    float pj[QPW];
#pragma unroll
    for (int j = 0; j < QPW; ++j) {  // the online softmax; a query past M, or seeing no key here, keeps its state
      const int i = i0 + warp + j * NW, t = t0 + lane;
      const bool seen = i < M && t <= P + first + i;
      const float sj = seen ? sc[j] : ATTN_NEG_INF;
      float tmax = sj;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const bool any = tmax != ATTN_NEG_INF;  // warp-uniform
      const float nm = any ? fmaxf(mx[j], tmax) : mx[j];
      const float corr = any ? __expf(mx[j] - nm) : 1.0f;  // exp(-inf) = 0 on the first visible tile
      pj[j] = seen ? __expf(sj - nm) : 0.0f;
      float psum = pj[j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      sum[j] = sum[j] * corr + psum;
      mx[j] = nm;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[j][e] *= corr;
    }
    // the tile's values weighted: a row of V is read once for all the warp's queries, the weights by shuffles
#pragma unroll 4
    for (int r = 0; r < TK; ++r) {
      float v[E];
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = s_v[r][e * WARPSIZE + lane];
#pragma unroll
      for (int j = 0; j < QPW; ++j) {
        const float pr = __shfl_sync(0xffffffffu, pj[j], r);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[j][e] += pr * v[e];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < QPW; ++j) {
    const int i = i0 + warp + j * NW;
    if (i >= M) continue;
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (e * WARPSIZE + lane < D)
        store_out(out, out_h, ((size_t)i * HQ + h) * D + e * WARPSIZE + lane, acc[j][e] / sum[j]);
  }
}
