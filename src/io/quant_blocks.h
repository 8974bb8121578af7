// GGML quantization block layouts and their scalar dequantization, written
// from the GGUF format description. Header-only so that each SIMD translation
// unit compiles (and vectorises) the same code for its own ISA.
#pragma once

#include <cstdint>

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
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

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

template <typename Block>
inline void dequant_blocks(const void* src, float* dst, int64_t n) {
  constexpr int64_t kPer = (sizeof(Block) >= 144) ? 256 : 32;
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kPer; ++i) dequant_block(b[i], dst + i * kPer);
}

}  // namespace wick
