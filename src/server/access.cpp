#include "server/access.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace wick::server {

namespace {

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](char c) { return char(std::tolower(uint8_t(c))); });
  return out;
}

bool all_digits(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(uint8_t(c)); });
}

// Four decimal octets, the first 127.
bool is_loopback_ipv4(std::string_view s) {
  int n = 0, first = -1;
  while (true) {
    const size_t dot = s.find('.');
    const std::string_view part = s.substr(0, dot);
    if (!all_digits(part) || part.size() > 3 || std::stoi(std::string(part)) > 255) return false;
    if (first < 0) first = std::stoi(std::string(part));
    ++n;
    if (dot == std::string_view::npos) break;
    s.remove_prefix(dot + 1);
  }
  return n == 4 && first == 127;
}

}  // namespace

std::string host_of(std::string_view h) {
  std::string_view host = h;
  if (!h.empty() && h.front() == '[') {  // [v6]:port
    const size_t close = h.find(']');
    host = close == std::string_view::npos ? h.substr(1) : h.substr(1, close - 1);
  } else if (std::count(h.begin(), h.end(), ':') == 1) {  // name:port (a bare v6 has several)
    host = h.substr(0, h.find(':'));
  }
  std::string out = lowercase(host);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

bool is_loopback_host(std::string_view host) {
  return host == "localhost" || host == "::1" || is_loopback_ipv4(host);
}

HostFilter::HostFilter(const std::string& bind_host, const std::vector<std::string>& allowed) {
  for (auto& a : allowed) allowed_.push_back(host_of(a));
  const bool any = std::find(allowed_.begin(), allowed_.end(), "*") != allowed_.end();
  check_ = !any && (is_loopback_host(host_of(bind_host)) || !allowed_.empty());
}

bool HostFilter::allows(std::string_view host_header) const {
  if (!check_ || host_header.empty()) return true;
  const std::string host = host_of(host_header);
  return is_loopback_host(host) ||
         std::find(allowed_.begin(), allowed_.end(), host) != allowed_.end();
}

OriginFilter::OriginFilter(const std::vector<std::string>& allowed) {
  for (const auto& a : allowed) {
    std::string o = lowercase(a);
    while (!o.empty() && o.back() == '/') o.pop_back();
    if (o == "*") any_ = true;
    if (!o.empty()) allowed_.push_back(std::move(o));
  }
}

bool OriginFilter::allows(std::string_view origin) const {
  if (origin.empty() || any_) return true;
  const std::string o = lowercase(origin);
  if (std::find(allowed_.begin(), allowed_.end(), o) != allowed_.end()) return true;
  // loopback pages: http(s)://host[:port], nothing after the authority
  for (std::string_view scheme : {"http://", "https://"}) {
    if (o.rfind(scheme, 0) != 0) continue;
    const std::string_view authority = std::string_view(o).substr(scheme.size());
    if (authority.empty() || authority.find_first_of("/?#@") != std::string_view::npos)
      return false;
    return is_loopback_host(host_of(authority));
  }
  return false;  // "null" (files, sandboxed frames), extensions: only when listed
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // No early exit: every byte of b is compared (with a repeated to b's length).
  uint8_t diff = a.size() != b.size();
  for (size_t i = 0; i < b.size(); ++i)
    diff |= uint8_t(b[i]) ^ (a.empty() ? uint8_t(0) : uint8_t(a[i % a.size()]));
  return diff == 0;
}

}  // namespace wick::server
