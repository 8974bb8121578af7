// The CUDA backend's entry points (plain C++: no CUDA headers here).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace wick {

int cuda_device_count();    // 0 when no driver or no GPU
std::string cuda_status();  // why there is none, or the devices' names
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt);

}  // namespace wick
