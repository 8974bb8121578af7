#include "backend/cuda/repack.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "io/quant_blocks.h"

namespace wick::cuda {

namespace {

int32_t round_up(int64_t n, int64_t m) {
  return int32_t((n + m - 1) / m * m);
}

// One block as integer levels and per-group (scale, min): value = q * scale - min,
// bit-exact with dequant_block (see each case).
struct Levels {
  int8_t q[256];
  float scale[16], min[16];
};

void levels(const BlockQ4_0& b, Levels& l) {  // (q - 8) d == q d - 8 d exactly
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    l.q[j] = int8_t(b.qs[j] & 15);
    l.q[j + 16] = int8_t(b.qs[j] >> 4);
  }
  l.scale[0] = d;
  l.min[0] = 8.f * d;
}
void levels(const BlockQ4_1& b, Levels& l) {  // q d + m
  for (int j = 0; j < 16; ++j) {
    l.q[j] = int8_t(b.qs[j] & 15);
    l.q[j + 16] = int8_t(b.qs[j] >> 4);
  }
  l.scale[0] = f16_to_f32(b.d);
  l.min[0] = -f16_to_f32(b.m);
}
void levels(const BlockQ5_0& b, Levels& l) {
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < 16; ++j) {
    l.q[j] = int8_t(((b.qs[j] & 15) | (((qh >> j) << 4) & 0x10)) - 16);
    l.q[j + 16] = int8_t(((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16);
  }
  l.scale[0] = f16_to_f32(b.d);
  l.min[0] = 0.f;
}
void levels(const BlockQ5_1& b, Levels& l) {
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < 16; ++j) {
    l.q[j] = int8_t((b.qs[j] & 15) | (((qh >> j) << 4) & 0x10));
    l.q[j + 16] = int8_t((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
  }
  l.scale[0] = f16_to_f32(b.d);
  l.min[0] = -f16_to_f32(b.m);
}
void levels(const BlockQ8_0& b, Levels& l) {
  for (int j = 0; j < 32; ++j) l.q[j] = b.qs[j];
  l.scale[0] = f16_to_f32(b.d);
  l.min[0] = 0.f;
}
void levels(const BlockQ4_K& b, Levels& l) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int j = 0; j < 4; ++j) {  // 64 weights per 32 bytes: low nibbles, then high
    for (int h = 0; h < 2; ++h) {
      uint8_t sc, m;
      k_scale_min(2 * j + h, b.scales, sc, m);
      l.scale[2 * j + h] = d * float(sc);
      l.min[2 * j + h] = dmin * float(m);
    }
    for (int i = 0; i < 32; ++i) {
      l.q[64 * j + i] = int8_t(b.qs[32 * j + i] & 15);
      l.q[64 * j + 32 + i] = int8_t(b.qs[32 * j + i] >> 4);
    }
  }
}
void levels(const BlockQ5_K& b, Levels& l) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int j = 0; j < 4; ++j) {
    for (int h = 0; h < 2; ++h) {
      uint8_t sc, m;
      k_scale_min(2 * j + h, b.scales, sc, m);
      l.scale[2 * j + h] = d * float(sc);
      l.min[2 * j + h] = dmin * float(m);
    }
    const uint8_t u1 = uint8_t(1 << (2 * j)), u2 = uint8_t(2 << (2 * j));
    for (int i = 0; i < 32; ++i) {
      l.q[64 * j + i] = int8_t((b.qs[32 * j + i] & 15) + (b.qh[i] & u1 ? 16 : 0));
      l.q[64 * j + 32 + i] = int8_t((b.qs[32 * j + i] >> 4) + (b.qh[i] & u2 ? 16 : 0));
    }
  }
}
void levels(const BlockQ6_K& b, Levels& l) {  // (d sc) q: the CPU's d * sc * q
  const float d = f16_to_f32(b.d);
  for (int g = 0; g < 16; ++g) {
    l.scale[g] = d * float(b.scales[g]);
    l.min[g] = 0.f;
  }
  for (int n = 0; n < 2; ++n) {
    const uint8_t* ql = b.ql + 64 * n;
    const uint8_t* qh = b.qh + 32 * n;
    for (int i = 0; i < 32; ++i) {
      l.q[128 * n + i] = int8_t(((ql[i] & 15) | ((qh[i] & 3) << 4)) - 32);
      l.q[128 * n + i + 32] = int8_t(((ql[i + 32] & 15) | (((qh[i] >> 2) & 3) << 4)) - 32);
      l.q[128 * n + i + 64] = int8_t(((ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4)) - 32);
      l.q[128 * n + i + 96] = int8_t(((ql[i + 32] >> 4) | (((qh[i] >> 6) & 3) << 4)) - 32);
    }
  }
}

