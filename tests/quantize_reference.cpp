// The reference writers of quantize_reference.h: the scalar code of
// src/io/quantize_k.cpp and src/io/quantize_iq4.cpp at bc8ed86, unchanged but
// for the namespace (and the two files in one).
#include "quantize_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/quant_blocks.h"
#include "io/quantize.h"

namespace wick::quant_ref {

namespace {

// The candidate scales a sub-block's search tries: `steps` on each side of the
// min/max (absmax) one, `step` levels apart, each refitted and re-rounded
// `refinements` times. q2_k and q3_k take the same range (one level either
// way) in half the candidates: with 4 or 8 levels their fits come out the
// same (q3_k) or within 0.05 % RMS (q2_k) in half the time.
struct SearchGrid {
  int steps;
  float step;
  int refinements;
};
constexpr SearchGrid kFine{10, 0.1f, 2}, kCoarse{5, 0.2f, 2};

struct Fit {
  float scale = 0.f, min = 0.f;  // x ~ scale * q - min, min >= 0
  float err = 0.f;
};

// v rounded to the nearest integer (half to even, as nearbyint) within
// [lo, hi]; a NaN gives lo. Adding and taking away 1.5 * 2^23 rounds in the
// default mode without a libm call (x86-64's baseline has no roundss).
int nearest(float v, int lo, int hi) {
  v = v > float(lo) ? v : float(lo);
  v = v < float(hi) ? v : float(hi);
  return int(v + 12582912.f - 12582912.f);
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
Fit search_affine(const float* x, int n, int n_max, const SearchGrid& g) {
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
  for (int k = -g.steps; k <= g.steps; ++k) {
    const float iscale = (float(n_max) + g.step * float(k)) / (hi - lo);
    for (int i = 0; i < n; ++i) q[i] = uint8_t(nearest(iscale * (x[i] - lo), 0, n_max));
    Fit f = fit_affine(x, q, n);
    for (int r = 0; r <= g.refinements; ++r) {
      if (f.scale <= 0.f) break;
      f.err = affine_error(x, n, f.scale, f.min, n_max, q);
      if (f.err < best.err) best = f;
      if (r < g.refinements) f = fit_affine(x, q, n);
    }
  }
  return best;
}

// The best signed scale for x ~ scale * q, q in [q_lo, q_hi] (q_lo = -q_hi - 1:
// one q6_k or q3_k sub-block).
float search_symmetric(const float* x, int n, int q_lo, int q_hi, const SearchGrid& g) {
  const float xm = signed_amax(x, n);
  if (xm == 0.f) return 0.f;
  float best_scale = xm / float(q_lo), best_err = INFINITY;
  auto error_of = [&](float scale, double* sxq, double* sqq) {
    const float inv = scale != 0.f ? 1.f / scale : 0.f;
    float err = 0.f;
    *sxq = *sqq = 0;
    for (int i = 0; i < n; ++i) {
      const int q = nearest(x[i] * inv, q_lo, q_hi);
      const float e = scale * float(q) - x[i];
      err += e * e;
      *sxq += double(x[i]) * q;
      *sqq += double(q) * q;
    }
    return err;
  };
  // The largest magnitude on the extra negative level, or on the top positive one.
  for (float top : {float(q_lo), float(q_hi)})
    for (int k = -g.steps; k <= g.steps; ++k) {
      float scale = xm / (top + (top < 0 ? -1.f : 1.f) * g.step * float(k));
      for (int r = 0; r <= g.refinements; ++r) {
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

// The layout of an affine K-quant super-block: n_sub sub-blocks of len
// elements, levels 0..n_max, sub-block scales and mins 0..sc_max.
struct AffineLayout {
  int n_sub, len, n_max, sc_max;
  SearchGrid grid;
};
constexpr AffineLayout kQ4K{8, 32, 15, 63, kFine}, kQ5K{8, 32, 31, 63, kFine},
    kQ2K{16, 16, 3, 15, kCoarse};

// Sub-block fits of a q2_k / q4_k / q5_k super-block as stored: 4- or 6-bit
// scales and mins against f16 super-block scales, and the levels for them.
struct AffineSuperblock {
  uint16_t d = 0, dmin = 0;
  uint8_t ls[16] = {}, lm[16] = {};
  uint8_t q[256];
  float err = 0.f;
};

AffineSuperblock pack_affine(const float* x, const Fit* fits, const AffineLayout& L) {
  AffineSuperblock sb;
  float max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < L.n_sub; ++j) {
    max_scale = std::max(max_scale, fits[j].scale);
    max_min = std::max(max_min, fits[j].min);
  }
  // rounded to f16 first, so that the sub-block scales fit the stored super-block scales
  sb.d = f32_to_f16(max_scale / float(L.sc_max));
  sb.dmin = f32_to_f16(max_min / float(L.sc_max));
  const float d16 = f16_to_f32(sb.d), dmin16 = f16_to_f32(sb.dmin);
  for (int j = 0; j < L.n_sub; ++j) {
    sb.ls[j] = uint8_t(d16 > 0 ? nearest(fits[j].scale / d16, 0, L.sc_max) : 0);
    sb.lm[j] = uint8_t(dmin16 > 0 ? nearest(fits[j].min / dmin16, 0, L.sc_max) : 0);
  }
  for (int j = 0; j < L.n_sub; ++j)  // the levels for the scales as stored
    sb.err += affine_error(x + L.len * j, L.len, d16 * float(sb.ls[j]), dmin16 * float(sb.lm[j]),
                           L.n_max, sb.q + L.len * j);
  return sb;
}

// One affine super-block. The searched fits are kept unless plain min/max
// fits come out better once their scales are rounded (blocks already on a
// grid, such as weights dequantized from q4_1).
AffineSuperblock quantize_affine_superblock(const float* x, const AffineLayout& L) {
  Fit searched[16], minmax[16];
  for (int j = 0; j < L.n_sub; ++j) {
    const float* xj = x + L.len * j;
    searched[j] = search_affine(xj, L.len, L.n_max, L.grid);
    float lo = 0.f, hi = xj[0];
    for (int i = 0; i < L.len; ++i) {
      lo = std::min(lo, xj[i]);
      hi = std::max(hi, xj[i]);
    }
    minmax[j].scale = std::max(hi - lo, 0.f) / float(L.n_max);
    minmax[j].min = -lo;
  }
  AffineSuperblock a = pack_affine(x, searched, L);
  AffineSuperblock b = pack_affine(x, minmax, L);
  return b.err < a.err ? b : a;
}

// Each sub-block's stored scale and min moved one step either way where that
// lowers its error with the super-block scales as they are (q2_k: a 4-bit
// scale rounds coarsely, and the nearest one is not always the best).
void refine_affine(const float* x, AffineSuperblock& sb, const AffineLayout& L) {
  const float d16 = f16_to_f32(sb.d), dmin16 = f16_to_f32(sb.dmin);
  uint8_t q[32];
  sb.err = 0.f;
  for (int j = 0; j < L.n_sub; ++j) {
    const float* xj = x + L.len * j;
    uint8_t* qj = sb.q + L.len * j;
    const int ls0 = sb.ls[j], lm0 = sb.lm[j];
    float best = affine_error(xj, L.len, d16 * float(ls0), dmin16 * float(lm0), L.n_max, qj);
    for (int ls = std::max(ls0 - 1, 0); ls <= std::min(ls0 + 1, L.sc_max); ++ls)
      for (int lm = std::max(lm0 - 1, 0); lm <= std::min(lm0 + 1, L.sc_max); ++lm) {
        if (ls == ls0 && lm == lm0) continue;
        const float e = affine_error(xj, L.len, d16 * float(ls), dmin16 * float(lm), L.n_max, q);
        if (e < best) {
          best = e;
          sb.ls[j] = uint8_t(ls);
          sb.lm[j] = uint8_t(lm);
          std::memcpy(qj, q, size_t(L.len));
        }
      }
    sb.err += best;
  }
}

}  // namespace

void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ4_K*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    BlockQ4_K& o = out[b];
    const AffineSuperblock sb = quantize_affine_superblock(src + b * 256, kQ4K);
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
    const AffineSuperblock sb = quantize_affine_superblock(src + b * 256, kQ5K);
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

// The layout of a symmetric K-quant super-block: 16 sub-blocks of 16,
// levels q_lo..q_hi, signed sub-block scales sc_lo..sc_hi.
struct SymmetricLayout {
  int q_lo, q_hi, sc_lo, sc_hi;
  SearchGrid grid;
};
constexpr SymmetricLayout kQ6K{-32, 31, -128, 127, kFine}, kQ3K{-4, 3, -32, 31, kCoarse};

// A q6_k / q3_k super-block as stored for the given sub-block scales: 8- or
// 6-bit scales against an f16 super-block scale, levels stored as q - q_lo.
struct SymmetricSuperblock {
  uint16_t d = 0;
  int8_t ls[16] = {};
  uint8_t q[256];
  float err = 0.f;
};

// err plus the squared error of one sub-block of 16 at scale s; its levels
// (less q_lo) into q.
float symmetric_error(const float* x, float s, const SymmetricLayout& L, uint8_t* q,
                      float err = 0.f) {
  const float inv = s != 0.f ? 1.f / s : 0.f;
  for (int i = 0; i < 16; ++i) {
    const int v = nearest(x[i] * inv, L.q_lo, L.q_hi);
    q[i] = uint8_t(v - L.q_lo);
    err += (s * float(v) - x[i]) * (s * float(v) - x[i]);
  }
  return err;
}

SymmetricSuperblock pack_symmetric(const float* x, const float* scales, const SymmetricLayout& L) {
  SymmetricSuperblock sb;
  sb.d = f32_to_f16(signed_amax(scales, 16) / float(L.sc_lo));
  const float d16 = f16_to_f32(sb.d);
  for (int j = 0; j < 16; ++j) {
    sb.ls[j] = int8_t(d16 != 0.f ? nearest(scales[j] / d16, L.sc_lo, L.sc_hi) : 0);
    sb.err = symmetric_error(x + 16 * j, d16 * float(sb.ls[j]), L, sb.q + 16 * j, sb.err);
  }
  return sb;
}

// The searched scales unless plain absmax ones fare better as stored.
SymmetricSuperblock quantize_symmetric_superblock(const float* x, const SymmetricLayout& L) {
  float searched[16], amax[16];
  for (int j = 0; j < 16; ++j) {
    searched[j] = search_symmetric(x + 16 * j, 16, L.q_lo, L.q_hi, L.grid);
    amax[j] = signed_amax(x + 16 * j, 16) / float(L.q_lo);
  }
  const SymmetricSuperblock a = pack_symmetric(x, searched, L), c = pack_symmetric(x, amax, L);
  return c.err < a.err ? c : a;
}

// Each sub-block's stored scale moved one step either way where that lowers
// its error (q3_k: the 8 levels leave the rounded scale's choice coarse).
void refine_symmetric(const float* x, SymmetricSuperblock& sb, const SymmetricLayout& L) {
  const float d16 = f16_to_f32(sb.d);
  uint8_t q[16];
  sb.err = 0.f;
  for (int j = 0; j < 16; ++j) {
    const int ls0 = sb.ls[j];
    float best = symmetric_error(x + 16 * j, d16 * float(ls0), L, sb.q + 16 * j);
    for (int ls = std::max(ls0 - 1, L.sc_lo); ls <= std::min(ls0 + 1, L.sc_hi); ++ls) {
      if (ls == ls0) continue;
      const float e = symmetric_error(x + 16 * j, d16 * float(ls), L, q);
      if (e < best) {
        best = e;
        sb.ls[j] = int8_t(ls);
        std::memcpy(sb.q + 16 * j, q, 16);
      }
    }
    sb.err += best;
  }
}

}  // namespace

void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ6_K*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    const SymmetricSuperblock sb = quantize_symmetric_superblock(src + b * 256, kQ6K);
    BlockQ6_K& o = out[b];
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

namespace {

// Q2_K / Q3_K: the 2 low bits of element e go to bits 2 ((e % 128) / 32) of
// byte 32 (e / 128) + e % 32 (the inverse of k2_bits).
void pack_k2_bits(const uint8_t* q, uint8_t* qs) {
  std::memset(qs, 0, 64);
  for (int e = 0; e < 256; ++e)
    qs[32 * (e / 128) + e % 32] |= uint8_t((q[e] & 3) << (2 * ((e % 128) / 32)));
}

}  // namespace

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ2_K*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* x = src + b * 256;
    AffineSuperblock sb = quantize_affine_superblock(x, kQ2K);
    refine_affine(x, sb, kQ2K);
    BlockQ2_K& o = out[b];
    o.d = sb.d;
    o.dmin = sb.dmin;
    for (int j = 0; j < 16; ++j) o.scales[j] = uint8_t(sb.ls[j] | (sb.lm[j] << 4));
    pack_k2_bits(sb.q, o.qs);
  }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ3_K*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* x = src + b * 256;
    SymmetricSuperblock sb = quantize_symmetric_superblock(x, kQ3K);
    refine_symmetric(x, sb, kQ3K);
    BlockQ3_K& o = out[b];
    o.d = sb.d;
    // levels q + 4 in 0..7: bits 0-1 as Q2_K's, bit 2 in hmask
    pack_k2_bits(sb.q, o.qs);
    std::memset(o.hmask, 0, sizeof o.hmask);
    for (int e = 0; e < 256; ++e)
      o.hmask[e % 32] |= uint8_t(((sb.q[e] >> 2) & 1) << (4 * (e / 128) + (e % 128) / 32));
    // scales sc = ls + 32 in 0..63: low nibbles in bytes 0..7, high 2 bits in 8..11
    std::memset(o.scales, 0, sizeof o.scales);
    for (int s = 0; s < 16; ++s) {
      const int sc = sb.ls[s] + 32;
      o.scales[s % 8] |= uint8_t((sc & 15) << (4 * (s / 8)));
      o.scales[8 + s % 4] |= uint8_t((sc >> 4) << (2 * (s / 4)));
    }
  }
}

}  // namespace wick::quant_ref

// ---- quantize_iq4.cpp
namespace wick::quant_ref {

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

}  // namespace wick::quant_ref
