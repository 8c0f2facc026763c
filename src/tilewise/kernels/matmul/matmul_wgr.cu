// matmul_wgr.cu - the matmul with its operands swapped on Hopper's warpgroup tensor cores (sm_90a only): W is
// wgmma's A operand, decoded straight into registers, and x is its B operand, copied by the TMA. Compiled after
// matmul_wg.cu (its wgmma, TMA and mbarrier helpers), matmul_wgmma_ops.cu (wgmma_rs<BT>, A from registers) and
// matmul_wgr_decode.cu (the decodes of a W stage into A fragments).
//
// nf4_mm_wgr<FMT, EPI, BF, BT, ST, KS, MB, DEC, SR>: a block computes out^T's BF x BT tile: BF / 64 warpgroups, each owning
// 64 output features (of every weight set) times the block's BT tokens, with `wgmma.mma_async m64nBTk16`. Because
// the tokens are the wgmma n, the token tile moves in steps of 8: 346 rows fit four tiles of 88 (6 rows padded)
// where the wg kind's 64-row slices pad 346 to 384.
// Per K step of 64: thread 0 copies the x tile (BT rows of f16, one TMA box, 128-byte swizzle: the K-major B
// layout the descriptor describes) and completes the stage's mbarrier; every thread copies by cp.async its share
// of the W rows (16 bytes longer than stored, so that a warp's eight rows fall in different banks) and of nf4's
// absmax of the step (the `absmax` arguments are stored (K / 64, N), `absmax_t` in the executor, so that a step's
// scales are contiguous). One step ahead of its wgmma each thread decodes, from shared memory, exactly the A
// fragment it holds (rows g and g + 8 of its warp's 16, columns 2t, 2t + 1, 2t + 8, 2t + 9 of each k16 step, the
// mma.sync m16n8k16 layout): nf4 is byte t of each of its rows' eight words, times the row's absmax, rounded once
// to f16 as the other kinds round it. Decoded weights never pass through shared memory, so nothing is fenced for
// the async proxy.
// Two fragment sets alternate: one is being decoded while the wgmma of the other runs.
// Ordering: the barrier of step kt comes after every warpgroup's wait for step kt - 1's wgmma, so stage
// (kt - 1) % ST (its x tile read by the tensor cores, its W rows by the decode) is free to be refilled with step
// kt + ST - 1.
// KS 1 applies the epilogue; KS > 1 writes slice blockIdx.z's raw sums to partial, which nf4_mm_splitk_reduce sums
// (SR 0), or (SR 1) the last of a tile's KS blocks to finish does: each block counts itself in the tile's word of
// `counters` after its partials are visible, and the block that counts KS adds the tile's slices in order 0..KS-1
// (as the reduction does: the same bits), applies the epilogue into final_out and sets the word back to 0 for the
// next launch (the words start at 0, written when the buffer is made; `serial_reduce` in matmul_reduce.cu, shared
// with nf4_mm_splitk). One launch fewer per split matmul. SR 2 (nf4_mm_wgr_cluster) launches a tile's KS blocks as
// one thread block cluster: each owns every KS-th group of 8 tokens, sends its raw sums of the others' groups into
// their owners' shared memory (distributed shared memory, `wgr_push_sums`) and sums its own groups' slices in order
// 0..KS-1 (the same bits again), with no partial sums in global memory, no counters and no reduction launch.
// MB is the launch bound's blocks per SM.
// DEC picks nf4's decode: 0 looks each nibble up in an f32 code table in shared memory and scales in f32 (one
// rounding to f16, as the other kinds); 1 looks four nibbles up at once in an f16 code table held in eight registers
// (byte permutes, no shared-memory load) and scales pairs in f16 (the code, the absmax and the product each rounded
// to f16: within the f16 tolerance, and fewer instructions on the decode's path). 2 and 3 look each stored byte up
// in a table of 256 f16 pairs in shared memory (both nibbles' codes in one load, as FLUTE's vectorized lookup does)
// and scale the pair as DEC 1 does, so they give DEC 1's bits with half its instructions and shorter dependency
// chains, for shared-memory loads instead. The table is held in 8 (DEC 2, 8 KB) or 32 (DEC 3, 32 KB) copies
// interleaved word by word, a lane reading copy lane % copies: 32 copies put every lane in its own bank, 8 leave
// conflicts only between lanes 8 apart whose bytes differ.
// out_h, where not null (EPI 0 and 2): the epilogue's values are stored rounded to f16 into out_h (M, N) instead of
// f32 into out / final_out, as nf4_mm_prep<0> would round them: the executor passes the next matmul's f16 rows when
// that matmul is the only reader, and drops its prologue launch.
// The norm fold (matmul_reduce.cu's `fold_chunk`, the executor's `fold_norm`): a residual launch summing in the
// kernel (KS 1, SR 2) with fold_g not null also stores f16 (h * fold_g) into out_h and its rows' sums of squares
// per 64 columns into ss_out (N % 64 == 0); a KS 1 or SR 2 launch with ss_in not null reads x as such rows and
// multiplies each token's outputs (SR 2: the sum of its slices) by rsqrt(sum / K + eps) before its epilogue. Null
// pointers: neither.
// rope, where not null (EPI 0 with KS 1 or SR 2; N % 64 == 0): q/k norm + RoPE instead of storing out
// (matmul_reduce.cu's `rope_chunk`, the executor's `fuse_rope`): the rows go to q and the KV cache.
// Shapes: K % (KS * 64) == 0; any M and N.

