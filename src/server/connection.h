// The server's connections: cpp-httplib's Server reading each socket through
// wick's own stream, which
//  - caps the request line and headers at max_header_bytes and at one read
//    timeout in all (Debian's cpp-httplib 0.11 reads a header line of any
//    length, and any number of them, into memory before it checks anything);
//  - lets a handler ask whether its client hung up (cpp-httplib 0.11 tells
//    only when a write fails, so a non-streaming request would run on).
#pragma once

#include <httplib.h>

#include <cstddef>

namespace wick::server {

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(size_t max_header_bytes) : max_header_bytes_(max_header_bytes) {}
  // In a handler (or its content provider): whether the client of the
  // request this thread serves closed its connection.
  static bool client_gone();
  // In the error handler: whether this thread's request went over the header limit.
  static bool headers_too_large();

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool wait_for_request(socket_t sock, class GuardedStream& strm) const;

  size_t max_header_bytes_;
};

}  // namespace wick::server
