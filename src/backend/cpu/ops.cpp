#include "backend/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/simd.h"

namespace wick::cpu {

namespace {
int g_n_threads = 0;

// Per-thread scratch that grows and is reused: no allocation per call.
float* thread_buf(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}
}  // namespace

void set_n_threads(int n) {
  g_n_threads = n > 0 ? n : omp_get_num_procs();
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
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float inv = 1.f / std::sqrt(float(ss / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void matmul(const Weight& w, const float* x, int64_t n_rows, float* y) {
  const auto& k = simd();
  const int64_t n_in = w.n_in, n_out = w.n_out;
  const bool direct = w.dtype == DType::F32;
  // Rows of w are split across threads; each weight row is dequantized once
  // and reused for every activation row.
#pragma omp parallel for schedule(static) \
    num_threads(n_threads()) if (n_out * n_in * n_rows > 32768)
  for (int64_t o = 0; o < n_out; ++o) {
    if (n_rows < 4) {  // decode: no pass through a buffer (same bits either way)
      float* buf = direct ? nullptr : thread_buf(size_t(n_in));
      for (int64_t r = 0; r < n_rows; ++r)
        y[r * n_out + o] = k.dot_row(w.dtype, w.row(o), x + r * n_in, n_in, buf);
      continue;
    }
    const float* wr;
    if (direct) {
      wr = reinterpret_cast<const float*>(w.row(o));
    } else {
      float* buf = thread_buf(size_t(n_in));
      k.dequant_row(w.dtype, w.row(o), buf, n_in);
      wr = buf;
    }
    for (int64_t r = 0; r < n_rows; ++r) y[r * n_out + o] = k.dot(x + r * n_in, wr, n_in);
  }
}

void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += b[i];
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          const float* inv_freq) {
  const int64_t half = head_dim / 2;
  float* cs = thread_buf(size_t(head_dim));
  for (int64_t r = 0; r < n_rows; ++r) {
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
}

void kv_write(float* k_layer, float* v_layer, int64_t kv_dim, const int32_t* slots, int64_t n,
              const float* k, const float* v) {
  const int64_t d = kv_dim;
  for (int64_t t = 0; t < n; ++t) {
    std::copy(k + t * d, k + (t + 1) * d, k_layer + int64_t(slots[t]) * d);
    std::copy(v + t * d, v + (t + 1) * d, v_layer + int64_t(slots[t]) * d);
  }
}

void attention(const float* q, const float* kl, const float* vl, int64_t kv_dim, const BatchArgs& b,
               const AttnShape& s, float* out) {
  const auto& k = simd();
  const int64_t n_tok = b.n_tokens, hd = s.head_dim, group = s.n_head / s.n_head_kv;
  const int64_t d = kv_dim, bs = b.block_size;
  const float scale = 1.f / std::sqrt(float(hd));
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(n_threads())
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t p = b.positions[t];
      const int64_t lo = s.sliding_window > 0 ? std::max<int64_t>(0, p - s.sliding_window + 1) : 0;
      const int32_t* table = b.block_table + int64_t(b.seq_of[t]) * b.max_blocks;
      auto slot = [&](int64_t j) { return int64_t(table[j / bs]) * bs + j % bs; };
      const int64_t kv_off = (h / group) * hd;
      const float* qh = q + (t * s.n_head + h) * hd;
      float* scores = thread_buf(size_t(p - lo + 1));
      float mx = -INFINITY;
      for (int64_t j = lo; j <= p; ++j) {
        const float sc = k.dot(qh, kl + slot(j) * d + kv_off, hd) * scale;
        scores[j - lo] = sc;
        mx = std::max(mx, sc);
      }
      float sum = 0.f;
      for (int64_t j = lo; j <= p; ++j) sum += (scores[j - lo] = std::exp(scores[j - lo] - mx));
      float* o = out + (t * s.n_head + h) * hd;
      std::fill(o, o + hd, 0.f);
      const float inv = 1.f / sum;
      for (int64_t j = lo; j <= p; ++j)
        k.axpy(scores[j - lo] * inv, vl + slot(j) * d + kv_off, o, hd);
    }
  }
}

}  // namespace wick::cpu
