// IQ4_NL and IQ4_XS: 4-bit indices into 16 non-linear levels (kIq4Values,
// -127..113, closer together near zero) times a scale per block of 32
// (IQ4_NL: an f16 scale; IQ4_XS: a 6-bit signed scale against the f16 scale
// of a 256-element super-block). The levels are not evenly spaced, so no
// closed-form rounding is the best: each block tries scales that put its
// element of largest magnitude at 95..143 level units either side of zero
// (the sign of the scale is free; beyond 127 or 113 it clips), gives every
// element its nearest level, fits the scale to those levels by least squares,
// and keeps the fit with the least squared error. The levels are then
// computed again with the scales as stored (rounded to f16, or to 6 bits);
// IQ4_XS keeps plain absmax scales where they fare better as stored, and
// tries each 6-bit scale one step either side.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/quant_blocks.h"
#include "io/quantize.h"

namespace wick {

namespace {

// Where the search puts the element of largest magnitude, in level units.
constexpr int kIqTopLo = 95, kIqTopHi = 143, kIqTopStep = 3;

// The index of the level nearest to t, looked up in steps of 1/2 over
// [-128, 114): every midpoint between two levels is a whole or half number,
// so none falls inside a step (a tie goes to the upper level). t outside
// that range clamps to the outermost levels, a NaN to the lowest.
struct LevelTable {
  uint8_t idx[484];
  float value[484];
};
constexpr LevelTable make_level_table() {
  LevelTable lt{};
  for (int k = 0; k < 484; ++k) {
    const int t2 = k - 256;  // 2 t
    int i = 0;
    while (i < 15 && t2 >= kIq4Values[i] + kIq4Values[i + 1]) ++i;
    lt.idx[k] = uint8_t(i);
    lt.value[k] = float(kIq4Values[i]);
  }
  return lt;
}
constexpr LevelTable kLevels = make_level_table();
inline int level_slot(float t) {
  t = t > -128.f ? t : -128.f;  // (so that a NaN lands on the lowest level)
  t = t < 113.75f ? t : 113.75f;
  return int((t + 128.f) * 2.f);
}

// err plus the squared error of x[0..n) at scale s, the level indices into idx.
float iq4_error(const float* x, int n, float s, uint8_t* idx, float err = 0.f) {
  const float inv = s != 0.f ? 1.f / s : 0.f;
  for (int i = 0; i < n; ++i) {
    const int k = level_slot(x[i] * inv);
    idx[i] = kLevels.idx[k];
    const float e = s * kLevels.value[k] - x[i];
    err += e * e;
  }
  return err;
}

// The best scale for x[0..n) (one block of 32), before any rounding.
float search_iq4(const float* x, int n) {
  const float xm = signed_amax(x, n);
  if (xm == 0.f) return 0.f;
  double sxx = 0;
  for (int i = 0; i < n; ++i) sxx += double(x[i]) * x[i];
  float best_scale = xm / float(kIq4Values[0]);
  double best_err = INFINITY;
  for (int top = kIqTopLo; top <= kIqTopHi; top += kIqTopStep)
    for (float sign : {-1.f, 1.f}) {
      const float inv = sign * float(top) / xm;
      float sxv = 0.f, svv = 0.f;
      for (int i = 0; i < n; ++i) {
        const float v = kLevels.value[level_slot(x[i] * inv)];
        sxv += x[i] * v;
        svv += v * v;
      }
      if (sxv == 0.f) continue;
      // least squares for these levels, and its error
      const double err = sxx - double(sxv) * sxv / svv;
      if (err < best_err) {
        best_err = err;
        best_scale = sxv / svv;
      }
    }
  return best_scale;
}

// 4-bit indices of a block of 32: element j in the low nibble of byte j,
// element j + 16 in the high one.
void pack_iq4_nibbles(const uint8_t* idx, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(idx[j] | (idx[j + 16] << 4));
}

// An IQ4_XS super-block as stored for the given sub-block scales.
struct Iq4Superblock {
  uint16_t d = 0;
  int ls[8] = {};  // -32..31
  uint8_t idx[256];
  float err = 0.f;
};

Iq4Superblock pack_iq4xs(const float* x, const float* scales) {
  Iq4Superblock sb;
  sb.d = f32_to_f16(signed_amax(scales, 8) / -32.f);
  const float d16 = f16_to_f32(sb.d);
  for (int j = 0; j < 8; ++j) {
    sb.ls[j] = d16 != 0.f ? std::clamp(int(std::nearbyint(scales[j] / d16)), -32, 31) : 0;
    sb.err = iq4_error(x + 32 * j, 32, d16 * float(sb.ls[j]), sb.idx + 32 * j, sb.err);
  }
  return sb;
}

// Each sub-block's 6-bit scale moved one step either way where that lowers its error.
void refine_iq4xs(const float* x, Iq4Superblock& sb) {
  const float d16 = f16_to_f32(sb.d);
  uint8_t idx[32];
  sb.err = 0.f;
  for (int j = 0; j < 8; ++j) {
    const int ls0 = sb.ls[j];
    float best = iq4_error(x + 32 * j, 32, d16 * float(ls0), sb.idx + 32 * j);
    for (int ls = std::max(ls0 - 1, -32); ls <= std::min(ls0 + 1, 31); ++ls) {
      if (ls == ls0) continue;
      const float e = iq4_error(x + 32 * j, 32, d16 * float(ls), idx);
      if (e < best) {
        best = e;
        sb.ls[j] = ls;
        std::memcpy(sb.idx + 32 * j, idx, 32);
      }
    }
    sb.err += best;
  }
}

}  // namespace

void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockIQ4_NL*>(dst);
  uint8_t idx[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    BlockIQ4_NL& o = out[b];
    o.d = f32_to_f16(search_iq4(x, 32));
    iq4_error(x, 32, f16_to_f32(o.d), idx);  // the levels for the scale as stored
    pack_iq4_nibbles(idx, o.qs);
  }
}

void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* x = src + b * 256;
    float searched[8], amax[8];
    for (int j = 0; j < 8; ++j) {
      searched[j] = search_iq4(x + 32 * j, 32);
      amax[j] = signed_amax(x + 32 * j, 32) / float(kIq4Values[0]);
    }
    // the searched scales unless plain absmax ones fare better as stored
    const Iq4Superblock a = pack_iq4xs(x, searched), c = pack_iq4xs(x, amax);
    Iq4Superblock sb = c.err < a.err ? c : a;
    refine_iq4xs(x, sb);
    BlockIQ4_XS& o = out[b];
    o.d = sb.d;
    o.scales_h = 0;
    std::memset(o.scales_l, 0, sizeof o.scales_l);
    for (int j = 0; j < 8; ++j) {
      const int ls = sb.ls[j] + 32;  // 0..63
      o.scales_l[j / 2] |= uint8_t((ls & 15) << (4 * (j % 2)));
      o.scales_h |= uint16_t((ls >> 4) << (2 * j));
      pack_iq4_nibbles(sb.idx + 32 * j, o.qs + 16 * j);
    }
  }
}

}  // namespace wick
