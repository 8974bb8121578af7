// K-quants: super-blocks of 256 with per-sub-block scales stored in 6 bits
// (q4_k, q5_k: 8 sub-blocks of 32, x = scale * q - min) or 8 bits (q6_k: 16
// sub-blocks of 16, x = scale * (q - 32)). Plain min/max rounding wastes
// levels on outliers; instead each sub-block tries a range of scales, fits
// scale and minimum to the resulting levels by least squares, and keeps the
// fit with the smallest squared error. The sub-block scales are then
// quantized against the super-block's f16 scale, and the levels computed
// again with the scales as stored, so the error measured is the real one.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/quant_blocks.h"
#include "io/quantize.h"

namespace wick {

namespace {

constexpr int kSteps = 10;       // candidate scales on each side of the min/max one
constexpr float kStep = 0.1f;    // in units of one level
constexpr int kRefinements = 2;  // re-rounding passes after the search

struct Fit {
  float scale = 0.f, min = 0.f;  // x ~ scale * q - min, min >= 0
  float err = 0.f;
};

int nearest(float v, int lo, int hi) {
  return std::clamp(int(std::nearbyint(v)), lo, hi);
}

// Squared error of x ~ scale * q - min with q rounded from the given fit.
float affine_error(const float* x, int n, float scale, float min, int n_max, uint8_t* q) {
  const float inv = scale > 0.f ? 1.f / scale : 0.f;
  float err = 0.f;
  for (int i = 0; i < n; ++i) {
    q[i] = uint8_t(nearest((x[i] + min) * inv, 0, n_max));
    const float e = scale * float(q[i]) - min - x[i];
    err += e * e;
  }
  return err;
}

// Least-squares scale and min for fixed levels q, with min >= 0 (the format
// stores the minimum unsigned: a block of positive values uses min = 0).
Fit fit_affine(const float* x, const uint8_t* q, int n) {
  double sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < n; ++i) {
    sq += q[i];
    sqq += double(q[i]) * q[i];
    sx += x[i];
    sqx += double(q[i]) * x[i];
  }
  Fit f;
  const double det = n * sqq - sq * sq;
  if (det <= 0) return f;  // all levels equal: caller keeps its candidate
  double s = (n * sqx - sq * sx) / det;
  double b = (sqq * sx - sq * sqx) / det;  // x ~ s q + b
  if (b > 0) {
    b = 0;
    s = sqq > 0 ? sqx / sqq : 0;
  }
  f.scale = float(std::max(s, 0.0));
  f.min = float(-b);
  return f;
}

// The best (scale, min) for one sub-block with levels 0..n_max.
Fit search_affine(const float* x, int n, int n_max) {
  float lo = 0.f, hi = x[0];  // lo <= 0: min is stored unsigned
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  uint8_t q[32];
  Fit best;
  if (hi <= lo) {  // all zero
    best.min = -lo;
    return best;
  }
  best.scale = (hi - lo) / float(n_max);  // plain min/max rounding, the baseline
  best.min = -lo;
  best.err = affine_error(x, n, best.scale, best.min, n_max, q);
  for (int k = -kSteps; k <= kSteps; ++k) {
    const float iscale = (float(n_max) + kStep * float(k)) / (hi - lo);
    for (int i = 0; i < n; ++i) q[i] = uint8_t(nearest(iscale * (x[i] - lo), 0, n_max));
    Fit f = fit_affine(x, q, n);
    for (int r = 0; r <= kRefinements; ++r) {
      if (f.scale <= 0.f) break;
      f.err = affine_error(x, n, f.scale, f.min, n_max, q);
      if (f.err < best.err) best = f;
      if (r < kRefinements) f = fit_affine(x, q, n);
    }
  }
  return best;
}

// The best signed scale for x ~ scale * q, q in [-32, 31] (one q6_k sub-block).
float search_symmetric(const float* x, int n) {
  const float xm = signed_amax(x, n);
  if (xm == 0.f) return 0.f;
  float best_scale = xm / -32.f, best_err = INFINITY;
  auto error_of = [&](float scale, double* sxq, double* sqq) {
    const float inv = scale != 0.f ? 1.f / scale : 0.f;
    float err = 0.f;
    *sxq = *sqq = 0;
    for (int i = 0; i < n; ++i) {
      const int q = nearest(x[i] * inv, -32, 31);
      const float e = scale * float(q) - x[i];
      err += e * e;
      *sxq += double(x[i]) * q;
      *sqq += double(q) * q;
    }
    return err;
  };
  // The largest magnitude on the extra negative level, or on the top positive one.
  for (float top : {-32.f, 31.f})
    for (int k = -kSteps; k <= kSteps; ++k) {
      float scale = xm / (top + (top < 0 ? -1.f : 1.f) * kStep * float(k));
      for (int r = 0; r <= kRefinements; ++r) {
        double sxq, sqq;
        const float err = error_of(scale, &sxq, &sqq);
        if (err < best_err) {
          best_err = err;
          best_scale = scale;
        }
        if (sqq <= 0) break;
        scale = float(sxq / sqq);  // least squares for these levels
      }
    }
  return best_scale;
}

// 6-bit sub-block scales and mins of q4_k / q5_k, packed as k_scale_min reads them.
void pack_scale_min(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= sc[j];
      s[j + 4] |= m[j];
    } else {
      s[j + 4] = uint8_t((sc[j] & 0x0f) | ((m[j] & 0x0f) << 4));
      s[j - 4] |= uint8_t((sc[j] >> 4) << 6);
      s[j] |= uint8_t((m[j] >> 4) << 6);
    }
  }
}

