// attention_mma.cu - the classifier's causal GQA attention on tensor cores; compiled after attention.cu (its
// ATTN_NEG_INF) and the model headers (pack2, mma_16816, ldmatrix from tensorcore.cuh).
//
//   attention_mma<D, NW, KW, PF>(q, k_cache, v_cache, out, M, P, first, HQ, HKV, out_h): attention.cu's arguments
//       tensor cores: grid (ceil(M / QT), HQ) with QT = 16 NW / KW, NW warps in NW / KW query groups of KW warps,
//       each group owning 16 queries. Per tile of 64 keys the block stages K and V in f16 (rows padded by 8 halves,
//       so ldmatrix's eight rows land in distinct banks); warp k of a group takes the tile's keys 64 k / KW .. (KW 1:
//       the whole tile) and computes its 16 queries' scores with m16n8k16 mma.sync (q, scaled by 1/sqrt(D), held as
//       A fragments from the start), keeps each row's online softmax in the accumulator layout (a row's four threads
//       reduce by shuffles), and multiplies the probabilities, rounded to f16 straight from the score registers as
//       the next A operand, with V (ldmatrix.trans) into f32 accumulators. A warp skips the keys its queries cannot
//       see. With KW > 1 a group's warps merge their (max, sum, output) in shared memory at the end: more, smaller
//       blocks, each key tile's work split KW ways (a causal block's tiles are a serial chain). Staging issues a
//       thread's loads of a tile at once; PF 1 loads the next tile into registers right after this one is staged,
//       so its memory latency overlaps this tile's math. f16 operands: verified at the f16 tolerance.
// Its output rows go to out_h as f16 where out_h is not null, as every attention kernel's. Rules mirrored from
// kernels/attention/cuda.py.

// the tensor-core kernel's rules: D in k16 steps (at most 128: its accumulators stay in registers), 1..8 warps in
// groups of KW (1, 2 or 4: each warp's share of a 64-key tile a whole number of k16 steps), and its shared memory
// (the queries and a K and a V tile of 64 keys, f16, rows padded by 8; with KW > 1 the (max, sum, output) of all
// but one warp of each group, f32) in 48 KB. PF 1 holds the next tile's K and V in registers through this tile's
// math: 4 D / NW floats a thread, at most ATTN_PF_FLOATS (beside the output, the scores and the query fragments)
#define ATTN_MMA_TK 64
#define ATTN_PF_FLOATS 64
__host__ __device__ constexpr int mma_attention_smem_bytes(int D, int NW, int KW) {
  return 2 * (16 * (NW / KW) + 2 * ATTN_MMA_TK) * (D + 8) + (KW > 1 ? 4 * (NW - NW / KW) * 16 * (D + 2) : 0);
}
__host__ __device__ constexpr int mma_attention_first_failure(int D, int NW, int KW, int PF) {
  if (D < 16 || D > 128 || D % 16 != 0) return 1;                   // head_dim_16_128
  if (NW < 1 || NW > 8) return 2;                                   // warps_1_8
  if (KW != 1 && KW != 2 && KW != 4) return 4;                      // key_warps_1_2_4
  if (NW % KW != 0) return 5;                                       // key_warps_divide_warps
  if (mma_attention_smem_bytes(D, NW, KW) > 48 * 1024) return 3;    // smem_48k
  if (PF != 0 && PF != 1) return 6;                                 // prefetch_0_1
  if (PF && 2 * ATTN_MMA_TK * D / (WARPSIZE * NW) > ATTN_PF_FLOATS) return 7;  // prefetch_registers
  return 0;
}

// Staging f32 rows as f16 tiles (LD halves a row): element e (a float4) of a ROWS x D tile is row e / (D / 4),
// columns 4 (e % (D / 4)).., and thread x takes elements x, x + NT, ... load_rows issues a thread's loads i0..i0+N-1
// at once (rows past `rows` read as zero) and store_rows converts them, scaled by `scale`, so staging a tile waits
// for memory once per call rather than once per float4.
template <int D, int ROWS, int NT, int N>
__device__ __forceinline__ void load_rows(float4 (&v)[N], const float *src, size_t stride, int rows, int i0) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = threadIdx.x + (i0 + i) * NT, r = e / (D / 4), c = 4 * (e % (D / 4));
    v[i] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (e < ROWS * D / 4 && r < rows) v[i] = *reinterpret_cast<const float4 *>(src + (size_t)r * stride + c);
  }
}

