// The emulator's CUDA runtime: the calls wick's CUDA backend and its tests
// make, over host memory. A created stream keeps its work until something
// waits for it (as a GPU far behind the host: a read the host makes before
// it waits sees what was there before), the legacy default stream runs it at
// once (WICK_EMU_ASYNC=0: every stream at once); a captured stream records
// it, and a graph replays the records (with the arguments as they were at
// capture, as a CUDA graph does). The device is
// H100-shaped: 132 SMs, 227 KB of shared memory a CTA; WICK_EMU_GPU names
// another GPU's shape (the CUDA guide's table of compute capabilities), and
// WICK_EMU_SMS, WICK_EMU_SMEM_OPTIN, WICK_EMU_GPU_MB, WICK_EMU_REGS change
// one figure of it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "emu_internal.h"

#undef warpSize  // the device code's name; here cudaDeviceProp's field

struct CUstream_st {
  bool capturing = false, invalidated = false;  // (invalidated: by an unsafe call)
  std::vector<wick_emu::Body> ops;              // recorded while capturing
  bool blocking = true;                // (not cudaStreamNonBlocking: waits for the default stream)
  std::deque<wick_emu::Body> pending;  // work not yet run, in order
  size_t n_enqueued = 0, n_done = 0;   // (an event waits for n_done to reach its count)
};
struct CUgraph_st {
  std::vector<wick_emu::Body> ops;
};
struct CUgraphExec_st {
  std::vector<wick_emu::Body> ops;
};
struct CUevent_st {
  cudaStream_t st = nullptr;  // the stream of its last record, and the work before it
  size_t n_before = 0;
};

