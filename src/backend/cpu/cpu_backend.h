// The CPU backend: host memory, f32 KV; matrices repacked at load into panels
// for the blocked multiply (packed.h), weights not prepared used in place.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace wick {

std::unique_ptr<Backend> make_cpu_backend();
Backend& cpu_backend();  // a shared instance, for one thread at a time (tests, the CLI)

}  // namespace wick
