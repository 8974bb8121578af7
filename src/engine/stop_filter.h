// Passes generated text through the stop strings: holds back what could be
// the start of one, and cuts the text where one appears.
#pragma once

#include <string>
#include <vector>

namespace wick {

class StopFilter {
 public:
  explicit StopFilter(const std::vector<std::string>& stops) : stops_(stops) {}
  // Appends delta; sets `out` to the text that can be passed on. Returns true
  // when a stop string appeared (out ends before it). final flushes all.
  bool feed(const std::string& delta, bool final, std::string& out);

 private:
  const std::vector<std::string>& stops_;
  std::string pending_;
};

}  // namespace wick
