#include "engine/stop_filter.h"

#include <algorithm>

namespace wick {

bool StopFilter::feed(const std::string& delta, bool final, std::string& out) {
  pending_ += delta;
  for (const auto& st : stops_)
    if (auto p = pending_.find(st); p != std::string::npos) {
      out = pending_.substr(0, p);
      pending_.clear();
      return true;
    }
  // hold back the longest suffix that is a proper prefix of a stop string
  size_t hold = 0;
  if (!final)
    for (const auto& st : stops_)
      for (size_t n = std::min(pending_.size(), st.size() - 1); n > hold; --n)
        if (pending_.compare(pending_.size() - n, n, st, 0, n) == 0) {
          hold = n;
          break;
        }
  out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return false;
}

}  // namespace wick
