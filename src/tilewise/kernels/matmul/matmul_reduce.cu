// matmul_reduce.cu - the three ways split-K's slices are summed; compiled after matmul.cu (silu, f16_bits) and
// before the kernels that split (matmul_mma.cu's split-K kernels, matmul_wgr.cu's):
//   nf4_mm_splitk_reduce<EPI, NT>: a launch of its own after the matmul (SR 0);
//   serial_reduce: the last block of each tile, inside the matmul's launch (SR 1);
//   cluster_reduce: every block of a tile's cluster, from each other's shared memory (SR 2, Hopper).
// All add the slices in order 0..KS-1 from 0.0f, so they give the same bits.

// Residual epilogues load the rows they add to for EPI_BATCH chunks of four columns before storing any of them: to
// the compiler a store into final_out may alias the next chunk's load, so a loop that loads, adds and stores one
// chunk at a time waits for memory once per chunk (measured: most of a KS 1 residual launch's epilogue). The sums
// are the same, so are the bits. An experiment switch as well (1: one chunk at a time). cluster_reduce batches at
// most EPI_BATCH chunks, fewer where their peer slices would pass 16 float4.
#ifndef EPI_BATCH
#define EPI_BATCH 8
#endif

__device__ __forceinline__ float4 add4(float4 a, float4 b) { return f4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// a float another block wrote in this launch, read through L2 (not a line this SM's L1 may hold)
__device__ __forceinline__ float ld_cg(const float *p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// four floats another block wrote in this launch (16-byte aligned), through L2
__device__ __forceinline__ float4 ld_cg4(const float *p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// the epilogue of four summed columns at output offset o (16-byte aligned): residual stores res + y into final_out,
// res being the row's four values there, which the caller loaded ahead (EPI_BATCH); none and swiglu store f32 into
// final_out, or f16 into out_h where it is not null (as nf4_mm_prep<0> rounds)
template <int EPI, int SETS>
__device__ __forceinline__ void store_sum4(const float4 (&y)[SETS], float4 res, float *final_out,
                                           unsigned short *out_h, size_t o) {
  if (EPI == 1) {
    *reinterpret_cast<float4 *>(final_out + o) = add4(res, y[0]);
    return;
  }
  const float4 a = y[0], b = y[SETS - 1];
  const float4 w = EPI == 0 ? a : f4(silu(a.x) * b.x, silu(a.y) * b.y, silu(a.z) * b.z, silu(a.w) * b.w);
  if (out_h) {
    uint2 q;
    q.x = (unsigned)f16_bits(w.x) | ((unsigned)f16_bits(w.y) << 16);
    q.y = (unsigned)f16_bits(w.z) | ((unsigned)f16_bits(w.w) << 16);
    *reinterpret_cast<uint2 *>(out_h + o) = q;
  } else {
    *reinterpret_cast<float4 *>(final_out + o) = w;
  }
}

// store_sum4 for one column
template <int EPI, int SETS>
__device__ __forceinline__ void store_sum1(const float (&y)[SETS], float *final_out, unsigned short *out_h, size_t o) {
  if (EPI == 1) {
    final_out[o] += y[0];
  } else {
    const float w = EPI == 0 ? y[0] : silu(y[0]) * y[SETS - 1];
    if (out_h) out_h[o] = f16_bits(w);
    else final_out[o] = w;
  }
}

// y[s] = the KS slices v[z][s] added in order 0..KS-1 from 0.0f, four columns at a time
template <int KS, int SETS>
__device__ __forceinline__ void sum_slices4(const float4 (&v)[KS][SETS], float4 (&y)[SETS]) {
#pragma unroll
  for (int s = 0; s < SETS; ++s) y[s] = f4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int z = 0; z < KS; ++z)
#pragma unroll
    for (int s = 0; s < SETS; ++s)
      y[s] = f4(y[s].x + v[z][s].x, y[s].y + v[z][s].y, y[s].z + v[z][s].z, y[s].w + v[z][s].w);
}

// SR 1 (split-K without a reduction launch): each of a tile's KS blocks calls this after storing its raw sums into
// partial (KS, SETS, M, N); the last to arrive, counted in the tile's word of `counters` (zero before the launch),
// adds the slices in order 0..KS-1 as nf4_mm_splitk_reduce does (the same bits), applies the epilogue into final_out
// (or, where out_h is not null and EPI is not residual, f16 into out_h) and sets the word back to 0. The tile is
// ROWS x COLS from (r0, c0); `flag` is one shared word. A thread reads every slice of CH outputs before it adds any:
// the loads are volatile, so one output at a time would wait for memory once per slice and output. Where COLS and N
// are multiples of 4 (every tile the spaces make, and the model's widths) each load takes four columns, so the last
// block waits for L2 a quarter as many times; each value is still added in the same order.
// serial_reduce's sum and epilogue four columns at a time (COLS % 4 == 0, N % 4 == 0: every load 16-byte aligned)
template <int EPI, int KS, int NT, int ROWS, int COLS>
__device__ __forceinline__ void serial_sum4(const float *partial, float *final_out, unsigned short *out_h, int M,
                                            int N, int r0, int c0) {
  constexpr int SETS = EPI == 2 ? 2 : 1, TOTAL = ROWS * COLS / 4, ITER = (TOTAL + NT - 1) / NT;
  constexpr int CH = 16 / (KS * SETS) > 1 ? 16 / (KS * SETS) : 1;  // at most 16 loads in flight a thread
  const size_t mn = (size_t)M * N;
#pragma unroll 1
  for (int i0 = 0; i0 < ITER; i0 += CH) {
    float4 v[CH][KS][SETS];
    size_t o[CH];
    bool ok[CH];
#pragma unroll
    for (int u = 0; u < CH; ++u) {  // along the columns: coalesced
      const int e = threadIdx.x + (i0 + u) * NT, r = r0 + e / (COLS / 4), c = c0 + e % (COLS / 4) * 4;
      ok[u] = e < TOTAL && r < M && c < N;  // c < N: all four, as N % 4 == 0
      o[u] = ok[u] ? (size_t)r * N + c : 0;
#pragma unroll
      for (int z = 0; z < KS; ++z)
#pragma unroll
        for (int s = 0; s < SETS; ++s)
          v[u][z][s] = ok[u] ? ld_cg4(partial + ((size_t)z * SETS + s) * mn + o[u]) : f4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float4 h[CH];  // the residual rows, all loaded before the first store (EPI_BATCH's reason)
#pragma unroll
    for (int u = 0; u < CH; ++u)
      h[u] = EPI == 1 && ok[u] ? *reinterpret_cast<const float4 *>(final_out + o[u]) : f4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      if (!ok[u]) continue;
      float4 y[SETS];
      sum_slices4<KS, SETS>(v[u], y);
      store_sum4<EPI, SETS>(y, h[u], final_out, out_h, o[u]);
    }
  }
}

template <int EPI, int KS, int NT, int ROWS, int COLS>
__device__ __forceinline__ void serial_reduce(const float *partial, float *final_out, unsigned short *out_h,
                                              unsigned *counters, unsigned *flag, int M, int N, int r0, int c0) {
  constexpr int SETS = EPI == 2 ? 2 : 1, TOTAL = ROWS * COLS, ITER = (TOTAL + NT - 1) / NT;
  constexpr int CH = 16 / (KS * SETS) > 1 ? 16 / (KS * SETS) : 1;  // at most 16 loads in flight a thread
  const size_t mn = (size_t)M * N;
  __threadfence();  // this block's partials are visible to the block that sums them
  __syncthreads();  // every thread stored and fenced (and the caller's shared memory is no longer read)
  const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) *flag = atomicAdd(&counters[tile], 1u) == KS - 1;
  __syncthreads();
  if (!*flag) return;
  __threadfence();
  if (COLS % 4 == 0 && N % 4 == 0) {
    serial_sum4<EPI, KS, NT, ROWS, COLS>(partial, final_out, out_h, M, N, r0, c0);
    if (threadIdx.x == 0) counters[tile] = 0u;
    return;
  }
#pragma unroll 1
  for (int i0 = 0; i0 < ITER; i0 += CH) {
    float v[CH][KS][SETS];
    size_t o[CH];
    bool ok[CH];
#pragma unroll
    for (int u = 0; u < CH; ++u) {  // along the columns: coalesced
      const int e = threadIdx.x + (i0 + u) * NT, r = r0 + e / COLS, c = c0 + e % COLS;
      ok[u] = e < TOTAL && r < M && c < N;
      o[u] = ok[u] ? (size_t)r * N + c : 0;
#pragma unroll
      for (int z = 0; z < KS; ++z)
#pragma unroll
        for (int s = 0; s < SETS; ++s) v[u][z][s] = ok[u] ? ld_cg(partial + ((size_t)z * SETS + s) * mn + o[u]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < CH; ++u) {
      if (!ok[u]) continue;
      float y[SETS];
#pragma unroll
      for (int s = 0; s < SETS; ++s) y[s] = 0.0f;
#pragma unroll
      for (int z = 0; z < KS; ++z)
#pragma unroll
        for (int s = 0; s < SETS; ++s) y[s] += v[u][z][s];
      store_sum1<EPI, SETS>(y, final_out, out_h, o[u]);
    }
  }
  if (threadIdx.x == 0) counters[tile] = 0u;
}

// The norm fold (the executor's `fold_norm`): a residual matmul whose output rows the next matmul reads through an
// RMSNorm stores, beside the f32 rows, the next matmul's f16 input unnormed, f16(h * g) with g the norm's weight,
// and each row's sum of squares of h per 64 columns, ss_out (M, N / 64). The next matmul (wgr, `ss_in`) multiplies
// its output rows by 1 / rms(h) = rsqrt(sum / N + eps), which the norm would have multiplied its input rows by: the
// same product, rounded to f16 at h * g instead of at the normed row (within the f16 tolerance), and no prologue
// launch between the two. fold_chunk is called by every lane of a half-warp for the 16 consecutive 4-column chunks
// of 64 aligned columns of one row (ok false: outside the output, nothing stored, 0 added); lane 0 of the sixteen
// stores their sum, added in one fixed order.
__device__ __forceinline__ void fold_chunk(float4 h, bool ok, const float *__restrict__ fold_g,
                                           unsigned short *__restrict__ out_h, float *__restrict__ ss_out, int row,
                                           int col, int N) {
  float sq = 0.0f;
  if (ok) {
    const float4 g = *reinterpret_cast<const float4 *>(fold_g + col);
    uint2 q;
    q.x = (unsigned)f16_bits(h.x * g.x) | ((unsigned)f16_bits(h.y * g.y) << 16);
    q.y = (unsigned)f16_bits(h.z * g.z) | ((unsigned)f16_bits(h.w * g.w) << 16);
    *reinterpret_cast<uint2 *>(out_h + (size_t)row * N + col) = q;
    sq = h.x * h.x + h.y * h.y + h.z * h.z + h.w * h.w;
  }
#pragma unroll
  for (int s = 8; s > 0; s >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, s);  // within the half-warp
  if (ok && col % 64 == 0) ss_out[(size_t)row * (N / 64) + col / 64] = sq;
}

// q/k norm + RoPE in the epilogue of the matmul that makes q, k and v (the executor's `fuse_rope`, attention.cu's
// qknorm_rope folded in): where a wgr launch of EPI 0 has `rope` (a RopeOut in device memory) its N output columns
// are HQ + 2 HKV heads of 64, and row m goes to attention's inputs instead of out: each q head normed (its own RMSNorm
// weight) and rotated into q row m, each k head normed and rotated into k_cache row start + m, each v head copied to
// v_cache row start + m. rope_chunk is called by every lane of a half-warp for the 16 4-column chunks of one head of
// one row (ok false: outside the output; it still takes part in the shuffles, and stores nothing): the head's sum of
// squares is added across the sixteen lanes, and the RoPE partner of column d (d + 32 or d - 32) is in lane ^ 8.
// The values are qknorm_rope's but for the order of that sum: within the f32 rounding, not the same bits.
struct RopeOut {
  const float *q_norm, *k_norm;  // (64) each
  const float *cos_t, *sin_t;    // (positions, 32) each
  float *q;                      // (M, HQ * 64)
  float *k_cache, *v_cache;      // (positions, HKV * 64) each
  int start, hq, hkv;
  float eps;
};

__device__ __forceinline__ void rope_chunk(float4 y, bool ok, const RopeOut &r, int row, int col) {
  const int h = col / 64, d = col % 64, pos = r.start + row;
  const bool is_q = h < r.hq, is_v = h >= r.hq + r.hkv;
  float ss = y.x * y.x + y.y * y.y + y.z * y.z + y.w * y.w;
#pragma unroll
  for (int s = 8; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);  // the head's 64 columns
  const float rms = rsqrtf(ss / 64.0f + r.eps);
  float4 g = f4(1.0f, 1.0f, 1.0f, 1.0f);
  if (ok && !is_v) g = *reinterpret_cast<const float4 *>((is_q ? r.q_norm : r.k_norm) + d);
  const float4 v = f4(y.x * rms * g.x, y.y * rms * g.y, y.z * rms * g.z, y.w * rms * g.w);
  float4 p;  // columns d +- 32 of the same head: lane ^ 8 holds them
  p.x = __shfl_xor_sync(0xffffffffu, v.x, 8);
  p.y = __shfl_xor_sync(0xffffffffu, v.y, 8);
  p.z = __shfl_xor_sync(0xffffffffu, v.z, 8);
  p.w = __shfl_xor_sync(0xffffffffu, v.w, 8);
  if (!ok) return;
  if (is_v) {
    *reinterpret_cast<float4 *>(r.v_cache + ((size_t)pos * r.hkv + (h - r.hq - r.hkv)) * 64 + d) = y;
    return;
  }
  if (d < 32) p = f4(-p.x, -p.y, -p.z, -p.w);
  const float4 c = *reinterpret_cast<const float4 *>(r.cos_t + (size_t)pos * 32 + d % 32);
  const float4 sn = *reinterpret_cast<const float4 *>(r.sin_t + (size_t)pos * 32 + d % 32);
  float *dst = is_q ? r.q + ((size_t)row * r.hq + h) * 64 + d : r.k_cache + ((size_t)pos * r.hkv + (h - r.hq)) * 64 + d;
  *reinterpret_cast<float4 *>(dst) = f4(v.x * c.x + p.x * sn.x, v.y * c.y + p.y * sn.y, v.z * c.z + p.z * sn.z,
                                        v.w * c.w + p.w * sn.w);
}

// the epilogue of one chunk of four summed columns (y, each set's) at output row `row`, column `col` (ok: inside the
// output): with `rope` q/k norm + RoPE (none), with `fold` the norm fold's producer (residual; whole half-warps call
// either, ok or not, N % 64 == 0), else
// store_sum4, or store_sum1 column by column where N % 4 != 0; res holds the residual row's four values, loaded ahead
template <int EPI, int SETS>
__device__ __forceinline__ void chunk_epilogue(const float4 (&y)[SETS], float4 res, bool ok, bool fold, int row,
                                               int col, float *final_out, unsigned short *out_h,
                                               const float *fold_g, float *ss_out, int N,
                                               const RopeOut *rope = nullptr) {
  if (EPI == 0 && rope != nullptr) {  // q/k norm + RoPE (whole half-warps call it, ok or not, N % 64 == 0)
    rope_chunk(y[0], ok, *rope, row, col);
    return;
  }
  const size_t o = (size_t)row * N + col;
  if (EPI == 1 && fold) {
    float4 h = f4(0.0f, 0.0f, 0.0f, 0.0f);
    if (ok) {
      h = add4(res, y[0]);  // as store_sum4<1> adds
      *reinterpret_cast<float4 *>(final_out + o) = h;
    }
    fold_chunk(h, ok, fold_g, out_h, ss_out, row, col, N);
    return;
  }
  if (!ok) return;
  if (N % 4 == 0) {  // col < N: all four
    store_sum4<EPI, SETS>(y, res, final_out, out_h, o);
  } else {
    for (int i = 0; i < 4 && col + i < N; ++i) {
      float yi[SETS];
#pragma unroll
      for (int s = 0; s < SETS; ++s) yi[s] = i == 0 ? y[s].x : i == 1 ? y[s].y : i == 2 ? y[s].z : y[s].w;
      store_sum1<EPI, SETS>(yi, final_out, out_h, o + i);
    }
  }
}

// both barriers of a thread block cluster: every thread of every block arrives (after its shared-memory stores,
// released to the cluster) before any goes on (acquiring them)
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// both barriers of a cluster with a relaxed arrive, for barriers no data passes through: a release arrive compiles
// to a GPU-scope fence (MEMBAR.ALL.GPU), which waits for all of the block's global stores. cluster_reduce's exit
// keeps each block's shared memory until every peer has read it (every peer load before it has been consumed, summed
// into a stored value, before the arrive issues); wgr's pushed sums (matmul_wgr.cu) wait at it for every ring to be
// free, the sums themselves counted by an mbarrier.
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// this block's rank in its cluster
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// the shared address `addr` of this block, in the cluster's block `rank`
__device__ __forceinline__ unsigned cluster_peer(unsigned addr, unsigned rank) {
  unsigned d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(addr), "r"(rank));
  return d;
}

__device__ __forceinline__ float ld_peer1(unsigned addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ float4 ld_peer4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

// SR 2: the KS blocks of a tile are one cluster (rank = slice), and each has stored its raw sums at shared address
// `tiles`: (SETS, ROWS, COLS + 4) f32, row-major. After a cluster barrier, block z sums the tile's 4-column chunks
// z, z + KS, ... (in units of NT) over the KS blocks in order 0..KS-1 from 0.0f (the reduction launch's order: the
// same bits) and applies the epilogue; a second barrier keeps every block's shared memory until all have read it.
// fold_g (residual, not null; N % 64 == 0, COLS % 64 == 0, NT % 32 == 0): the norm fold's f16 rows into out_h and
// sums of squares into ss_out (`fold_chunk`). Every thread of a block loops the same number of times (CHUNKS is a
// multiple of NT wherever the fold runs), so whole half-warps call fold_chunk. scaled (the fold's consumer, EPI 0
// or 2): each row's summed slices are multiplied by the scale its blocks wrote into the padding column COLS of
// their tiles' first set, before the epilogue.
template <int EPI, int KS, int NT, int ROWS, int COLS>
__device__ __forceinline__ void cluster_reduce(unsigned tiles, float *final_out, unsigned short *out_h, int M, int N,
                                               int r0, int c0, const float *fold_g, float *ss_out,
                                               bool scaled = false) {
  static_assert(COLS % 4 == 0, "cluster_reduce reads four columns at a time");
  constexpr int SETS = EPI == 2 ? 2 : 1, TS = COLS + 4, CHUNKS = ROWS * (COLS / 4);
  // chunks a thread sums at a time (at most 16 float4 of peer slices in flight, as serial_sum4): their residual rows
  // and every peer load before the first sum. One chunk at a time paid a distributed-shared-memory round trip per
  // chunk: its loads waited for their sums, and a store is not passed by the next chunk's loads (generic addresses).
  // The batch loop is not unrolled: one copy of the batch's code
  constexpr int PB = 16 / (KS * SETS) > 1 ? (16 / (KS * SETS) < EPI_BATCH ? 16 / (KS * SETS) : EPI_BATCH) : 1;
  cluster_sync();
  const unsigned rank = cluster_rank();
  unsigned peer[KS];
#pragma unroll
  for (int z = 0; z < KS; ++z) peer[z] = cluster_peer(tiles, z);
  constexpr bool FOLD = EPI == 1 && COLS % 64 == 0 && NT % 32 == 0 && CHUNKS % NT == 0;
  const bool fold = FOLD && fold_g != nullptr;
#pragma unroll 1
  for (int e0 = threadIdx.x + rank * NT; e0 < CHUNKS; e0 += PB * KS * NT) {
    float4 res[PB], v[PB][KS][SETS];
    float k[PB];
    int row[PB], c[PB];
    bool ok[PB];
#pragma unroll
    for (int u = 0; u < PB; ++u) {
      const int e = e0 + u * KS * NT;
      row[u] = e / (COLS / 4);
      c[u] = 4 * (e % (COLS / 4));
      ok[u] = e < CHUNKS && r0 + row[u] < M && c0 + c[u] < N;
      // residual (N % 4 == 0): the row's four values, loaded before the first store
      res[u] = EPI == 1 && N % 4 == 0 && ok[u]
                   ? *reinterpret_cast<const float4 *>(final_out + (size_t)(r0 + row[u]) * N + c0 + c[u])
                   : f4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int z = 0; z < KS; ++z)
#pragma unroll
        for (int s = 0; s < SETS; ++s)
          v[u][z][s] = ok[u] ? ld_peer4(peer[z] + 4 * ((s * ROWS + row[u]) * TS + c[u])) : f4(0.0f, 0.0f, 0.0f, 0.0f);
      // the norm fold's consumer: the row's scale, which every block wrote into its padding column COLS
      k[u] = scaled && ok[u] ? ld_peer1(peer[0] + 4 * (row[u] * TS + COLS)) : 1.0f;
    }
#pragma unroll
    for (int u = 0; u < PB; ++u) {
      const int r = r0 + row[u], col = c0 + c[u];
      float4 y[SETS];
      sum_slices4<KS, SETS>(v[u], y);
      if (scaled) {
#pragma unroll
        for (int s = 0; s < SETS; ++s) y[s] = f4(y[s].x * k[u], y[s].y * k[u], y[s].z * k[u], y[s].w * k[u]);
      }
      if (FOLD && fold && e0 + u * KS * NT >= CHUNKS) break;  // the same for every thread (CHUNKS % NT == 0)
      chunk_epilogue<EPI, SETS>(y, res[u], ok[u], FOLD && fold, r, col, final_out, out_h, fold_g, ss_out, N);
    }
  }
  cluster_sync_relaxed();
}

// out = epilogue(sum of the ks slices of partial), one thread per output value; the slices are added in order
// 0..ks-1, so a graph replay gives bit-identical results
template <int EPI, int NT>
__global__ void __launch_bounds__(NT)
nf4_mm_splitk_reduce(const float *__restrict__ partial, int ks, float *__restrict__ out, int M, int N) {
  PDL_BEGIN();
  constexpr int FAIL = reduce_first_failure(EPI, NT);
  static_assert(FAIL != 1, "variant: EPI in 0..2 (none, residual, swiglu)");
  static_assert(FAIL != 2, "whole_warps: NT must be a whole number of warps, 32..1024");
  constexpr int SETS = EPI == 2 ? 2 : 1;
  const size_t mn = (size_t)M * N, e = (size_t)blockIdx.x * NT + threadIdx.x;
  if (e >= mn) return;
  float y[SETS];
#pragma unroll
  for (int s = 0; s < SETS; ++s) y[s] = 0.0f;
  for (int z = 0; z < ks; ++z)
#pragma unroll
    for (int s = 0; s < SETS; ++s) y[s] += partial[((size_t)z * SETS + s) * mn + e];
  if (EPI == 0) out[e] = y[0];
  else if (EPI == 1) out[e] += y[0];
  else out[e] = silu(y[0]) * y[SETS - 1];
}
