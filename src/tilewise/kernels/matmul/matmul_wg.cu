// matmul_wg.cu - the matmul on Hopper's warpgroup tensor cores (wgmma, sm_90a only); compiled after matmul.cu,
// matmul_pipe.cu and matmul_ring.cu (their helpers: WRaw and decode8, the cp.async wrappers, store_epilogue_at,
// store_partial_at, and the ring's x prologue nf4_mm_prep, whose f16 rows this kind reads) and matmul_wgmma_ops.cu
// (the generated wgmma instructions: wgmma_tile<BN> here).
//
// nf4_mm_wg<FMT, EPI, BM, BN, MT, ST, KS, MB>: BM / (64 MT) warpgroups, each multiplying MT 64-row slices of the
// BM x BN tile with `wgmma.mma_async m64nBNk16` (f16 x f16 -> f32, both operands read by the tensor cores from
// shared memory). A larger BM decodes each weight for more rows: the decode is the W tile's, once per block.
// K steps of 64 (one 128-byte row of f16 per tile row, the 128-byte swizzle's row) pass through rings filled by
// cp.async: ST x tiles (f16 rows of xh, zero-filled past M), ST - 2 steps ahead, and W tiles as stored (rows past N
// zero-filled). f16 weights are the operand as they land; nf4 and f32 weights land ST - 1 steps ahead (ST - 1
// slots) and are decoded (nf4: the NF4 code times the row's absmax, rounded once to f16) one step ahead into one of
// three decoded tiles, while the tensor cores run on the previous step (issued, not yet waited for). The copy and
// decode loops have compile-time trip counts: with `e += NT` loops ptxas serialized the wgmma ops of some nf4
// tiles (C7515).
// Operand tiles are K-major in the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), which is what
// the wgmma descriptors below describe: 8-row groups 1024 bytes apart, K advanced by 32 bytes per k16 step.
// Ordering: ordinary stores and cp.async writes are made visible to the tensor cores (the async proxy) by
// fence.proxy.async before each step's barrier. A warpgroup waits for its previous step's wgmma (wait_group 1)
// before the next barrier, so after the barrier of step kt every warpgroup is done with step kt - 2: its ring stage
// is refilled and its decoded tile (of three) rewritten in step kt.
// KS 1 applies the epilogue; KS > 1 writes slice blockIdx.z's raw sums to partial for nf4_mm_splitk_reduce. MB is
// the launch bound's blocks per SM. Warp w of a warpgroup holds rows 16 (w % 4).. of each of its m64 slices in the
// mma.sync accumulator layout, so the family's store_epilogue_at serves each slice as a 16 x BN warp tile.
// nf4_mm_wgt<...> (the wgt kind, TX 1 in wg_body): the same kernel with each step's x tile copied by the TMA: one
// thread arms the stage's mbarrier with the tile's bytes and issues BM / 64 boxes of 64 x 64 f16 from the tensor map
// (rows past M zero-filled, in the same 128-byte swizzle); every thread waits on that mbarrier's phase before the
// step's barrier. The copies' address arithmetic leaves the warps that issue the wgmma.
// Shapes: K % (KS * 64) == 0; any M and N.

__host__ __device__ constexpr int wg_threads(int BM, int MT) { return BM / (64 * MT) * 128; }
// bytes of one W row of a step as stored: nf4 32, f16 128 (the operand), f32 256
__host__ __device__ constexpr int wg_row_bytes(int FMT) { return FMT == 0 ? 32 : FMT == 1 ? 128 : 256; }
// bytes of one step's W tile as stored: its rows, and nf4's absmax per row
__host__ __device__ constexpr int wg_raw_bytes(int FMT, int EPI, int BN) {
  return (EPI == 2 ? 2 : 1) * BN * (wg_row_bytes(FMT) + (FMT == 0 ? 4 : 0));
}
// shared memory, from a 1024-byte boundary (the swizzle's atom): nf4 and f32: three decoded W tiles, ST x tiles
// (BM, 64) f16, 128 bytes a row, and ST - 1 W tiles as stored; f16: ST x tiles and ST W tiles (the operand as it
// lands); then the NF4 code; + 1024 bytes to find that boundary. All of it is dynamic: the rules count every byte.
// (TX 1: + ST mbarriers of the x ring, 64 bytes)
__host__ __device__ constexpr int wg_smem_bytes(int FMT, int EPI, int BM, int BN, int ST, int TX = 0) {
  return (FMT == 1 ? ST * wg_raw_bytes(FMT, EPI, BN)
                   : 3 * (EPI == 2 ? 2 : 1) * BN * 128 + (ST - 1) * wg_raw_bytes(FMT, EPI, BN)) +
         ST * BM * 128 + 16 * 4 + (TX ? 64 : 0) + 1024;  // + the NF4 code
}
__host__ __device__ constexpr int wg_register_cap(int BM, int MT, int MB) {
  return 65536 / (wg_threads(BM, MT) * MB) < 255 ? 65536 / (wg_threads(BM, MT) * MB) : 255;
}
// registers addresses, descriptors and the decode need beside the accumulators: over the whole space, ptxas spilled
// 20-52 bytes with 64 to spare (512 threads, 64 accumulators) and never with 69 or more
#define WG_SPARE 72