// Sub-block fits of a q4_k / q5_k super-block as stored: 6-bit scales and
// mins against f16 super-block scales, and the levels for them.
struct AffineSuperblock {
  uint16_t d = 0, dmin = 0;
  uint8_t ls[8] = {}, lm[8] = {};
  uint8_t q[256];
  float err = 0.f;
};

AffineSuperblock pack_affine(const float* x, const Fit* fits, int n_max) {
  AffineSuperblock sb;
  float max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    max_scale = std::max(max_scale, fits[j].scale);
    max_min = std::max(max_min, fits[j].min);
  }
  // rounded to f16 first, so that the 6-bit scales fit the stored super-block scales
  sb.d = f32_to_f16(max_scale / 63.f);
  sb.dmin = f32_to_f16(max_min / 63.f);
  const float d16 = f16_to_f32(sb.d), dmin16 = f16_to_f32(sb.dmin);
  for (int j = 0; j < 8; ++j) {
    sb.ls[j] = uint8_t(d16 > 0 ? nearest(fits[j].scale / d16, 0, 63) : 0);
    sb.lm[j] = uint8_t(dmin16 > 0 ? nearest(fits[j].min / dmin16, 0, 63) : 0);
  }
  for (int j = 0; j < 8; ++j)  // the levels for the scales as stored
    sb.err += affine_error(x + 32 * j, 32, d16 * float(sb.ls[j]), dmin16 * float(sb.lm[j]), n_max,
                           sb.q + 32 * j);
  return sb;
}

// One q4_k / q5_k super-block. The searched fits are kept unless plain
// min/max fits come out better once their scales are rounded to 6 bits
// (blocks already on a grid, such as weights dequantized from q4_1).
AffineSuperblock quantize_affine_superblock(const float* x, int n_max) {
  Fit searched[8], minmax[8];
  for (int j = 0; j < 8; ++j) {
    searched[j] = search_affine(x + 32 * j, 32, n_max);
    float lo = 0.f, hi = x[32 * j];
    for (int i = 0; i < 32; ++i) {
      lo = std::min(lo, x[32 * j + i]);
      hi = std::max(hi, x[32 * j + i]);
    }
    minmax[j].scale = std::max(hi - lo, 0.f) / float(n_max);
    minmax[j].min = -lo;
  }
  AffineSuperblock a = pack_affine(x, searched, n_max);
  AffineSuperblock b = pack_affine(x, minmax, n_max);
  return b.err < a.err ? b : a;
}

}  // namespace