void levels(const BlockQ2_K& b, Levels& l) {  // (d sc) q - dmin m per 16
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int g = 0; g < 16; ++g) {
    l.scale[g] = d * float(b.scales[g] & 15);
    l.min[g] = dmin * float(b.scales[g] >> 4);
  }
  for (int e = 0; e < 256; ++e) l.q[e] = int8_t(q2k_code(b, e));
}
void levels(const BlockQ3_K& b, Levels& l) {  // (d (sc - 32)) q per 16
  const float d = f16_to_f32(b.d);
  for (int g = 0; g < 16; ++g) {
    l.scale[g] = d * float(q3k_scale(b, g));
    l.min[g] = 0.f;
  }
  for (int e = 0; e < 256; ++e) l.q[e] = int8_t(q3k_code(b, e));
}
void levels(const BlockIQ4_NL& b, Levels& l) {  // the level (an int8) times d
  for (int j = 0; j < 16; ++j) {
    l.q[j] = kIq4Values[b.qs[j] & 15];
    l.q[j + 16] = kIq4Values[b.qs[j] >> 4];
  }
  l.scale[0] = f16_to_f32(b.d);
  l.min[0] = 0.f;
}
void levels(const BlockIQ4_XS& b, Levels& l) {  // the level times d (ls - 32) per 32
  const float d = f16_to_f32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    l.scale[ib] = d * float(iq4xs_scale(b, ib));
    l.min[ib] = 0.f;
    for (int j = 0; j < 16; ++j) {
      l.q[32 * ib + j] = kIq4Values[b.qs[16 * ib + j] & 15];
      l.q[32 * ib + j + 16] = kIq4Values[b.qs[16 * ib + j] >> 4];
    }
  }
}

template <typename Block>
void repack_int(const Weight& w, Repacked& r, int block_elems, int group, bool nibbles) {
  r.fmt = nibbles ? Fmt::U4 : Fmt::I8;
  r.group = group;
  r.k_pad = round_up(w.n_in, k_chunk(r.fmt));
  const int64_t n_groups = r.k_pad / group, row_q = nibbles ? r.k_pad / 2 : r.k_pad;
  r.q.assign(size_t(w.n_out * row_q), 0);
  r.scale.assign(size_t(w.n_out * n_groups), 0.f);
  r.min.assign(size_t(w.n_out * n_groups), 0.f);
  bool any_min = false;
  Levels l;
  for (int64_t o = 0; o < w.n_out; ++o) {
    const auto* blocks = reinterpret_cast<const Block*>(w.row(o));
    uint8_t* qrow = r.q.data() + o * row_q;
    for (int64_t bi = 0; bi < w.n_in / block_elems; ++bi) {
      levels(blocks[bi], l);
      for (int g = 0; g < block_elems / group; ++g) {
        const int64_t gi = o * n_groups + (bi * block_elems) / group + g;
        r.scale[size_t(gi)] = l.scale[g];
        r.min[size_t(gi)] = l.min[g];
        any_min |= l.min[g] != 0.f;
      }
      for (int i = 0; i < block_elems; ++i) {
        const int64_t k = bi * block_elems + i;
        if (nibbles)
          qrow[k / 2] |= uint8_t((uint8_t(l.q[i]) & 15) << (4 * (k % 2)));
        else
          qrow[k] = uint8_t(l.q[i]);
      }
    }
  }
  // Q4_0's min is 8 d: the kernels compute it rather than read 4 more bytes a group
  bool min8 = any_min;
  for (size_t i = 0; min8 && i < r.min.size(); ++i) min8 = r.min[i] == 8.f * r.scale[i];
  r.min8 = min8;
  if (!any_min || min8) r.min.clear();
}

