// Repacking weights into panels of 16 rows (see packed.h), once at load.
#include <omp.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/simd.h"
#include "io/quant_blocks.h"

namespace wick::cpu {

void AlignedFree::operator()(uint8_t* p) const {
  std::free(p);
}

AlignedBytes aligned_bytes(size_t n, bool zero) {
  // Large buffers (packed weights) on 2 MiB boundaries with transparent huge pages
  // asked for: a 1 GB matrix is 500 faults, not 250,000.
  constexpr size_t kHuge = size_t(2) << 20;
  const bool huge = n >= kHuge;
  const size_t align = huge ? kHuge : 64;
  const size_t bytes = (std::max<size_t>(n, 1) + align - 1) / align * align;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(align, bytes));
  if (!p) throw std::bad_alloc();
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  if (zero) std::memset(p, 0, bytes);
  return AlignedBytes(p);
}

namespace {

size_t round64(size_t n) {
  return (n + 63) / 64 * 64;
}

// The unsigned codes of one scale block of a stored row (u as packed.h defines it).
void block_codes(DType t, const uint8_t* src, uint8_t* u) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1: {
      const uint8_t* qs = t == DType::Q4_0 ? reinterpret_cast<const BlockQ4_0*>(src)->qs
                                           : reinterpret_cast<const BlockQ4_1*>(src)->qs;
      for (int j = 0; j < 16; ++j) {
        u[j] = qs[j] & 15;
        u[j + 16] = qs[j] >> 4;
      }
      return;
    }
    case DType::Q5_0:
    case DType::Q5_1: {
      const uint8_t *qs, *qhp;
      if (t == DType::Q5_0) {
        qs = reinterpret_cast<const BlockQ5_0*>(src)->qs;
        qhp = reinterpret_cast<const BlockQ5_0*>(src)->qh;
      } else {
        qs = reinterpret_cast<const BlockQ5_1*>(src)->qs;
        qhp = reinterpret_cast<const BlockQ5_1*>(src)->qh;
      }
      const uint32_t qh = load_u32(qhp);
      for (int j = 0; j < 16; ++j) {
        u[j] = uint8_t((qs[j] & 15) | (((qh >> j) & 1) << 4));
        u[j + 16] = uint8_t((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      }
      return;
    }
    case DType::Q8_0: {
      const auto& b = *reinterpret_cast<const BlockQ8_0*>(src);
      for (int j = 0; j < 32; ++j) u[j] = uint8_t(int(b.qs[j]) + 128);
      return;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const uint8_t* qs = t == DType::Q4_K ? reinterpret_cast<const BlockQ4_K*>(src)->qs
                                           : reinterpret_cast<const BlockQ5_K*>(src)->qs;
      const uint8_t* qh = t == DType::Q5_K ? reinterpret_cast<const BlockQ5_K*>(src)->qh : nullptr;
      for (int jj = 0; jj < 4; ++jj)
        for (int l = 0; l < 32; ++l) {
          uint8_t a = qs[32 * jj + l] & 15, b = qs[32 * jj + l] >> 4;
          if (qh) {
            a |= uint8_t(((qh[l] >> (2 * jj)) & 1) << 4);
            b |= uint8_t(((qh[l] >> (2 * jj + 1)) & 1) << 4);
          }
          u[64 * jj + l] = a;
          u[64 * jj + 32 + l] = b;
        }
      return;
    }
    case DType::Q6_K: {
      const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
      for (int e = 0; e < 256; ++e) {
        const int half = e / 128, w = e % 128, quarter = w / 32, l = w % 32;
        const uint8_t* ql = b.ql + 64 * half;
        const uint8_t* qh = b.qh + 32 * half;
        int q;
        switch (quarter) {
          case 0:
            q = (ql[l] & 15) | ((qh[l] & 3) << 4);
            break;
          case 1:
            q = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
            break;
          case 2:
            q = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            break;
          default:
            q = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
        u[e] = uint8_t(q);
      }
      return;
    }
    case DType::Q2_K: {
      const auto& b = *reinterpret_cast<const BlockQ2_K*>(src);
      for (int e = 0; e < 256; ++e) u[e] = uint8_t(q2k_code(b, e));
      return;
    }
    case DType::Q3_K: {
      const auto& b = *reinterpret_cast<const BlockQ3_K*>(src);
      for (int e = 0; e < 256; ++e) u[e] = uint8_t(q3k_code(b, e) + 4);
      return;
    }
    case DType::IQ4_NL:
    case DType::IQ4_XS: {  // 16 bytes per 32: low nibbles 0..15, high 16..31
      const uint8_t* qs = t == DType::IQ4_NL ? reinterpret_cast<const BlockIQ4_NL*>(src)->qs
                                             : reinterpret_cast<const BlockIQ4_XS*>(src)->qs;
      for (int e = 0; e < scale_block(t); ++e)
        u[e] = uint8_t((qs[16 * (e / 32) + e % 16] >> (4 * ((e % 32) / 16))) & 15);
      return;
    }
    default:
      throw std::logic_error("block_codes: not a quantized type");
  }
}

// The scales of one scale block of a stored row into the panel's scale record for row c.
void block_scales(DType t, const uint8_t* src, uint8_t* rec, int c) {
  auto put16 = [&](size_t off, uint16_t v) { std::memcpy(rec + off + 2 * size_t(c), &v, 2); };
  switch (t) {
    case DType::Q4_0:
      return put16(0, reinterpret_cast<const BlockQ4_0*>(src)->d);
    case DType::Q5_0:
      return put16(0, reinterpret_cast<const BlockQ5_0*>(src)->d);
    case DType::Q8_0:
      return put16(0, reinterpret_cast<const BlockQ8_0*>(src)->d);
    case DType::Q4_1: {
      const auto& b = *reinterpret_cast<const BlockQ4_1*>(src);
      put16(0, b.d);
      return put16(32, b.m);
    }
    case DType::Q5_1: {
      const auto& b = *reinterpret_cast<const BlockQ5_1*>(src);
      put16(0, b.d);
      return put16(32, b.m);
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      uint16_t d, dmin;
      const uint8_t* scales;
      if (t == DType::Q4_K) {
        const auto& b = *reinterpret_cast<const BlockQ4_K*>(src);
        d = b.d, dmin = b.dmin, scales = b.scales;
      } else {
        const auto& b = *reinterpret_cast<const BlockQ5_K*>(src);
        d = b.d, dmin = b.dmin, scales = b.scales;
      }
      put16(0, d);
      put16(32, dmin);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        k_scale_min(j, scales, sc, m);
        rec[64 + 16 * j + c] = sc;
        rec[192 + 16 * j + c] = m;
      }
      return;
    }
    case DType::Q6_K: {
      const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
      put16(0, b.d);
      for (int j = 0; j < 16; ++j) rec[32 + 16 * j + c] = uint8_t(b.scales[j]);
      return;
    }
    case DType::Q2_K: {
      const auto& b = *reinterpret_cast<const BlockQ2_K*>(src);
      put16(0, b.d);
      put16(32, b.dmin);
      for (int j = 0; j < 16; ++j) {
        rec[64 + 16 * j + c] = b.scales[j] & 15;
        rec[320 + 16 * j + c] = b.scales[j] >> 4;
      }
      return;
    }
    case DType::Q3_K: {
      const auto& b = *reinterpret_cast<const BlockQ3_K*>(src);
      put16(0, b.d);
      for (int j = 0; j < 16; ++j) rec[32 + 16 * j + c] = uint8_t(int8_t(q3k_scale(b, j)));
      return;
    }
    case DType::IQ4_NL:
      return put16(0, reinterpret_cast<const BlockIQ4_NL*>(src)->d);
    case DType::IQ4_XS: {
      const auto& b = *reinterpret_cast<const BlockIQ4_XS*>(src);
      put16(0, b.d);
      for (int j = 0; j < 8; ++j) rec[32 + 16 * j + c] = uint8_t(int8_t(iq4xs_scale(b, j)));
      return;
    }
    default:
      throw std::logic_error("block_scales: not a quantized type");
  }
}

// The codes u[0..31] of row c into a 32-element group's codes g (packed.h's layout).
template <int Bits>
void put_group(uint8_t* g, int c, const uint8_t* u) {
  if constexpr (Bits == 8) {
    for (int kg = 0; kg < 8; ++kg) std::memcpy(g + 64 * kg + 4 * c, u + 4 * kg, 4);
    return;
  }
  for (int t = 0; t < 4; ++t)  // k-groups 2t (low nibbles) and 2t + 1 (high)
    for (int j = 0; j < 4; ++j)
      g[64 * t + 4 * c + j] = uint8_t((u[8 * t + j] & 15) | (u[8 * t + 4 + j] & 15) << 4);
  for (int kg = 0; kg < 8; ++kg)
    for (int j = 0; j < 4; ++j) {
      const int lane = 4 * c + j, hi = u[4 * kg + j] >> 4;
      if constexpr (Bits == 5) g[256 + 8 * kg + lane / 8] |= uint8_t((hi & 1) << (lane % 8));
      if constexpr (Bits == 6) g[256 + 64 * (kg / 4) + lane] |= uint8_t((hi & 3) << (2 * (kg % 4)));
    }
}

void put_group(DType t, uint8_t* g, int c, const uint8_t* u) {
  switch (code_bits(t)) {
    case 8:
      return put_group<8>(g, c, u);
    case 6:
      return put_group<6>(g, c, u);
    case 5:
      return put_group<5>(g, c, u);
    default:
      return put_group<4>(g, c, u);
  }
}

uint8_t get_code(DType t, const uint8_t* g, int c, int e) {
  const int kg = e / 4, j = e % 4, lane = 4 * c + j;
  if (code_bits(t) == 8) return g[64 * kg + lane];
  int u = (g[64 * (kg / 2) + lane] >> (4 * (kg % 2))) & 15;
  if (code_bits(t) == 5) u |= ((g[256 + 8 * kg + lane / 8] >> (lane % 8)) & 1) << 4;
  if (code_bits(t) == 6) u |= ((g[256 + 64 * (kg / 4) + lane] >> (2 * (kg % 4))) & 3) << 4;
  return uint8_t(u);
}

}  // namespace

