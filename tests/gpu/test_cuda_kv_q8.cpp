// The GPU's q8_0 KV cache (--kv-cache-dtype q8_0): its writers give the
// bytes of the CPU's quantize_row_q8_0 (laid out as kernels.h's KvLayer
// says), whole blocks copy both planes, and a model on it keeps batch
// invariance and tracks the CPU's q8_0 cache. (Attention and deviations over
// it: CudaAttention's q8_0 cases and CudaKv.DeviationMatchesCpu in
// test_cuda_kernels.cpp.)
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "engine/engine.h"
#include "engine_run.h"
#include "gpu/gpu_helpers.h"
#include "helpers.h"

namespace wick::test {
namespace {

// Where two byte strings first differ (-1: nowhere).
int64_t first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

// kv_write and rope_kv_write store the CPU's bytes in layer 1 (not 0): rows
// of 3 blocks (3 heads of 32), a row of zeros (scale 0), a row of one large
// value among small ones, and keys rotated first (the quantized values are
// of the rotated f32 row the kernel leaves in k).
TEST(CudaKvQ8, WritesHoldTheCpusBytes) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend_q8();
  std::mt19937 rng(8);
  const int64_t n_head = 6, n_head_kv = 3, hd = 32, kv_dim = n_head_kv * hd, bs = 16;
  const int64_t n_blocks = 3, n_slots = n_blocks * bs;
  Batch b;
  b.block_tables = {{2, 0}, {1}};
  b.add(1, 5, 0, false);
  b.add(1, 17, 0, false);
  b.add(1, 3, 1, false);
  b.finish(int32_t(bs));
  const std::vector<int64_t> slots{2 * bs + 5, 0 * bs + 1, 1 * bs + 3};
  auto k = randn(size_t(3 * kv_dim), rng), v = randn(size_t(3 * kv_dim), rng);
  for (int64_t i = 0; i < kv_dim; ++i) v[size_t(kv_dim + i)] = 0.f;  // token 1's V: zeros
  v[size_t(2 * kv_dim + 7)] = 1e4f;                                  // token 2's: one outlier
  auto q = randn(size_t(3 * n_head * hd), rng);
  const std::vector<float> inv = rope_inv_freq(hd);
  for (bool rope : {false, true}) {
    SCOPED_TRACE(rope ? "rope_kv_write" : "kv_write");
    auto kv = be->make_kv(2, n_blocks, bs, kv_dim);
    ASSERT_EQ(kv->dtype, DType::Q8_0);
    const BatchArgs a = be->upload(b);
    Buffer dq = to_device(*be, q.data(), q.size() * 4), dk = to_device(*be, k.data(), k.size() * 4),
           dv = to_device(*be, v.data(), v.size() * 4),
           dinv = to_device(*be, inv.data(), inv.size() * 4);
    if (rope)
      be->rope_kv_write(dq.as<float>(), dk.as<float>(), dv.as<float>(), *kv, 1, a,
                        AttnShape{n_head, n_head_kv, hd, 0}, dinv.as<float>());
    else
      be->kv_write(*kv, 1, a, dk.as<float>(), dv.as<float>());
    const auto k_rows = to_host<float>(*be, dk, k.size());  // (rotated where rope)
    if (rope) {
      auto want_k = k;
      cpu::rope(want_k.data(), b.positions.data(), 3, n_head_kv, hd, inv.data());
      EXPECT_LT(max_rel(k_rows, want_k), 2e-5);
    }
    // each layer's planes whole: the three rows where their slots are, zeros
    // (quantized: q 0, d 0) everywhere else, layer 0 untouched
    for (int il = 0; il < 2; ++il)
      for (bool is_v : {false, true}) {
        std::vector<float> rows(size_t(n_slots * kv_dim), 0.f);
        if (il == 1)
          for (size_t t = 0; t < 3; ++t)
            std::memcpy(&rows[size_t(slots[t] * kv_dim)], &(is_v ? v : k_rows)[t * size_t(kv_dim)],
                        size_t(kv_dim) * 4);
        std::vector<uint8_t> got(kv->layer_bytes());
        be->copy_to_host(got.data(), is_v ? kv->v_layer<void>(il) : kv->k_layer<void>(il),
                         got.size());
        EXPECT_EQ(first_diff(got, q8_cache_planes(rows, kv_dim)), -1)
            << "layer " << il << (is_v ? " V" : " K") << ": first differing byte (int8 plane "
            << n_slots * kv_dim << " bytes, then the scales)";
      }
  }
}

// copy_blocks copies a block's int8 rows and its scales' rows, every layer,
// and nothing else.
TEST(CudaKvQ8, CopiedBlocksKeepBothPlanes) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend_q8();
  std::mt19937 rng(9);
  const int64_t kv_dim = 64, bs = 16, n_blocks = 5;
  auto kv = be->make_kv(2, n_blocks, bs, kv_dim);
  const size_t per_layer = size_t(n_blocks * bs * kv_dim);
  std::vector<std::vector<float>> rows(4);  // layer 0 K, V, layer 1 K, V
  for (int il = 0; il < 2; ++il)
    for (int kvv = 0; kvv < 2; ++kvv) {
      auto& r = rows[size_t(2 * il + kvv)];
      r = randn(per_layer, rng);
      const auto planes = q8_cache_planes(r, kv_dim);
      be->copy_to_device(kvv ? kv->v_layer<void>(il) : kv->k_layer<void>(il), planes.data(),
                         planes.size());
    }
  const std::vector<std::pair<int32_t, int32_t>> pairs{{1, 3}, {4, 0}};
  be->copy_blocks(*kv, pairs);
  for (int il = 0; il < 2; ++il)
    for (int kvv = 0; kvv < 2; ++kvv) {
      auto want_rows = rows[size_t(2 * il + kvv)];
      for (auto [src, dst] : pairs)
        std::memcpy(&want_rows[size_t(dst * bs * kv_dim)],
                    &rows[size_t(2 * il + kvv)][size_t(src * bs * kv_dim)],
                    size_t(bs * kv_dim) * 4);
      std::vector<uint8_t> got(kv->layer_bytes());
      be->copy_to_host(got.data(), kvv ? kv->v_layer<void>(il) : kv->k_layer<void>(il), got.size());
      EXPECT_EQ(first_diff(got, q8_cache_planes(want_rows, kv_dim)), -1)
          << "layer " << il << (kvv ? " V" : " K");
    }
}