__host__ __device__ constexpr int wgr_threads(int BF) { return BF / 64 * 128; }
// one stage: the x tile (BT, 64) f16, then SETS x BF W rows as stored (padded) and nf4's absmax per row
__host__ __device__ constexpr int wgr_stage_w_bytes(int FMT, int EPI, int BF) {
  return (EPI == 2 ? 2 : 1) * BF * (wgr_row_stride(FMT) + (FMT == 0 ? 4 : 0));
}
// the ring: ST x tiles, then ST W stages
__host__ __device__ constexpr int wgr_ring_bytes(int FMT, int EPI, int BF, int BT, int ST) {
  return ST * (BT * 128 + wgr_stage_w_bytes(FMT, EPI, BF));
}
// the epilogue's tiles (BT, BF + 4) f32, staged where the ring was: rows 16-byte aligned, and the fragment stores of
// a warp's four token pairs fall into different banks. One tile, staged a weight set at a time, except with SR 2:
// each block stages the summed slices of every set of its own rows at once.
__host__ __device__ constexpr int wgr_tile_bytes(int EPI, int BF, int BT, int SR) {
  return (SR == 2 && EPI == 2 ? 2 : 1) * BT * (BF + 4) * 4;
}
// SR 2: the n8 token groups of a tile (tokens 8 j .. 8 j + 7) a block owns at most (group j: the cluster's block
// j % KS), and the raw sums it receives from its KS - 1 peers for them, (KS - 1, groups, SETS, threads) float4,
// after its tile where the ring was (sent once every block of the cluster is past its K loop)
__host__ __device__ constexpr int wgr_own_groups(int BT, int KS) { return (BT / 8 + KS - 1) / KS; }
__host__ __device__ constexpr int wgr_recv_bytes(int EPI, int BF, int BT, int KS, int SR) {
  return SR == 2 ? (KS - 1) * wgr_own_groups(BT, KS) * (EPI == 2 ? 2 : 1) * wgr_threads(BF) * 16 : 0;
}
// the code and the mbarriers, after the ring or the tiles (and SR 2's received sums), whichever is larger
__host__ __device__ constexpr int wgr_lut_offset(int FMT, int EPI, int BF, int BT, int ST, int KS, int SR) {
  return wgr_ring_bytes(FMT, EPI, BF, BT, ST) > wgr_tile_bytes(EPI, BF, BT, SR) + wgr_recv_bytes(EPI, BF, BT, KS, SR)
             ? wgr_ring_bytes(FMT, EPI, BF, BT, ST)
             : wgr_tile_bytes(EPI, BF, BT, SR) + wgr_recv_bytes(EPI, BF, BT, KS, SR);
}
// shared memory from a 1024-byte boundary (the swizzle's atom): the ring (or the epilogue's tiles), the NF4 code, ST
// `full` and ST `empty` mbarriers (128 bytes), DEC 2 and 3's pair table, + 1024 bytes to find that boundary
__host__ __device__ constexpr int wgr_smem_bytes(int FMT, int EPI, int BF, int BT, int ST, int KS, int DEC, int SR) {
  return wgr_lut_offset(FMT, EPI, BF, BT, ST, KS, SR) + 16 * 4 + 128 + 256 * 4 * wgr_pair_copies(DEC) + 1024;
}
__host__ __device__ constexpr int wgr_register_cap(int BF, int MB) {
  return 65536 / (wgr_threads(BF) * MB) < 255 ? 65536 / (wgr_threads(BF) * MB) : 255;
}
// registers beside the accumulators and the two fragment sets (16 a set and weight set); DEC 1's code table takes
// 8 more
#define WGR_SPARE 48
// How a stage is handed back for refilling. 1: per-stage mbarriers. Every thread's W copies arrive on the stage's
// `full` barrier when they land (cp.async.mbarrier.arrive.noinc; thread 0's expect_tx and the TMA's bytes too),
// and a thread decodes a step once that barrier completes; after its warpgroup's wgmma of step kt - 1 has finished,
// each thread arrives on that stage's `empty` barrier, and the stage is refilled one step later, once all have. No
// block-wide barrier in the K loop, and a warpgroup may run up to a step ahead of the other. 0: one __syncthreads
// per step (each thread waits for its own copies, then all for all). An experiment switch (experiments/
// wgr_parts_cuda.py races both); it goes once measured.
#ifndef WGR_RELEASE
#define WGR_RELEASE 1
#endif