AlignedBytes pack_matrix(const Weight& w, PackedMatrix& m) {
  const DType t = w.dtype;
  m.dtype = t;
  m.n_out = w.n_out;
  m.n_in = w.n_in;
  m.n_panels = (w.n_out + kPanel - 1) / kPanel;
  size_t scales = 0;
  switch (t) {
    case DType::F32:
      m.k_pad = w.n_in;
      m.codes_bytes = round64(size_t(m.k_pad) * 64);
      break;
    case DType::F16:
      m.k_pad = w.n_in;
      m.codes_bytes = round64(size_t(m.k_pad) * 32);
      break;
    case DType::BF16:
      m.k_pad = (w.n_in + 1) / 2 * 2;
      m.codes_bytes = round64(size_t(m.k_pad) * 32);
      break;
    default: {
      if (!code_bits(t))
        throw std::runtime_error(std::string("CPU matmul: unsupported weight type ") +
                                 dtype_name(t));
      if (w.n_in % scale_block(t))
        throw std::runtime_error("CPU matmul: row length not a whole number of blocks");
      m.k_pad = w.n_in;
      m.codes_bytes = round64(size_t(m.k_pad / 32) * group_code_bytes(t));
      scales = round64(size_t(m.k_pad / scale_block(t)) * scale_block_bytes(t));
    }
  }
  m.panel_bytes = m.codes_bytes + scales;
  // Each panel is zeroed (padding, or-ed bits) by the thread that fills it, while it is in cache.
  AlignedBytes buf = aligned_bytes(size_t(m.n_panels) * m.panel_bytes, false);
  m.data = buf.get();
  const int64_t n_in = w.n_in;
#pragma omp parallel for schedule(static) num_threads(n_threads()) if (w.n_out * n_in > (1 << 20))
  for (int64_t p = 0; p < m.n_panels; ++p) {
    uint8_t* codes = m.data + size_t(p) * m.panel_bytes;
    uint8_t* sc = codes + m.codes_bytes;
    std::memset(codes, 0, m.panel_bytes);
    uint8_t u[256];
    for (int c = 0; c < kPanel; ++c) {
      const int64_t o = p * kPanel + c;
      if (o >= w.n_out) break;
      const uint8_t* row = w.row(o);
      switch (t) {
        case DType::F32:
          for (int64_t k = 0; k < n_in; ++k) std::memcpy(codes + k * 64 + 4 * c, row + 4 * k, 4);
          break;
        case DType::F16:
          for (int64_t k = 0; k < n_in; ++k) std::memcpy(codes + k * 32 + 2 * c, row + 2 * k, 2);
          break;
        case DType::BF16:
          for (int64_t k = 0; k < n_in; ++k)
            std::memcpy(codes + (k / 2) * 64 + 4 * c + 2 * (k % 2), row + 2 * k, 2);
          break;
        default: {
          const int bs = scale_block(t);
          const size_t bb = traits(t).block_bytes, sb = scale_block_bytes(t);
          for (int64_t b = 0; b < n_in / bs; ++b) {
            block_codes(t, row + size_t(b) * bb, u);
            block_scales(t, row + size_t(b) * bb, sc + size_t(b) * sb, c);
            for (int e = 0; e < bs; e += 32)
              put_group(t, codes + size_t((b * bs + e) / 32) * group_code_bytes(t), c, u + e);
          }
        }
      }
    }
  }
  return buf;
}

