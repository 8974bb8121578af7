// Read-only memory map of a whole file (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace wick {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws IoError
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Whether the file is now shorter than the mapping (truncated or rewritten
  // in place since it was mapped): reading the pages past its end would
  // raise SIGBUS. A file deleted or replaced by rename has not shrunk: the
  // mapping keeps the old inode's data.
  bool shrunk() const;

 private:
  std::string path_;
  int fd_ = -1;  // kept open to watch the size of this inode, not of whatever the path names now
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace wick
