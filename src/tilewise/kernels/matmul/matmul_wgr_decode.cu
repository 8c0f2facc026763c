// matmul_wgr_decode.cu - nf4_mm_wgr's decodes (DEC 0-3, described in matmul_wgr.cu): a thread's A fragments of
// one K step, straight from the W stage in shared memory into registers. Compiled after matmul_wg.cu (wg_row_bytes)
// and before matmul_wgr.cu, which sizes its stages and tables with the two layout helpers below.

// bytes between two W rows of a stage: a stored row of one step (nf4 32, f16 128, f32 256) + 16
__host__ __device__ constexpr int wgr_row_stride(int FMT) { return wg_row_bytes(FMT) + 16; }
// DEC 2 and 3's table of f16 pairs: 256 entries in 8 or 32 copies
__host__ __device__ constexpr int wgr_pair_copies(int DEC) { return DEC == 2 ? 8 : DEC == 3 ? 32 : 0; }

__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned sel) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ unsigned mul_f16x2(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// DEC 1's code table: byte j of lo[i] / hi[i] is the low / high byte of entry 4 i + j of the nf4 code in f16
struct Nf4Table {
  unsigned lo[4], hi[4];
};

// The words are literals (nf4's standard code rounded to f16, the rounding f16_bits gives; a unit test recomputes
// them from the code): built from NF4_CODE at run time, every block waited for constant-memory loads and 16
// conversions before its first decode.
__device__ __forceinline__ Nf4Table nf4_table() {
  return Nf4Table{{0x52339200u, 0x00d4ea8du, 0x68e02618u, 0x00c9800du},
                  {0xb6b8b9bcu, 0x00adb1b4u, 0x3533312du, 0x3c393837u}};
}

// the f16 codes of the four nibbles in sel's low 16 bits (nibble j: selector nibble j), as a low-byte and a
// high-byte word; m's byte j is 0xff where nibble j is 8 or more (then the entry comes from the table's upper half)
__device__ __forceinline__ void nf4_lookup4(const Nf4Table &tb, unsigned sel, unsigned m, unsigned &lo,
                                            unsigned &hi) {
  lo = (prmt(tb.lo[0], tb.lo[1], sel) & ~m) | (prmt(tb.lo[2], tb.lo[3], sel) & m);
  hi = (prmt(tb.hi[0], tb.hi[1], sel) & ~m) | (prmt(tb.hi[2], tb.hi[3], sel) & m);
}

// four stored nf4 bytes q (byte i: k 2i in the high nibble, 2i + 1 in the low) -> o[i] = f16x2 (code(high) in the
// low half, code(low) in the high half) times the absmax pair sc2
__device__ __forceinline__ void nf4_decode4(const Nf4Table &tb, unsigned q, unsigned sc2, unsigned (&o)[4]) {
  const unsigned s = q & 0x77777777u, a = q << 4;  // prmt reads a selector nibble's bit 3 as "replicate the sign"
  // bit 3 of nibble j is bit 7 of byte j / 2 of a (j even) or of q (j odd); the sign mode copies it over a byte
  const unsigned m0 = prmt(a, q, 0xD9C8u), m1 = prmt(a, q, 0xFBEAu);
  unsigned lo0, hi0, lo1, hi1;
  nf4_lookup4(tb, s, m0, lo0, hi0);        // nibbles 0..3: stored bytes 0 and 1
  nf4_lookup4(tb, s >> 16, m1, lo1, hi1);  // nibbles 4..7: stored bytes 2 and 3
  o[0] = mul_f16x2(prmt(lo0, hi0, 0x4051u), sc2);
  o[1] = mul_f16x2(prmt(lo0, hi0, 0x6273u), sc2);
  o[2] = mul_f16x2(prmt(lo1, hi1, 0x4051u), sc2);
  o[3] = mul_f16x2(prmt(lo1, hi1, 0x6273u), sc2);
}

// this thread's A fragments of one K step from its W stage: rows r and r + 8 of each weight set (r = the warp's
// 16-row slice + lane / 4), the k16 steps' columns 2t, 2t + 1 (registers 0, 1) and 2t + 8, 2t + 9 (2, 3); pt is
// this thread's copy of DEC 2 and 3's pair table (entry b at pt[b * copies])
template <int FMT, int SETS, int BF, int DEC>
__device__ __forceinline__ void wgr_fragments(unsigned (&a)[SETS][4][4], const unsigned char *ws, const float *lut,
                                              const Nf4Table &tb, const unsigned *pt, int r, int t) {
  constexpr int RS = wgr_row_stride(FMT);
#pragma unroll
  for (int s = 0; s < SETS; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = s * BF + r + 8 * h;
      const unsigned char *p = ws + row * RS;
      if constexpr (FMT == 0) {  // word i holds k 8i..8i+7; its byte t is k 8i + 2t (high nibble) and 8i + 2t + 1
        const uint4 lo = reinterpret_cast<const uint4 *>(p)[0], hi = reinterpret_cast<const uint4 *>(p)[1];
        const unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const float sc = reinterpret_cast<const float *>(ws + SETS * BF * RS)[row];
        if constexpr (DEC == 1) {  // byte t of words 4c..4c+3 gathered into one word, decoded four bytes at once
          const unsigned pick = t | (t + 4) << 4, sc2 = pack2(sc, sc);
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const unsigned q = prmt(prmt(w[4 * c], w[4 * c + 1], pick), prmt(w[4 * c + 2], w[4 * c + 3], pick),
                                    0x5410u);
            unsigned o[4];
            nf4_decode4(tb, q, sc2, o);
#pragma unroll
            for (int i = 0; i < 4; ++i) a[s][(4 * c + i) / 2][2 * (i % 2) + h] = o[i];  // word 4c + i
          }
        } else if constexpr (DEC >= 2) {  // byte t of each word: one load of its pair of codes, one f16x2 multiply
          const unsigned sc2 = pack2(sc, sc), pick = 0x4440u | t;  // byte t, zero-extended
#pragma unroll
          for (int i = 0; i < 8; ++i)
            a[s][i / 2][2 * (i % 2) + h] = mul_f16x2(pt[prmt(w[i], 0u, pick) * wgr_pair_copies(DEC)], sc2);
        } else {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const unsigned byte = (w[2 * kk + half] >> (8 * t)) & 0xffu;
              a[s][kk][2 * half + h] = pack2(lut[byte >> 4] * sc, lut[byte & 0xfu] * sc);
            }
        }
      } else if constexpr (FMT == 1) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            a[s][kk][2 * half + h] = reinterpret_cast<const unsigned *>(p)[8 * kk + 4 * half + t];
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float2 f = reinterpret_cast<const float2 *>(p)[8 * kk + 4 * half + t];
            a[s][kk][2 * half + h] = pack2(f.x, f.y);
          }
      }
    }
}
