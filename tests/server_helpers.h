// What the server's parser and writer tests share.
#pragma once

#include <gtest/gtest.h>

#include "server/parse_common.h"

namespace wick::server {

// The ApiError f throws (a failure when it throws none).
template <typename F>
ApiError error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return {0, ""};
}

}  // namespace wick::server
