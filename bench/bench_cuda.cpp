// wick_gpu_bench: the CUDA matrix products at the projection shapes of real
// models (Google Benchmark), for the share of the H100's measured 3.0 TB/s
// that each decode product streams (CUDA issue: >= 70 % on the large ones).
//
// A benchmark is one product of one model's layer (q/k/v, o, gate/up, down,
// or the output head) in one weight type, launched many times in a CUDA
// graph over enough copies of the layer's weights (>= 256 MB, five times the
// L2) that every launch reads its weights from DRAM, as a decode step does.
// Times come from CUDA events around the graph. Names:
//   mm/MODEL/TYPE/PROJ/M<rows>/kw<slices>/t<tiles>/<chain>
// kw0 is kw_for's rule; kw4..kw32 force the slice count (the rule's table is
// chosen from these rows); t0 is the rule's 8-row tiles a warp, t1, t2, t4
// force them (decode of 16-bit weights only); at 512 rows, bf16 also at 4 and
// 8 slices (what the slice rule costs prefill). chain "b2b": products back to
// back (each may start while the one before drains, as launch_early allows);
// "norm": each after a one-row rmsnorm of its input, as in a decode step;
// "intb2b", "intnorm": the same with integer products (8/4-bit weights,
// WICK_CUDA_INT_MMA), each product's activation quantization timed with it
// (intnorm: made by the norm, as the backend does unless WICK_CUDA_NORM_INT=0),
// at one row also at 8, 16 and 32 forced slices (whether the rule's count,
// chosen for bf16 products, suits them) and, but for gate/up, two 8-row
// tiles a warp (t2); one-row integer products take dp4a (WICK_CUDA_INT_DP4A),
// and "immab2b", "immanorm" are the same on the tensor cores' mma instead.
// "xs0b2b", "xs0norm": bf16 products with x not staged
// in shared memory (WICK_CUDA_X_STAGE=0) at one row and (b2b) 16 rows.
// "pd0b2b": 8/4-bit weights at 512 rows with each warp of the tiled kernel
// decoding its own tiles' weights (WICK_CUDA_PREDECODE=0).
// Counters: us a product, GB/s of weight bytes, share of 3.0 TB/s, TFLOP/s.
// copy/d2d/MiB1024: this GPU's own ceiling, a device-to-device copy of 1 GiB
// (TB/s counting bytes read and written, as ../shared/anchors.md's 3.0 for
// the H100; an H200 copies at about 4.3), so that shares on another GPU can
// be read against it (gpu_kernels_table.py, gpu_table.py --peak).
//
// Run: build-gpu/bin/wick_gpu_bench [--benchmark_filter=REGEX]; without a
// GPU it prints why and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "io/dtype.h"
#include "model/shaped.h"

