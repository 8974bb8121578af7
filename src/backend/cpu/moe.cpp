// Mixture-of-experts routing and expert products on the CPU.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops.h"

namespace wick::cpu {

namespace {
void grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}
}  // namespace

void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, bool norm,
               int32_t* ids, float* w) {
  thread_local std::vector<float> r;
  thread_local std::vector<int32_t> order;
  r.resize(size_t(n_expert));
  order.resize(size_t(n_expert));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::copy_n(logits + t * n_expert, n_expert, r.begin());
    const float mx = *std::max_element(r.begin(), r.end());
    float sum = 0.f;
    for (auto& x : r) sum += (x = std::exp(x - mx));
    for (auto& x : r) x /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [](int32_t a, int32_t b) { return r[size_t(a)] > r[size_t(b)]; });
    float top = 0.f;
    for (int64_t j = 0; j < k; ++j) top += r[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const float p = r[size_t(order[size_t(j)])];
      ids[t * k + j] = order[size_t(j)];
      w[t * k + j] = norm ? p / top : p;
    }
  }
}

// Each expert runs once on the rows routed to it; rows are summed into out
// in expert order.
void moe_mlp(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens, int64_t k,
             const int32_t* ids, const float* w, float* out, MoeScratch& s) {
  const int64_t D = experts[0].down.n_out, F = experts[0].gate.n_out;
  std::fill(out, out + n_tokens * D, 0.f);
  grow(s.x, n_tokens * D);
  grow(s.gate, n_tokens * F);
  grow(s.up, n_tokens * F);
  grow(s.out, n_tokens * D);
  for (int64_t e = 0; e < int64_t(experts.size()); ++e) {
    s.rows.clear();
    s.row_w.clear();
    for (int64_t i = 0; i < n_tokens * k; ++i)
      if (ids[i] == e) {
        s.rows.push_back(int32_t(i / k));
        s.row_w.push_back(w[i]);
      }
    if (s.rows.empty()) continue;
    const int64_t n = int64_t(s.rows.size());
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x + int64_t(s.rows[size_t(i)]) * D, D, s.x.data() + i * D);
    const ExpertWeights& xw = experts[size_t(e)];
    const Weight* gate_up[2] = {&xw.gate, &xw.up};
    float* ys[2] = {s.gate.data(), s.up.data()};
    matmul_shared_input(gate_up, s.x.data(), n, ys);
    silu_mul(s.gate.data(), s.up.data(), n * F);
    matmul(xw.down, s.gate.data(), n, s.out.data());
    for (int64_t i = 0; i < n; ++i) {
      float* dst = out + int64_t(s.rows[size_t(i)]) * D;
      const float* src = s.out.data() + i * D;
      const float rw = s.row_w[size_t(i)];
      for (int64_t j = 0; j < D; ++j) dst[j] += src[j] * rw;
    }
  }
}

}  // namespace wick::cpu
