#include "engine/span_blend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace wick {

std::vector<int32_t> choose_span_rows(std::span<const float> deviation, int32_t n_tokens,
                                      int32_t n_first, float fraction) {
  if (!deviation.empty() && int32_t(deviation.size()) != n_tokens)
    throw std::logic_error("choose_span_rows: one deviation per token");
  const int32_t first = std::clamp(n_first, 0, n_tokens);
  std::vector<int32_t> rows(size_t(n_tokens - first));
  std::iota(rows.begin(), rows.end(), first);
  // a hair below the product, so that 0.15 * 100 takes 15, not 16
  const double want = std::ceil(double(fraction) * double(n_tokens) - 1e-6);
  const size_t n_more = deviation.empty() ? 0 : size_t(std::clamp(want, 0.0, double(rows.size())));
  if (n_more > 0) {
    auto key = [&](int32_t i) {  // NaN (a broken row) counts as the largest: computed again
      const float d = deviation[size_t(i)];
      return std::isnan(d) ? INFINITY : d;
    };
    std::stable_sort(rows.begin(), rows.end(),
                     [&](int32_t a, int32_t b) { return key(a) > key(b); });
  }
  rows.resize(n_more);
  for (int32_t i = 0; i < first; ++i) rows.push_back(i);
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace wick
