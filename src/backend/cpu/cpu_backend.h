// The CPU backend: host memory, f32 KV, weights used in place from the
// mapped files (a later repack happens in prepare_matrix).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace wick {

std::unique_ptr<Backend> make_cpu_backend();
Backend& cpu_backend();  // a shared instance, for one thread at a time (tests, the CLI)

}  // namespace wick
