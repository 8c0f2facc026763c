// matmul_ws.cu - the wgmma matmul with warp specialization (sm_90a only); compiled after matmul_wg.cu (its wgmma
// wrappers, descriptors, fences, wg_pin, its K step wg_step and its store wg_store) and the ring's helpers
// (cp.async, decode8, and the x prologue nf4_mm_prep, whose f16 rows this kind reads).
//
// nf4_mm_ws<FMT, EPI, BM, BN, MT, ST, KS, MB, PW>: the wg kind's tile and math, with the copies and the decode
// taken off the tensor-core warps. BM / (64 MT) consumer warpgroups only wait, issue wgmma and store; PW producer
// warpgroups (the block's last) issue every cp.async, decode nf4 / f32 W into the stage's swizzled f16 tile, and
// hand stage s over through named barriers: FULL s (the producers arrive, the consumers wait) and EMPTY s (the
// consumers arrive, the producers wait). setmaxnreg moves registers from the producers to the consumers, so tiles
// whose accumulators the wg kind could not hold beside its copy and decode registers become legal.
// Stage s holds one K step (64): the x tile (BM, 64) and SETS W operand tiles (BN, 64), f16, K-major in the 128-byte
// swizzle (the wg kind's descriptors). nf4 and f32 W land as stored in a ring of ST - 1 raw slots first; each
// producer thread decodes exactly the chunks it copied, so the producers never wait for each other. f16 W is
// copied straight into the stage.
// Lead: the producer fills step j + ST - 2 while step j is decoded. A consumer releases step j once step j + 1's
// wgmma is issued and step j's has retired (wait_group 1), and a refill of that stage waits for the release, so
// ST - 2 steps is the deepest lead that cannot deadlock. Every EMPTY arrival has its wait (steps j + ST < steps),
// so no barrier is left half passed when the block ends.
// KS 1 applies the epilogue; KS > 1 writes slice blockIdx.z's raw sums to partial for nf4_mm_splitk_reduce.
// Shapes: K % (KS * 64) == 0; any M and N.

#define WS_PRODUCER_REGS 40  // the producer's loops keep one chunk's addresses at a time (unroll 1): no spills
#define WS_FULL0 1   // named barriers 1..ST: stage s is full
#define WS_EMPTY0 7  // named barriers 7..ST+6: stage s is free (0 is __syncthreads', ST <= 6)
#define WS_PRODUCERS 13

__host__ __device__ constexpr int ws_consumers(int BM, int MT) { return BM / (64 * MT); }
__host__ __device__ constexpr int ws_threads(int BM, int MT, int PW) { return (ws_consumers(BM, MT) + PW) * 128; }
__host__ __device__ constexpr int ws_min(int a, int b) { return a < b ? a : b; }
// what a thread starts with: the launch bound's share of the register file, in steps of 8 (at 256 threads ptxas
// gives 240 of the 248, as much as any region asks for after setmaxnreg)
__host__ __device__ constexpr int ws_launch_regs(int BM, int MT, int MB, int PW) {
  return ws_min(65536 / (ws_threads(BM, MT, PW) * MB), 255) / 8 * 8;
}
// a consumer thread's registers after setmaxnreg: the block's registers less the producers', shared by the
// consumers, in steps of 8, at most 240
__host__ __device__ constexpr int ws_consumer_regs(int BM, int MT, int MB, int PW) {
  return ws_min((ws_launch_regs(BM, MT, MB, PW) * ws_threads(BM, MT, PW) - PW * 128 * WS_PRODUCER_REGS) /
                    (ws_consumers(BM, MT) * 128) / 8 * 8,
                240);
}
// bytes of one step's W as stored, in a raw slot: nf4 32 a row and one absmax per 16-byte chunk; f32 256 a row;
// f16 none (it lands in the stage)
__host__ __device__ constexpr int ws_raw_bytes(int FMT, int EPI, int BN) {
  return (EPI == 2 ? 2 : 1) * BN * (FMT == 0 ? 32 + 2 * 4 : FMT == 2 ? 256 : 0);
}
// shared memory, from a 1024-byte boundary: ST stages of x (BM, 64) and SETS W tiles (BN, 64), f16; ST - 1 raw
// slots; the NF4 code; + 1024 bytes to find that boundary. All of it is dynamic.
__host__ __device__ constexpr int ws_smem_bytes(int FMT, int EPI, int BM, int BN, int ST) {
  return ST * (BM + (EPI == 2 ? 2 : 1) * BN) * 128 + (ST - 1) * ws_raw_bytes(FMT, EPI, BN) + 16 * 4 + 1024;
}