namespace wick_emu {
namespace {

long env_or(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

// What the backend's choices read of a GPU: SMs, shared memory a CTA may opt
// in to (an SM has 1 KB more), threads and CTAs an SM holds, and sm_XY.
struct Shape {
  const char* name;
  int n_sms, smem_optin, max_threads_sm, max_ctas_sm, major, minor;
};
constexpr Shape kShapes[] = {
    {"h100", 132, 232448, 2048, 32, 9, 0}, {"a100", 108, 166912, 2048, 32, 8, 0},
    {"a10", 72, 101376, 1536, 16, 8, 6},   {"rtx3060", 28, 101376, 1536, 16, 8, 6},
    {"l4", 58, 101376, 1536, 24, 8, 9},    {"rtx4090", 128, 101376, 1536, 24, 8, 9},
};

Shape shape_from_env() {
  const char* name = std::getenv("WICK_EMU_GPU");
  if (!name || !*name) return kShapes[0];
  for (const Shape& s : kShapes)
    if (std::strcmp(s.name, name) == 0) return s;
  std::string known;
  for (const Shape& s : kShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  std::fprintf(stderr, "cuda emulator: WICK_EMU_GPU=%s is none of %s\n", name, known.c_str());
  std::abort();
}

struct Device {
  Shape shape = shape_from_env();
  int n_sms = int(env_or("WICK_EMU_SMS", shape.n_sms));
  int smem_optin = int(env_or("WICK_EMU_SMEM_OPTIN", shape.smem_optin));
  int regs = int(env_or("WICK_EMU_REGS", 128));  // a thread's registers, for occupancy
  size_t total = size_t(env_or("WICK_EMU_GPU_MB", 4096)) << 20;
  int global_poison = int(env_or("WICK_EMU_POISON_GLOBAL", 0xff));  // fresh cudaMalloc bytes
  size_t used = 0;
  std::map<void*, size_t> allocs;
  std::map<const void*, int> max_dynamic_smem;  // cudaFuncSetAttribute
  std::map<void*, size_t> pinned;               // cudaMallocHost
  std::mutex mu;
  // the streams with work kept (the work of all of them is run under
  // streams_mu: cudaFree waits for every stream, from any host thread)
  bool async = env_or("WICK_EMU_ASYNC", 1) != 0;
  std::vector<cudaStream_t> streams;
  std::recursive_mutex streams_mu;
};
// Never destroyed: a program's static objects (a CLI's model pool) free
// their device buffers at exit, after a function-local static made during
// their lifetime would be gone (real CUDA answers such late calls too).
Device& dev() {
  static Device* d = new Device;
  return *d;
}

// A kernel's resources: the table's (an H100's) for the backend's kernels,
// else WICK_EMU_REGS registers and nothing else known.
KernelResources resources_of(const void* kernel) {
  if (const KernelResources* r = kernel_resources(kernel)) return *r;
  KernelResources r;
  r.regs = dev().regs;
  return r;
}

thread_local cudaError_t g_last = cudaSuccess;

cudaError_t set_error(cudaError_t e, const std::string& why) {
  std::fprintf(stderr, "cuda emulator: %s\n", why.c_str());
  g_last = e;
  return e;
}

// Runs st's kept work until n_done reaches `until` (an error a kernel found
// is thrown here, where the host waits, and drops the rest).
void run_until(cudaStream_t st, size_t until) {
  std::lock_guard<std::recursive_mutex> lock(dev().streams_mu);
  while (st->n_done < until && !st->pending.empty()) {
    Body op = std::move(st->pending.front());
    st->pending.pop_front();
    ++st->n_done;
    try {
      op();
    } catch (...) {
      st->n_done += st->pending.size();
      st->pending.clear();
      throw;
    }
  }
}
void run_all(cudaStream_t st) {
  run_until(st, st->n_enqueued);
}
// Every stream's kept work (cudaFree, cudaFreeHost: the device waits), or the
// blocking streams' (the legacy default stream waits for them).
void run_streams(bool blocking_only) {
  Device& d = dev();
  std::lock_guard<std::recursive_mutex> lock(d.streams_mu);
  for (cudaStream_t st : d.streams)
    if (!blocking_only || st->blocking) run_all(st);
}

// Records while the stream is captured, keeps it in a created stream, runs
// it now in the default one (after the blocking streams' work).
void enqueue(cudaStream_t st, Body op) {
  if (st && st->capturing) {
    st->ops.push_back(std::move(op));
  } else if (st && dev().async) {
    std::lock_guard<std::recursive_mutex> lock(dev().streams_mu);
    st->pending.push_back(std::move(op));
    ++st->n_enqueued;
  } else {
    run_streams(true);
    op();
  }
}

// The streams this host thread captures in a mode other than relaxed: while
// there are any, the calls that may make the device wait (cudaMalloc, cudaFree,
// a synchronous memset, waiting for a stream or an event) fail and spoil the
// captures, as the runtime's "potentially unsafe API calls" do.
thread_local std::vector<cudaStream_t> g_strict_captures;
bool unsafe_in_capture(const char* call) {
  if (g_strict_captures.empty()) return false;
  for (cudaStream_t st : g_strict_captures) st->invalidated = true;
  set_error(cudaErrorStreamCaptureUnsupported,
            std::string(call) + " while this thread captures a stream (the capture is spoilt)");
  return true;
}

enum class Mem { Device, Pinned, Pageable };
Mem kind_of(const void* p) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  auto in = [p](const std::map<void*, size_t>& m) {
    auto it = m.upper_bound(const_cast<void*>(p));
    if (it == m.begin()) return false;
    --it;
    return p < static_cast<const char*>(it->first) + it->second;
  };
  return in(d.allocs) ? Mem::Device : in(d.pinned) ? Mem::Pinned : Mem::Pageable;
}

}  // namespace

void submit(cudaStream_t st, dim3 grid, dim3 block, size_t smem, const void* kernel, Body body) {
  Device& d = dev();
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 || block.z > 64 ||
      grid.y > 65535 || grid.z > 65535) {
    set_error(cudaErrorInvalidConfiguration,
              "launch of grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
                  std::to_string(grid.z) + ") and block (" + std::to_string(block.x) + ", " +
                  std::to_string(block.y) + ", " + std::to_string(block.z) + ")");
    return;
  }
  const KernelResources r = resources_of(kernel);
  // without an opt-in a CTA has 48 KB, static and dynamic together
  int allowed = 48 * 1024 - r.static_smem;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.max_dynamic_smem.find(kernel);
    if (it != d.max_dynamic_smem.end()) allowed = std::max(allowed, it->second);
  }
  if (smem > size_t(std::max(0, allowed)) || smem + size_t(r.static_smem) > size_t(d.smem_optin)) {
    set_error(cudaErrorInvalidValue, "launch with " + std::to_string(smem) +
                                         " bytes of dynamic shared memory; the kernel allows " +
                                         std::to_string(allowed) + " (it has " +
                                         std::to_string(r.static_smem) + " static), the device " +
                                         std::to_string(d.smem_optin));
    return;
  }
  if (threads > (unsigned long long)max_threads_of(r)) {
    set_error(cudaErrorLaunchOutOfResources,
              "launch of " + std::to_string(threads) + " threads a CTA: the kernel takes " +
                  std::to_string(r.regs) + " registers a thread" +
                  (r.max_threads ? " and __launch_bounds__(" + std::to_string(r.max_threads) + ")"
                                 : std::string()) +
                  ", so at most " + std::to_string(max_threads_of(r)) +
                  " (too many resources requested for launch)");
    return;
  }
  const size_t smem_limit = size_t(d.smem_optin);
  enqueue(st, [grid, block, smem, smem_limit, body = std::move(body)] {
    run_grid(body, grid, block, smem, smem_limit);
  });
}

}  // namespace wick_emu

