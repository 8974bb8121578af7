// Weight matrices repacked once at load for the CPU matrix multiply, and the
// activation forms the multiply takes.
//
// Layout. Output rows (the columns of y) are grouped in panels of 16; a panel
// holds its 16 rows interleaved so that one 64-byte vector carries the same k
// (or the same 4 or 2 consecutive k) of all 16 rows, one 32-bit lane per
// output. Rows past n_out are zero. Per panel, all codes come first, then all
// scales (each region 64-byte aligned):
//   F32   [k][16] f32                       F16  [k][16] f16
//   BF16  [k/2][16][2] bf16 (k padded to even with zeros)
//   quantized types: unsigned codes u per element, in 32-element groups; in
//   a group, k-group g (elements 4g..4g+3) of the 16 rows is the 64 bytes
//   [16 rows][4] (byte 4c + j = u of row c, element 4g + j):
//     8-bit (Q8_0, u = q + 128):  8 such vectors;
//     4-bit (Q4_0, Q4_1, Q4_K, and IQ4_NL, IQ4_XS with u the level's index):
//                                 4 vectors of nibbles, vector t holding
//                                 k-group 2t in the low and 2t + 1 in the high nibbles;
//     2-bit (Q2_K, u = q):        2 vectors, vector t holding k-group 4t + s in bits
//                                 2s..2s+1 of each byte;
//     3-bit (Q3_K, u = q + 4):    the 2-bit part, then 8 64-bit masks of bit 2 (as 5-bit);
//     5-bit (Q5_0, Q5_1, Q5_K):   the 4-bit part, then 8 64-bit masks (one per
//                                 k-group, bit 4c + j = bit 4 of u);
//     6-bit (Q6_K):               the 4-bit part, then 2 vectors of 2-bit high
//                                 parts: vector h, byte i, bits 2s..2s+1 = bits
//                                 4-5 of byte i of k-group 4h + s.
//   Scales per 32 (Q4_0, Q5_0, Q8_0: d[16]; Q4_1, Q5_1: d[16], m[16]; f16) or
//   per 256 (Q4_K, Q5_K: d[16], dmin[16] f16, sc[8][16], m[8][16] u8;
//   Q6_K, Q3_K: d[16] f16, sc[16][16] i8 (Q3_K's sc - 32); Q2_K: d[16], dmin[16] f16,
//   (sc | m << 4)[16][16] u8 (the file's bytes); IQ4_XS: d[16] f16, sc[8][16] i8 (ls - 32)).
// Every weight is exactly what dequantize_row_ref gives for it: the kernels
// apply the reference formula to u (Q4_0: float(int(u) - 8) * d, ...).
//
// Paths (the activation form), chosen once per matrix at load:
//   F32  activations stay f32; weights decoded to f32 (exact products).
//   I8   activations quantized per row in blocks of 32 (int8, f32 scale, sums
//        per 16), integer dot products per block (VNNI vpdpbusd or maddubs).
//   I8X3 the I8 form three times: x ~ d1 q1 + d2 q2 + d3 q3, each level
//        quantizing what the one before left, so that a block's activations
//        are within about 1e-7 of its largest (f32 rounding is 6e-8); one
//        integer sum per level.
//   BF16 (BF16 weights on a CPU with AVX512_BF16) activations rounded to
//        bf16, products by vdpbf16ps; in the "amx" set (AMX-BF16: Sapphire
//        Rapids and later) by tdpbf16ps on tiles, whose 16-pair steps each
//        fold into the accumulator as AMX does it (other bits than vdpbf16ps's).
// Reduction order: each output element is one chain of operations in k
// order, carried by one vector lane: f32 and BF16 paths one FMA (or one
// vdpbf16ps pair) per k step (amx: one tdpbf16ps step per 16 pairs of k, the
// pairs past the last whole step by vdpbf16ps); I8 one exact integer sum per block (or 16-half
// for Q6_K) folded into the f32 accumulator by one FMA (and one for the min
// term), I8X3 the same for each level in turn. The chain is the same whatever
// the tile, the thread or the number of rows, so a row's results do not
// depend on the rest of the batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/weight.h"

namespace wick::cpu {

constexpr int kPanel = 16;  // output rows per panel

enum class GemmPath : uint8_t { F32, I8, BF16, I8X3 };

struct PackedMatrix {
  DType dtype = DType::F32;
  GemmPath path = GemmPath::F32;
  int64_t n_out = 0, n_in = 0;
  int64_t k_pad = 0;  // elements per packed row (BF16: n_in rounded up to even)
  int64_t n_panels = 0;
  size_t codes_bytes = 0;  // per panel; the scales follow at this offset
  size_t panel_bytes = 0;
  uint8_t* data = nullptr;  // n_panels * panel_bytes, 64-byte aligned

