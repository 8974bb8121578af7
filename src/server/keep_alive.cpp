#include "server/keep_alive.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace wick::server {

namespace {

// Past this a keep-alive is forever (and no time arithmetic overflows).
constexpr double kMaxMs = 100.0 * 365 * 24 * 3600 * 1000;

KeepAlive from_ms(double ms) {
  if (ms < 0 || ms > kMaxMs) return kKeepForever;
  return KeepAlive(int64_t(std::llround(ms)));
}

double unit_ms(const std::string& u) {
  if (u == "ns") return 1e-6;
  if (u == "us" || u == "\xc2\xb5s" || u == "\xce\xbcs") return 1e-3;  // us, µs (both code points)
  if (u == "ms") return 1;
  if (u == "s") return 1e3;
  if (u == "m") return 60e3;
  if (u == "h") return 3600e3;
  return -1;
}

}  // namespace

std::optional<KeepAlive> parse_duration(const std::string& text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  size_t i = 0;
  bool negative = false;
  if (text[0] == '-' || text[0] == '+') negative = text[i++] == '-';
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  auto number = [&](double& v) {
    const size_t start = i;
    while (i < text.size() && (is_digit(text[i]) || text[i] == '.')) ++i;
    const std::string n = text.substr(start, i - start);
    if (n.empty() || n == "." || std::count(n.begin(), n.end(), '.') > 1) return false;
    v = std::stod(n);
    return true;
  };
  double first = 0;
  if (!number(first)) return std::nullopt;
  if (i == text.size()) {  // a bare number: seconds (Go wants "0" alone; OLLAMA_KEEP_ALIVE any)
    if (text.find('.') != std::string::npos) return std::nullopt;
    return from_ms(negative ? -1 : first * 1e3);
  }
  double ms = 0;
  double v = first;
  while (true) {
    const size_t u0 = i;
    while (i < text.size() && !is_digit(text[i]) && text[i] != '.') ++i;
    const double per = unit_ms(text.substr(u0, i - u0));
    if (per < 0) return std::nullopt;
    ms += v * per;
    if (i == text.size()) break;
    if (!number(v)) return std::nullopt;
  }
  return from_ms(negative && ms > 0 ? -1 : ms);
}

KeepAlive keep_alive_of(const json& body, KeepAlive dflt) {
  auto it = body.find("keep_alive");
  if (it == body.end() || it->is_null()) return dflt;
  if (it->is_number()) {
    const double s = it->get<double>();
    if (!std::isfinite(s)) bad("keep_alive", "keep_alive must be a finite number of seconds");
    return from_ms(s * 1e3);
  }
  if (it->is_string())
    if (auto d = parse_duration(it->get<std::string>())) return *d;
  bad("keep_alive",
      "keep_alive must be a duration such as \"5m\", \"1h30m\" or \"10s\", or a number of "
      "seconds; 0 unloads the model after the request, a negative value keeps it loaded",
      it->is_string() ? "invalid_value" : "invalid_type");
}

std::string keep_alive_text(KeepAlive k) {
  if (k.count() < 0) return "forever";
  int64_t ms = k.count();
  std::string out;
  if (ms >= 3600000) out += std::to_string(ms / 3600000) + "h", ms %= 3600000;
  if (ms >= 60000) out += std::to_string(ms / 60000) + "m", ms %= 60000;
  if (ms >= 1000) out += std::to_string(ms / 1000) + "s", ms %= 1000;
  if (ms || out.empty()) out += std::to_string(ms) + "ms";
  return out;
}

}  // namespace wick::server