using wick_emu::dev;
using wick_emu::KernelResources;
using wick_emu::max_threads_of;
using wick_emu::resources_of;
using wick_emu::warp_registers;

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = wick_emu::g_last;
  wick_emu::g_last = cudaSuccess;
  return e;
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated device)";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return "cuda emulator error";
  }
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  auto& d = dev();
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "wick CUDA emulator (%s, %d SMs)", d.shape.name, d.n_sms);
  p->totalGlobalMem = d.total;
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = size_t(d.smem_optin);
  p->sharedMemPerMultiprocessor = size_t(d.smem_optin) + 1024;
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsPerMultiProcessor = d.shape.max_threads_sm;
  p->maxBlocksPerMultiProcessor = d.shape.max_ctas_sm;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->multiProcessorCount = d.n_sms;
  p->major = d.shape.major;
  p->minor = d.shape.minor;
  p->l2CacheSize = 50 << 20;
  p->memoryBusWidth = 5120;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  auto& d = dev();
  switch (a) {
    case cudaDevAttrMultiProcessorCount:
      *v = d.n_sms;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *v = d.smem_optin;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *v = 48 * 1024;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *v = d.smem_optin + 1024;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *v = d.shape.major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *v = d.shape.minor;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *v = 32;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *v = 1024;
      return cudaSuccess;
    default:
      *v = 0;
      return cudaSuccess;
  }
}

// ---- memory ----
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (wick_emu::unsafe_in_capture("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  auto& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.used + bytes > d.total) {
    *p = nullptr;
    return wick_emu::set_error(cudaErrorMemoryAllocation,
                               "cudaMalloc of " + std::to_string(bytes) +
                                   " bytes: " + std::to_string(d.total - d.used) + " free");
  }
  // exactly `bytes` (256-byte aligned, as cudaMalloc's): under ASan a kernel's
  // read past a buffer's end is reported
  if (posix_memalign(p, 256, std::max<size_t>(bytes, 1)) != 0) {
    *p = nullptr;
    return cudaErrorMemoryAllocation;
  }
  // fresh device memory holds what it held before on a GPU: poisoned here, so
  // that a kernel reading a buffer before anything wrote it shows (NaN floats)
  std::memset(*p, d.global_poison, bytes);
  d.allocs[*p] = bytes;
  d.used += bytes;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (wick_emu::unsafe_in_capture("cudaFree")) return cudaErrorStreamCaptureUnsupported;
  wick_emu::run_streams(false);  // (the device finishes its work first)
  auto& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocs.find(p);
  if (it == d.allocs.end())
    return wick_emu::set_error(cudaErrorInvalidValue,
                               "cudaFree of a pointer cudaMalloc did not return");
  d.used -= it->second;
  d.allocs.erase(it);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = nullptr;
  if (wick_emu::unsafe_in_capture("cudaMallocHost")) return cudaErrorStreamCaptureUnsupported;
  bytes = std::max<size_t>(bytes, 1);
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!*p) return cudaErrorMemoryAllocation;
  auto& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  d.pinned[*p] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  if (wick_emu::unsafe_in_capture("cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
  wick_emu::run_streams(false);
  auto& d = dev();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (!d.pinned.erase(p))
      return wick_emu::set_error(cudaErrorInvalidValue,
                                 "cudaFreeHost of a pointer cudaMallocHost did not return");
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  auto& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  *free_b = d.total - d.used;
  *total_b = d.total;
  return cudaSuccess;
}
// As the runtime's API sync behaviour says: from pageable memory the source is
// taken at the call; to pageable memory the call waits for the copy; pinned
// memory is read and written when the copy runs (a pinned destination is
// poisoned until then, so that a read before the host waits shows).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t st) {
  using wick_emu::Mem;
  const Mem from = wick_emu::kind_of(src), to = wick_emu::kind_of(dst);
  if (to == Mem::Pageable && from != Mem::Pageable && st && !st->capturing) {
    wick_emu::run_all(st);
    std::memmove(dst, src, n);
    return cudaSuccess;
  }
  if (from == Mem::Pageable && to != Mem::Pageable) {
    auto copy = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + n);
    wick_emu::enqueue(st, [=] { std::memcpy(dst, copy->data(), n); });
    return cudaSuccess;
  }
  if (to == Mem::Pinned && st && !st->capturing && dev().async)
    std::memset(dst, dev().global_poison, n);
  wick_emu::enqueue(st, [=] { std::memmove(dst, src, n); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
  if (wick_emu::unsafe_in_capture("cudaMemset")) return cudaErrorStreamCaptureUnsupported;
  wick_emu::run_streams(true);  // (the legacy default stream's)
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t st) {
  wick_emu::enqueue(st, [=] { std::memset(p, v, n); });
  return cudaSuccess;
}

// ---- kernels ----
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int v) {
  if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    auto& d = dev();
    const int n_static = resources_of(f).static_smem;  // (the runtime counts both)
    if (v + n_static > d.smem_optin)
      return wick_emu::set_error(cudaErrorInvalidValue,
                                 "cudaFuncSetAttribute: " + std::to_string(v) +
                                     " bytes of dynamic shared memory and " +
                                     std::to_string(n_static) + " static, over the device's " +
                                     std::to_string(d.smem_optin));
    std::lock_guard<std::mutex> lock(d.mu);
    d.max_dynamic_smem[f] = v;
  }
  return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void* f) {
  *a = cudaFuncAttributes{};
  const KernelResources r = resources_of(f);
  a->numRegs = r.regs;
  a->maxThreadsPerBlock = max_threads_of(r);
  a->sharedSizeBytes = size_t(r.static_smem);
  a->localSizeBytes = size_t(r.stack);
  a->maxDynamicSharedSizeBytes = 48 * 1024;
  a->ptxVersion = a->binaryVersion = 90;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* f, int block_size,
                                                          size_t smem) {
  auto& d = dev();
  const KernelResources r = resources_of(f);
  const int warps = std::max(1, (block_size + 31) / 32);
  const int by_warps = d.shape.max_threads_sm / 32 / warps;
  const int by_regs = 65536 / warp_registers(r) / warps;
  // each CTA also holds its static shared memory and 1 KB the system keeps
  const int by_smem = int((size_t(d.smem_optin) + 1024) / (smem + size_t(r.static_smem) + 1024));
  *n = block_size > max_threads_of(r)
           ? 0
           : std::max(0, std::min({d.shape.max_ctas_sm, by_warps, by_regs, by_smem}));
  return cudaSuccess;
}