namespace wick {
namespace {

constexpr double kPeakBytesPerS = 3.0e12;  // the H100's measured copy (../shared/anchors.md)
constexpr size_t kRotateBytes = size_t(256) << 20;

struct ModelShape {
  const char* name;
  int64_t n_embd, n_ff, q_dim, kv_dim, n_vocab;
};
// as model/shaped.cpp's shapes
constexpr ModelShape kModels[] = {
    {"qwen2.5-0.5b", 896, 4864, 896, 128, 151936},
    {"llama3.2-1b", 2048, 8192, 2048, 512, 128256},
    {"llama3.2-3b", 3072, 8192, 3072, 1024, 128256},
    {"llama3.1-8b", 4096, 14336, 4096, 1024, 128256},
};
constexpr DType kTypes[] = {DType::BF16, DType::Q8_0, DType::Q4_0};
constexpr const char* kProjs[] = {"qkv", "o", "gate_up", "down", "head"};

// The weights of one product as [n_out, n_in] (q/k/v three, gate/up two).
std::vector<std::pair<int64_t, int64_t>> proj_shapes(const ModelShape& m, const std::string& proj) {
  if (proj == "qkv") return {{m.q_dim, m.n_embd}, {m.kv_dim, m.n_embd}, {m.kv_dim, m.n_embd}};
  if (proj == "o") return {{m.n_embd, m.q_dim}};
  if (proj == "gate_up") return {{m.n_ff, m.n_embd}, {m.n_ff, m.n_embd}};
  if (proj == "down") return {{m.n_embd, m.n_ff}};
  return {{m.n_vocab, m.n_embd}};
}

Backend& backend() {
  static std::unique_ptr<Backend> be = [] {
    BackendOptions o;
    o.device = Device::Cuda;
    o.gpu_memory_fraction = 0.9;
    return make_backend(o);
  }();
  return *be;
}

// One product's weights on the device, uploaded once (prepare_matrix) and
// copied on the device until the copies fill kRotateBytes; kept while
// consecutive benchmarks (registered in order) use the same ones.
struct Layer {
  std::string key;
  std::vector<Weight> prepared;                      // copy 0, as the backend made it
  std::vector<Buffer> buffers;                       // the other copies' bytes
  std::vector<std::vector<cuda::GpuWeight>> copies;  // [copy][weight of the product]
  size_t bytes = 0;                                  // one copy's device bytes (scales included)
  int64_t n_in = 0, n_out_total = 0;
  void clear() {  // (main calls it before the backend goes)
    copies.clear();
    buffers.clear();
    for (auto& w : prepared) backend().release_matrix(w);
    prepared.clear();
  }
};
Layer g_layer;

// The device bytes of one weight's q, scale and min.
size_t q_bytes(const cuda::GpuWeight& g) {
  const size_t half_bytes = g.fmt == cuda::Fmt::U4    ? 1
                            : g.fmt == cuda::Fmt::I8  ? 2
                            : g.fmt == cuda::Fmt::F32 ? 8
                                                      : 4;
  return size_t(g.n_out) * size_t(g.k_pad) * half_bytes / 2;
}
size_t scale_bytes(const cuda::GpuWeight& g) {
  return g.group ? size_t(g.n_out) * size_t(g.k_pad / g.group) * 4 : 0;
}

// A copy of g's bytes in new device buffers (kept in L.buffers).
cuda::GpuWeight copy_on_device(const cuda::GpuWeight& g, Layer& L) {
  auto dup = [&](const void* src, size_t n) -> void* {
    if (!src || !n) return nullptr;
    Buffer& b = L.buffers.emplace_back(backend().alloc(n));
    if (cudaMemcpy(b.data(), src, n, cudaMemcpyDeviceToDevice) != cudaSuccess)
      throw std::runtime_error("wick_gpu_bench: a device copy failed");
    return b.data();
  };
  cuda::GpuWeight c = g;
  c.q = dup(g.q, q_bytes(g));
  c.scale = static_cast<const float*>(dup(g.scale, scale_bytes(g)));
  c.min = static_cast<const float*>(dup(g.min, scale_bytes(g)));
  return c;
}

const Layer& layer(const ModelShape& m, DType t, const std::string& proj) {
  const std::string key = std::string(m.name) + "/" + dtype_name(t) + "/" + proj;
  if (g_layer.key == key) return g_layer;
  g_layer.clear();
  g_layer.key = key;
  g_layer.bytes = 0;
  g_layer.n_out_total = 0;
  uint64_t seed = 7;
  auto& first = g_layer.copies.emplace_back();
  for (auto [n_out, n_in] : proj_shapes(m, proj)) {
    std::vector<uint8_t> host(size_t(n_out) * row_bytes(t, n_in));
    fill_random_weight(t, n_out, n_in, host.data(), ++seed);
    const Weight& w = g_layer.prepared.emplace_back(
        backend().prepare_matrix(Weight{t, n_out, n_in, host.data()}));
    backend().sync();  // (the upload may read host memory until then)
    const auto& g = *static_cast<const cuda::GpuWeight*>(w.aux);
    first.push_back(g);
    g_layer.bytes += q_bytes(g) + scale_bytes(g) * (g.min ? 2 : 1);
    g_layer.n_in = n_in;
    g_layer.n_out_total += n_out;
  }
  for (size_t total = g_layer.bytes; total < kRotateBytes; total += g_layer.bytes) {
    std::vector<cuda::GpuWeight> c;
    for (const auto& g : g_layer.copies[0]) c.push_back(copy_on_device(g, g_layer));
    g_layer.copies.push_back(std::move(c));
  }
  return g_layer;
}

struct Stream {
  cudaStream_t st = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  Stream() {
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
  }
};

#define BENCH_CUDA(call)                                                                 \
  do {                                                                                   \
    const cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                             \
      state.SkipWithError((std::string(#call) + ": " + cudaGetErrorString(e_)).c_str()); \
      return;                                                                            \
    }                                                                                    \
  } while (0)

void BM_Product(benchmark::State& state, const ModelShape m, DType t, std::string proj, int M,
                int kw, int tiles, bool norm_first, bool int_mma, bool x_stage, bool dp4a,
                bool predecode) {
  Backend& be = backend();
  const Layer& L = layer(m, t, proj);
  static Stream s;
  struct Reset {
    bool int_was = cuda::int_products(), stage_was = cuda::x_stage(), dp4a_was = cuda::int_dp4a(),
         pre_was = cuda::predecode();
    ~Reset() {
      cuda::set_predecode(pre_was);
      cuda::set_kw_force(0);
      cuda::set_decode_tiles(0);
      cuda::set_int_products(int_was);
      cuda::set_x_stage(stage_was);
      cuda::set_int_dp4a(dp4a_was);
    }
  } reset;
  cuda::set_kw_force(kw);
  cuda::set_decode_tiles(tiles);
  cuda::set_int_products(int_mma);
  cuda::set_x_stage(x_stage);
  cuda::set_int_dp4a(dp4a);
  cuda::set_predecode(predecode);
  // x, a norm's weights, the outputs, and the prefill kernel's scratch
  const int64_t n_in = L.n_in;
  std::vector<float> hx(size_t(M * n_in));
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-3f;
  Buffer x = be.alloc(hx.size() * 4), xn = be.alloc(hx.size() * 4), nw = be.alloc(size_t(n_in) * 4),
         y = be.alloc(size_t(M) * size_t(L.n_out_total) * 4);
  be.copy_to_device(x.data(), hx.data(), hx.size() * 4);
  be.copy_to_device(nw.data(), hx.data(), size_t(n_in) * 4);
  const cuda::GpuWeight& w0 = L.copies[0][0];
  Buffer xb;
  if (M >= 64 || cuda::int_path(w0)) xb = be.alloc(cuda::matmul_scratch_bytes(M, w0.k_pad));
  be.sync();

  // the product's input: x, or its norm computed just before (decode's order;
  // with integer products the norm makes x's integer form, as the backend's)
  const float* in = norm_first ? xn.as<float>() : x.as<float>();
  Buffer ni_buf;
  cuda::NormInt ni_form;
  const cuda::NormInt* ni = nullptr;
  if (norm_first && cuda::int_path(w0) && cuda::norm_int()) {
    ni_buf = be.alloc(cuda::norm_int_bytes(M, int(n_in)));
    ni_form = cuda::NormInt{ni_buf.data(), M, int(n_in)};
    ni = &ni_form;
  }
  auto product = [&](const std::vector<cuda::GpuWeight>& c) {
    if (norm_first)
      cuda::rmsnorm(x.as<float>(), nw.as<float>(), M, int(n_in), 1e-6f, xn.as<float>(), s.st, ni);
    cuda::MatmulJob jobs[3];
    float* out = y.as<float>();
    for (size_t i = 0; i < c.size(); ++i) {
      jobs[i] = {&c[i], out, nullptr};
      out += size_t(M) * size_t(c[i].n_out);
    }
    if (proj == "gate_up")
      cuda::matmul_gate_up(*jobs[0].w, *jobs[1].w, in, M, y.as<float>(), xb.data(), s.st, ni);
    else
      cuda::matmul(jobs, int(c.size()), in, M, xb.data(), s.st, ni);
  };
  // enough launches for ~2 ms at the peak, and at least every copy once
  const double ideal_s = double(L.bytes) / kPeakBytesPerS;
  const int n_copies = int(L.copies.size());
  const int n_launch = std::max(n_copies, std::min(4000, int(2e-3 / ideal_s) + 1));
  // once outside the capture: each kernel's first launch sets its attributes
  product(L.copies[0]);
  BENCH_CUDA(cudaStreamSynchronize(s.st));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CUDA(cudaStreamBeginCapture(s.st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n_launch; ++i) product(L.copies[size_t(i % n_copies)]);
  BENCH_CUDA(cudaStreamEndCapture(s.st, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  BENCH_CUDA(cudaGraphLaunch(exec, s.st));  // warm: clocks, the instruction cache
  BENCH_CUDA(cudaStreamSynchronize(s.st));
  double total_s = 0;
  int64_t n_graphs = 0;
  for (auto _ : state) {
    cudaEventRecord(s.t0, s.st);
    cudaGraphLaunch(exec, s.st);
    cudaEventRecord(s.t1, s.st);
    BENCH_CUDA(cudaEventSynchronize(s.t1));
    float ms = 0;
    cudaEventElapsedTime(&ms, s.t0, s.t1);
    state.SetIterationTime(ms * 1e-3);
    total_s += ms * 1e-3;
    ++n_graphs;
  }
  cudaGraphExecDestroy(exec);
  const double per = total_s / double(n_graphs * n_launch);
  state.counters["us"] = per * 1e6;
  state.counters["GB/s"] = double(L.bytes) / per * 1e-9;
  state.counters["of_3TB/s"] = double(L.bytes) / per / kPeakBytesPerS;
  state.counters["TFLOP/s"] = 2.0 * M * double(L.n_out_total) * double(n_in) / per * 1e-12;
  state.counters["MB"] = double(L.bytes) * 1e-6;
}

// A device-to-device copy of 1 GiB, ten a graph: the bandwidth the products'
// shares are read against (on an H100, anchors.md's 3.0 TB/s).
void BM_Copy(benchmark::State& state) {
  Backend& be = backend();
  static Stream s;
  constexpr size_t kBytes = size_t(1) << 30;
  constexpr int kCopies = 10;
  Buffer src = be.alloc(kBytes), dst = be.alloc(kBytes);
  BENCH_CUDA(cudaMemsetAsync(src.data(), 0x5a, kBytes, s.st));  // (not zeros)
  BENCH_CUDA(cudaMemsetAsync(dst.data(), 0xa5, kBytes, s.st));
  BENCH_CUDA(cudaMemcpyAsync(dst.data(), src.data(), kBytes, cudaMemcpyDeviceToDevice, s.st));
  BENCH_CUDA(cudaStreamSynchronize(s.st));  // (warm: clocks)
  double total_s = 0;
  int64_t n = 0;
  for (auto _ : state) {
    BENCH_CUDA(cudaEventRecord(s.t0, s.st));
    for (int i = 0; i < kCopies; ++i)
      BENCH_CUDA(cudaMemcpyAsync(dst.data(), src.data(), kBytes, cudaMemcpyDeviceToDevice, s.st));
    BENCH_CUDA(cudaEventRecord(s.t1, s.st));
    BENCH_CUDA(cudaEventSynchronize(s.t1));
    float ms = 0;
    cudaEventElapsedTime(&ms, s.t0, s.t1);
    state.SetIterationTime(ms * 1e-3);
    total_s += ms * 1e-3;
    n += kCopies;
  }
  const double per = total_s / double(n);
  state.counters["us"] = per * 1e6;
  state.counters["TB/s"] = 2.0 * double(kBytes) / per * 1e-12;  // read + written
  state.counters["of_3TB/s"] = 2.0 * double(kBytes) / per / kPeakBytesPerS;
}

void register_all() {
  benchmark::RegisterBenchmark("copy/d2d/MiB1024", BM_Copy)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(5);
  for (const ModelShape& m : kModels)
    for (DType t : kTypes)
      for (const char* proj : kProjs) {
        bool fits = true;  // shaped models' rule: rows split into whole blocks
        for (auto [n_out, n_in] : proj_shapes(m, proj))
          fits = fits && n_in % traits(t).block_size == 0;
        if (!fits) continue;
        const std::string base = std::string("mm/") + m.name + "/" + dtype_name(t) + "/" + proj;
        struct Run {
          int M, kw, tiles;
          bool norm, int_mma = false, xs0 = false, mma = false;  // mma: dp4a off
          bool pd0 = false;  // the tiled kernel's warps decode their own weights
        };
        for (Run r : {Run{1, 0, 0, false},
                      Run{1, 4, 0, false},
                      Run{1, 8, 0, false},
                      Run{1, 16, 0, false},
                      Run{1, 32, 0, false},
                      Run{1, 0, 1, false},
                      Run{1, 0, 2, false},
                      Run{1, 0, 4, false},
                      Run{1, 0, 0, true},
                      Run{16, 0, 0, false},
                      Run{512, 0, 0, false},
                      Run{512, 4, 0, false},
                      Run{512, 8, 0, false},
                      Run{1, 0, 0, false, true},
                      Run{1, 0, 0, true, true},
                      Run{16, 0, 0, false, true},
                      Run{512, 0, 0, false, true},
                      Run{1, 8, 0, false, true},
                      Run{1, 16, 0, false, true},
                      Run{1, 32, 0, false, true},
                      Run{1, 0, 2, false, true},
                      Run{1, 0, 0, false, true, false, true},
                      Run{1, 0, 0, true, true, false, true},
                      Run{1, 0, 0, false, false, true},
                      Run{1, 0, 0, true, false, true},
                      Run{16, 0, 0, false, false, true},
                      Run{512, 0, 0, false, false, false, false, true}}) {
          // (8- and 4-bit weights: one tile a warp, but for integer products' two)
          if (r.tiles && t != DType::BF16 && !r.int_mma) continue;
          if (r.tiles && r.int_mma && proj == std::string("gate_up")) continue;  // (gated: one)
          if (r.M == 512 && r.kw && t != DType::BF16) continue;    // (prefill's slice sweep: bf16)
          if ((r.int_mma || r.pd0) && t == DType::BF16) continue;  // (8/4-bit weights)
          const std::string chain = std::string(r.mma       ? "/imma"
                                                : r.int_mma ? "/int"
                                                : r.xs0     ? "/xs0"
                                                : r.pd0     ? "/pd0"
                                                            : "/") +
                                    (r.norm ? "norm" : "b2b");
          const std::string name = base + "/M" + std::to_string(r.M) + "/kw" +
                                   std::to_string(r.kw) + "/t" + std::to_string(r.tiles) + chain;
          benchmark::RegisterBenchmark(name.c_str(), BM_Product, m, t, std::string(proj), r.M, r.kw,
                                       r.tiles, r.norm, r.int_mma, !r.xs0, !r.mma, !r.pd0)
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond)
              ->Iterations(10);  // a graph is >= ~2 ms of thousands of products
        }
      }
}

}  // namespace
}  // namespace wick

int main(int argc, char** argv) {
  bool listing = false;  // --benchmark_list_tests needs no GPU
  for (int i = 1; i < argc; ++i) listing = listing || std::strstr(argv[i], "list_tests") != nullptr;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!listing && wick::cuda_device_count() == 0) {
    std::printf("wick_gpu_bench: skipped, no CUDA GPU visible (%s)\n", wick::cuda_status().c_str());
    return 0;
  }
  wick::register_all();
  benchmark::RunSpecifiedBenchmarks();
  wick::g_layer.clear();
  benchmark::Shutdown();
  return 0;
}