__host__ __device__ constexpr int wg_first_failure(int FMT, int EPI, int BM, int BN, int MT, int ST, int KS,
                                                    int MB, int TX = 0) {
  const int sets = EPI == 2 ? 2 : 1;
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2) return 1;                                // variant
  if (MT != 1 && MT != 2) return 2;                                                     // mt_1_2
  if (BM % (64 * MT) != 0 || BM < 64 * MT || BM > 4 * 64 * MT) return 3;                // warpgroups_1_4
  if (BN != 32 && BN != 64 && BN != 128 && BN != 256) return 4;                         // bn_32_256
  if (MT * sets * BN > 256) return 5;                                                   // accumulators_128
  if (MB < 1 || MB > 2) return 6;                                                       // mb_1_2
  if (wg_register_cap(BM, MT, MB) - MT * sets * BN / 2 < WG_SPARE) return 7;           // registers_spare
  if (ST < 3 || ST > 6) return 8;                                                       // stages_3_6
  if (KS != 1 && KS != 2 && KS != 4 && KS != 8) return 9;                               // ks_1_2_4_8
  if (wg_smem_bytes(FMT, EPI, BM, BN, ST, TX) > PIPE_SMEM_MAX) return 10;               // smem_227k
  return 0;
}

// a shared-memory matrix descriptor: start address, leading byte offset 16 (unused by the swizzled K-major
// layout), stride byte offset 1024 (from one 8-row group to the next), 128-byte swizzle
__device__ __forceinline__ unsigned long long wg_desc(unsigned saddr) {
  return (unsigned long long)((saddr & 0x3ffffu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
         (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// TMA (TX 1): a CUtensorMap passed by value, an mbarrier per x stage that the copy's bytes complete
struct __align__(64) TmaMap {
  unsigned long long v[16];
};
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT;\n"
      "}\n" ::"r"(bar), "r"(parity) : "memory");
}
// box (64 columns, 64 rows) of the map at column c0, row c1 into shared dst (1024-byte aligned: the 128-byte swizzle)
__device__ __forceinline__ void tma_box(unsigned dst, const TmaMap *map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// the tensor map's 128 bytes fetched ahead of its first copy (a kernel parameter: no launch writes it, so this may
// run before the PDL wait and overlap the launch before)
__device__ __forceinline__ void tma_prefetch_map(const TmaMap *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// the accumulators may not be moved while a wgmma writes them: pin each one in place around the waits
template <int MT, int SETS, int J>
__device__ __forceinline__ void wg_pin(float (&acc)[MT][SETS][1][J][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int s = 0; s < SETS; ++s)
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(acc[mt][s][0][j][q])::"memory");
}

// one K step of 64 for warpgroup wg: its MT m64 slices of the x tile at shared address st times the SETS W tiles
// (BN, 64) at wt, issued asynchronously; then waiting for the previous step's wgmma (this one runs on)
template <int BN, int MT, int SETS>
__device__ __forceinline__ void wg_step(float (&acc)[MT][SETS][1][BN / 8][4], unsigned st, unsigned wt, int wg) {
  wg_pin(acc);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 64 / 16; ++kk)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int s = 0; s < SETS; ++s)
        wgmma_tile<BN>(acc[mt][s][0], wg_desc(st + (wg * MT + mt) * 64 * 128 + kk * 32),
                       wg_desc(wt + s * BN * 128 + kk * 32));
  wg_commit();
  wg_wait<1>();
  wg_pin(acc);
}

// warpgroup wg's MT slices stored: the epilogue (KS 1) or slice blockIdx.z's raw sums into partial
template <int EPI, int BN, int MT, int SETS, int KS>
__device__ __forceinline__ void wg_store(const float (&acc)[MT][SETS][1][BN / 8][4], float *out, int M, int N,
                                         int m0, int n0, int wg, int warp) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int row0 = m0 + (wg * MT + mt) * 64 + 16 * (warp % 4);
    if (KS == 1) store_epilogue_at<EPI, 16, BN, SETS>(acc[mt], out, M, N, row0, n0);
    else store_partial_at<16, BN, SETS>(acc[mt], out, M, N, row0, n0);
  }
}

