#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "io/error.h"

namespace wick {

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp-XXXXXX") {
  std::vector<char> name(tmp_.begin(), tmp_.end());
  name.push_back('\0');
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0) throw_io("{}: cannot create: {}", path_, std::strerror(errno));
  tmp_.assign(name.data());
  ::fchmod(fd_, 0644);  // mkstemp's 0600 would surprise whoever reads the result
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  tmp_.clear();
  throw_io("{}: {} failed after {} bytes: {}; nothing was written there", path_, what, n_written_,
           std::strerror(err));
}

void AtomicFile::write(const void* data, size_t n) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("write", k < 0 ? errno : ENOSPC);
    p += k;
    n -= size_t(k);
    n_written_ += size_t(k);
  }
}

void AtomicFile::commit() {
  // A full disk may only show at sync or close (delayed allocation, NFS).
  if (::fsync(fd_) != 0) fail("sync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", errno);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename", errno);
  tmp_.clear();
}

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace wick
