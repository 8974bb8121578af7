// Micro-benchmarks of the CPU kernels (Google Benchmark). Speed targets live
// here and in `wick bench`, never in unit tests.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/batch.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/simd.h"
#include "io/quant_blocks.h"

namespace {

using namespace wick;

// A random weight of the given type: random blocks with sane f16 scales.
std::vector<uint8_t> random_weight(DType t, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  std::vector<float> row(static_cast<size_t>(n_in));
  std::normal_distribution<float> nd(0.f, 0.02f);
  const size_t rb = row_bytes(t, n_in);
  std::vector<uint8_t> out(size_t(n_out) * rb);
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& x : row) x = nd(rng);
    uint8_t* dst = out.data() + size_t(r) * rb;
    switch (t) {
      case DType::F32:
        std::memcpy(dst, row.data(), rb);
        break;
      case DType::BF16:
        for (int64_t i = 0; i < n_in; ++i)
          reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(row[size_t(i)]);
        break;
      case DType::Q8_0:
        quantize_row_q8_0(row.data(), dst, n_in);
        break;
      case DType::F16:
        for (int64_t i = 0; i < n_in; ++i)
          reinterpret_cast<uint16_t*>(dst)[i] = f32_to_f16(row[size_t(i)]);
        break;
      default: {  // block types: random codes, small f16 scales (and mins)
        for (size_t i = 0; i < rb; ++i) dst[i] = uint8_t(rng());
        const size_t bb = traits(t).block_bytes;
        const bool has_min = t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K ||
                             t == DType::Q5_K || t == DType::Q2_K;
        const size_t d_off = t == DType::Q6_K   ? offsetof(BlockQ6_K, d)
                             : t == DType::Q2_K ? offsetof(BlockQ2_K, d)
                             : t == DType::Q3_K ? offsetof(BlockQ3_K, d)
                                                : 0;
        const uint16_t d = f32_to_f16(0.002f);
        for (size_t b = 0; b < rb / bb; ++b) {
          std::memcpy(dst + b * bb + d_off, &d, 2);
          if (has_min) std::memcpy(dst + b * bb + d_off + 2, &d, 2);
        }
      }
    }
  }
  return out;
}

