// Between the emulator's threads (emu_core.cpp) and its runtime (emu_runtime.cpp).
#pragma once

#include "cuda_emu.h"

namespace wick_emu {

// Runs every CTA of the grid, one after another, on this host thread; throws
// std::runtime_error on a deadlock, a bad collective or a shared-memory overrun.
void run_grid(const Body& body, dim3 grid, dim3 block, size_t smem_bytes);

}  // namespace wick_emu
