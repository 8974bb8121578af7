// Who may talk to the server: the Host check against DNS rebinding (a web
// page whose name resolves to 127.0.0.1 must not reach a loopback server),
// the Origin check of browsers' cross-origin requests, and the API key,
// compared in constant time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace wick::server {

// The host of a Host header value, lowercased, without port, brackets or a
// trailing dot: "LocalHost:8080" -> "localhost", "[::1]:8080" -> "::1".
std::string host_of(std::string_view host_header);
// localhost, an address in 127.0.0.0/8, or ::1 (as host_of leaves them).
bool is_loopback_host(std::string_view host);

class HostFilter {
 public:
  // bind_host: the address the server listens on; allowed: extra host names
  // (--allowed-hosts; "*" allows any). A server on a loopback address answers
  // loopback names and `allowed`; one on another address checks nothing
  // unless `allowed` is given (then loopback names and `allowed`).
  HostFilter(const std::string& bind_host, const std::vector<std::string>& allowed);
  // A request without a Host header passes: browsers always send one.
  bool allows(std::string_view host_header) const;

 private:
  bool check_ = false;
  std::vector<std::string> allowed_;  // as host_of leaves them
};

// Browsers' cross-origin requests (CORS). A page's Origin is checked
// before anything else runs: a form or a text/plain POST needs no preflight,
// so without this check any web page could make a loopback server generate,
// copy or unload models. Requests without an Origin (every client outside a
// browser) pass.
class OriginFilter {
 public:
  // allowed: origins answered besides loopback ones (http or https on
  // localhost, 127.x.x.x or [::1], any port): "scheme://host[:port]" as
  // browsers send them; "*" allows any.
  explicit OriginFilter(const std::vector<std::string>& allowed);
  bool allows(std::string_view origin) const;  // an empty origin: no browser page, allowed

 private:
  bool any_ = false;
  std::vector<std::string> allowed_;  // lowercased, no trailing slash
};

// a == b in a time that depends on b's length only (b: what the client sent).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace wick::server
