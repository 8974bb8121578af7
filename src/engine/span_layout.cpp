#include "engine/span_layout.h"

#include <algorithm>

#include "engine/sequence.h"

namespace wick {

std::vector<std::pair<int32_t, int32_t>> block_fills(std::span<const int32_t> tokens, int32_t bs) {
  std::vector<std::pair<int32_t, int32_t>> fills;
  for (size_t blk = 0; blk * size_t(bs) < tokens.size(); ++blk) {
    int32_t begin = bs, end = 0;
    for (int32_t i = 0; i < bs; ++i) {
      const size_t pos = blk * size_t(bs) + size_t(i);
      if (pos >= tokens.size() || tokens[pos] != kHole) {
        begin = std::min(begin, i);
        end = i + 1;
      }
    }
    fills.push_back({std::min(begin, end), end});
  }
  return fills;
}

std::vector<int32_t> span_job_tokens(std::span<const int32_t> context,
                                     std::span<const int32_t> span, int32_t bs) {
  std::vector<int32_t> t(context.begin(), context.end());
  while (t.size() % size_t(bs)) t.push_back(kHole);
  t.insert(t.end(), span.begin(), span.end());
  return t;
}

}  // namespace wick