void unpack_row(const PackedMatrix& m, int64_t o, float* out) {
  const DType t = m.dtype;
  const int64_t p = o / kPanel;
  const int c = int(o % kPanel);
  const uint8_t* codes = m.panel(p);
  const uint8_t* sc = m.scales(p);
  auto f16 = [&](const uint8_t* rec, size_t off) {
    uint16_t h;
    std::memcpy(&h, rec + off + 2 * size_t(c), 2);
    return f16_to_f32(h);
  };
  for (int64_t k = 0; k < m.n_in; ++k) {
    if (t == DType::F32) {
      std::memcpy(out + k, codes + k * 64 + 4 * c, 4);
      continue;
    }
    if (t == DType::F16 || t == DType::BF16) {
      uint16_t h;
      std::memcpy(
          &h, t == DType::F16 ? codes + k * 32 + 2 * c : codes + (k / 2) * 64 + 4 * c + 2 * (k % 2),
          2);
      out[k] = t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
      continue;
    }
    const int u = get_code(t, codes + size_t(k / 32) * group_code_bytes(t), c, int(k % 32));
    const uint8_t* rec = sc + size_t(k / scale_block(t)) * scale_block_bytes(t);
    const int e = int(k % scale_block(t));
    switch (t) {
      case DType::Q4_0:
        out[k] = float(u - 8) * f16(rec, 0);
        break;
      case DType::Q5_0:
        out[k] = float(u - 16) * f16(rec, 0);
        break;
      case DType::Q8_0:
        out[k] = float(u - 128) * f16(rec, 0);
        break;
      case DType::Q4_1:
      case DType::Q5_1:
        out[k] = float(u) * f16(rec, 0) + f16(rec, 32);
        break;
      case DType::Q4_K:
      case DType::Q5_K: {
        const float d1 = f16(rec, 0) * float(rec[64 + 16 * (e / 32) + c]);
        const float m1 = f16(rec, 32) * float(rec[192 + 16 * (e / 32) + c]);
        out[k] = d1 * float(u) - m1;
        break;
      }
      case DType::Q6_K:
        out[k] = f16(rec, 0) * float(int8_t(rec[32 + 16 * (e / 16) + c])) * float(u - 32);
        break;
      case DType::Q3_K:
        out[k] = f16(rec, 0) * float(int8_t(rec[32 + 16 * (e / 16) + c])) * float(u - 4);
        break;
      case DType::Q2_K: {
        const float d1 = f16(rec, 0) * float(rec[64 + 16 * (e / 16) + c]);
        const float m1 = f16(rec, 32) * float(rec[320 + 16 * (e / 16) + c]);
        out[k] = d1 * float(u) - m1;
        break;
      }
      case DType::IQ4_NL:
        out[k] = f16(rec, 0) * float(kIq4Values[u]);
        break;
      case DType::IQ4_XS:
        out[k] = f16(rec, 0) * float(int8_t(rec[32 + 16 * (e / 32) + c])) * float(kIq4Values[u]);
        break;
      default:
        throw std::logic_error("unpack_row");
    }
  }
}