// One K step's W rows as stored (SETS x BN rows of wg_row_bytes, w_up's after w's; rows past N zero-filled) and
// nf4's absmax per row at ws + SA, by cp.async from all NT threads: 16-byte chunk e (of row e / chunks-per-row)
// lands at ws + dst(e, row), so each kind lays the rows out its own way (the wg kinds' swizzle, the wgr kind's
// padding).
template <int FMT, int SETS, int BN, int NT, int SA, typename Dst, bool ABSMAX = true>
__device__ __forceinline__ void cp_w_rows(unsigned char *ws, Dst dst, const unsigned *w,
                                          const float *absmax, const unsigned *w_up, const float *absmax_up, int n0,
                                          int N, int K, int k0, int tid) {
  constexpr int RROW = wg_row_bytes(FMT), WQ = SETS * BN * RROW / 16;
  constexpr unsigned CPR = RROW / 16;  // 16-byte chunks of a stored row
#pragma unroll
  for (int i = 0; i < (WQ + NT - 1) / NT; ++i) {
    const unsigned e = tid + i * NT, row = e / CPR, r = row % BN;
    if (WQ % NT == 0 || e < (unsigned)WQ) {
      const bool ok = n0 + (int)r < N;
      const unsigned char *src = reinterpret_cast<const unsigned char *>(row >= BN ? w_up : w);
      cp_async16(ws + dst(e, row), ok ? src + ((size_t)(n0 + r) * K + k0) * RROW / 64 + (e % CPR) * 16 : src, ok);
    }
  }
  if (FMT == 0 && ABSMAX) {  // the rows' absmax of this step, as stored: (N, K / 64)
    float *sa = reinterpret_cast<float *>(ws + SA);
#pragma unroll
    for (int i = 0; i < (SETS * BN + NT - 1) / NT; ++i) {
      const unsigned e = tid + i * NT, r = e % BN;
      if ((SETS * BN) % NT == 0 || e < (unsigned)(SETS * BN)) {
        const bool ok = n0 + (int)r < N;
        const float *src = e >= BN ? absmax_up : absmax;
        cp_async4(sa + e, ok ? src + ((size_t)(n0 + r) * K + k0) / 64 : src, ok);
      }
    }
  }
}