__host__ __device__ constexpr int wgr_first_failure(int FMT, int EPI, int BF, int BT, int ST, int KS, int MB,
                                                    int DEC, int SR) {
  const int sets = EPI == 2 ? 2 : 1;
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2) return 1;                                 // variant
  if (BF % 64 != 0 || BF < 64 || BF > 256) return 2;                                     // warpgroups_1_4
  if (BT % 8 != 0 || BT < 8 || BT > 256) return 3;                                       // bt_8_256
  if (sets * BT > 256) return 4;                                                         // accumulators_128
  if (MB < 1 || MB > 2) return 5;                                                        // mb_1_2
  if (DEC < 0 || DEC > 3 || (DEC != 0 && FMT != 0)) return 6;                            // dec_nf4
  if (wgr_register_cap(BF, MB) - sets * BT / 2 - 32 * sets < WGR_SPARE + 8 * (DEC == 1)) return 7;  // registers_spare
  if (ST < 3 || ST > 6) return 8;                                                        // stages_3_6
  if (KS != 1 && KS != 2 && KS != 4 && KS != 8) return 9;                                // ks_1_2_4_8
  if (SR < 0 || SR > 2 || (SR != 0 && KS == 1)) return 10;                               // sr_with_slices
  if (wgr_smem_bytes(FMT, EPI, BF, BT, ST, KS, DEC, SR) > PIPE_SMEM_MAX) return 11;      // smem_227k
  return 0;
}

template <int SETS, int J>
__device__ __forceinline__ void wgr_pin(float (&acc)[SETS][J][4], unsigned (&a)[SETS][4][4]) {
#pragma unroll
  for (int s = 0; s < SETS; ++s) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(acc[s][j][q])::"memory");
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(a[s][kk][q])::"memory");
  }
}

// one K step: the warpgroup's SETS x 4 register-A wgmma on the x tile at shared address xs, issued asynchronously,
// then the wait for the previous step's (this one runs on)
template <int BT, int SETS>
__device__ __forceinline__ void wgr_step(float (&acc)[SETS][BT / 8][4], unsigned (&a)[SETS][4][4], unsigned xs) {
  wgr_pin(acc, a);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int s = 0; s < SETS; ++s) wgmma_rs<BT>(acc[s], a[s][kk], wg_desc(xs + kk * 32));
  wg_commit();
  wg_wait<1>();
  wgr_pin(acc, a);
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// an arrival on `bar` once every cp.async this thread has issued so far has landed (the barrier's count includes it)
__device__ __forceinline__ void cp_async_mbar_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// ---- SR 2: a tile's slices summed in its cluster, pushed to the block that owns each token group ----------------
// The n8 token group j of a tile (tokens 8 j .. 8 j + 7) belongs to the cluster's block j % KS (rank = slice). Once
// every block of the cluster is past its K loop, each sends, for every group another block owns, its raw sums
// straight from its accumulators into that block's shared memory where its ring was (`st.async`, one fragment's
// four values a store), each store counted in bytes by the owner's `recv` mbarrier; the owner waits for the bytes,
// adds the KS slices of its groups in order 0..KS-1 from 0.0f (its own from registers: the reduction launch's order,
// so the same bits), stages them in its tile and applies the epilogue to its groups' rows. Against the pulled
// reduction (`cluster_reduce`): its first barrier's release arrive compiles to a GPU-scope fence, here a relaxed
// one; each peer slice was a distributed-shared-memory load whose round trip the sum waited for; and no exit
// barrier, since blocks only write into each other and an owner returns after every byte sent to it has landed.
// (Sent ahead of the barrier, into a region of their own, the sums took more shared memory, and qkv's tile lost its
// second block per SM.)

// four floats into a peer's shared memory at cluster address `addr` (16-byte aligned), counted by its mbarrier `bar`
__device__ __forceinline__ void st_async4(unsigned addr, const float (&v)[4], unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(addr), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(bar) : "memory");
}

// the token groups the cluster's block `rank` owns
template <int BT, int KS>
__device__ __forceinline__ int wgr_groups_of(unsigned rank) {
  return (int)rank < BT / 8 ? (BT / 8 - (int)rank + KS - 1) / KS : 0;
}

// this thread's raw sums of every group another block owns, into that block's `recv` region at slot (this block's
// rank, less one past the owner's), the group's index among the owner's, the set and the thread
template <int KS, int NT, int BT, int SETS>
__device__ __forceinline__ void wgr_push_sums(const float (&acc)[SETS][BT / 8][4], unsigned recv, unsigned recv_bar,
                                              int tid) {
  constexpr int OWN = wgr_own_groups(BT, KS);
  const unsigned rank = cluster_rank();
  // every block's ring is free (its wgmma waited for, its decodes done: the ring-free __syncthreads), so peers may
  // send into it, and its `recv` barrier is initialized (fence.mbarrier_init)
  cluster_sync_relaxed();
#pragma unroll
  for (int j = 0; j < BT / 8; ++j) {
    const unsigned z = j % KS;
    if (z == rank) continue;
    const unsigned slot = rank < z ? rank : rank - 1, dst = cluster_peer(recv, z), bar = cluster_peer(recv_bar, z);
#pragma unroll
    for (int s = 0; s < SETS; ++s)
      st_async4(dst + 16u * (((slot * OWN + j / KS) * SETS + s) * NT + tid), acc[s][j], bar);
  }
}