template <int D, int LD, int ROWS, int NT, int N>
__device__ __forceinline__ void store_rows(unsigned short (*dst)[LD], const float4 (&v)[N], float scale, int i0) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = threadIdx.x + (i0 + i) * NT, r = e / (D / 4), c = 4 * (e % (D / 4));
    if (e >= ROWS * D / 4) continue;
    uint2 h;
    h.x = pack2(v[i].x * scale, v[i].y * scale);
    h.y = pack2(v[i].z * scale, v[i].w * scale);
    *reinterpret_cast<uint2 *>(&dst[r][c]) = h;
  }
}

// a thread's float4s of a ROWS x D tile
template <int D, int ROWS, int NT>
__host__ __device__ constexpr int rows_per_thread() {
  return (ROWS * D / 4 + NT - 1) / NT;
}

// one ROWS x D tile (or two: TWO, the same rows of src2 into dst2) staged in chunks of at most 8 float4s in flight,
// so that the registers stay bounded where a thread's share is large (few warps, D 128)
template <int D, int LD, int ROWS, int NT, bool TWO = false>
__device__ __forceinline__ void stage_f16(unsigned short (*dst)[LD], const float *src, size_t stride, int rows,
                                          float scale, unsigned short (*dst2)[LD] = nullptr,
                                          const float *src2 = nullptr) {
  constexpr int N = rows_per_thread<D, ROWS, NT>(), MAX = TWO ? 4 : 8, CH = N < MAX ? N : MAX;
#pragma unroll 1
  for (int i0 = 0; i0 < N; i0 += CH) {  // not unrolled: a chunk's loads are not hoisted above the last one's stores
    float4 a[CH], b[CH];
    load_rows<D, ROWS, NT, CH>(a, src, stride, rows, i0);
    if constexpr (TWO) load_rows<D, ROWS, NT, CH>(b, src2, stride, rows, i0);
    store_rows<D, LD, ROWS, NT, CH>(dst, a, scale, i0);
    if constexpr (TWO) store_rows<D, LD, ROWS, NT, CH>(dst2, b, scale, i0);
  }
}

