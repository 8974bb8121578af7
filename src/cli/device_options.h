// --device, --gpu-f32 and --gpu-memory-fraction, shared by every command
// that runs a model (WICK_DEVICE sets the default device).
#pragma once

#include <CLI/CLI.hpp>

#include "backend/backend.h"

namespace wick::cli {

void add_device_options(CLI::App* cmd);
BackendOptions backend_options();  // what the command line and the environment chose

}  // namespace wick::cli
