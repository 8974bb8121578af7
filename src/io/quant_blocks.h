// GGML quantization block layouts and their scalar dequantization, written
// from the GGUF format description. Header-only so that each SIMD translation
// unit compiles (and vectorises) the same code for its own ISA.
#pragma once

#include <cstdint>
#include <type_traits>

#include "io/dtype.h"

namespace wick {

#pragma pack(push, 1)
struct BlockQ4_0 {  // 32 weights: x = (q - 8) * d
  uint16_t d;
  uint8_t qs[16];  // low nibbles: weights 0..15, high nibbles: 16..31
};
struct BlockQ4_1 {  // x = q * d + m
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_0 {  // x = (q - 16) * d, 5th bit in qh
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {  // x = q * d + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {  // x = q * d
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_K {  // 256 weights in 8 sub-blocks of 32, 6-bit scales and mins
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {  // 256 weights in 16 sub-blocks of 16, 8-bit scales
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ2_K {     // 256 weights in 16 sub-blocks of 16: x = d sc q - dmin m, q in 0..3
  uint8_t scales[16];  // per sub-block: sc in the low nibble, m in the high
  uint8_t qs[64];      // 2-bit q, see q2k_code
  uint16_t d, dmin;
};
struct BlockQ3_K {     // 256 weights in 16 sub-blocks of 16: x = d (sc - 32) q, q in -4..3
  uint8_t hmask[32];   // bit 2 of q + 4
  uint8_t qs[64];      // bits 0-1 of q + 4, as Q2_K's
  uint8_t scales[12];  // 16 6-bit sc, see q3k_scale
  uint16_t d;
};
struct BlockIQ4_NL {  // 32 weights: x = d * kIq4Values[i], 4-bit i as Q4_0's
  uint16_t d;
  uint8_t qs[16];
};
struct BlockIQ4_XS {  // 256 weights in 8 sub-blocks of 32: x = d (ls - 32) kIq4Values[i]
  uint16_t d;
  uint16_t scales_h;    // bits 4-5 of ls, 2 per sub-block
  uint8_t scales_l[4];  // bits 0-3 of ls, a nibble per sub-block
  uint8_t qs[128];      // 4-bit i, 16 bytes per sub-block as IQ4_NL's
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ2_K) == 84 &&
              sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);

// Elements per block.
template <typename Block>
constexpr int64_t block_elems() {
  if constexpr (std::is_same_v<Block, BlockQ4_K> || std::is_same_v<Block, BlockQ5_K> ||
                std::is_same_v<Block, BlockQ6_K> || std::is_same_v<Block, BlockQ2_K> ||
                std::is_same_v<Block, BlockQ3_K> || std::is_same_v<Block, BlockIQ4_XS>)
    return 256;
  else
    return 32;
}

inline void dequant_block(const BlockQ4_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = float(int(b.qs[j] & 0x0f) - 8) * d;
    y[j + 16] = float(int(b.qs[j] >> 4) - 8) * d;
  }
}

inline void dequant_block(const BlockQ4_1& b, float* y) {
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = float(b.qs[j] & 0x0f) * d + m;
    y[j + 16] = float(b.qs[j] >> 4) * d + m;
  }
}

inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

inline void dequant_block(const BlockQ5_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int hi0 = ((qh >> j) << 4) & 0x10;
    const int hi1 = (qh >> (j + 12)) & 0x10;
    y[j] = float(((b.qs[j] & 0x0f) | hi0) - 16) * d;
    y[j + 16] = float(((b.qs[j] >> 4) | hi1) - 16) * d;
  }
}

inline void dequant_block(const BlockQ5_1& b, float* y) {
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int hi0 = ((qh >> j) << 4) & 0x10;
    const int hi1 = (qh >> (j + 12)) & 0x10;
    y[j] = float((b.qs[j] & 0x0f) | hi0) * d + m;
    y[j + 16] = float((b.qs[j] >> 4) | hi1) * d + m;
  }
}

inline void dequant_block(const BlockQ8_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < 32; ++j) y[j] = float(b.qs[j]) * d;
}