// (.., 1): one block an SM is all it asks, so ptxas may use registers freely (with the bare thread bound, several
// KW > 1 instantiations spilled a few bytes)
template <int D, int NW, int KW, int PF>
__global__ void __launch_bounds__(NW * WARPSIZE, 1) attention_mma(const float *__restrict__ q,
                                                                const float *__restrict__ k_cache,
                                                                const float *__restrict__ v_cache,
                                                                float *__restrict__ out, int M, int P, int first,
                                                                int HQ, int HKV, unsigned short *__restrict__ out_h) {
  PDL_BEGIN();
  constexpr int FAIL = mma_attention_first_failure(D, NW, KW, PF);
  static_assert(FAIL != 1, "head_dim_16_128: D must be a multiple of 16, 16..128");
  static_assert(FAIL != 2, "warps_1_8: NW (warps per block) must be 1..8");
  static_assert(FAIL != 4, "key_warps_1_2_4: KW (warps splitting each key tile) must be 1, 2 or 4");
  static_assert(FAIL != 5, "key_warps_divide_warps: NW must be a multiple of KW");
  static_assert(FAIL != 3, "smem_48k: the queries, a K and a V tile of 64 keys and the merge exceed 48 KB");
  static_assert(FAIL != 6, "prefetch_0_1: PF (the next key tile loaded into registers) must be 0 or 1");
  static_assert(FAIL != 7, "prefetch_registers: PF 1 holds 4 D / NW floats a thread, more than ATTN_PF_FLOATS");
  constexpr int QG = NW / KW, QT = 16 * QG, TK = ATTN_MMA_TK, TW = TK / KW, LD = D + 8, NT = NW * WARPSIZE;
  constexpr int KD = D / 16, NK = TW / 8, ND = D / 8;  // k16 steps over D, n8 tiles of a warp's keys and of dims
  __shared__ __align__(16) unsigned short s_q[QT][LD];
  __shared__ __align__(16) unsigned short s_k[TK][LD];
  __shared__ __align__(16) unsigned short s_v[TK][LD];
  const int i0 = blockIdx.x * QT, h = blockIdx.y, kvh = h / (HQ / HKV);
  const int warp = threadIdx.x / WARPSIZE, lane = threadIdx.x % WARPSIZE, g = lane >> 2, t = lane & 3;
  const int qg = warp / KW, kw = warp % KW, k0 = kw * TW;  // the warp's query group and its keys k0.. of a tile
  const size_t kv_stride = (size_t)HKV * D;
  stage_f16<D, LD, QT, NT>(s_q, q + ((size_t)(first + i0) * HQ + h) * D, (size_t)HQ * D, M - i0, rsqrtf((float)D));
  __syncthreads();
  unsigned qa[KD][4];  // the group's 16 queries as A fragments: (rows 0-7 | 8-15) x (k 0-7 | 8-15) of each k16 step
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) ldmatrix_x4(qa[kk], &s_q[16 * qg + (lane & 15)][16 * kk + (lane >> 4) * 8]);
  const int qi = i0 + 16 * qg + g;  // the thread's two query rows: qi and qi + 8
  const int last = (i0 + QT < M ? i0 + QT : M) - 1;
  const int keys = P + first + last + 1;  // keys the block's last query sees
  const int warp_last = (i0 + 16 * qg + 15 < M ? i0 + 16 * qg + 15 : M - 1);
  const int warp_keys = P + first + warp_last + 1;  // keys the group's last query sees
  float o[ND][4], mx[2] = {ATTN_NEG_INF, ATTN_NEG_INF}, sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < ND; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[j][c] = 0.0f;
  constexpr int NPF = PF ? rows_per_thread<D, TK, NT>() : 1;
  float4 pk[NPF], pv[NPF];  // PF 1: the next tile's K and V, loaded during this tile's math
  if constexpr (PF) {
    load_rows<D, TK, NT, NPF>(pk, k_cache + (size_t)kvh * D, kv_stride, keys, 0);
    load_rows<D, TK, NT, NPF>(pv, v_cache + (size_t)kvh * D, kv_stride, keys, 0);
  }
  for (int t0 = 0; t0 < keys; t0 += TK) {
    __syncthreads();  // every warp is done with the previous tile
    if constexpr (PF) {
      store_rows<D, LD, TK, NT, NPF>(s_k, pk, 1.0f, 0);
      store_rows<D, LD, TK, NT, NPF>(s_v, pv, 1.0f, 0);
    } else {
      stage_f16<D, LD, TK, NT, true>(s_k, k_cache + ((size_t)t0 * HKV + kvh) * D, kv_stride, keys - t0, 1.0f, s_v,
                               v_cache + ((size_t)t0 * HKV + kvh) * D);
    }
    __syncthreads();
    if constexpr (PF) {
      if (t0 + TK < keys) {  // block-uniform
        load_rows<D, TK, NT, NPF>(pk, k_cache + ((size_t)(t0 + TK) * HKV + kvh) * D, kv_stride, keys - t0 - TK, 0);
        load_rows<D, TK, NT, NPF>(pv, v_cache + ((size_t)(t0 + TK) * HKV + kvh) * D, kv_stride, keys - t0 - TK, 0);
      }
    }
    if (i0 + 16 * qg >= M || t0 + k0 >= warp_keys) continue;  // warp-uniform: none of its queries sees these keys
    float sc[NK][4];  // scores: (row g | g + 8) x (key 2t, 2t + 1) of each n8 tile
#pragma unroll
    for (int j = 0; j < NK; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) sc[j][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk)
#pragma unroll
      for (int j = 0; j < NK; j += 2) {  // B for key tiles j, j + 1: (keys 0-7 | 8-15) x (k 0-7 | 8-15)
        unsigned b[4];
        ldmatrix_x4(b, &s_k[k0 + 8 * j + (lane & 7) + (lane >> 4) * 8][16 * kk + ((lane >> 3) & 1) * 8]);
        mma_16816(sc[j], qa[kk], b);
        mma_16816(sc[j + 1], qa[kk], b + 2);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the online softmax of row qi + 8 r over the warp's visible keys of this tile
      const int see = qi + 8 * r < M ? P + first + qi + 8 * r : -1;  // its last visible key
      float tmax = ATTN_NEG_INF;
#pragma unroll
      for (int j = 0; j < NK; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = t0 + k0 + 8 * j + 2 * t + c;
          if (key > see) sc[j][2 * r + c] = ATTN_NEG_INF;
          tmax = fmaxf(tmax, sc[j][2 * r + c]);
        }
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
      const float nm = fmaxf(mx[r], tmax);
      const float base = nm == ATTN_NEG_INF ? 0.0f : nm;  // a row that has seen nothing yet stays at zero
      corr[r] = __expf(mx[r] - base);
      float ps = 0.0f;
#pragma unroll
      for (int j = 0; j < NK; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p = __expf(sc[j][2 * r + c] - base);  // exp(-inf) = 0 for the keys it does not see
          sc[j][2 * r + c] = p;
          ps += p;
        }
      sum[r] = sum[r] * corr[r] + ps;  // this thread's share of the row; the row's four threads add up at the end
      mx[r] = nm;
    }
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      o[j][0] *= corr[0];
      o[j][1] *= corr[0];
      o[j][2] *= corr[1];
      o[j][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < TW / 16; ++kk) {
      // the probabilities of keys 16 kk.. as an A fragment: score tiles 2 kk and 2 kk + 1 are its k halves
      const unsigned pa[4] = {pack2(sc[2 * kk][0], sc[2 * kk][1]), pack2(sc[2 * kk][2], sc[2 * kk][3]),
                              pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int j = 0; j < ND; j += 2) {  // B for dim tiles j, j + 1: (keys 0-7 | 8-15) x (dims 0-7 | 8-15), transposed
        unsigned b[4];
        ldmatrix_x4_trans(b, &s_v[k0 + 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8][8 * j + (lane >> 4) * 8]);
        mma_16816(o[j], pa, b);
        mma_16816(o[j + 1], pa, b + 2);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // each row's sum over its four threads
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
  }
  if constexpr (KW > 1) {  // warps 1.. of each group hand their (max, sum, output) to warp 0 of the group
    constexpr int SLOTS = (NW - QG) * 16;  // a row of each such warp
    __shared__ float s_m[SLOTS], s_l[SLOTS];
    __shared__ float s_o[SLOTS][D];
    if (kw > 0) {
      const int slot = (qg * (KW - 1) + kw - 1) * 16;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (t == 0) {
          s_m[slot + g + 8 * r] = mx[r];
          s_l[slot + g + 8 * r] = sum[r];
        }
#pragma unroll
        for (int j = 0; j < ND; ++j) {
          s_o[slot + g + 8 * r][8 * j + 2 * t] = o[j][2 * r];
          s_o[slot + g + 8 * r][8 * j + 2 * t + 1] = o[j][2 * r + 1];
        }
      }
    }
    __syncthreads();
    if (kw > 0) return;
#pragma unroll
    for (int w = 1; w < KW; ++w) {
      const int slot = (qg * (KW - 1) + w - 1) * 16;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m2 = s_m[slot + g + 8 * r], nm = fmaxf(mx[r], m2);
        const float base = nm == ATTN_NEG_INF ? 0.0f : nm;  // neither has seen a key: a row past M, never stored
        const float a = __expf(mx[r] - base), b = __expf(m2 - base);  // exp(-inf) = 0 for a side that saw nothing
        sum[r] = sum[r] * a + s_l[slot + g + 8 * r] * b;
        mx[r] = nm;
#pragma unroll
        for (int j = 0; j < ND; ++j) {
          o[j][2 * r] = o[j][2 * r] * a + s_o[slot + g + 8 * r][8 * j + 2 * t] * b;
          o[j][2 * r + 1] = o[j][2 * r + 1] * a + s_o[slot + g + 8 * r][8 * j + 2 * t + 1] * b;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = qi + 8 * r;
    if (row >= M) continue;
    const float inv = 1.0f / sum[r];
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      float2 v;
      v.x = o[j][2 * r] * inv;
      v.y = o[j][2 * r + 1] * inv;
      const size_t at = ((size_t)row * HQ + h) * D + 8 * j + 2 * t;
      if (out_h) *reinterpret_cast<unsigned *>(out_h + at) = pack2(v.x, v.y);
      else *reinterpret_cast<float2 *>(out + at) = v;
    }
  }
}
