// Helpers for the GPU tests: skip without a GPU, a CUDA backend, random data.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
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