__host__ __device__ constexpr int ws_first_failure(int FMT, int EPI, int BM, int BN, int MT, int ST, int KS,
                                                    int MB, int PW) {
  const int sets = EPI == 2 ? 2 : 1;
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2) return 1;                               // variant
  if (MT != 1 && MT != 2) return 2;                                                    // mt_1_2
  if (BM % (64 * MT) != 0 || BM < 64 * MT || BM > 3 * 64 * MT) return 3;               // consumers_1_3
  if (BN != 32 && BN != 64 && BN != 128 && BN != 256) return 4;                        // bn_32_256
  if (MT * sets * BN > 256) return 5;                                                  // accumulators_128
  if (MB < 1 || MB > 2) return 6;                                                      // mb_1_2
  if (PW != 1 && PW != 2) return 7;                                                    // pw_1_2
  if (ws_consumer_regs(BM, MT, MB, PW) - MT * sets * BN / 2 < WG_SPARE) return 8;     // registers_spare
  if (ST < 3 || ST > 6) return 9;                                                      // stages_3_6
  if (KS != 1 && KS != 2 && KS != 4 && KS != 8) return 10;                             // ks_1_2_4_8
  if (ws_smem_bytes(FMT, EPI, BM, BN, ST) > PIPE_SMEM_MAX) return 11;                  // smem_227k
  return 0;
}

