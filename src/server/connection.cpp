#include "server/connection.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace wick::server {

namespace {

using Clock = std::chrono::steady_clock;

bool wait_for(int fd, short events, time_t sec, time_t usec) {
  pollfd p{fd, events, 0};
  const int ms = int(sec * 1000 + usec / 1000);
  int rc;
  do rc = ::poll(&p, 1, ms);
  while (rc < 0 && errno == EINTR);
  return rc > 0 && (p.revents & events);
}

// The peer closed (or reset) its end: an EOF is waiting to be read.
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
  char c;
  return (p.revents & POLLIN) && ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// After refusing a request that is still arriving: closing with unread
// bytes would reset the connection and lose the answer, so read (and drop)
// what comes for a moment first.
void drain_and_close(int fd) {
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  size_t n_read = 0;
  const auto until = Clock::now() + std::chrono::seconds(1);
  while (n_read < (size_t(1) << 20) && Clock::now() < until && wait_for(fd, POLLIN, 0, 100000)) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    n_read += size_t(n);
  }
  ::close(fd);
}

void ip_and_port(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof buf);
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof buf);
    port = ntohs(v6.sin6_port);
  }
  ip = buf;
}

}  // namespace

// A socket with a read buffer (cpp-httplib reads headers a byte at a time)
// that counts the bytes of each request up to the blank line ending its headers.
class GuardedStream : public httplib::Stream {
 public:
  GuardedStream(int fd, size_t max_header_bytes, time_t read_sec, time_t read_usec,
                time_t write_sec, time_t write_usec)
      : fd_(fd),
        max_header_bytes_(max_header_bytes),
        read_sec_(read_sec),
        read_usec_(read_usec),
        write_sec_(write_sec),
        write_usec_(write_usec) {}

  void start_request() {
    in_headers_ = true;
    header_bytes_ = 0;
    n_matched_ = 0;
    too_large_ = false;
    n_written_ = 0;
    headers_deadline_ =
        Clock::now() + std::chrono::seconds(read_sec_) + std::chrono::microseconds(read_usec_);
  }
  bool too_large() const { return too_large_; }
  size_t n_written() const { return n_written_; }
  bool has_buffered() const { return pos_ < buf_.size(); }

  bool is_readable() const override {
    return has_buffered() || wait_for(fd_, POLLIN, read_sec_, read_usec_);
  }
  bool is_writable() const override { return wait_for(fd_, POLLOUT, write_sec_, write_usec_); }

  ssize_t read(char* ptr, size_t size) override {
    if (in_headers_ && !header_room()) return -1;
    if (!has_buffered() && !fill()) return -1;
    size_t n = std::min(size, buf_.size() - pos_);
    if (in_headers_) n = count_header_bytes(n);
    std::copy_n(buf_.data() + pos_, n, ptr);
    pos_ += n;
    return ssize_t(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    if (n > 0) n_written_ += size_t(n);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip_and_port(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip_and_port(a, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // Whether the headers may take more bytes and more time.
  bool header_room() {
    if (header_bytes_ >= max_header_bytes_ || Clock::now() > headers_deadline_) too_large_ = true;
    return !too_large_;
  }
  bool fill() {
    if (!wait_for(fd_, POLLIN, read_sec_, read_usec_)) return false;
    buf_.resize(kBufBytes);
    ssize_t n;
    do n = ::recv(fd_, buf_.data(), buf_.size(), 0);
    while (n < 0 && errno == EINTR);
    buf_.resize(n > 0 ? size_t(n) : 0);
    pos_ = 0;
    return n > 0;
  }
  // Of the next n buffered bytes, those before the header limit; notes the
  // end of the headers ("\r\n\r\n").
  size_t count_header_bytes(size_t n) {
    n = std::min(n, max_header_bytes_ - header_bytes_);
    static constexpr char kEnd[] = "\r\n\r\n";
    for (size_t i = 0; i < n; ++i) {
      const char c = buf_[pos_ + i];
      n_matched_ = c == kEnd[n_matched_] ? n_matched_ + 1 : (c == '\r' ? 1 : 0);
      if (n_matched_ == 4) {
        in_headers_ = false;
        n = i + 1;
        break;
      }
    }
    header_bytes_ += n;
    return n;
  }

  static constexpr size_t kBufBytes = 4096;
  int fd_;
  size_t max_header_bytes_;
  time_t read_sec_, read_usec_, write_sec_, write_usec_;
  std::string buf_;
  size_t pos_ = 0;
  bool in_headers_ = true;
  size_t header_bytes_ = 0;
  int n_matched_ = 0;
  bool too_large_ = false;
  size_t n_written_ = 0;
  Clock::time_point headers_deadline_;
};

namespace {
thread_local GuardedStream* t_stream = nullptr;  // the connection this thread serves
}

bool GuardedServer::client_gone() {
  return t_stream && peer_closed(t_stream->socket());
}

bool GuardedServer::headers_too_large() {
  return t_stream && t_stream->too_large();
}

// Waits (in short slices, to notice a stop) for the next request on a kept-alive connection.
bool GuardedServer::wait_for_request(socket_t sock, GuardedStream& strm) const {
  const auto until = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
  while (svr_sock_ != INVALID_SOCKET) {
    if (strm.has_buffered() || wait_for(sock, POLLIN, 0, 50000)) return true;
    if (Clock::now() > until) return false;
  }
  return false;
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  GuardedStream strm(sock, max_header_bytes_, read_timeout_sec_, read_timeout_usec_,
                     write_timeout_sec_, write_timeout_usec_);
  t_stream = &strm;
  bool ok = false;
  for (size_t left = keep_alive_max_count_; left > 0 && wait_for_request(sock, strm); --left) {
    strm.start_request();
    bool closed = false;
    ok = process_request(strm, left == 1, closed, nullptr);
    if (strm.too_large() && strm.n_written() == 0) {  // cut off in the request line: answer here
      const std::string body =
          R"({"error":{"message":"the request line and headers are too large or too slow","type":"invalid_request_error","param":null,"code":"headers_too_large"}})";
      const std::string head = fmt::format(
          "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n"
          "Content-Length: {}\r\nConnection: close\r\n\r\n",
          body.size());
      strm.write((head + body).data(), head.size() + body.size());
    }
    if (!ok || closed || strm.too_large()) break;
  }
  t_stream = nullptr;
  if (strm.too_large()) {
    drain_and_close(sock);
    return ok;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace wick::server