// ---- streams, events, graphs ----
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* st, unsigned flags) {
  *st = new CUstream_st;
  (*st)->blocking = !(flags & cudaStreamNonBlocking);
  auto& d = dev();
  std::lock_guard<std::recursive_mutex> lock(d.streams_mu);
  d.streams.push_back(*st);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* st) {
  return cudaStreamCreateWithFlags(st, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t st) {
  auto& d = dev();
  std::lock_guard<std::recursive_mutex> lock(d.streams_mu);
  wick_emu::run_all(st);  // (its work still runs, as on a GPU)
  d.streams.erase(std::find(d.streams.begin(), d.streams.end(), st));
  delete st;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) {
  if (st && st->capturing) return cudaErrorStreamCaptureUnsupported;
  if (wick_emu::unsafe_in_capture("cudaStreamSynchronize"))
    return cudaErrorStreamCaptureUnsupported;
  if (st)
    wick_emu::run_all(st);
  else
    wick_emu::run_streams(true);
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode mode) {
  if (!st || st->capturing) return cudaErrorIllegalState;
  st->capturing = true;
  st->invalidated = false;
  st->ops.clear();
  if (mode != cudaStreamCaptureModeRelaxed) wick_emu::g_strict_captures.push_back(st);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t* g) {
  if (!st || !st->capturing) return cudaErrorIllegalState;
  auto& strict = wick_emu::g_strict_captures;
  strict.erase(std::remove(strict.begin(), strict.end(), st), strict.end());
  st->capturing = false;
  *g = st->invalidated ? nullptr : new CUgraph_st{std::move(st->ops)};
  st->ops.clear();
  return st->invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t st, cudaStreamCaptureStatus* s) {
  *s = st && st->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
  *e = new CUgraphExec_st{g->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t st) {
  for (auto& op : e->ops) wick_emu::enqueue(st, op);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
  std::lock_guard<std::recursive_mutex> lock(dev().streams_mu);
  if (st && st->capturing) return cudaSuccess;  // (a node of the graph: nothing to wait for here)
  e->st = st;
  e->n_before = st ? st->n_enqueued : 0;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (wick_emu::unsafe_in_capture("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
  auto& d = dev();
  std::lock_guard<std::recursive_mutex> lock(d.streams_mu);
  if (std::find(d.streams.begin(), d.streams.end(), e->st) != d.streams.end())
    wick_emu::run_until(e->st, e->n_before);  // (a destroyed stream ran all its work)
  return cudaSuccess;
}

}  // extern "C"