// once every peer's sums have landed: the slices of this block's groups added in order 0..KS-1 from 0.0f, into the
// (SETS, BT, BF + 4) tile at the fragments' places (feature r + 8 (q / 2), token 8 j + 2 t + q % 2)
template <int KS, int NT, int BT, int BF, int SETS>
__device__ __forceinline__ void wgr_sum_own(const float (&acc)[SETS][BT / 8][4], float *tile, const float4 *recv,
                                            unsigned recv_bar, int r, int t, int tid) {
  constexpr int OWN = wgr_own_groups(BT, KS), TS = BF + 4;
  const unsigned rank = cluster_rank();
  mbar_wait(recv_bar, 0);
#pragma unroll
  for (int j = 0; j < BT / 8; ++j) {
    if (j % KS != (int)rank) continue;
#pragma unroll
    for (int s = 0; s < SETS; ++s) {
      float4 y = f4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int z = 0; z < KS; ++z) {
        const float4 v = z == (int)rank ? f4(acc[s][j][0], acc[s][j][1], acc[s][j][2], acc[s][j][3])
                                        : recv[(((z < (int)rank ? z : z - 1) * OWN + j / KS) * SETS + s) * NT + tid];
        y = add4(y, v);
      }
      const float q4[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) tile[(s * BT + 8 * j + 2 * t + q % 2) * TS + r + 8 * (q / 2)] = q4[q];
    }
  }
}

// the epilogue of this block's groups' rows from the staged tile: a group's 8 rows are BF / 4 chunks of four columns
// each, one chunk a thread (NT = 2 BF), the residual rows of up to EPI_BATCH groups loaded before any store (as
// matmul_reduce.cu's epilogues); `scaled` (the norm fold's consumer) multiplies each row's sums by the scale in the
// tile's padding column BF; fold_g (residual, N % 64 == 0) stores the fold's f16 rows and sums of squares, whole
// half-warps calling fold_chunk on a row's 64 aligned columns
template <int EPI, int KS, int NT, int BT, int BF>
__device__ __forceinline__ void wgr_own_epilogue(const float *tile, int tid, float *final_out, unsigned short *out_h,
                                                 int M, int N, int t0, int f0, const float *fold_g, float *ss_out,
                                                 bool scaled, const RopeOut *rope) {
  static_assert(NT == 2 * BF, "one chunk a thread in each token group");
  constexpr int SETS = EPI == 2 ? 2 : 1, TS = BF + 4, OWN = wgr_own_groups(BT, KS);
  constexpr int PB = OWN < EPI_BATCH ? OWN : EPI_BATCH;
  const unsigned rank = cluster_rank();
  const int groups = wgr_groups_of<BT, KS>(rank), rr = tid / (BF / 4), c = 4 * (tid % (BF / 4)), col = f0 + c;
  const bool fold = EPI == 1 && fold_g != nullptr;
#pragma unroll 1
  for (int g0 = 0; g0 < groups; g0 += PB) {
    float4 res[PB];
    int row[PB];
    bool ok[PB];
#pragma unroll
    for (int u = 0; u < PB; ++u) {
      row[u] = 8 * ((int)rank + (g0 + u) * KS) + rr;
      ok[u] = g0 + u < groups && t0 + row[u] < M && col < N;
      res[u] = EPI == 1 && N % 4 == 0 && ok[u]
                   ? *reinterpret_cast<const float4 *>(final_out + (size_t)(t0 + row[u]) * N + col)
                   : f4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < PB; ++u) {
      if (g0 + u >= groups) break;  // the same for every thread of the block
      float4 y[SETS];
#pragma unroll
      for (int s = 0; s < SETS; ++s) y[s] = *reinterpret_cast<const float4 *>(tile + (s * BT + row[u]) * TS + c);
      if (scaled) {
        const float k = ok[u] ? tile[row[u] * TS + BF] : 1.0f;
#pragma unroll
        for (int s = 0; s < SETS; ++s) y[s] = f4(y[s].x * k, y[s].y * k, y[s].z * k, y[s].w * k);
      }
      chunk_epilogue<EPI, SETS>(y, res[u], ok[u], fold, t0 + row[u], col, final_out, out_h, fold_g, ss_out, N, rope);
    }
  }
}

