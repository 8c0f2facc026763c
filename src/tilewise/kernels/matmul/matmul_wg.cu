// matmul_wg.cu - the matmul on Hopper's warpgroup tensor cores (wgmma, sm_90a only); compiled after matmul.cu,
// matmul_pipe.cu and matmul_ring.cu (their helpers: load_raw, decode8, the cp.async wrappers, store_epilogue,
// store_partial, and the ring's x prologue nf4_mm_prep, whose f16 rows this kind reads).
//
// nf4_mm_wg<FMT, EPI, BM, BN, ST, KS, MB>: BM / 64 warpgroups, each multiplying a 64-row slice of the BM x BN tile
// with `wgmma.mma_async m64nBNk16` (f16 x f16 -> f32, both operands read by the tensor cores from shared memory).
// K steps of 64 (one 128-byte row of f16 per tile row, the 128-byte swizzle's row) pass through a ring of ST
// stages; stage kt + ST - 2 is filled while step kt multiplies:
//   x:  f16 rows of xh by cp.async, zero-filled past M;
//   W:  each thread's words of the step, loaded from global memory one step earlier into registers, decoded to f16
//       (nf4: the NF4 code times the row's absmax, rounded once) and stored into the stage: W is decoded once per K
//       step, not once per warp; rows past N are zeros.
// Both tiles are stored K-major in the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), which is
// what the wgmma descriptors below describe: 8-row groups 1024 bytes apart, K advanced by 32 bytes per k16 step.
// Writes by ordinary stores and cp.async are made visible to the tensor cores (the async proxy) by
// fence.proxy.async before each step's barrier. A warpgroup waits for its previous step's wgmma (wait_group 1)
// before the next barrier, so after the barrier of step kt every warpgroup is done with step kt - 2's stage, the one
// refilled. KS 1 applies the epilogue; KS > 1 writes slice blockIdx.z's raw sums to partial for
// nf4_mm_splitk_reduce. MB is the launch bound's blocks per SM. The accumulators of warp w are rows 16w.. of the
// tile in the mma.sync layout, so the family's store_epilogue serves them as a 16 x BN warp tile.
// Shapes: K % (KS * 64) == 0; any M and N.

// one ring stage: the x tile (BM, 64) f16 then SETS W tiles (BN, 64) f16, each 128 bytes a row, swizzled
__host__ __device__ constexpr int wg_stage_bytes(int EPI, int BM, int BN) {
  return (BM + (EPI == 2 ? 2 : 1) * BN) * 128;
}
// + 1024: the stages start at the first 1024-byte boundary of dynamic shared memory (the swizzle's atom)
__host__ __device__ constexpr int wg_smem_bytes(int EPI, int BM, int BN, int ST) {
  return ST * wg_stage_bytes(EPI, BM, BN) + 1024;
}
__host__ __device__ constexpr int wg_threads(int BM) { return BM / 64 * 128; }
// registers a thread holds across a step beside the accumulators: per 16-byte chunk of the next step's W, its raw
// words (nf4: a word and its absmax; f16: four; f32: eight) and its shared-memory address. Counted without the
// address, f16 at 128 accumulators and 16 chunks a thread passed the rule and spilled 16 bytes.
__host__ __device__ constexpr int wg_held_registers(int FMT, int EPI, int BM, int BN) {
  return ((EPI == 2 ? 2 : 1) * BN * 8 + wg_threads(BM) - 1) / wg_threads(BM) * (FMT == 0 ? 3 : FMT == 1 ? 5 : 9);
}
// registers the addresses, descriptors and the decode need beside those
#define WG_SPARE 48
__host__ __device__ constexpr int wg_register_cap(int BM, int MB) {
  return 65536 / (wg_threads(BM) * MB) < 255 ? 65536 / (wg_threads(BM) * MB) : 255;
}

