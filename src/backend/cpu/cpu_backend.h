// The CPU backend: host memory, an f32 (or f16, or q8_0) KV cache; matrices repacked at load into
// panels for the blocked multiply (packed.h), weights not prepared used in place.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace wick {

std::unique_ptr<Backend> make_cpu_backend(DType kv_dtype = DType::F32);
Backend& cpu_backend();  // a shared instance, for one thread at a time (tests, the CLI)

}  // namespace wick