void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ4_K*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    BlockQ4_K& o = out[b];
    const AffineSuperblock sb = quantize_affine_superblock(src + b * 256, 15);
    o.d = sb.d;
    o.dmin = sb.dmin;
    pack_scale_min(sb.ls, sb.lm, o.scales);
    const uint8_t* q = sb.q;
    for (int p = 0; p < 4; ++p)  // 32 bytes per pair of sub-blocks: low nibble first
      for (int l = 0; l < 32; ++l)
        o.qs[32 * p + l] = uint8_t(q[64 * p + l] | (q[64 * p + 32 + l] << 4));
  }
}

void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ5_K*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    BlockQ5_K& o = out[b];
    const AffineSuperblock sb = quantize_affine_superblock(src + b * 256, 31);
    o.d = sb.d;
    o.dmin = sb.dmin;
    pack_scale_min(sb.ls, sb.lm, o.scales);
    const uint8_t* q = sb.q;
    std::memset(o.qh, 0, sizeof o.qh);
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = q[64 * p + l], hi = q[64 * p + 32 + l];
        o.qs[32 * p + l] = uint8_t((lo & 0x0f) | ((hi & 0x0f) << 4));
        o.qh[l] |= uint8_t(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
      }
  }
}

namespace {

// A q6_k super-block as stored for the given sub-block scales: 8-bit scales
// against an f16 super-block scale, levels 0..63 (value + 32).
struct SymmetricSuperblock {
  uint16_t d = 0;
  int8_t ls[16] = {};
  uint8_t q[256];
  float err = 0.f;
};

SymmetricSuperblock pack_symmetric(const float* x, const float* scales) {
  SymmetricSuperblock sb;
  sb.d = f32_to_f16(signed_amax(scales, 16) / -128.f);
  const float d16 = f16_to_f32(sb.d);
  for (int j = 0; j < 16; ++j) {
    sb.ls[j] = int8_t(d16 != 0.f ? nearest(scales[j] / d16, -128, 127) : 0);
    const float s = d16 * float(sb.ls[j]);
    const float inv = s != 0.f ? 1.f / s : 0.f;
    for (int i = 0; i < 16; ++i) {
      const float v = x[16 * j + i];
      const int q = nearest(v * inv, -32, 31);
      sb.q[16 * j + i] = uint8_t(q + 32);
      sb.err += (s * float(q) - v) * (s * float(q) - v);
    }
  }
  return sb;
}

}  // namespace

void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ6_K*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* x = src + b * 256;
    BlockQ6_K& o = out[b];
    float searched[16], amax[16];
    for (int j = 0; j < 16; ++j) {
      searched[j] = search_symmetric(x + 16 * j, 16);
      amax[j] = signed_amax(x + 16 * j, 16) / -32.f;
    }
    // the searched scales unless plain absmax ones fare better as stored
    const SymmetricSuperblock a = pack_symmetric(x, searched), c = pack_symmetric(x, amax);
    const SymmetricSuperblock& sb = c.err < a.err ? c : a;
    o.d = sb.d;
    std::memcpy(o.scales, sb.ls, 16);
    const uint8_t* q = sb.q;
    std::memset(o.qh, 0, sizeof o.qh);
    for (int h = 0; h < 2; ++h) {  // halves of 128: ql 64 bytes, qh 32 bytes each
      const uint8_t* qq = q + 128 * h;
      uint8_t* ql = o.ql + 64 * h;
      uint8_t* qh = o.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = uint8_t((qq[l] & 0x0f) | ((qq[l + 64] & 0x0f) << 4));
        ql[l + 32] = uint8_t((qq[l + 32] & 0x0f) | ((qq[l + 96] & 0x0f) << 4));
        qh[l] = uint8_t((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                        ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace wick
