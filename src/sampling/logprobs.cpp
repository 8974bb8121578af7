#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace wick {

float log_sum_exp(std::span<const float> row) {
  const float mx = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(double(x - mx));
  return mx + float(std::log(sum));
}

std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> row, float lse, size_t n,
                                                    std::vector<int32_t>& order) {
  n = std::min(n, row.size());
  order.resize(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + long(n), order.end(), [&](int32_t a, int32_t b) {
    return row[size_t(a)] != row[size_t(b)] ? row[size_t(a)] > row[size_t(b)] : a < b;
  });
  std::vector<std::pair<int32_t, float>> top;
  top.reserve(n);
  for (size_t j = 0; j < n; ++j) top.emplace_back(order[j], row[size_t(order[j])] - lse);
  return top;
}

int32_t rank_of(std::span<const float> row, int32_t id) {
  const float x = row[size_t(id)];
  int32_t rank = 1;
  for (size_t j = 0; j < row.size(); ++j) rank += row[j] > x || (row[j] == x && int32_t(j) < id);
  return rank;
}

}  // namespace wick