// the kernels' body: nf4_mm_wgr (SR 0, 1) and nf4_mm_wgr_cluster (SR 2) differ only in their cluster shape. xmap is
// the kernel's own __grid_constant__ parameter, taken by reference: the TMA reads the descriptor where it is.
template <int FMT, int EPI, int BF, int BT, int ST, int KS, int MB, int DEC, int SR>
__device__ __forceinline__ void wgr_body(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w,
                                         const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
                                         const float *__restrict__ absmax_up, float *__restrict__ out, int M, int N,
                                         int K, const TmaMap &xmap, float *__restrict__ final_out,
                                         unsigned *__restrict__ counters, unsigned short *__restrict__ out_h,
                                         const float *__restrict__ ss_in, float eps, const float *__restrict__ fold_g,
                                         float *__restrict__ ss_out, const RopeOut *__restrict__ rope) {
  constexpr int FAIL = wgr_first_failure(FMT, EPI, BF, BT, ST, KS, MB, DEC, SR);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu)");
  static_assert(FAIL != 2, "warpgroups_1_4: BF must be 1..4 warpgroups of 64 features");
  static_assert(FAIL != 3, "bt_8_256: BT (tokens, the wgmma n) must be a multiple of 8 in 8..256");
  static_assert(FAIL != 4, "accumulators_128: SETS * BT / 2 accumulators per thread must be at most 128");
  static_assert(FAIL != 5, "mb_1_2: MB (blocks per SM in the launch bound) must be 1 or 2");
  static_assert(FAIL != 6, "dec_nf4: DEC (the decode) must be 0, or 1..3 with nf4 weights");
  static_assert(FAIL != 7, "registers_spare: the launch bound leaves too few registers beside the accumulators");
  static_assert(FAIL != 8, "stages_3_6: ST (ring stages) must be in 3..6");
  static_assert(FAIL != 9, "ks_1_2_4_8: KS (slices of K) must be 1, 2, 4 or 8");
  static_assert(FAIL != 10, "sr_with_slices: SR (who sums the slices) must be 0, or 1 or 2 with KS > 1");
  static_assert(FAIL != 11, "smem_227k: the ring exceeds 227 KB of shared memory");
  constexpr int NT = wgr_threads(BF), SETS = EPI == 2 ? 2 : 1, BK = 64;
  constexpr int XBYTES = BT * 128, WBYTES = wgr_stage_w_bytes(FMT, EPI, BF), RROW = wg_row_bytes(FMT);
  constexpr int RS = wgr_row_stride(FMT), CPR = RROW / 16;  // a W row's stride, its 16-byte chunks
  extern __shared__ __align__(16) unsigned char dsmem[];
  const unsigned raw_addr = smem_addr(dsmem), base_addr = (raw_addr + 1023u) & ~1023u;
  unsigned char *base = dsmem + (base_addr - raw_addr);
  // x tiles, W stages (or the epilogue's tile), then the code and the mbarriers
  constexpr int WOFF = ST * XBYTES, LOFF = wgr_lut_offset(FMT, EPI, BF, BT, ST, KS, SR);
  float *lut = reinterpret_cast<float *>(base + LOFF);
  const unsigned bars = base_addr + LOFF + 64;
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / WARPSIZE, lane = tid % WARPSIZE;
  const int f0 = blockIdx.x * BF, t0 = blockIdx.y * BT;
  const int steps = K / KS / BK, k_begin = blockIdx.z * (K / KS);
  if (tid == 0) tma_prefetch_map(&xmap);
  if (DEC == 0 && tid < 16) lut[tid] = NF4_CODE[tid];  // read after the first barrier below (DEC 0 only)
  // DEC 2 and 3: entry b of the pair table's copy c (word b * copies + c) is byte b's two codes in f16, the high
  // nibble's in the low half (the earlier k), as DEC 1 rounds them; read after the same barrier
  unsigned *pairs = reinterpret_cast<unsigned *>(base + LOFF + 64 + 128);
  if constexpr (DEC >= 2) {
    for (int e = tid; e < 256 * wgr_pair_copies(DEC); e += NT) {
      const int b = e / wgr_pair_copies(DEC);
      pairs[e] = f16_bits(NF4_CODE[b >> 4]) | (unsigned)f16_bits(NF4_CODE[b & 15]) << 16;
    }
  }
  const unsigned *pt = DEC >= 2 ? pairs + (lane & (wgr_pair_copies(DEC) - 1)) : nullptr;  // copies: 8 or 32
  const unsigned empties = bars + 64;  // stage s: `full` at bars + 8 s, `empty` at empties + 8 s
  // SR 2: `recv` counts the bytes of the peers' sums for this block's token groups (wgr_push_sums), in `full`'s
  // eighth slot (ST <= 6); they land after the block's tile
  constexpr int ROFF = wgr_tile_bytes(EPI, BF, BT, SR);
  const unsigned recv_bar = bars + 56, recv = base_addr + ROFF;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mbar_init(bars + 8 * s, WGR_RELEASE ? NT + 1 : 1);  // release 1: every thread's copies + thread 0's expect_tx
      mbar_init(empties + 8 * s, NT);
    }
    if (SR == 2) mbar_init(recv_bar, 1);
    mbar_init_fence();
    if (SR == 2) mbar_expect_tx(recv_bar, (KS - 1) * wgr_groups_of<BT, KS>(cluster_rank()) * SETS * NT * 16);
  }
  __syncthreads();  // the mbarriers exist before any thread waits on one (the first wait precedes the next barrier)

  // step j into stage j % ST: x by the TMA (thread 0), W rows by cp.async (all)
  auto issue_x = [&](int j) {
    if (j >= steps || tid != 0) return;
    const unsigned bar = bars + 8 * (j % ST);  // tokens past M are zero-filled by the TMA; their bytes count too
    mbar_expect_tx(bar, XBYTES);
    tma_box(base_addr + (j % ST) * XBYTES, &xmap, k_begin + j * BK, t0, bar);
  };
  auto row_at = [](unsigned e, unsigned row) { return row * RS + (e % CPR) * 16; };  // a W chunk's place
  auto issue_w = [&](int j) {
    if (j >= steps) return;
    unsigned char *ws = base + WOFF + (j % ST) * WBYTES;
    cp_w_rows<FMT, SETS, BF, NT, SETS * BF * RS, decltype(row_at), false>(ws, row_at, w, absmax, w_up, absmax_up,
                                                                          f0, N, K, k_begin + j * BK, tid);
    if (FMT == 0) {  // the step's absmax, stored (K / 64, N): BF contiguous floats a set, in 16-byte chunks
      float *sa = reinterpret_cast<float *>(ws + SETS * BF * RS);
      const size_t kb = (size_t)(k_begin + j * BK) / 64;
#pragma unroll
      for (int i = 0; i < (SETS * BF / 4 + NT - 1) / NT; ++i) {
        const int e = tid + i * NT, s = e / (BF / 4), c = 4 * (e % (BF / 4)), n = f0 + c;
        if ((SETS * BF / 4) % NT != 0 && e >= SETS * BF / 4) continue;
        const float *src = (s ? absmax_up : absmax) + kb * N + n;
        if (N % 4 == 0) {
          cp_async16(sa + s * BF + c, n < N ? src : absmax, n < N);  // n < N: the whole chunk is (N % 4 == 0)
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) cp_async4(sa + s * BF + c + q, n + q < N ? src + q : absmax, n + q < N);
        }
      }
    }
    if (WGR_RELEASE) cp_async_mbar_arrive(bars + 8 * (j % ST));  // when this thread's copies so far have landed
  };

  // Release 0, copy groups: group g holds step g's W rows (always one group per step, empty past the last, so the
  // waits line up). The prologue commits steps 0..ST-2; step kt + 1 has landed when at most ST - 3 groups are
  // pending. Release 1: the prologue issues steps 0..ST-3 and step kt issues step kt + ST - 2, into the stage step
  // kt - 2 used (released at step kt - 1). The weights are read before the PDL wait (no launch writes them); x, the
  // prep launch's output, only after it.
  constexpr int AHEAD = WGR_RELEASE ? ST - 2 : ST - 1;  // steps in flight before the loop
