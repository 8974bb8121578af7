// Helpers for the GPU tests: skip without a GPU, a CUDA backend, random data.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "io/dtype.h"
#include "random_weight.h"

namespace wick::test {

#define WICK_REQUIRE_GPU()                                                     \
  do {                                                                         \
    if (::wick::cuda_device_count() == 0)                                      \
      GTEST_SKIP() << "no CUDA GPU visible (" << ::wick::cuda_status() << ")"; \
  } while (0)

// The CUDA device with half its memory; gpu_f32 keeps f32 weights, K/V and
// attention (no CUDA graphs then), else bf16 weights and f16 K/V as served.
inline BackendOptions cuda_opts(bool gpu_f32) {
  BackendOptions o;
  o.device = Device::Cuda;
  o.gpu_f32 = gpu_f32;
  o.gpu_memory_fraction = 0.5;
  return o;
}

inline std::unique_ptr<Backend> cuda_backend(bool gpu_f32 = false) {
  return make_backend(cuda_opts(gpu_f32));
}
// bf16 weights and a q8_0 KV cache (--kv-cache-dtype q8_0).
inline BackendOptions cuda_q8_opts() {
  BackendOptions o = cuda_opts(false);
  o.kv_cache_dtype = "q8_0";
  return o;
}
inline std::unique_ptr<Backend> cuda_backend_q8() {
  return make_backend(cuda_q8_opts());
}

// Slot rows of kv_dim values as a layer of the GPU's q8_0 cache holds them
// (kernels.h's KvLayer): each row quantize_row_q8_0'd, then the int8 plane
// [n_slots][kv_dim] and the f16 scales' plane [n_slots][kv_dim / 32].
inline std::vector<uint8_t> q8_cache_planes(const std::vector<float>& rows, int64_t kv_dim) {
  const size_t n_slots = rows.size() / size_t(kv_dim), nb = size_t(kv_dim / 32);
  std::vector<uint8_t> out(n_slots * size_t(kv_dim) + n_slots * nb * 2);
  std::vector<uint8_t> blocks(nb * 34);
  for (size_t s = 0; s < n_slots; ++s) {
    quantize_row_q8_0(rows.data() + s * size_t(kv_dim), blocks.data(), kv_dim);
    for (size_t b = 0; b < nb; ++b) {
      std::memcpy(&out[s * size_t(kv_dim) + 32 * b], &blocks[34 * b + 2], 32);
      std::memcpy(&out[n_slots * size_t(kv_dim) + 2 * (s * nb + b)], &blocks[34 * b], 2);
    }
  }
  return out;
}
// The values those planes hold: q d in f32 (exact).
inline std::vector<float> q8_cache_values(const std::vector<uint8_t>& planes, int64_t kv_dim) {
  const size_t n_slots = planes.size() / (size_t(kv_dim) + size_t(kv_dim) / 16);
  std::vector<float> out(n_slots * size_t(kv_dim));
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t d;
    std::memcpy(&d, &planes[n_slots * size_t(kv_dim) + 2 * (i / 32)], 2);
    out[i] = float(int8_t(planes[i])) * f16_to_f32(d);
  }
  return out;
}

// A host vector copied to a new device buffer, and back.
inline Buffer to_device(Backend& be, const void* p, size_t bytes) {
  Buffer b = be.alloc(bytes);
  be.copy_to_device(b.data(), p, bytes);
  return b;
}
template <typename T>
std::vector<T> to_host(Backend& be, const Buffer& b, size_t n) {
  std::vector<T> v(n);
  be.copy_to_host(v.data(), b.data(), n * sizeof(T));
  return v;
}

// y [n_rows][n_out] against the float64 product of the CPU's dequantized
// weights (host) and x [n_rows][n_in]: the largest |y - ref| / sum |w x|,
// and where it is.
struct ProductError {
  double worst = 0;
  int64_t row = 0, col = 0;
  double got = 0, ref = 0;
};
inline ProductError product_error(const Weight& host, const std::vector<float>& x, int64_t n_rows,
                                  const std::vector<float>& y) {
  ProductError e;
  const int64_t n_in = host.n_in, n_out = host.n_out;
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    dequantize_row_ref(host.dtype, host.row(o), row.data(), n_in);
    for (int64_t r = 0; r < n_rows; ++r) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double p = double(row[size_t(i)]) * x[size_t(r * n_in + i)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = y[size_t(r * n_out + o)], err = std::fabs(got - ref) / (mag + 1e-30);
      if (err > e.worst) e = ProductError{err, r, o, got, ref};
    }
  }
  return e;
}

// Rows [50, 50 + m) of x alone, for each m, give the bits of the same rows
// of y, the product of all of x (the batch invariance of w's products).
inline void expect_rows_alone_equal(Backend& be, const Weight& w, const Buffer& dx, int64_t n_in,
                                    const std::vector<float>& y, std::initializer_list<int64_t> ms,
                                    const std::string& what) {
  const int64_t n_out = w.n_out;
  for (int64_t m : ms) {
    Buffer dy = be.alloc(size_t(m * n_out) * 4);
    be.matmul(w, dx.as<float>() + 50 * n_in, m, dy.as<float>());
    const auto y1 = to_host<float>(be, dy, size_t(m * n_out));
    for (int64_t i = 0; i < m * n_out; ++i)
      if (y1[size_t(i)] != y[size_t(50 * n_out + i)]) {
        ADD_FAILURE() << what << ": " << m << " rows differ from the whole batch at " << i;
        break;
      }
  }
}

// Integer products of 8/4-bit weights (WICK_CUDA_INT_MMA) on or off for a scope.
struct IntProducts {
  bool was = cuda::int_products();
  explicit IntProducts(bool on) { cuda::set_int_products(on); }
  ~IntProducts() { cuda::set_int_products(was); }
};

// The norms' integer form for the products after them (cuda::set_norm_int), in a scope.
struct NormInts {
  bool was = cuda::norm_int();
  explicit NormInts(bool on) { cuda::set_norm_int(on); }
  ~NormInts() { cuda::set_norm_int(was); }
};

// E random experts on the host: gate and up [F][D] of type tg, down [D][F]
// of td (the weights point into bytes).
struct HostExperts {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<ExpertWeights> w;
};
inline HostExperts random_experts(int64_t E, int64_t D, int64_t F, DType tg, DType td,
                                  std::mt19937& rng) {
  HostExperts h;
  h.w.resize(size_t(E));
  for (ExpertWeights& e : h.w) {
    h.bytes.push_back(random_weight(tg, F, D, rng));
    e.gate = Weight{tg, F, D, h.bytes.back().data()};
    h.bytes.push_back(random_weight(tg, F, D, rng));
    e.up = Weight{tg, F, D, h.bytes.back().data()};
    h.bytes.push_back(random_weight(td, D, F, rng));
    e.down = Weight{td, D, F, h.bytes.back().data()};
  }
  return h;
}

// RoPE's inverse frequencies for heads of hd (theta 10,000).
inline std::vector<float> rope_inv_freq(int64_t hd) {
  std::vector<float> inv(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    inv[size_t(i)] = std::pow(10000.f, -2.f * float(i) / float(hd));
  return inv;
}

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace wick::test
