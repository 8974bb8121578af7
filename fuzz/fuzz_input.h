// What the fuzz targets share: fuzzed bytes as a file path (the readers take
// paths and map them), splitting one input into parts, and the shared
// tokenizers the text targets run against.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "text/tokenizer.h"

namespace wick::fuzz {

// An in-memory file (memfd) rewritten with each input; path() opens it.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("wick-fuzz", 0)) {
    if (fd_ < 0) std::abort();
  }
  std::string write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != ssize_t(size)) std::abort();
    return "/proc/self/fd/" + std::to_string(fd_);
  }

 private:
  int fd_;
};

// The part before the first NUL byte, and what follows it (empty when none).
inline std::pair<std::string_view, std::string_view> split_at_nul(const uint8_t* data,
                                                                  size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t k = all.find('\0');
  if (k == std::string_view::npos) return {all, {}};
  return {all.substr(0, k), all.substr(k + 1)};
}

// A real tokenizer from the shared fixtures (WICK_FUZZ_TOKENIZERS overrides
// the folder); loaded once. Targets call it from LLVMFuzzerInitialize: loading
// takes seconds under ASan, which must not count against the first input.
inline const Tokenizer& shared_tokenizer(const std::string& name) {
  static std::map<std::string, const Tokenizer*> loaded;
  if (auto it = loaded.find(name); it != loaded.end()) return *it->second;
  const char* env = std::getenv("WICK_FUZZ_TOKENIZERS");
  std::string dir = env ? env : WICK_SHARED_DIR "/tokenizers";
  try {
    return *(loaded[name] = Tokenizer::load(dir + "/" + name).release());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: cannot load the %s tokenizer from %s: %s\n", name.c_str(),
                 dir.c_str(), e.what());
    std::exit(2);
  }
}

}  // namespace wick::fuzz