#pragma unroll
  for (int g = 0; g < AHEAD; ++g) {
    issue_w(g);
    if (!WGR_RELEASE) cp_async_commit();
  }
  PDL_BEGIN();
#pragma unroll
  for (int g = 0; g < AHEAD; ++g) issue_x(g);
  // ss_in (KS 1 or SR 2, the norm fold's consumer): each of the block's tokens' 1 / rms(h) from its sums of squares
  // per 64 columns, added in order, here while the first stages land rather than after the K loop, where its loads
  // were waited for at the end of the launch; held in a register until the epilogue
  constexpr int SCALES = (BT + NT - 1) / NT;
  constexpr bool FOLDS = KS == 1 || SR == 2;  // the launches that may consume the fold (a split's sum is scaled)
  float scale[SCALES];
  if (FOLDS && ss_in != nullptr) {
#pragma unroll
    for (int u = 0; u < SCALES; ++u) {
      const int i = tid + u * NT;
      float ss = 0.0f;
      if (i < BT && t0 + i < M) {
        const float *row = ss_in + (size_t)(t0 + i) * (K / 64);
#pragma unroll 1
        for (int j = 0; j < K / 64; j += 4) {  // four loads in flight, added in order (a 0 past the end adds nothing)
          float v[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) v[q] = j + q < K / 64 ? row[j + q] : 0.0f;
#pragma unroll
          for (int q = 0; q < 4; ++q) ss += v[q];
        }
      }
      scale[u] = rsqrtf(ss / (float)K + eps);
    }
  }
  const int r = 64 * wg + 16 * (warp % 4) + lane / 4, t = lane % 4;
  unsigned a0[SETS][4][4], a1[SETS][4][4];
  float acc[SETS][BT / 8][4];
