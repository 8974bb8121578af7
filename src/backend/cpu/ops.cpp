#include "backend/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_limit.h"
#include "backend/cpu/simd.h"
#include "io/quantize.h"

namespace wick::cpu {

namespace {
int g_n_threads = 0;

// Prefill makes these ops long enough (hundreds of rows) that one thread doing them while the
// others wait at the next matmul shows in the profile. They are per row or per element, so
// splitting [0, n) across the threads changes no bits; pieces start at multiples of `align`
// so that every element takes the same vector or tail path as in one piece.
constexpr int64_t kParallelMin = 32768;  // elements below which the fork costs more than it saves

template <class F>
void for_ranges(int64_t n, int64_t align, int64_t elems, F f) {
  const int nt = elems >= kParallelMin ? n_threads() : 1;
  if (nt == 1) return f(int64_t(0), n);
  const int64_t units = (n + align - 1) / align;
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), m = omp_get_num_threads();
    const int64_t b = std::min(n, units * t / m * align),
                  e = std::min(n, units * (t + 1) / m * align);
    if (b < e) f(b, e);
  }
}
}  // namespace

float* thread_buf(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

void set_n_threads(int n) {
  g_n_threads = n > 0 ? n : default_n_threads(omp_get_num_procs(), process_cpu_limit());
  omp_set_num_threads(g_n_threads);
}

int n_threads() {
  return g_n_threads > 0 ? g_n_threads : omp_get_max_threads();
}

void embed(const Weight& tok, const int32_t* ids, int64_t n, float* out) {
  const auto& k = simd();
  for (int64_t i = 0; i < n; ++i)
    k.dequant_row(tok.dtype, tok.row(ids[i]), out + i * tok.n_in, tok.n_in);
}

void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  for_ranges(n_rows, 1, n_rows * n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
      const float inv = 1.f / std::sqrt(float(ss / double(n)) + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
  });
}

void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) {
  for_ranges(n_rows, 1, n_rows * n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = 0; i < n; ++i) y[r * n + i] += b[i];
  });
}

void add(float* y, const float* x, int64_t n) {
  for_ranges(n, 64, n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] += x[i];
  });
}

void scale(float* x, float s, int64_t n) {
  for_ranges(n, 64, n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] *= s;
  });
}

void silu_mul(float* gate, const float* up, int64_t n) {
  const auto& k = simd();
  for_ranges(n, 64, n, [&](int64_t i0, int64_t i1) { k.silu_mul(gate + i0, up + i0, i1 - i0); });
}

void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          const float* inv_freq) {
  const int64_t half = head_dim / 2;
  for_ranges(n_rows, 1, n_rows * n_heads * head_dim, [&](int64_t r0, int64_t r1) {
    float* cs = thread_buf(size_t(head_dim));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = float(pos[r]) * inv_freq[i];
        cs[i] = std::cos(angle);
        cs[half + i] = std::sin(angle);
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (r * n_heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cs[i] - b * cs[half + i];
          v[i + half] = b * cs[i] + a * cs[half + i];
        }
      }
    }
  });
}

void kv_write(void* k_layer, void* v_layer, DType dtype, int64_t kv_dim, const int32_t* slots,
              int64_t n, const float* k, const float* v) {
  const int64_t d = kv_dim;
  const size_t row_b = row_bytes(dtype, d);
  for (int64_t t = 0; t < n; ++t) {
    const size_t at = size_t(slots[t]) * row_b;
    auto* kc = static_cast<uint8_t*>(k_layer) + at;
    auto* vc = static_cast<uint8_t*>(v_layer) + at;
    if (dtype == DType::F16) {
      simd().f16_from_f32(k + t * d, reinterpret_cast<uint16_t*>(kc), d);
      simd().f16_from_f32(v + t * d, reinterpret_cast<uint16_t*>(vc), d);
    } else if (dtype == DType::BF16) {  // to nearest even, as the activations' rows
      auto *kh = reinterpret_cast<uint16_t*>(kc), *vh = reinterpret_cast<uint16_t*>(vc);
      for (int64_t i = 0; i < d; ++i) {
        kh[i] = f32_to_bf16(k[t * d + i]);
        vh[i] = f32_to_bf16(v[t * d + i]);
      }
    } else if (dtype == DType::Q8_0) {
      quantize_row(DType::Q8_0, k + t * d, kc, d);
      quantize_row(DType::Q8_0, v + t * d, vc, d);
    } else {
      std::memcpy(kc, k + t * d, row_b);
      std::memcpy(vc, v + t * d, row_b);
    }
  }
}

void kv_deviation(const void* k_layer, const void* v_layer, DType dtype, int64_t kv_dim,
                  const int32_t* slots, int64_t n, const float* k, const float* v, float* out) {
  const int64_t d = kv_dim;
  const size_t row_b = row_bytes(dtype, d);
  std::vector<float> rows(dtype != DType::F32 ? size_t(2 * d) : 0);
  for (int64_t t = 0; t < n; ++t) {
    const auto* kb = static_cast<const uint8_t*>(k_layer) + size_t(slots[t]) * row_b;
    const auto* vb = static_cast<const uint8_t*>(v_layer) + size_t(slots[t]) * row_b;
    const float *kc = reinterpret_cast<const float*>(kb), *vc = reinterpret_cast<const float*>(vb);
    if (dtype != DType::F32) {  // the rows widened, as attention reads them
      simd().dequant_row(dtype, kb, rows.data(), d);
      simd().dequant_row(dtype, vb, rows.data() + d, d);
      kc = rows.data();
      vc = rows.data() + d;
    }
    float sum = 0.f;
    for (int64_t i = 0; i < d; ++i) {
      const float dk = k[t * d + i] - kc[i], dv = v[t * d + i] - vc[i];
      sum += dk * dk + dv * dv;
    }
    out[t] = sum;
  }
}

}  // namespace wick::cpu