// 6-bit scale and min of sub-block j packed into 12 bytes (K-quants).
inline void k_scale_min(int j, const uint8_t* s, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

inline void dequant_block(const BlockQ4_K& b, float* y) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  const uint8_t* q = b.qs;
  for (int j = 0; j < 256; j += 64) {
    const int is = j / 32;
    uint8_t sc, m;
    k_scale_min(is, b.scales, sc, m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    k_scale_min(is + 1, b.scales, sc, m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; ++l) y[j + l] = d1 * float(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) y[j + 32 + l] = d2 * float(q[l] >> 4) - m2;
    q += 32;
  }
}

inline void dequant_block(const BlockQ5_K& b, float* y) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  const uint8_t* ql = b.qs;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    const int is = j / 32;
    uint8_t sc, m;
    k_scale_min(is, b.scales, sc, m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    k_scale_min(is + 1, b.scales, sc, m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; ++l)
      y[j + l] = d1 * float((ql[l] & 0x0f) + (b.qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      y[j + 32 + l] = d2 * float((ql[l] >> 4) + (b.qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    u1 <<= 2;
    u2 <<= 2;
  }
}

inline void dequant_block(const BlockQ6_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  const uint8_t* ql = b.ql;
  const uint8_t* qh = b.qh;
  const int8_t* sc = b.scales;
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
      const int q2 = int((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[n + l] = d * float(sc[is]) * float(q1);
      y[n + l + 32] = d * float(sc[is + 2]) * float(q2);
      y[n + l + 64] = d * float(sc[is + 4]) * float(q3);
      y[n + l + 96] = d * float(sc[is + 6]) * float(q4);
    }
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Q2_K and Q3_K: the 2 low bits of element e. Each half of 128 has 32 bytes; element
// 32 j + l of a half is bits 2j..2j+1 of byte l.
inline int k2_bits(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}
inline int q2k_code(const BlockQ2_K& b, int e) {  // 0..3
  return k2_bits(b.qs, e);
}
// -4..3: the low bits, less 4 where bit 4 (e / 128) + (e % 128) / 32 of hmask[e % 32] is clear.
inline int q3k_code(const BlockQ3_K& b, int e) {
  const int bit = 4 * (e / 128) + (e % 128) / 32;
  return k2_bits(b.qs, e) - ((b.hmask[e % 32] >> bit) & 1 ? 0 : 4);
}
// sc - 32 of sub-block s (0..15): low 4 bits from byte s % 8 (low nibble for s < 8),
// high 2 bits from byte 8 + s % 4 (bits 2 (s / 4)..).
inline int q3k_scale(const BlockQ3_K& b, int s) {
  const int lo = (b.scales[s % 8] >> (4 * (s / 8))) & 15;
  const int hi = (b.scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (lo | hi << 4) - 32;
}

// The 16 levels of the 4-bit non-linear types (IQ4_NL, IQ4_XS).
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
// ls - 32 of IQ4_XS sub-block ib (0..7).
inline int iq4xs_scale(const BlockIQ4_XS& b, int ib) {
  const int lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15;
  const int hi = (b.scales_h >> (2 * ib)) & 3;
  return (lo | hi << 4) - 32;
}

inline void dequant_block(const BlockQ2_K& b, float* y) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * float(b.scales[s] & 15), ml = dmin * float(b.scales[s] >> 4);
    for (int e = 16 * s; e < 16 * s + 16; ++e) y[e] = dl * float(q2k_code(b, e)) - ml;
  }
}

inline void dequant_block(const BlockQ3_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * float(q3k_scale(b, s));
    for (int e = 16 * s; e < 16 * s + 16; ++e) y[e] = dl * float(q3k_code(b, e));
  }
}

inline void dequant_block(const BlockIQ4_NL& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(kIq4Values[b.qs[j] & 15]);
    y[j + 16] = d * float(kIq4Values[b.qs[j] >> 4]);
  }
}

inline void dequant_block(const BlockIQ4_XS& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const float dl = d * float(iq4xs_scale(b, ib));
    const uint8_t* qs = b.qs + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      y[32 * ib + j] = dl * float(kIq4Values[qs[j] & 15]);
      y[32 * ib + j + 16] = dl * float(kIq4Values[qs[j] >> 4]);
    }
  }
}

template <typename Block>
inline void dequant_blocks(const void* src, float* dst, int64_t n) {
  constexpr int64_t kPer = block_elems<Block>();
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kPer; ++i) dequant_block(b[i], dst + i * kPer);
}

}  // namespace wick