__host__ __device__ constexpr int wg_first_failure(int FMT, int EPI, int BM, int BN, int ST, int KS, int MB) {
  const int sets = EPI == 2 ? 2 : 1;
  if (FMT < 0 || FMT > 2 || EPI < 0 || EPI > 2) return 1;                              // variant
  if (BM != 64 && BM != 128) return 2;                                                // bm_64_128
  if (BN != 32 && BN != 64 && BN != 128 && BN != 256) return 3;                       // bn_32_256
  if (sets * BN > 256) return 4;                                                      // accumulators_128
  if (MB < 1 || MB > 2) return 5;                                                     // mb_1_2
  if (wg_register_cap(BM, MB) - sets * BN / 2 - wg_held_registers(FMT, EPI, BM, BN) < WG_SPARE) return 6;  // registers_spare
  if (ST < 3 || ST > 6) return 7;                                                     // stages_3_6
  if (KS != 1 && KS != 2 && KS != 4 && KS != 8) return 8;                             // ks_1_2_4_8
  if (wg_smem_bytes(EPI, BM, BN, ST) > PIPE_SMEM_MAX) return 9;                       // smem_227k
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

// the accumulators may not be moved while a wgmma writes them: pin each one in place around the waits
template <int J>
__device__ __forceinline__ void wg_pin(float (&d)[J][4]) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(d[j][q])::"memory");
}

// m64nNk16, f32 += f16 x f16, A and B K-major in shared memory; d[j][q] is the mma.sync accumulator q of n8 tile j
__device__ __forceinline__ void wgmma_n32(float (&d)[4][4], unsigned long long da, unsigned long long db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 "
      "}, %16, %17, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(da), "l"(db));
}

__device__ __forceinline__ void wgmma_n64(float (&d)[8][4], unsigned long long da, unsigned long long db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 "
      "}, %32, %33, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db));
}

__device__ __forceinline__ void wgmma_n128(float (&d)[16][4], unsigned long long da, unsigned long long db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 "
      "}, %64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(da), "l"(db));
}

__device__ __forceinline__ void wgmma_n256(float (&d)[32][4], unsigned long long da, unsigned long long db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "
      "}, %128, %129, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
        "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
        "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
        "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
        "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
        "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
        "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
        "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]),
        "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
        "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
        "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]),
        "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
        "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]),
        "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "l"(da), "l"(db));
}

template <int BN>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 8][4], unsigned long long da, unsigned long long db) {
  if constexpr (BN == 32) wgmma_n32(d, da, db);
  else if constexpr (BN == 64) wgmma_n64(d, da, db);
  else if constexpr (BN == 128) wgmma_n128(d, da, db);
  else wgmma_n256(d, da, db);
}

