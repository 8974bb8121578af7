// --device, --gpu-f32 and --gpu-memory-fraction, shared by every command
// that runs a model (WICK_DEVICE sets the default device).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace wick::cli {

void add_device_options(CLI::App* cmd);
BackendOptions backend_options();  // what the command line and the environment chose

// --lora PATH and --lora-scaled PATH S (llama.cpp's flags); `verb` says what
// the command does with them ("apply ... at load", "merge ... into the weights").
struct LoraFlags {
  std::vector<std::string> paths;
  std::vector<std::pair<std::string, float>> scaled;
  std::vector<std::pair<std::string, float>> adapters() const;  // (path, scale)
};
void add_lora_options(CLI::App* cmd, LoraFlags& f, const std::string& verb);

}  // namespace wick::cli