#pragma unroll
  for (int s = 0; s < SETS; ++s)
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[s][j][q] = 0.0f;
  if (WGR_RELEASE) {
    mbar_wait(bars, 0);  // step 0's x and every thread's W rows
  } else {
    cp_async_wait<ST - 2>();
    mbar_wait(bars, 0);
    __syncthreads();  // step 0 landed for every thread
  }
  const Nf4Table tb = DEC == 1 ? nf4_table() : Nf4Table{};
  wgr_fragments<FMT, SETS, BF, DEC>(a0, base + WOFF, lut, tb, pt, r, t);

  // step kt multiplies with fragment set `cur` while set `nxt` receives step kt + 1
  auto step = [&](int kt, unsigned (&cur)[SETS][4][4], unsigned (&nxt)[SETS][4][4]) {
    wgr_step<BT, SETS>(acc, cur, base_addr + (kt % ST) * XBYTES);  // step kt - 1's wgmma is done (this warpgroup)
    if (WGR_RELEASE) {
      if (kt >= 1) mbar_arrive(empties + 8 * ((kt - 1) % ST));  // this thread is done with step kt - 1's stage
      const int j = kt + ST - 2;                                 // into the stage of step kt - 2
      if (j < steps) {
        if (j >= ST) mbar_wait(empties + 8 * (j % ST), (j / ST - 1) & 1);  // step j - ST released it, every thread
        issue_x(j);
        issue_w(j);
      }
      if (kt + 1 < steps) mbar_wait(bars + 8 * ((kt + 1) % ST), ((kt + 1) / ST) & 1);  // step kt + 1 landed, all
    } else {
      if (kt + 1 < steps) {
        cp_async_wait<ST - 3>();                                    // step kt + 1's W rows (this thread's)
        mbar_wait(bars + 8 * ((kt + 1) % ST), ((kt + 1) / ST) & 1);  // step kt + 1's x tile
      }
      __syncthreads();  // ... for every thread; every warpgroup is done with step kt - 1
      issue_x(kt + ST - 1);  // into stage (kt - 1) % ST
      issue_w(kt + ST - 1);
      cp_async_commit();
    }
    if (kt + 1 < steps)
      wgr_fragments<FMT, SETS, BF, DEC>(nxt, base + WOFF + ((kt + 1) % ST) * WBYTES, lut, tb, pt, r, t);
  };
  for (int kt = 0; kt < steps; kt += 2) {
    step(kt, a0, a1);
    if (kt + 1 < steps) step(kt + 1, a1, a0);
  }
  wg_wait<0>();
  wgr_pin(acc, a0);
  wgr_pin(acc, a1);
  cp_async_wait<0>();
  // The next launch may start once every block of this grid has passed its K loop (so every block has had its
  // room, and none of them waits for room the next launch's blocks take): those set up and copy their first weight
  // stages, which no launch writes, during this epilogue instead of after it. Their wait still covers every write
  // below.
  PDL_LAUNCH_DEPENDENTS();

  // The epilogue goes through shared memory: each thread stores its fragments (rows of out^T) into the (BT, BF)
  // tile, then the block writes the tile's token rows with 16-byte accesses in a loop that is not unrolled. Stored
  // straight from the fragments, a thread's outputs were 4-byte words four token rows apart, and the unrolled
  // stores with their bounds checks were most of the kernel's code. KS > 1 stages each set's raw sums in turn.
  __syncthreads();  // every warpgroup's wgmma and copies are done: the ring is free
  constexpr int TS = BF + 4, PASSES = KS > 1 ? SETS : 1;
  float *tile = reinterpret_cast<float *>(base);
  // ss_in (KS 1 or SR 2): x came as f16 (h * g), unnormed (the norm fold, matmul_reduce.cu); each token's
  // 1 / rms(h) (`scale`, from before the K loop) goes into the padding column BF of its tile row (of set 0's rows;
  // the fragments fill columns 0..BF-1 only), and the token's outputs (SR 2: its summed slices, in cluster_reduce)
  // are multiplied by it before the epilogue
  const bool scaled = FOLDS && ss_in != nullptr;
  if (scaled) {
#pragma unroll
    for (int u = 0; u < SCALES; ++u)
      if (tid + u * NT < BT) tile[(tid + u * NT) * TS + BF] = scale[u];
  }
  if constexpr (SR == 2) {
    wgr_push_sums<KS, NT, BT, SETS>(acc, recv, recv_bar, tid);
    wgr_sum_own<KS, NT, BT, BF, SETS>(acc, tile, reinterpret_cast<const float4 *>(base + ROFF), recv_bar, r, t, tid);
    __syncthreads();  // the block's summed rows (and the scales) are staged
    wgr_own_epilogue<EPI, KS, NT, BT, BF>(tile, tid, final_out, out_h, M, N, t0, f0, fold_g, ss_out, scaled,
                                          EPI == 0 ? rope : nullptr);
    return;
  }
  if (scaled) __syncthreads();  // the scales are read by other threads below
  const size_t mn = (size_t)M * N;
  const bool vec = N % 4 == 0;  // a row's 16-byte chunks are aligned (f0 is a multiple of 64)