template <int FMT, int EPI, int BM, int BN, int ST, int KS, int MB>
__global__ void __launch_bounds__(BM / 64 * 128, MB)
nf4_mm_wg(const unsigned short *__restrict__ xh, const unsigned *__restrict__ w, const float *__restrict__ absmax,
          const unsigned *__restrict__ w_up, const float *__restrict__ absmax_up, float *__restrict__ out, int M,
          int N, int K) {
  constexpr int FAIL = wg_first_failure(FMT, EPI, BM, BN, ST, KS, MB);
  static_assert(FAIL != 1, "variant: FMT in 0..2 (nf4, f16, f32), EPI in 0..2 (none, residual, swiglu)");
  static_assert(FAIL != 2, "bm_64_128: BM must be 64 or 128 (one m64 warpgroup per 64 rows)");
  static_assert(FAIL != 3, "bn_32_256: BN must be 32, 64, 128 or 256 (a wgmma n size)");
  static_assert(FAIL != 4, "accumulators_128: SETS * BN / 2 accumulators per thread must be at most 128");
  static_assert(FAIL != 5, "mb_1_2: MB (blocks per SM in the launch bound) must be 1 or 2");
  static_assert(FAIL != 6, "registers_spare: the launch bound leaves too few registers beside the accumulators");
  static_assert(FAIL != 7, "stages_3_6: ST (ring stages) must be in 3..6");
  static_assert(FAIL != 8, "ks_1_2_4_8: KS (slices of K) must be 1, 2, 4 or 8");
  static_assert(FAIL != 9, "smem_227k: the ring exceeds 227 KB of shared memory");
  constexpr int NT = wg_threads(BM), SETS = EPI == 2 ? 2 : 1, BK = 64;
  constexpr int XBYTES = BM * 128, WBYTES = BN * 128, STAGE = wg_stage_bytes(EPI, BM, BN);
  constexpr int XQ = BM * 8, WQ = SETS * BN * 8;  // 16-byte chunks of a step's x and W tiles
  constexpr int XPT = (XQ + NT - 1) / NT, WPT = (WQ + NT - 1) / NT;
  extern __shared__ __align__(16) unsigned char dsmem[];
  __shared__ float lut[16];
  const unsigned raw_addr = smem_addr(dsmem), base_addr = (raw_addr + 1023u) & ~1023u;
  unsigned char *base = dsmem + (base_addr - raw_addr);
  const int tid = threadIdx.x, wg = tid / 128;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int steps = K / KS / BK, k_begin = blockIdx.z * (K / KS);
  if (tid < 16) lut[tid] = NF4_CODE[tid];
  __syncthreads();  // the code, before the prologue decodes

  auto load_x = [&](int slot, int k0) {
    unsigned char *xs = base + slot * STAGE;
#pragma unroll
    for (int i = 0; i < XPT; ++i) {
      const int e = tid + i * NT, r = e / 8, c = e % 8;
      const bool ok = m0 + r < M;
      if (e < XQ)
        cp_async16(xs + r * 128 + ((c ^ (r & 7)) << 4), ok ? xh + (size_t)(m0 + r) * K + k0 + 8 * c : xh, ok);
    }
  };
  WRaw<FMT> wr[WPT];
  auto fetch_w = [&](int k0) {
#pragma unroll
    for (int i = 0; i < WPT; ++i) {
      const int e = tid + i * NT, s = e / (BN * 8), r = (e % (BN * 8)) / 8, c = e % 8;
      if (e < WQ && n0 + r < N) load_raw<FMT>(s ? w_up : w, s ? absmax_up : absmax, n0 + r, k0 + 8 * c, K, wr[i]);
    }
  };
  auto store_w = [&](int slot) {
    unsigned char *ws = base + slot * STAGE + XBYTES;
#pragma unroll
    for (int i = 0; i < WPT; ++i) {
      const int e = tid + i * NT, s = e / (BN * 8), r = (e % (BN * 8)) / 8, c = e % 8;
      if (e < WQ)
        *reinterpret_cast<uint4 *>(ws + s * WBYTES + r * 128 + ((c ^ (r & 7)) << 4)) =
            n0 + r < N ? decode8<FMT>(wr[i], lut) : u4(0u, 0u, 0u, 0u);
    }
  };

  // the prologue: steps 0..ST-3 in their stages (x in flight), the raw words of step ST - 2 in registers
#pragma unroll
  for (int s = 0; s < ST - 2; ++s) {  // always ST - 2 groups, empty past the last step, so the waits line up
    if (s < steps) {
      load_x(s, k_begin + s * BK);
      fetch_w(k_begin + s * BK);
      store_w(s);
    }
    cp_async_commit();
  }
  if (ST - 2 < steps) fetch_w(k_begin + (ST - 2) * BK);

  float acc[SETS][1][BN / 8][4];
  zero_acc(acc);
  for (int kt = 0; kt < steps; ++kt) {
    cp_async_wait<ST - 3>();
    fence_proxy_async();
    __syncthreads();  // step kt's tiles are in place for every warpgroup, and step kt - 2's stage is free
    const unsigned st = base_addr + (kt % ST) * STAGE;
#pragma unroll
    for (int s = 0; s < SETS; ++s) wg_pin(acc[s][0]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
      for (int s = 0; s < SETS; ++s)
        wgmma_tile<BN>(acc[s][0], wg_desc(st + wg * 64 * 128 + kk * 32), wg_desc(st + XBYTES + s * WBYTES + kk * 32));
    wg_commit();
    wg_wait<1>();  // this warpgroup's step kt - 1 is done
#pragma unroll
    for (int s = 0; s < SETS; ++s) wg_pin(acc[s][0]);
    const int nxt = kt + ST - 2;  // into stage (kt - 2) % ST
    if (nxt < steps) {
      load_x(nxt % ST, k_begin + nxt * BK);
      store_w(nxt % ST);
    }
    cp_async_commit();
    if (nxt + 1 < steps) fetch_w(k_begin + (nxt + 1) * BK);
  }
  wg_wait<0>();
#pragma unroll
  for (int s = 0; s < SETS; ++s) wg_pin(acc[s][0]);
  cp_async_wait<0>();
  if (KS == 1) store_epilogue<EPI, BM, BN, 16, BN, SETS>(acc, out, M, N);
  else store_partial<BM, BN, 16, BN, SETS>(acc, out, M, N);
}
