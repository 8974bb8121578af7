// Errors caused by input (files, requests): messages a user can act on.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace wick {

struct IoError : std::runtime_error {  // a model or data file is unreadable or malformed
  using std::runtime_error::runtime_error;
};
struct ModelError : std::runtime_error {  // a model is readable but not usable by wick
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void throw_io(fmt::format_string<Args...> f, Args&&... args) {
  throw IoError(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void throw_model(fmt::format_string<Args...> f, Args&&... args) {
  throw ModelError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace wick