  const uint8_t* panel(int64_t p) const { return data + size_t(p) * panel_bytes; }
  const uint8_t* scales(int64_t p) const { return panel(p) + codes_bytes; }
};

// Geometry of the packed quantized types (per panel).
constexpr int code_bits(DType t) {
  switch (t) {
    case DType::Q8_0:
      return 8;
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q4_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
      return 4;
    case DType::Q3_K:
      return 3;
    case DType::Q2_K:
      return 2;
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q5_K:
      return 5;
    case DType::Q6_K:
      return 6;
    default:
      return 0;  // a float type
  }
}
// Bytes of codes of one 32-element group of 16 rows.
constexpr size_t group_code_bytes(DType t) {
  return size_t(code_bits(t)) * 64;
}
// Elements per scale block, and the bytes of its scales for 16 rows.
constexpr int scale_block(DType t) {
  switch (t) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::IQ4_XS:
      return 256;
    default:
      return 32;
  }
}
// Scale records with one factor per 16 elements (two per 32-element group).
constexpr int halves(DType t) {
  return t == DType::Q6_K || t == DType::Q2_K || t == DType::Q3_K ? 2 : 1;
}
// Codes that index the non-linear levels kIq4Values: the kernels map them to level + 128
// and treat them as Q8_0's codes.
constexpr bool lut_codes(DType t) {
  return t == DType::IQ4_NL || t == DType::IQ4_XS;
}
constexpr size_t scale_block_bytes(DType t) {
  switch (t) {
    case DType::Q4_1:
    case DType::Q5_1:
      return 64;  // d[16], m[16] f16
    case DType::Q4_K:
    case DType::Q5_K:
      return 320;  // d[16], dmin[16] f16, sc[8][16], m[8][16] u8
    case DType::Q6_K:
    case DType::Q3_K:
      return 288;  // d[16] f16, sc[16][16] i8
    case DType::Q2_K:
      return 320;  // d[16], dmin[16] f16, (sc | m << 4)[16][16] u8
    case DType::IQ4_XS:
      return 160;  // d[16] f16, sc[8][16] i8
    default:
      return 32;  // d[16] f16
  }
}

struct AlignedFree {
  void operator()(uint8_t* p) const;
};
using AlignedBytes = std::unique_ptr<uint8_t[], AlignedFree>;
AlignedBytes aligned_bytes(size_t n, bool zero = true);  // 64-byte aligned (zeroed)

// Repacks w (rows of its stored type) into m (path left as given); returns the buffer it owns.
AlignedBytes pack_matrix(const Weight& w, PackedMatrix& m);
// Whether a weight of this type and row length has a packed form.
bool can_pack(DType t, int64_t n_in);

// A weight packed for this CPU's kernel set and the bytes it owns.
struct PackedWeight {
  PackedMatrix m;
  AlignedBytes bytes;
};
PackedWeight pack_weight(const Weight& w);  // w must pass can_pack

// y [n_rows, m.n_out] = x [n_rows, m.n_in] times m transposed, on every core.
void matmul_packed(const PackedMatrix& m, const float* x, int64_t n_rows, float* y);
// Row o of m, dequantized with the reference formulas (for tests).
void unpack_row(const PackedMatrix& m, int64_t o, float* out);

// The path the matrix multiply takes for a weight of this type on this kernel
// set. By default F32 for f32 and f16 weights (held to 1e-4 of transformers'
// f32 logits); BF16 for bf16 weights where the set has vdpbf16ps: activations
// rounded to bf16 as llama.cpp does, 1.5x its prefill rate, 4e-3 to 8e-3 from
// the f32-activation reference where transformers itself, run in bf16, misses
// by 7e-3 to 1e-2 (docs/perf.md); I8X3 for Q4_1 and Q8_0 (SmolLM2's types,
// held to 1e-4 of a float64 forward, which int8 activations miss by 5.8e-2);
// I8 for the other block types. WICK_MATMUL=exact: F32 for every type;
// WICK_MATMUL=fast: I8 for every block type, BF16 for bf16.
enum class MatmulMode { Default, Exact, Fast };
MatmulMode matmul_mode();            // WICK_MATMUL, read once, unless set below
void set_matmul_mode(MatmulMode m);  // for tests: holds for weights packed after it
struct SimdKernels;
GemmPath choose_path(DType t, const SimdKernels& k);

// Activations quantized for the I8 path: per row, k_pad int8 values, then per
// block of 32 its scale, the sum of its 32 values times the scale, and the
// integer sums of its two halves of 16.
struct ActBlock {
  float d;
  float dsum;  // d * (s[0] + s[1])
  int32_t s[2];
};

// The activations of one matmul in the form its path takes.
struct ActRows {
  GemmPath path = GemmPath::F32;
  int64_t n_rows = 0;
  // F32
  const float* x = nullptr;
  int64_t ldx = 0;  // floats between rows
  // I8, I8X3 (the levels of a row k_pad bytes and k_pad / 32 blocks apart)
  const int8_t* q = nullptr;
  const ActBlock* blk = nullptr;
  int64_t ldq = 0;  // bytes between rows of q
  int64_t ldb = 0;  // blocks between rows of blk
  // BF16: pairs of bf16 as 32-bit words
  const uint32_t* h = nullptr;
  int64_t ldh = 0;  // words between rows
};

// The PackedMatrix a prepared weight carries (Weight::aux), or nullptr.
inline const PackedMatrix* packed_of(const Weight& w) {
  return static_cast<const PackedMatrix*>(w.aux);
}

}  // namespace wick::cpu