template <int FMT, int EPI, int BM, int BN, int MT, int ST, int KS, int MB, int TX>
__device__ __forceinline__ void wg_body(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w,
                                        const float *__restrict__ absmax, const unsigned *__restrict__ w_up,
                                        const float *__restrict__ absmax_up, float *__restrict__ out, int M, int N,
                                        int K, const TmaMap *xmap) {
  constexpr int FAIL = wg_first_failure(FMT, EPI, BM, BN, MT, ST, KS, MB, TX);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu)");
  static_assert(FAIL != 2, "mt_1_2: MT (m64 slices per warpgroup) must be 1 or 2");
  static_assert(FAIL != 3, "warpgroups_1_4: BM must be 1..4 warpgroups of MT x 64 rows");
  static_assert(FAIL != 4, "bn_32_256: BN must be 32, 64, 128 or 256 (a wgmma n size)");
  static_assert(FAIL != 5, "accumulators_128: MT * SETS * BN / 2 accumulators per thread must be at most 128");
  static_assert(FAIL != 6, "mb_1_2: MB (blocks per SM in the launch bound) must be 1 or 2");
  static_assert(FAIL != 7, "registers_spare: the launch bound leaves too few registers beside the accumulators");
  static_assert(FAIL != 8, "stages_3_6: ST (ring stages) must be in 3..6");
  static_assert(FAIL != 9, "ks_1_2_4_8: KS (slices of K) must be 1, 2, 4 or 8");
  static_assert(FAIL != 10, "smem_227k: the ring exceeds 227 KB of shared memory");
  constexpr int NT = wg_threads(BM, MT), SETS = EPI == 2 ? 2 : 1, BK = 64, DEC = FMT != 1;
  constexpr int XBYTES = BM * 128, RAW = wg_raw_bytes(FMT, EPI, BN), WTILE = BN * 128;
  constexpr int RROW = wg_row_bytes(FMT);
  constexpr int XQ = BM * 8;  // 16-byte x copies per step
  constexpr int DQ = SETS * BN * 8;                             // 16-byte decoded chunks per step
  extern __shared__ __align__(16) unsigned char dsmem[];
  const unsigned raw_addr = smem_addr(dsmem), base_addr = (raw_addr + 1023u) & ~1023u;
  unsigned char *base = dsmem + (base_addr - raw_addr);
  constexpr int XOFF = DEC ? 3 * SETS * WTILE : 0, WOFF = XOFF + ST * XBYTES;  // the x ring, the W ring
  constexpr int WSLOTS = DEC ? ST - 1 : ST;  // stored W tiles: decoded ones land a step earlier, see the loop
  float *lut = reinterpret_cast<float *>(base + WOFF + WSLOTS * RAW);  // (16,) the NF4 code
  const unsigned bars = base_addr + WOFF + WSLOTS * RAW + 64;          // TX: (ST,) mbarriers, one per x stage
  unsigned char *dec = base;  // three decoded W tiles (SETS x (BN, 64) f16 each)
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / WARPSIZE;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int steps = K / KS / BK, k_begin = blockIdx.z * (K / KS);
  if (tid < 16) lut[tid] = NF4_CODE[tid];  // read after the first barrier below
  if (TX && tid == 0) {  // the copies are issued by this thread only, after their barrier's init in program order
#pragma unroll
    for (int s = 0; s < ST; ++s) mbar_init(bars + 8 * s, 1);
    mbar_init_fence();
  }

  // Thread e of a step's copies or decodes handles 16-byte chunk e: chunk c = e % CPR of row e / CPR (rows of all
  // weight sets in a row, s * BN + r). Unsigned powers of two throughout: the index math is shifts and masks, and
  // a swizzled 128-byte row's chunk lands at byte (e * 16) ^ ((row % 8) * 16). Every count is a compile-time
  // constant, so the loops unroll with no branches (x: exactly 4 MT chunks a thread).
  auto swz = [](unsigned e) { return (e << 4) ^ (((e >> 3) & 7u) << 4); };
  auto issue_x = [&](int j) {  // step j's x tile into x stage j % ST by cp.async (TX: BM / 64 TMA boxes)
    if (j >= steps) return;
    if constexpr (TX) {  // rows past M are zero-filled by the TMA, and their bytes count toward the barrier's
      if (tid == 0) {
        const unsigned bar = bars + 8 * (j % ST), dst = base_addr + XOFF + (j % ST) * XBYTES;
        mbar_expect_tx(bar, XBYTES);
#pragma unroll
        for (int i = 0; i < BM / 64; ++i) tma_box(dst + i * 64 * 128, xmap, k_begin + j * BK, m0 + 64 * i, bar);
      }
      return;
    }
    unsigned char *st = base + XOFF + (j % ST) * XBYTES;
    const unsigned short *src = xh + k_begin + j * BK;
    static_assert(XQ % NT == 0, "x tile: whole chunks per thread");
#pragma unroll
    for (int i = 0; i < XQ / NT; ++i) {
      const unsigned e = tid + i * NT, r = e >> 3;
      const bool ok = m0 + (int)r < M;
      cp_async16(st + swz(e), ok ? src + (size_t)(m0 + r) * K + (e & 7u) * 8 : xh, ok);
    }
  };
  auto issue_w = [&](int j) {  // step j's W tile(s) as stored into W slot j % WSLOTS by cp.async
    if (j >= steps) return;
    unsigned char *ws = base + WOFF + (j % WSLOTS) * RAW;
    // f16: the swizzled operand; nf4, f32: rows as stored, decoded later
    cp_w_rows<FMT, SETS, BN, NT, SETS * BN * RROW>(ws, [&](unsigned e, unsigned) { return FMT == 1 ? swz(e) : e * 16; },
                                                   w, absmax, w_up, absmax_up, n0, N, K, k_begin + j * BK, tid);
  };
  auto decode = [&](int j) {  // step j's stored W (landed) -> decoded tile j % 3, swizzled
    if (!DEC || j >= steps) return;
    const unsigned char *ws = base + WOFF + (j % WSLOTS) * RAW;
    unsigned char *d = dec + (j % 3) * SETS * WTILE;
#pragma unroll
    for (int i = 0; i < (DQ + NT - 1) / NT; ++i) {
      const unsigned e = tid + i * NT;  // chunk e % 8 of row e / 8: 8 weights, one nf4 word or 32 bytes of f32
      if (DQ % NT == 0 || e < (unsigned)DQ) {
        WRaw<FMT> raw;
        if (FMT == 0) {
          raw.q[0].x = reinterpret_cast<const unsigned *>(ws)[e];
          raw.s = reinterpret_cast<const float *>(ws + SETS * BN * RROW)[e >> 3];
        } else {
          const uint4 *f = reinterpret_cast<const uint4 *>(ws + e * 32);
          raw.q[0] = f[0];
          raw.q[FMT == 2 ? 1 : 0] = f[1];
        }
        *reinterpret_cast<uint4 *>(d + swz(e)) = decode8<FMT>(raw, lut);
      }
    }
  };

  // Copy groups: group g holds x of step g and W of step g (f16) or g + 1 (decoded: W is decoded a step before its
  // wgmma, so it lands a step earlier). The prologue commits groups 0..ST-3 (always ST - 2, empty past the last
  // step, so the waits line up; group 0 also holds the decoded kinds' W of step 0) and decodes step 0.
