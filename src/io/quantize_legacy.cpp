// q4_0, q4_1, q5_0, q5_1: blocks of 32 with one f16 scale (and minimum).
// Symmetric types map the element of largest magnitude onto the most
// negative level (-8 or -16), which uses the one extra level the format has.
#include <algorithm>
#include <cmath>

#include "io/quant_blocks.h"
#include "io/quantize.h"

namespace wick {

namespace {

// Symmetric: q = floor(x / d + half + 0.5) clamped to [0, 2 * half - 1].
template <int kHalf>
void quantize_symmetric(const float* x, uint16_t& d_out, uint8_t* q) {
  const float d = signed_amax(x, 32) / -float(kHalf);
  const float id = d != 0.f ? 1.f / d : 0.f;
  d_out = f32_to_f16(d);
  for (int j = 0; j < 32; ++j)
    q[j] = uint8_t(std::clamp(int(std::floor(x[j] * id + float(kHalf) + 0.5f)), 0, 2 * kHalf - 1));
}

// With a minimum: q = floor((x - min) / d + 0.5) clamped to [0, n_level - 1].
template <int kLevels>
void quantize_affine(const float* x, uint16_t& d_out, uint16_t& m_out, uint8_t* q) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / float(kLevels - 1);
  const float id = d != 0.f ? 1.f / d : 0.f;
  d_out = f32_to_f16(d);
  m_out = f32_to_f16(lo);
  for (int j = 0; j < 32; ++j)
    q[j] = uint8_t(std::clamp(int(std::floor((x[j] - lo) * id + 0.5f)), 0, kLevels - 1));
}

void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
}

void pack_fifth_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= uint32_t(q[j] >> 4) << j;
  for (int i = 0; i < 4; ++i) qh[i] = uint8_t(bits >> (8 * i));
}

}  // namespace

void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ4_0*>(dst);
  uint8_t q[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    quantize_symmetric<8>(src + b * 32, out[b].d, q);
    pack_nibbles(q, out[b].qs);
  }
}

void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ5_0*>(dst);
  uint8_t q[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    quantize_symmetric<16>(src + b * 32, out[b].d, q);
    pack_nibbles(q, out[b].qs);
    pack_fifth_bits(q, out[b].qh);
  }
}

void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ4_1*>(dst);
  uint8_t q[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    quantize_affine<16>(src + b * 32, out[b].d, out[b].m, q);
    pack_nibbles(q, out[b].qs);
  }
}

void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ5_1*>(dst);
  uint8_t q[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    quantize_affine<32>(src + b * 32, out[b].d, out[b].m, q);
    pack_nibbles(q, out[b].qs);
    pack_fifth_bits(q, out[b].qh);
  }
}

}  // namespace wick
