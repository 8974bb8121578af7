// Between the emulator's threads (emu_core.cpp) and its runtime (emu_runtime.cpp).
#pragma once

#include "cuda_emu.h"

namespace wick_emu {

// Runs every CTA of the grid, one after another, on this host thread; throws
// std::runtime_error on a deadlock, a bad collective, a shared-memory overrun
// or static and dynamic shared memory past the device's `smem_limit` bytes.
void run_grid(const Body& body, dim3 grid, dim3 block, size_t smem_bytes, size_t smem_limit);

}  // namespace wick_emu