#pragma unroll
  for (int g = 0; g < ST - 2; ++g) {
    if (DEC && g == 0) issue_w(0);
    issue_x(g);
    issue_w(g + DEC);
    cp_async_commit();
  }
  cp_async_wait<ST - 3>();
  __syncthreads();  // group 0 landed for every thread; the code is in place
  decode(0);

  float acc[MT][SETS][1][BN / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero_acc(acc[mt]);
  for (int kt = 0; kt < steps; ++kt) {
    cp_async_wait<ST - 3>();  // group kt landed (this thread's copies): x of step kt, W of step kt (+ 1 decoded)
    if (TX) mbar_wait(bars + 8 * (kt % ST), (kt / ST) & 1);  // x of step kt landed (phase kt / ST of its stage)
    fence_proxy_async();
    __syncthreads();  // ... for every thread; step kt decoded; every warpgroup is done with step kt - 2
    issue_x(kt + ST - 2);  // into x stage (kt - 2) % ST
    issue_w(kt + ST - 2 + DEC);  // f16: W stage (kt - 2) % ST; decoded: slot kt % (ST - 1), decoded last step
    cp_async_commit();
    decode(kt + 1);  // into decoded tile (kt + 1) % 3 = (kt - 2) % 3, while step kt - 1's wgmma runs
    const unsigned st = base_addr + XOFF + (kt % ST) * XBYTES;
    const unsigned wt = base_addr + (DEC ? (kt % 3) * SETS * WTILE : WOFF + (kt % WSLOTS) * RAW);
    wg_step<BN, MT, SETS>(acc, st, wt, wg);  // this warpgroup's step kt - 1 is done; kt runs on through the copies
  }
  wg_wait<0>();
  wg_pin(acc);
  cp_async_wait<0>();
  wg_store<EPI, BN, MT, SETS, KS>(acc, out, M, N, m0, n0, wg, warp);
}

template <int FMT, int EPI, int BM, int BN, int MT, int ST, int KS, int MB>
__global__ void __launch_bounds__(BM / (64 * MT) * 128, MB)
nf4_mm_wg(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w, const float *__restrict__ absmax,
          const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, float *__restrict__ out, int M,
          int N, int K) {
  PDL_BEGIN();
  wg_body<FMT, EPI, BM, BN, MT, ST, KS, MB, 0>(xh, w, absmax, w_up, absmax_up, out, M, N, K, nullptr);
}

// the wgt kind: x tiles by TMA through xmap (f16 xh as (M, K) rows, boxes of 64 x 64, the 128-byte swizzle)
template <int FMT, int EPI, int BM, int BN, int MT, int ST, int KS, int MB>
__global__ void __launch_bounds__(BM / (64 * MT) * 128, MB)
nf4_mm_wgt(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w, const float *__restrict__ absmax,
           const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, float *__restrict__ out, int M,
           int N, int K, const __grid_constant__ TmaMap xmap) {
  PDL_BEGIN();
  wg_body<FMT, EPI, BM, BN, MT, ST, KS, MB, 1>(xh, w, absmax, w_up, absmax_up, out, M, N, K, &xmap);
}