// A whole model on a q8_0 cache (the tiny qwen3: the one tiny model whose
// head_dim, 32, a q8_0 cache takes; its 4 layers' planes share one buffer,
// so layers past the first start 2-byte aligned at some lengths).
const char* kQ8Arch = "qwen3";

// Logits: a prompt's prefill (the tiled products, chunks of 5) has the bits
// of the same tokens decoded one at a time; against the CPU's q8_0 cache
// within bf16's tolerance (each side quantizes its own K/V: a block's
// quantum moves with K's last bits), and against the GPU's f16 cache.
TEST(TinyQ8OnGpu, LogitsTrackTheCpuAndPrefillEqualsDecode) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir(kQ8Arch) + "/bf16");
  auto q8 = prepare_model(*m, make_backend(cuda_q8_opts()));
  auto f16 = prepare_model(*m, make_backend(cuda_opts(false)));
  auto cpu = prepare_model(*m, make_cpu_backend(DType::Q8_0));
  std::mt19937 rng(3);
  const std::vector<int32_t> ids = random_tokens(rng, 37, 256);
  cuda::set_matmul_path(cuda::MatmulPath::Tiled);
  const auto prefill = run_all_logits(*q8->backend, m->config, q8->weights, ids, 5);
  cuda::set_matmul_path(cuda::MatmulPath::Auto);
  const auto decode = run_all_logits(*q8->backend, m->config, q8->weights, ids, 1);
  EXPECT_EQ(prefill, decode);
  const auto want = run_all_logits(*cpu->backend, m->config, cpu->weights, ids);
  const auto on_f16 = run_all_logits(*f16->backend, m->config, f16->weights, ids);
  const double err_cpu = rel_err(prefill, want), err_f16 = rel_err(prefill, on_f16);
  std::printf(
      "[ report ] q8_0 cache on the GPU: relative error %.2e to the CPU's q8_0 cache, "
      "%.2e to the GPU's f16 cache\n",
      err_cpu, err_f16);
  EXPECT_LT(err_cpu, 3e-2);
  EXPECT_LT(err_f16, 3e-2);
}

// Batch invariance on a q8_0 cache: concurrent requests (chunked prefills,
// decodes, graphs) give the tokens of each request alone; and a span request
// served from cached spans (keys kept before RoPE, quantized, rotated as
// attention reads them) in another order answers as a fresh engine does.
TEST(TinyQ8OnGpu, EngineBatchedEqualsAloneAndSpansReuse) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir(kQ8Arch), {}, cuda_q8_opts());
  std::mt19937 rng(1);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r =
        greedy_request(random_tokens(rng, 3 + int(rng() % 60), 512), 4 + int32_t(rng() % 16));
    r.prefill_chunk = i % 3 == 0 ? 5 : 0;
    reqs.push_back(r);
  }
  EngineConfig cfg;
  cfg.max_batch_tokens = 48;
  cfg.max_seqs = 6;
  cfg.n_blocks = 256;
  const auto alone = run_one_by_one(m, cfg, reqs);
  Engine e(m, cfg);
  const auto together = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
  EXPECT_EQ(e.blocks().n_used(), 0);

  EngineConfig span_cfg = cfg;
  span_cfg.span_cache = true;
  const auto prefix = random_tokens(rng, 5, 256);
  const auto A = random_tokens(rng, 20, 256), B = random_tokens(rng, 37, 256),
             C = random_tokens(rng, 9, 256);
  Engine spans(m, span_cfg);
  run_one(spans, request_with_spans(prefix, {A, B, C}, random_tokens(rng, 6, 256), 8));
  const GenerateRequest again =
      request_with_spans(prefix, {C, A, B}, random_tokens(rng, 6, 256), 8);
  const GenerateResult reused = run_one(spans, again);
  EXPECT_EQ(reused.n_span_hits, 3);
  Engine fresh(m, span_cfg);
  const GenerateResult first = run_one(fresh, again);
  EXPECT_EQ(reused.tokens, first.tokens);
  EXPECT_EQ(reused.first_logits, first.first_logits);
}

}  // namespace
}  // namespace wick::test
