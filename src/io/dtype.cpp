#include "io/dtype.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "io/quant_blocks.h"

namespace wick {

namespace {
constexpr DTypeTraits kUnknown{nullptr, 0, 0, false};

DTypeTraits lookup(uint32_t t) {
  switch (t) {
    case 0:
      return {"f32", 1, 4, true};
    case 1:
      return {"f16", 1, 2, true};
    case 2:
      return {"q4_0", 32, sizeof(BlockQ4_0), true};
    case 3:
      return {"q4_1", 32, sizeof(BlockQ4_1), true};
    case 6:
      return {"q5_0", 32, sizeof(BlockQ5_0), true};
    case 7:
      return {"q5_1", 32, sizeof(BlockQ5_1), true};
    case 8:
      return {"q8_0", 32, sizeof(BlockQ8_0), true};
    case 9:
      return {"q8_1", 32, 36, false};
    case 10:
      return {"q2_k", 256, sizeof(BlockQ2_K), true};
    case 11:
      return {"q3_k", 256, sizeof(BlockQ3_K), true};
    case 12:
      return {"q4_k", 256, sizeof(BlockQ4_K), true};
    case 13:
      return {"q5_k", 256, sizeof(BlockQ5_K), true};
    case 14:
      return {"q6_k", 256, sizeof(BlockQ6_K), true};
    case 15:
      return {"q8_k", 256, 292, false};
    case 16:
      return {"iq2_xxs", 256, 66, false};
    case 17:
      return {"iq2_xs", 256, 74, false};
    case 18:
      return {"iq3_xxs", 256, 98, false};
    case 19:
      return {"iq1_s", 256, 50, false};
    case 20:
      return {"iq4_nl", 32, sizeof(BlockIQ4_NL), true};
    case 21:
      return {"iq3_s", 256, 110, false};
    case 22:
      return {"iq2_s", 256, 82, false};
    case 23:
      return {"iq4_xs", 256, sizeof(BlockIQ4_XS), true};
    case 24:
      return {"i8", 1, 1, false};
    case 25:
      return {"i16", 1, 2, false};
    case 26:
      return {"i32", 1, 4, false};
    case 27:
      return {"i64", 1, 8, false};
    case 28:
      return {"f64", 1, 8, false};
    case 29:
      return {"iq1_m", 256, 56, false};
    case 30:
      return {"bf16", 1, 2, true};
    case 34:
      return {"tq1_0", 256, 54, false};
    case 35:
      return {"tq2_0", 256, 66, false};
    default:
      return kUnknown;
  }
}
}  // namespace

std::optional<DTypeTraits> dtype_traits(uint32_t t) {
  DTypeTraits tr = lookup(t);
  if (!tr.name) return std::nullopt;
  return tr;
}

const DTypeTraits& traits(DType t) {
  static const DTypeTraits e4m3{"f8_e4m3", 1, 1, false}, e5m2{"f8_e5m2", 1, 1, false};
  if (t == DType::F8_E4M3) return e4m3;
  if (t == DType::F8_E5M2) return e5m2;
  static const DTypeTraits table[] = {
      lookup(0),  lookup(1),  lookup(2),  lookup(3),  lookup(4),  lookup(5),  lookup(6),
      lookup(7),  lookup(8),  lookup(9),  lookup(10), lookup(11), lookup(12), lookup(13),
      lookup(14), lookup(15), lookup(16), lookup(17), lookup(18), lookup(19), lookup(20),
      lookup(21), lookup(22), lookup(23), lookup(24), lookup(25), lookup(26), lookup(27),
      lookup(28), lookup(29), lookup(30)};
  auto i = static_cast<uint32_t>(t);
  if (i >= std::size(table) || !table[i].name) throw std::logic_error("traits: unknown dtype");
  return table[i];
}

std::string dtype_name(uint32_t t) {
  auto tr = dtype_traits(t);
  return tr ? tr->name : "type#" + std::to_string(t);
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (uint32_t t = 0; t <= 30; ++t) {
    DTypeTraits tr = lookup(t);
    if (tr.name && tr.supported && name == tr.name) return static_cast<DType>(t);
  }
  return std::nullopt;
}

size_t row_bytes(DType t, int64_t n) {
  const auto& tr = traits(t);
  return size_t(n / tr.block_size) * tr.block_bytes;
}

namespace {

// Without branches (masks, not conditions), so that a row of them
// vectorises: subnormals as float(mantissa) * 2^-24 (exact, and no subnormal
// float on the way, so the FTZ/DAZ modes do not matter), infinities and NaNs
// (exponent 31 -> 255) with their mantissa bits as they are, normals by
// moving the bits and re-biasing the exponent (+112).
[[gnu::always_inline]] inline float half_to_float(uint16_t half) {
  const uint32_t h = half, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  const uint32_t subnormal = 0u - uint32_t(exp == 0), special = 0u - uint32_t(exp == 31);
  const float sub = float(int32_t(man)) * 0x1p-24f;
  uint32_t sub_bits;
  std::memcpy(&sub_bits, &sub, 4);
  const uint32_t normal_bits = ((exp + 112 + (special & 112)) << 23) | (man << 13);
  const uint32_t u = ((h & 0x8000) << 16) | (subnormal & sub_bits) | (~subnormal & normal_bits);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

float f16_to_f32(uint16_t h) {
  return half_to_float(h);
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into exponent
  return uint16_t(half);
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
      return;
    }
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::Q4_0:
      return dequant_blocks<BlockQ4_0>(src, dst, n);
    case DType::Q4_1:
      return dequant_blocks<BlockQ4_1>(src, dst, n);
    case DType::Q5_0:
      return dequant_blocks<BlockQ5_0>(src, dst, n);
    case DType::Q5_1:
      return dequant_blocks<BlockQ5_1>(src, dst, n);
    case DType::Q8_0:
      return dequant_blocks<BlockQ8_0>(src, dst, n);
    case DType::Q4_K:
      return dequant_blocks<BlockQ4_K>(src, dst, n);
    case DType::Q5_K:
      return dequant_blocks<BlockQ5_K>(src, dst, n);
    case DType::Q6_K:
      return dequant_blocks<BlockQ6_K>(src, dst, n);
    case DType::Q2_K:
      return dequant_blocks<BlockQ2_K>(src, dst, n);
    case DType::Q3_K:
      return dequant_blocks<BlockQ3_K>(src, dst, n);
    case DType::IQ4_NL:
      return dequant_blocks<BlockIQ4_NL>(src, dst, n);
    case DType::IQ4_XS:
      return dequant_blocks<BlockIQ4_XS>(src, dst, n);
    default:
      throw std::runtime_error(std::string("dequantize: unsupported type ") + dtype_name(t));
  }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    float d = amax / 127.f;
    float id = d != 0.f ? 1.f / d : 0.f;
    out[b].d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) out[b].qs[j] = int8_t(std::lround(x[j] * id));
  }
}

}  // namespace wick
