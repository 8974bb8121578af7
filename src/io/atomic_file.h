// Writing a file whole or not at all: the bytes go to a temporary file in the
// same folder, which is synced and renamed over the destination only once
// everything is written. On failure (a full disk, a size limit, an I/O error)
// the temporary is removed, no partial file is left at the destination, and
// the IoError names the destination and the cause.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace wick {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // creates the temporary; throws IoError
  ~AtomicFile();                                 // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);  // throws IoError
  void commit();                           // sync, close, rename over path; throws IoError

 private:
  [[noreturn]] void fail(const char* what, int err);
  std::string path_, tmp_;
  int fd_ = -1;
  size_t n_written_ = 0;
};

// The whole of bytes as path, through an AtomicFile.
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace wick