// y = W x for a Qwen2.5-0.5B-sized projection (896 -> 4864), n_rows tokens.
void BM_Matmul(benchmark::State& st, DType t) {
  const int64_t n_in = 896, n_out = 4864, n_rows = st.range(0);
  std::mt19937 rng(1);
  auto wbytes = random_weight(t, n_out, n_in, rng);
  Weight w{t, n_out, n_in, wbytes.data()};
  std::vector<float> x(size_t(n_rows * n_in)), y(size_t(n_rows * n_out));
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  cpu::set_n_threads(0);
  for (auto _ : st) {
    cpu::matmul(w, x.data(), n_rows, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(double(2 * n_in * n_out * n_rows),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  st.counters["weight_GB/s"] =
      benchmark::Counter(double(wbytes.size()), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
  st.SetLabel(std::string(dtype_name(t)) + " " + cpu::simd().isa);
}
BENCHMARK_CAPTURE(BM_Matmul, f32, DType::F32)->Arg(1)->Arg(32);
BENCHMARK_CAPTURE(BM_Matmul, bf16, DType::BF16)->Arg(1)->Arg(32);
BENCHMARK_CAPTURE(BM_Matmul, q8_0, DType::Q8_0)->Arg(1)->Arg(32);
BENCHMARK_CAPTURE(BM_Matmul, q4_0, DType::Q4_0)->Arg(1)->Arg(32);
BENCHMARK_CAPTURE(BM_Matmul, q4_1, DType::Q4_1)->Arg(1)->Arg(32);

// The blocked multiply on packed weights, one thread, the default kernel set, each path a type
// takes: y = W x for 896 -> 4864 (1024 -> 4864 for the K types: whole blocks), n_rows tokens.
void BM_Gemm(benchmark::State& st, DType t, cpu::GemmPath path) {
  const auto& k = cpu::simd();
  if (path == cpu::GemmPath::BF16 && !k.bf16_dp) {
    st.SkipWithError("this kernel set has no vdpbf16ps");
    return;
  }
  const int64_t n_in = traits(t).block_size == 256 ? 1024 : 896, n_out = 4864;
  const int64_t n_rows = st.range(0);
  std::mt19937 rng(1);
  auto wbytes = random_weight(t, n_out, n_in, rng);
  cpu::PackedMatrix m;
  m.path = path;
  const cpu::AlignedBytes packed = cpu::pack_matrix(Weight{t, n_out, n_in, wbytes.data()}, m);
  std::vector<float> x(size_t(n_rows * n_in)), y(size_t(n_rows * n_out));
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  cpu::set_n_threads(1);
  for (auto _ : st) {
    cpu::matmul_packed(m, x.data(), n_rows, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  cpu::set_n_threads(0);
  st.counters["GFLOP/s"] = benchmark::Counter(double(2 * n_in * n_out * n_rows),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  st.counters["weight_GB/s"] =
      benchmark::Counter(double(wbytes.size()), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
  st.SetLabel(k.isa);
}
[[maybe_unused]] const bool kGemmRegistered = [] {
  const char* names[] = {"f32", "i8", "bf16", "i8x3"};
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                  DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K,
                  DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS})
    for (auto p :
         {cpu::GemmPath::F32, cpu::GemmPath::I8, cpu::GemmPath::I8X3, cpu::GemmPath::BF16}) {
      if ((p != cpu::GemmPath::F32 && p != cpu::GemmPath::BF16 && !cpu::code_bits(t)) ||
          (p == cpu::GemmPath::BF16 && t != DType::BF16))
        continue;
      benchmark::RegisterBenchmark(
          (std::string("BM_Gemm/") + dtype_name(t) + "/" + names[int(p)]).c_str(), BM_Gemm, t, p)
          ->Arg(1)
          ->Arg(128);
    }
  return true;
}();

// One thread, one kernel set: dot_row over every row of a 4864 x 1024 weight (the fused decode
// kernel), and dequant_row + dot (what prefill does per weight row and activation row). 1024
// (Qwen3-0.6B's width) rather than 896 so that K-quant rows are whole blocks.
void BM_DotRow(benchmark::State& st, const char* isa, DType t, bool fused) {
  const cpu::SimdKernels* k = cpu::simd_for(isa);
  if (!k) {
    st.SkipWithError("this CPU lacks the ISA");
    return;
  }
  const int64_t n_in = 1024, n_out = 4864;
  std::mt19937 rng(1);
  auto wbytes = random_weight(t, n_out, n_in, rng);
  const size_t rb = row_bytes(t, n_in);
  std::vector<float> x(static_cast<size_t>(n_in)), buf(static_cast<size_t>(n_in));
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  for (auto _ : st) {
    float acc = 0;
    for (int64_t o = 0; o < n_out; ++o) {
      const uint8_t* w = wbytes.data() + size_t(o) * rb;
      if (fused) {
        acc += k->dot_row(t, w, x.data(), n_in, buf.data());
      } else {
        k->dequant_row(t, w, buf.data(), n_in);
        acc += k->dot(x.data(), buf.data(), n_in);
      }
    }
    benchmark::DoNotOptimize(acc);
  }
  st.counters["weight_GB/s"] =
      benchmark::Counter(double(wbytes.size()), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}
[[maybe_unused]] const bool kDotRowRegistered = [] {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                  DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (const char* isa : {"generic", "avx2", "avx512", "avx512bf16"})
      for (bool fused : {true, false})
        benchmark::RegisterBenchmark(
            (std::string(fused ? "BM_DotRow/" : "BM_DequantDot/") + dtype_name(t) + "/" + isa)
                .c_str(),
            BM_DotRow, isa, t, fused);
  return true;
}();

// One thread: a decode step's attention at depth range(0) on one layer of a KV cache of type t
// (SmolLM2's shape: 9 query heads on 3 KV heads of 64), the layers taken in turn over a cache
// of at least 128 MB, so that the keys and values come from memory as in a real step; the
// cache read as whole rows (what decode does) or as one head's slice of each row.
void BM_AttnDecode(benchmark::State& st, DType t, cpu::KvReads reads) {
  const int64_t n_head = 9, n_head_kv = 3, hd = 64, kv_dim = n_head_kv * hd, bs = 16;
  const int64_t depth = st.range(0), n_blocks = (depth + bs - 1) / bs;
  const size_t rb = row_bytes(t, kv_dim), layer_b = size_t(n_blocks * bs) * rb;
  const int64_t n_layer = int64_t((size_t(128) << 20) / (2 * layer_b) + 1);
  std::mt19937 rng(1);
  auto kv = random_weight(t, 2 * n_layer * n_blocks * bs, kv_dim, rng);
  std::vector<float> q(size_t(n_head * hd)), out(q.size());
  std::normal_distribution<float> nd;
  for (auto& v : q) v = nd(rng);
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t i = 0; i < n_blocks; ++i) table[size_t(i)] = int32_t(i);
  const int32_t pos = int32_t(depth - 1), zero = 0, slot = pos, runs[2] = {0, 1};
  BatchArgs b;
  b.n_tokens = b.n_seqs = b.n_logits = b.n_runs = b.max_run = 1;
  b.block_size = int32_t(bs);
  b.max_blocks = int32_t(n_blocks);
  b.max_ctx = int32_t(depth);
  b.positions = b.rope_pos = &pos;
  b.seq_of = b.logit_rows = &zero;
  b.slots = &slot;
  b.block_table = table.data();
  b.runs = runs;
  cpu::set_n_threads(1);
  cpu::set_kv_reads(reads);
  int64_t layer = 0;
  for (auto _ : st) {
    const uint8_t* kl = kv.data() + size_t(2 * layer) * layer_b;
    cpu::attention(q.data(), kl, kl + layer_b, t, kv_dim, b, AttnShape{n_head, n_head_kv, hd, 0},
                   nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % n_layer;
  }
  cpu::set_kv_reads(cpu::KvReads::Auto);
  cpu::set_n_threads(0);
  st.counters["kv_GB/s"] = benchmark::Counter(double(2 * depth) * double(rb),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  st.SetLabel(cpu::simd().isa);
}
// One thread: a prefill chunk's attention, 128 queries after range(0) keys, on one layer of
// Qwen2.5-0.5B's shape (14 query heads on 2 KV heads of 64) with a cache of type t (bf16: on
// AMX tiles where the kernel set has them). Counted in query tokens a second.
void BM_AttnPrefill(benchmark::State& st, DType t) {
  const int64_t n_head = 14, n_head_kv = 2, hd = 64, kv_dim = n_head_kv * hd, bs = 16, n_q = 128;
  const int64_t depth = st.range(0), n_ctx = depth + n_q, n_blocks = (n_ctx + bs - 1) / bs;
  std::mt19937 rng(1);
  auto kv = random_weight(t, 2 * n_blocks * bs, kv_dim, rng);
  const size_t layer_b = size_t(n_blocks * bs) * row_bytes(t, kv_dim);
  std::vector<float> q(size_t(n_q * n_head * hd)), out(q.size());
  std::normal_distribution<float> nd;
  for (auto& v : q) v = nd(rng);
  Batch batch;
  batch.block_tables.emplace_back();
  for (int64_t i = 0; i < n_blocks; ++i) batch.block_tables.back().push_back(int32_t(i));
  for (int64_t i = 0; i < n_q; ++i) batch.add(7, int32_t(depth + i), 0, true);
  batch.finish(int32_t(bs));
  const BatchArgs b = batch.args(batch.packed().data());
  cpu::set_n_threads(1);
  for (auto _ : st) {
    cpu::attention(q.data(), kv.data(), kv.data() + layer_b, t, kv_dim, b,
                   AttnShape{n_head, n_head_kv, hd, 0}, nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  cpu::set_n_threads(0);
  st.counters["tok/s"] =
      benchmark::Counter(double(n_q), benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(cpu::simd().isa);
}
[[maybe_unused]] const bool kAttnPrefillRegistered = [] {
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    benchmark::RegisterBenchmark((std::string("BM_AttnPrefill/") + dtype_name(t)).c_str(),
                                 BM_AttnPrefill, t)
        ->Arg(512)
        ->Arg(2048);
  return true;
}();

[[maybe_unused]] const bool kAttnRegistered = [] {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
    for (auto [reads, name] : {std::pair{cpu::KvReads::WholeRows, "whole"},
                               std::pair{cpu::KvReads::HeadSlices, "slices"}})
      benchmark::RegisterBenchmark(
          (std::string("BM_AttnDecode/") + dtype_name(t) + "/" + name).c_str(), BM_AttnDecode, t,
          reads)
          ->Arg(1024)
          ->Arg(4096);
  return true;
}();

void BM_Dot(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> a(size_t(n), 1.f), b(size_t(n), 2.f);
  const auto& k = cpu::simd();
  for (auto _ : st) benchmark::DoNotOptimize(k.dot(a.data(), b.data(), n));
  st.SetLabel(k.isa);
}
BENCHMARK(BM_Dot)->Arg(64)->Arg(896)->Arg(4864);

}  // namespace

BENCHMARK_MAIN();