bool can_pack(DType t, int64_t n_in) {
  if (t == DType::F32 || t == DType::F16 || t == DType::BF16) return true;
  return code_bits(t) > 0 && n_in % scale_block(t) == 0;
}

PackedWeight pack_weight(const Weight& w) {
  PackedWeight p;
  p.m.path = choose_path(w.dtype, simd());
  p.bytes = pack_matrix(w, p.m);
  return p;
}

namespace {

MatmulMode mode_from_env() {
  const char* e = std::getenv("WICK_MATMUL");
  const std::string m = e ? e : "";
  if (m.empty()) return MatmulMode::Default;
  if (m == "exact") return MatmulMode::Exact;
  if (m == "fast") return MatmulMode::Fast;
  throw std::runtime_error("WICK_MATMUL=" + m + ": not one of exact, fast");
}

std::atomic<MatmulMode>& mode_slot() {
  static std::atomic<MatmulMode> mode{mode_from_env()};
  return mode;
}

}  // namespace

MatmulMode matmul_mode() {
  return mode_slot().load(std::memory_order_relaxed);
}
void set_matmul_mode(MatmulMode m) {
  mode_slot().store(m, std::memory_order_relaxed);
}

GemmPath choose_path(DType t, const SimdKernels& k) {
  const MatmulMode mode = matmul_mode();
  if (t == DType::BF16)  // bf16 activations, as llama.cpp: see packed.h for the error
    return mode != MatmulMode::Exact && k.bf16_dp ? GemmPath::BF16 : GemmPath::F32;
  if (!code_bits(t)) return GemmPath::F32;  // f32, f16
  if (mode == MatmulMode::Exact) return GemmPath::F32;
  if (mode == MatmulMode::Fast) return GemmPath::I8;
  // SmolLM2's types: its logits are held to 1e-4 of a float64 forward, and int8 activations
  // in its Q4_1 layers or its Q8_0 output matrix alone give 5.8e-2.
  return t == DType::Q4_1 || t == DType::Q8_0 ? GemmPath::I8X3 : GemmPath::I8;
}

}  // namespace wick::cpu