template <typename T>
void repack_dense(const Weight& w, Repacked& r, Fmt fmt, int align, T (*conv)(const uint8_t*)) {
  r.fmt = fmt;
  r.k_pad = round_up(w.n_in, align);
  r.q.assign(size_t(w.n_out) * size_t(r.k_pad) * sizeof(T), 0);
  for (int64_t o = 0; o < w.n_out; ++o) {
    const uint8_t* src = w.row(o);
    T* dst = reinterpret_cast<T*>(r.q.data()) + o * r.k_pad;
    const size_t in_bytes = traits(w.dtype).block_bytes;
    for (int64_t i = 0; i < w.n_in; ++i) dst[i] = conv(src + size_t(i) * in_bytes);
  }
}

uint16_t copy16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float copy32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t f32_bf16(const uint8_t* p) {
  return f32_to_bf16(copy32(p));
}

}  // namespace

Repacked repack(const Weight& w, bool keep_f32) {
  Repacked r;
  r.n_out = int32_t(w.n_out);
  r.n_in = int32_t(w.n_in);
  switch (w.dtype) {
    case DType::F32:
      if (keep_f32)
        repack_dense<float>(w, r, Fmt::F32, 4, copy32);
      else
        repack_dense<uint16_t>(w, r, Fmt::BF16, k_chunk(Fmt::BF16), f32_bf16);
      break;
    case DType::BF16:
      repack_dense<uint16_t>(w, r, Fmt::BF16, k_chunk(Fmt::BF16), copy16);
      break;
    case DType::F16:
      repack_dense<uint16_t>(w, r, Fmt::F16, k_chunk(Fmt::F16), copy16);
      break;
    case DType::Q4_0:
      repack_int<BlockQ4_0>(w, r, 32, 32, true);
      break;
    case DType::Q4_1:
      repack_int<BlockQ4_1>(w, r, 32, 32, true);
      break;
    case DType::Q4_K:
      repack_int<BlockQ4_K>(w, r, 256, 32, true);
      break;
    case DType::Q5_0:
      repack_int<BlockQ5_0>(w, r, 32, 32, false);
      break;
    case DType::Q5_1:
      repack_int<BlockQ5_1>(w, r, 32, 32, false);
      break;
    case DType::Q5_K:
      repack_int<BlockQ5_K>(w, r, 256, 32, false);
      break;
    case DType::Q8_0:
      repack_int<BlockQ8_0>(w, r, 32, 32, false);
      break;
    case DType::Q6_K:
      repack_int<BlockQ6_K>(w, r, 256, 16, false);
      break;
    case DType::Q2_K:
      repack_int<BlockQ2_K>(w, r, 256, 16, false);
      break;
    case DType::Q3_K:
      repack_int<BlockQ3_K>(w, r, 256, 16, false);
      break;
    case DType::IQ4_NL:
      repack_int<BlockIQ4_NL>(w, r, 32, 32, false);
      break;
    case DType::IQ4_XS:
      repack_int<BlockIQ4_XS>(w, r, 256, 32, false);
      break;
    default:
      throw std::invalid_argument(std::string("no CUDA layout for weights of type ") +
                                  dtype_name(w.dtype));
  }
  return r;
}

float repacked_value(const Repacked& r, int64_t row, int64_t i) {
  switch (r.fmt) {
    case Fmt::F32:
      return reinterpret_cast<const float*>(r.q.data())[row * r.k_pad + i];
    case Fmt::BF16:
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(r.q.data())[row * r.k_pad + i]);
    case Fmt::F16:
      return f16_to_f32(reinterpret_cast<const uint16_t*>(r.q.data())[row * r.k_pad + i]);
    default: {
      const int64_t gi = row * (r.k_pad / r.group) + i / r.group;
      float q;
      if (r.fmt == Fmt::I8) {
        q = float(int8_t(r.q[size_t(row * r.k_pad + i)]));
      } else {
        const uint8_t byte = r.q[size_t((row * r.k_pad + i) / 2)];
        q = float(i % 2 ? byte >> 4 : byte & 15);
      }
      const float m = r.min8 ? 8.f * r.scale[size_t(gi)] : r.min.empty() ? 0.f : r.min[size_t(gi)];
      // two roundings, as the kernels' __fmul_rn / __fsub_rn
      volatile float prod = q * r.scale[size_t(gi)];
      return prod - m;
    }
  }
}

}  // namespace wick::cuda
