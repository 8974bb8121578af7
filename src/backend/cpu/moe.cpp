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
    // The k first of the descending order, ties to the lower id (a total order, so partial_sort
    // picks what a stable sort would; 8 of 128 without sorting the rest).
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [](int32_t a, int32_t b) {
      const float ra = r[size_t(a)], rb = r[size_t(b)];
      return ra > rb || (ra == rb && a < b);
    });
    float top = 0.f;
    for (int64_t j = 0; j < k; ++j) top += r[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const float p = r[size_t(order[size_t(j)])];
      ids[t * k + j] = order[size_t(j)];
      w[t * k + j] = norm ? p / top : p;
    }
  }
}

// Each expert runs once on the rows routed to it. Experts are taken in groups of about
// kGroupRows routed rows; a group's gate/up products run in one parallel region and its down
// products in another (a decode step's experts in two regions, not two each). Rows are summed
// into out in expert order, each expert's in routing order.
void moe_mlp(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens, int64_t k,
             const int32_t* ids, const float* w, float* out, MoeScratch& s) {
  constexpr int64_t kGroupRows = 256;
  const int64_t D = experts[0].down.n_out, F = experts[0].gate.n_out;
  const int64_t n_expert = int64_t(experts.size()), n_routed = n_tokens * k;
  std::fill(out, out + n_tokens * D, 0.f);
  // The routed rows sorted by expert (a counting sort, stable in routing order).
  s.first.assign(size_t(n_expert + 1), 0);
  for (int64_t i = 0; i < n_routed; ++i) ++s.first[size_t(ids[i]) + 1];
  for (int64_t e = 0; e < n_expert; ++e) s.first[size_t(e + 1)] += s.first[size_t(e)];
  s.rows.resize(size_t(n_routed));
  s.row_w.resize(size_t(n_routed));
  s.next.assign(s.first.begin(), s.first.end() - 1);
  for (int64_t i = 0; i < n_routed; ++i) {
    const int32_t at = s.next[size_t(ids[i])]++;
    s.rows[size_t(at)] = int32_t(i / k);
    s.row_w[size_t(at)] = w[i];
  }
  for (int64_t e0 = 0; e0 < n_expert;) {
    // Experts [e0, e1): routed rows [r0, r1) of the sorted order.
    const int64_t r0 = s.first[size_t(e0)];
    int64_t e1 = e0 + 1;
    while (e1 < n_expert && s.first[size_t(e1 + 1)] - r0 <= kGroupRows) ++e1;
    const int64_t r1 = s.first[size_t(e1)], n = r1 - r0;
    if (n > 0) {
      grow(s.x, n * D);
      grow(s.gate, n * F);
      grow(s.up, n * F);
      grow(s.out, n * D);
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(x + int64_t(s.rows[size_t(r0 + i)]) * D, D, s.x.data() + i * D);
      s.jobs.clear();
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t at = s.first[size_t(e)] - r0, n_e = s.first[size_t(e + 1)] - r0 - at;
        if (n_e == 0) continue;
        const ExpertWeights& xw = experts[size_t(e)];
        s.jobs.push_back({&xw.gate, s.x.data() + at * D, n_e, s.gate.data() + at * F});
        s.jobs.push_back({&xw.up, s.x.data() + at * D, n_e, s.up.data() + at * F});
      }
      matmul_many(s.jobs);
      silu_mul(s.gate.data(), s.up.data(), n * F);
      s.jobs.clear();
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t at = s.first[size_t(e)] - r0, n_e = s.first[size_t(e + 1)] - r0 - at;
        if (n_e > 0)
          s.jobs.push_back(
              {&experts[size_t(e)].down, s.gate.data() + at * F, n_e, s.out.data() + at * D});
      }
      matmul_many(s.jobs);
      for (int64_t i = 0; i < n; ++i) {
        float* dst = out + int64_t(s.rows[size_t(r0 + i)]) * D;
        const float* src = s.out.data() + i * D;
        const float rw = s.row_w[size_t(r0 + i)];
        for (int64_t j = 0; j < D; ++j) dst[j] += src[j] * rw;
      }
    }
    e0 = e1;
  }
}

}  // namespace wick::cpu