#pragma unroll
  for (int s = 0; s < PASSES; ++s) {
    // out^T's fragment: accumulator q of n8 tile j is feature r + 8 (q / 2), token 8 j + 2 t + q % 2
    if (KS == 1 && scaled) {
      // the thread's BT / 4 token scales into registers before the first store into the tile: read between the
      // stores (which, to the compiler, may write them), each waited for shared memory in turn
      float sc[BT / 8][2];
#pragma unroll
      for (int j = 0; j < BT / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) sc[j][h] = tile[(8 * j + 2 * t + h) * TS + BF];
#pragma unroll
      for (int j = 0; j < BT / 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float k = sc[j][q % 2];
          tile[(8 * j + 2 * t + q % 2) * TS + r + 8 * (q / 2)] =
              EPI != 2 ? acc[0][j][q] * k : silu(acc[0][j][q] * k) * (acc[SETS - 1][j][q] * k);
        }
    } else {
#pragma unroll
      for (int j = 0; j < BT / 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          tile[(8 * j + 2 * t + q % 2) * TS + r + 8 * (q / 2)] =
              KS > 1 || EPI != 2 ? acc[s][j][q] : silu(acc[0][j][q]) * acc[SETS - 1][j][q];
    }
    __syncthreads();
    float *dst = KS > 1 ? out + ((size_t)blockIdx.z * SETS + s) * mn : out;
    constexpr int CHUNKS = BT * (BF / 4);  // the tile's 4-column chunks; NT divides it (BT / 8 a thread)
    // residual (KS 1): the rows of EPI_BATCH chunks are loaded before any is stored (matmul_reduce.cu says why)
    auto residual_rows = [&](int e0, float4(&res)[EPI_BATCH]) {
#pragma unroll
      for (int u = 0; u < EPI_BATCH; ++u) {
        const int e = e0 + u * NT, tok = t0 + e / (BF / 4), feat = f0 + 4 * (e % (BF / 4));
        res[u] = KS == 1 && EPI == 1 && vec && e < CHUNKS && tok < M && feat < N
                     ? *reinterpret_cast<const float4 *>(dst + (size_t)tok * N + feat)
                     : f4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    };
    // q/k norm + RoPE (none), or the norm fold (residual); N % 64 == 0: BT / 8 passes for every thread, so that
    // whole half-warps (a row's 64 aligned columns) call rope_chunk or fold_chunk
    if (KS == 1 && ((EPI == 0 && rope != nullptr) || (EPI == 1 && fold_g != nullptr))) {
#pragma unroll 1
      for (int e0 = tid; e0 < CHUNKS; e0 += EPI_BATCH * NT) {
        float4 res[EPI_BATCH];
        residual_rows(e0, res);
#pragma unroll
        for (int u = 0; u < EPI_BATCH; ++u) {
          const int e = e0 + u * NT;
          if (e >= CHUNKS) break;  // the same for every thread of the block
          const int row = e / (BF / 4), c = 4 * (e % (BF / 4)), tok = t0 + row, feat = f0 + c;
          const bool ok = tok < M && feat < N;
          float4 h = f4(0.0f, 0.0f, 0.0f, 0.0f);
          if (ok) {
            const float4 v = *reinterpret_cast<const float4 *>(tile + row * TS + c);
            h = EPI == 1 ? add4(res[u], v) : v;
            if (EPI == 1) *reinterpret_cast<float4 *>(dst + (size_t)tok * N + feat) = h;
          }
          if (EPI == 0) rope_chunk(h, ok, *rope, tok, feat);
          else fold_chunk(h, ok, fold_g, out_h, ss_out, tok, feat, N);
        }
      }
      continue;
    }
#pragma unroll 1
    for (int e0 = tid; e0 < CHUNKS; e0 += EPI_BATCH * NT) {
      float4 res[EPI_BATCH];
      residual_rows(e0, res);
#pragma unroll
      for (int u = 0; u < EPI_BATCH; ++u) {
        const int e = e0 + u * NT, row = e / (BF / 4), c = 4 * (e % (BF / 4)), tok = t0 + row, feat = f0 + c;
        if (e >= CHUNKS || tok >= M || feat >= N) continue;
        const float4 v = *reinterpret_cast<const float4 *>(tile + row * TS + c);
        const size_t o = (size_t)tok * N + feat;
        if (vec) {
          if (KS == 1 && EPI == 1) {
            *reinterpret_cast<float4 *>(dst + o) = add4(res[u], v);
          } else if (KS == 1 && out_h) {
            *reinterpret_cast<uint2 *>(out_h + o) = make_uint2(f16_bits(v.x) | (unsigned)f16_bits(v.y) << 16,
                                                               f16_bits(v.z) | (unsigned)f16_bits(v.w) << 16);
          } else {
            *reinterpret_cast<float4 *>(dst + o) = v;
          }
        } else {
          const float vs[4] = {v.x, v.y, v.z, v.w};
          for (int i = 0; i < 4 && feat + i < N; ++i) {
            if (KS == 1 && EPI == 1) dst[o + i] += vs[i];
            else if (KS == 1 && out_h) out_h[o + i] = f16_bits(vs[i]);
            else dst[o + i] = vs[i];
          }
        }
      }
    }
    if (s + 1 < PASSES) __syncthreads();  // the tile is read before the next set overwrites it
  }
  if constexpr (SR == 1)  // the code table is no longer read: its first word holds the flag
    serial_reduce<EPI, KS, NT, BT, BF>(out, final_out, out_h, counters, reinterpret_cast<unsigned *>(lut), M, N, t0,
                                       f0);
}

template <int FMT, int EPI, int BF, int BT, int ST, int KS, int MB, int DEC, int SR>
__global__ void __launch_bounds__(BF / 64 * 128, MB)
nf4_mm_wgr(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w, const float *__restrict__ absmax,
           const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, float *__restrict__ out, int M,
           int N, int K, const __grid_constant__ TmaMap xmap, float *__restrict__ final_out,
           unsigned *__restrict__ counters, unsigned short *__restrict__ out_h, const float *__restrict__ ss_in,
           float eps, const float *__restrict__ fold_g, float *__restrict__ ss_out, const RopeOut *__restrict__ rope) {
  static_assert(SR != 2, "SR 2 (a cluster per tile) is launched as nf4_mm_wgr_cluster");
  wgr_body<FMT, EPI, BF, BT, ST, KS, MB, DEC, SR>(xh, w, absmax, w_up, absmax_up, out, M, N, K, xmap, final_out,
                                                  counters, out_h, ss_in, eps, fold_g, ss_out, rope);
}

// SR 2: the KS blocks of a tile (blockIdx.z = 0..KS-1) are one cluster; out is final_out (no partial sums) and
// counters is not read
template <int FMT, int EPI, int BF, int BT, int ST, int KS, int MB, int DEC, int SR>
__global__ void __cluster_dims__(1, 1, KS) __launch_bounds__(BF / 64 * 128, MB)
nf4_mm_wgr_cluster(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w,
                   const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
                   const float *__restrict__ absmax_up, float *__restrict__ out, int M, int N, int K,
                   const __grid_constant__ TmaMap xmap, float *__restrict__ final_out, unsigned *__restrict__ counters,
                   unsigned short *__restrict__ out_h, const float *__restrict__ ss_in, float eps,
                   const float *__restrict__ fold_g, float *__restrict__ ss_out, const RopeOut *__restrict__ rope) {
  static_assert(SR == 2, "nf4_mm_wgr_cluster sums the slices in a cluster: SR 2");
  wgr_body<FMT, EPI, BF, BT, ST, KS, MB, DEC, SR>(xh, w, absmax, w_up, absmax_up, out, M, N, K, xmap, final_out,
                                                  counters, out_h, ss_in, eps, fold_g, ss_out, rope);
}
