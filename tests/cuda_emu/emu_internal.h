// Between the emulator's threads (emu_core.cpp) and its runtime (emu_runtime.cpp).
#pragma once

#include "cuda_emu.h"

namespace wick_emu {

// Runs every CTA of the grid, one after another, on this host thread; throws
// std::runtime_error on a deadlock, a bad collective, a shared-memory overrun
// or static and dynamic shared memory past the device's `smem_limit` bytes.
void run_grid(const Body& body, dim3 grid, dim3 block, size_t smem_bytes, size_t smem_limit);

// What a kernel takes on an H100 (cuda_emu.h): set_kernel_resources's, else
// the table's line for a backend kernel; null for others, and for all where
// no table is used (WICK_EMU_RESOURCES=none).
const KernelResources* kernel_resources(const void* kernel);
// The registers a warp of the kernel is given (256 at a time), and the most
// threads a CTA of it can have: 1,024, its bound, and what its registers
// allow (64 K a CTA).
int warp_registers(const KernelResources& r);
int max_threads_of(const KernelResources& r);

}  // namespace wick_emu
