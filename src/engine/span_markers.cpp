#include "engine/span_markers.h"

#include <fmt/format.h>

#include <charconv>
#include <stdexcept>
#include <string>

namespace wick {

SpanMarkers parse_span_markers(std::string_view text) {
  std::vector<int64_t> v;
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find(',', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(at, end - at);
    int64_t x = -1;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || x < 0 ||
        x > INT32_MAX)
      throw std::invalid_argument(fmt::format(
          "span markers '{}': '{}' is not a non-negative token id (expected PLUS,CROSS,PAD or "
          "PLUS,CROSS,PAD,BLOCK, e.g. 10,13,27)",
          text, item));
    v.push_back(x);
    at = end + 1;
  }
  if (v.size() != 3 && v.size() != 4)
    throw std::invalid_argument(fmt::format(
        "span markers '{}': expected PLUS,CROSS,PAD or PLUS,CROSS,PAD,BLOCK (got {} numbers)", text,
        v.size()));
  if (v[0] == v[1] || v[0] == v[2] || v[1] == v[2])
    throw std::invalid_argument(
        fmt::format("span markers '{}': PLUS, CROSS and PAD must be three different ids", text));
  SpanMarkers m{int32_t(v[0]), int32_t(v[1]), int32_t(v[2])};
  if (v.size() == 4) {
    if (v[3] < 1 || v[3] > 4096)
      throw std::invalid_argument(
          fmt::format("span markers '{}': the block size must be in [1, 4096]", text));
    m.block_size = int32_t(v[3]);
  }
  return m;
}

std::vector<std::pair<int32_t, int32_t>> marker_spans(std::span<const int32_t> ids,
                                                      const SpanMarkers& m) {
  std::vector<std::pair<int32_t, int32_t>> spans;
  if (!m.enabled()) return spans;
  int32_t open = -1;  // the begin of the span being read
  for (size_t i = 0; i < ids.size(); i += size_t(m.block_size)) {
    if (ids[i] != m.plus && ids[i] != m.cross) continue;
    if (open >= 0) spans.emplace_back(open, int32_t(i));
    open = ids[i] == m.plus ? int32_t(i) : -1;
  }
  return spans;  // a span still open runs to the end: the last part, no span
}

void pad_to_block(std::vector<int32_t>& ids, const SpanMarkers& m) {
  while (ids.size() % size_t(m.block_size)) ids.push_back(m.pad);
}

void push_marker(std::vector<int32_t>& ids, int32_t marker, const SpanMarkers& m) {
  pad_to_block(ids, m);
  ids.push_back(marker);
}

}  // namespace wick