__device__ __forceinline__ void bar_sync_n(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive_n(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

template <int FMT, int EPI, int BM, int BN, int MT, int ST, int KS, int MB, int PW>
__global__ void __launch_bounds__((BM / (64 * MT) + PW) * 128, MB)
nf4_mm_ws(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w, const float *__restrict__ absmax,
          const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, float *__restrict__ out, int M,
          int N, int K) {
  PDL_BEGIN();
  constexpr int FAIL = ws_first_failure(FMT, EPI, BM, BN, MT, ST, KS, MB, PW);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu)");
  static_assert(FAIL != 2, "mt_1_2: MT (m64 slices per consumer warpgroup) must be 1 or 2");
  static_assert(FAIL != 3, "consumers_1_3: BM must be 1..3 consumer warpgroups of MT x 64 rows");
  static_assert(FAIL != 4, "bn_32_256: BN must be 32, 64, 128 or 256 (a wgmma n size)");
  static_assert(FAIL != 5, "accumulators_128: MT * SETS * BN / 2 accumulators per thread must be at most 128");
  static_assert(FAIL != 6, "mb_1_2: MB (blocks per SM in the launch bound) must be 1 or 2");
  static_assert(FAIL != 7, "pw_1_2: PW (producer warpgroups) must be 1 or 2");
  static_assert(FAIL != 8, "registers_spare: the consumers' registers leave too few beside the accumulators");
  static_assert(FAIL != 9, "stages_3_6: ST (stages) must be in 3..6");
  static_assert(FAIL != 10, "ks_1_2_4_8: KS (slices of K) must be 1, 2, 4 or 8");
  static_assert(FAIL != 11, "smem_227k: the stages exceed 227 KB of shared memory");
  constexpr int NC = ws_consumers(BM, MT), NT = ws_threads(BM, MT, PW), SETS = EPI == 2 ? 2 : 1, BK = 64;
  constexpr int NP = PW * 128;  // producer threads
  constexpr int XBYTES = BM * 128, WTILE = BN * 128, STAGE = XBYTES + SETS * WTILE;
  constexpr int RAW = ws_raw_bytes(FMT, EPI, BN), LEAD = ST - 2, SLOTS = ST - 1;
  static_assert(STAGE % 1024 == 0, "stages start on the swizzle's 1024-byte atom");
  extern __shared__ __align__(16) unsigned char dsmem[];
  const unsigned raw_addr = smem_addr(dsmem), base_addr = (raw_addr + 1023u) & ~1023u;
  unsigned char *base = dsmem + (base_addr - raw_addr);
  unsigned char *raw = base + ST * STAGE;                             // SLOTS raw W slots
  float *lut = reinterpret_cast<float *>(raw + SLOTS * RAW);          // (16,) the NF4 code
  const int tid = threadIdx.x, wg = tid / 128;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int steps = K / KS / BK, k_begin = blockIdx.z * (K / KS);
  auto swz = [](unsigned e) { return (e << 4) ^ (((e >> 3) & 7u) << 4); };  // 16-byte chunk e of 128-byte rows

  if (wg >= NC) {  // ---- the producer warpgroups ---------------------------------------------------------------
    setmaxnreg_dec<WS_PRODUCER_REGS>();
    const unsigned p = tid - NC * 128;
    if (FMT == 0) {
      if (p < 16) lut[p] = NF4_CODE[p];
      bar_sync_n(WS_PRODUCERS, NP);
    }
    // nf4: chunk e of a step's W = 16 bytes (32 weights, half a row) of row e / 2; f32: 32 bytes (8 weights) of row
    // e / 8; f16: 16 bytes (8 weights) of row e / 8, straight into the stage. Rows run over both weight sets.
    constexpr int WQ = SETS * BN * (FMT == 0 ? 2 : 8), XQ = BM * 8;
    auto issue = [&](int j) {  // step j's copies: x and W into stage j % ST (f16 W) or raw slot j % SLOTS
      if (j >= steps) return;
      unsigned char *st = base + (j % ST) * STAGE;
      const int k0 = k_begin + j * BK;
      static_assert(XQ % NP == 0, "x tile: whole chunks per producer thread");
#pragma unroll 1
      for (int i = 0; i < XQ / NP; ++i) {
        const unsigned e = p + i * NP, r = e >> 3;
        const bool ok = m0 + (int)r < M;
        cp_async16(st + swz(e), ok ? xh + (size_t)(m0 + r) * K + k0 + (e & 7u) * 8 : xh, ok);
      }
      unsigned char *ws = raw + (j % SLOTS) * RAW;
#pragma unroll 1
      for (int i = 0; i < (WQ + NP - 1) / NP; ++i) {
        const unsigned e = p + i * NP;
        if (WQ % NP == 0 || e < (unsigned)WQ) {
          const unsigned row = FMT == 0 ? e >> 1 : e >> 3, r = row % BN, c = FMT == 0 ? e & 1u : e & 7u;
          const bool ok = n0 + (int)r < N;
          const unsigned char *src = reinterpret_cast<const unsigned char *>(row >= BN ? w_up : w);
          const size_t at = (size_t)(n0 + r) * K + k0;  // the row's first weight of the step
          if (FMT == 0) {
            cp_async16(ws + e * 16, ok ? src + at / 2 + c * 16 : src, ok);
            const float *sa = row >= BN ? absmax_up : absmax;
            cp_async4(ws + WQ * 16 + e * 4, ok ? sa + at / 64 : sa, ok);
          } else if (FMT == 1) {
            cp_async16(st + XBYTES + swz(e), ok ? src + at * 2 + c * 16 : src, ok);
          } else {
            cp_async16(ws + e * 32, ok ? src + at * 4 + c * 32 : src, ok);
            cp_async16(ws + e * 32 + 16, ok ? src + at * 4 + c * 32 + 16 : src, ok);
          }
        }
      }
    };
    auto decode = [&](int j) {  // this thread's chunks of step j's raw slot -> stage j % ST's W tiles, swizzled
      if (FMT == 1) return;
      const unsigned char *ws = raw + (j % SLOTS) * RAW;
      unsigned char *d = base + (j % ST) * STAGE + XBYTES;
#pragma unroll 1
      for (int i = 0; i < (WQ + NP - 1) / NP; ++i) {
        const unsigned e = p + i * NP;
        if (WQ % NP == 0 || e < (unsigned)WQ) {
          if (FMT == 0) {
            const uint4 q = *reinterpret_cast<const uint4 *>(ws + e * 16);
            WRaw<0> r;
            r.s = *reinterpret_cast<const float *>(ws + WQ * 16 + e * 4);
            const unsigned words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {  // word k of the half is chunk 4 (e % 2) + k of row e / 2
              r.q[0].x = words[k];
              *reinterpret_cast<uint4 *>(d + swz((e >> 1) * 8 + (e & 1u) * 4 + k)) = decode8<0>(r, lut);
            }
          } else {
            WRaw<FMT> r;
            const uint4 *f = reinterpret_cast<const uint4 *>(ws + e * 32);
            r.q[0] = f[0];
            r.q[FMT == 2 ? 1 : 0] = f[1];
            *reinterpret_cast<uint4 *>(d + swz(e)) = decode8<FMT>(r, lut);
          }
        }
      }
    };
#pragma unroll
    for (int j = 0; j < LEAD; ++j) {
      issue(j);
      cp_async_commit();
    }
    for (int j = 0; j < steps; ++j) {
      const int jn = j + LEAD;
      if (jn < steps) {
        if (jn >= ST) bar_sync_n(WS_EMPTY0 + jn % ST, NT);  // the consumers are done with step jn - ST
        issue(jn);
      }
      cp_async_commit();
      cp_async_wait<LEAD>();  // this thread's copies of step j landed
      decode(j);
      fence_proxy_async();  // the stage's generic writes, visible to the tensor cores
      bar_arrive_n(WS_FULL0 + j % ST, NT);
    }
    cp_async_wait<0>();
    return;
  }

  // ---- the consumer warpgroups --------------------------------------------------------------------------------
  setmaxnreg_inc<ws_consumer_regs(BM, MT, MB, PW)>();
  const int warp = tid / WARPSIZE;
  float acc[MT][SETS][1][BN / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero_acc(acc[mt]);
  for (int kt = 0; kt < steps; ++kt) {
    bar_sync_n(WS_FULL0 + kt % ST, NT);
    const unsigned st = base_addr + (kt % ST) * STAGE;
    wg_step<BN, MT, SETS>(acc, st, st + XBYTES, wg);  // step kt - 1 has retired: its stage may be refilled
    if (kt >= 1 && kt - 1 + ST < steps) bar_arrive_n(WS_EMPTY0 + (kt - 1) % ST, NT);
  }
  wg_wait<0>();
  wg_pin(acc);
  wg_store<EPI, BN, MT, SETS, KS>(acc, out, M, N, m0, n0, wg, warp);
}
