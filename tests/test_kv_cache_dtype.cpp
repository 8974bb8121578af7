// The CPU's f16, bf16 and q8_0 KV caches (--kv-cache-dtype f16|bf16|q8_0). f16 and bf16 (with
// AMX: attention on tiles, attention_amx.inc): half the bytes; logits near
// transformers' on every tiny architecture; batch invariance kept (a prompt
// in chunks has the bits of one pass, the engine's batched run the tokens of
// sequential sessions); keys kept before RoPE (the span cache) and the
// selective recompute's deviation read it too. q8_0 (head dims a multiple of
// 32): 0.27 of the bytes, on the default model against its float64 reference.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "engine_run.h"
#include "helpers.h"

namespace wick::test {
namespace {

BackendOptions f16_options() {
  BackendOptions o;
  o.device = Device::Cpu;
  o.kv_cache_dtype = "f16";
  return o;
}

TEST(KvF16, HalfTheBytes) {
  auto f32 = make_cpu_backend(), f16 = make_cpu_backend(DType::F16);
  EXPECT_EQ(f16->kv_dtype(), DType::F16);
  auto a = f32->make_kv(4, 8, 16, 128), b = f16->make_kv(4, 8, 16, 128);
  EXPECT_EQ(b->dtype, DType::F16);
  EXPECT_EQ(2 * b->k.bytes(), a->k.bytes());
  EXPECT_EQ(2 * b->v.bytes(), a->v.bytes());
  auto bf16 = make_cpu_backend(DType::BF16);
  auto c = bf16->make_kv(4, 8, 16, 128);
  EXPECT_EQ(c->dtype, DType::BF16);
  EXPECT_EQ(2 * c->k.bytes(), a->k.bytes());
  EXPECT_THROW(make_cpu_backend(DType::Q4_0), std::runtime_error);
}

// Against transformers' f32 logits the f16 cache's rounding (2^-11 of each
// K and V element) moves the logits by 3.6e-4 to 1.0e-3 of their scale on
// the eight tiny models; the bound is 2e-3 (the f32 cache's is 1e-4).
// The bf16 cache's rounding (2^-8 of each K and V element; with AMX q and the
// softmax weights too) moves the dense tiny models' logits by 2.5e-3 to 8.5e-3
// of their scale. The tiny mixtures of experts' routers have near ties that it
// tips: an expert changes and the logits move by up to 0.32 (Mixtral). For them
// only the bits are checked, and the error printed.
constexpr double kBf16Bound = 2e-2;
double bf16_bound(const std::string& arch) {
  return load_model(tiny_dir(arch))->config.n_expert > 0 ? INFINITY : kBf16Bound;
}

void expect_near_transformers_in_bits(const std::string& arch, DType dt, double bound) {
  const std::string dir = tiny_dir(arch);
  auto m = load_model(dir);
  auto dm = prepare_model(*m, make_cpu_backend(dt));
  auto exact = cpu_model(*m);
  double worst = 0, moved = 0;
  const auto ref = read_json(dir + "/reference.json");
  for (auto& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto want = read_f32(dir + "/" + p["logits"].get<std::string>());
    const auto one = run_all_logits(*dm->backend, m->config, dm->weights, ids);
    worst = std::max(worst, rel_err(one, want));
    // batch invariance: in chunks of 5 and token by token, the same bits
    EXPECT_EQ(run_all_logits(*dm->backend, m->config, dm->weights, ids, 5), one);
    EXPECT_EQ(run_all_logits(*dm->backend, m->config, dm->weights, ids, 1), one);
    // the cache is really of this type: the logits moved from the f32 cache's
    moved = std::max(moved,
                     rel_err(one, run_all_logits(*exact->backend, m->config, exact->weights, ids)));
  }
  std::printf(
      "[ report ] %-10s %s KV (%s): worst relative error %.2e (from the f32 cache's %.2e)\n",
      arch.c_str(), dtype_name(dt), cpu::simd().isa, worst, moved);
  EXPECT_LT(worst, bound);
  EXPECT_GT(moved, 0.0);
}

// Keys kept before RoPE and rotated when read: within the cache's bound of keys
// rotated when written (the two round different values).
void expect_pre_rope_near_rotated(const std::string& arch, DType dt, double bound) {
  const std::string dir = tiny_dir(arch);
  auto m = load_model(dir);
  auto dm = prepare_model(*m, make_cpu_backend(dt));
  const auto ids =
      read_json(dir + "/reference.json")["prompts"][0]["ids"].get<std::vector<int32_t>>();
  const auto rotated = run_all_logits(*dm->backend, m->config, dm->weights, ids, 7, false);
  const auto pre = run_all_logits(*dm->backend, m->config, dm->weights, ids, 7, true);
  EXPECT_LT(rel_err(pre, rotated), bound);
}

class KvF16Arch : public ::testing::TestWithParam<std::string> {};

TEST_P(KvF16Arch, LogitsNearTransformersAndChunksKeepTheBits) {
  WICK_REQUIRE_SHARED();
  expect_near_transformers_in_bits(GetParam(), DType::F16, 2e-3);
}

TEST_P(KvF16Arch, PreRopeKeysNearRotatedOnes) {
  WICK_REQUIRE_SHARED();
  expect_pre_rope_near_rotated(GetParam(), DType::F16, 5e-3);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, KvF16Arch, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

class KvBf16Arch : public ::testing::TestWithParam<std::string> {};

TEST_P(KvBf16Arch, LogitsNearTransformersAndChunksKeepTheBits) {
  WICK_REQUIRE_SHARED();
  expect_near_transformers_in_bits(GetParam(), DType::BF16, bf16_bound(GetParam()));
}

TEST_P(KvBf16Arch, PreRopeKeysNearRotatedOnes) {
  WICK_REQUIRE_SHARED();
  expect_pre_rope_near_rotated(GetParam(), DType::BF16, bf16_bound(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(AllArchs, KvBf16Arch, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

// Past 1,024 positions attention reduces the keys in partitions combined per
// query: in one pass, in chunks of 700 and token by token, the same bits,
// with every cache type but q8_0 (head dim 16).
TEST(KvCache, LongContextChunksKeepTheBits) {
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir("qwen2"));
  std::mt19937 rng(11);
  std::vector<int32_t> ids(2300);
  for (auto& id : ids) id = int32_t(rng() % uint32_t(m->config.n_vocab));
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    auto dm = prepare_model(*m, make_cpu_backend(dt));
    const auto one = run_all_logits(*dm->backend, m->config, dm->weights, ids);
    EXPECT_EQ(run_all_logits(*dm->backend, m->config, dm->weights, ids, 700), one)
        << dtype_name(dt);
    EXPECT_EQ(run_all_logits(*dm->backend, m->config, dm->weights, ids, 1), one) << dtype_name(dt);
  }
}

// Concurrent requests (chunked prefills mixed with decodes) give the tokens
// of one-at-a-time sessions with the f16 and bf16 caches too.
TEST(KvF16, EngineBatchedEqualsSequential) {
  WICK_REQUIRE_SHARED();
  for (const char* dt : {"f16", "bf16"}) {
    BackendOptions o = f16_options();
    o.kv_cache_dtype = dt;
    auto m = load_model_and_tokenizer(tiny_dir("llama"), {}, o);
    ASSERT_EQ(dtype_name(m->device->backend->kv_dtype()), std::string(dt));
    EngineConfig cfg;
    cfg.max_batch_tokens = 48;
    cfg.max_seqs = 6;
    expect_engine_equals_sessions(m, 3, 8, cfg);
  }
}

// The engine's KV budget is bytes: the same --kv-memory holds twice the
// blocks with an f16 cache (3.8 times with q8_0: 34 bytes per 32 values).
TEST(KvF16, TheSameBudgetHoldsTwiceTheBlocks) {
  WICK_REQUIRE_SHARED();
  BackendOptions f32;
  f32.device = Device::Cpu;
  auto a = load_model_and_tokenizer(tiny_dir("llama"), {}, f32);
  auto b = load_model_and_tokenizer(tiny_dir("llama"), {}, f16_options());
  EngineConfig cfg;
  cfg.kv_bytes = size_t(1) << 20;
  Engine ea(a, cfg), eb(b, cfg);
  EXPECT_EQ(eb.blocks().n_blocks(), 2 * ea.blocks().n_blocks());
  EXPECT_GT(ea.blocks().n_blocks(), 8);
}

// The deviation of rows from the cache reads the f16 (bf16) rows widened: the
// rows written are ~0 away (their rounding), others their distance from the
// rounded rows.
TEST(KvF16, DeviationReadsTheRoundedRows) {
  const int64_t kv_dim = 40, n = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t(n * kv_dim)), v(k.size()), k2(k.size()), v2(k.size());
  for (auto* x : {&k, &v, &k2, &v2})
    for (float& f : *x) f = nd(rng);
  for (const DType dt : {DType::F16, DType::BF16}) {
    const bool b16 = dt == DType::BF16;
    auto round = [&](float x) { return b16 ? f32_to_bf16(x) : f32_to_f16(x); };
    auto widen = [&](uint16_t h) { return b16 ? bf16_to_f32(h) : f16_to_f32(h); };
    std::vector<uint16_t> kc(k.size()), vc(k.size());
    const int32_t slots[3] = {2, 0, 1};
    cpu::kv_write(kc.data(), vc.data(), dt, kv_dim, slots, n, k.data(), v.data());
    std::vector<float> got(n);
    cpu::kv_deviation(kc.data(), vc.data(), dt, kv_dim, slots, n, k2.data(), v2.data(), got.data());
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t i = 0; i < kv_dim; ++i) {
        const size_t at = size_t(slots[t] * kv_dim + i), x = size_t(t * kv_dim + i);
        EXPECT_EQ(kc[at], round(k[x])) << dtype_name(dt);
        EXPECT_EQ(vc[at], round(v[x])) << dtype_name(dt);
        const double dk = k2[x] - widen(kc[at]), dv = v2[x] - widen(vc[at]);
        s += dk * dk + dv * dv;
      }
      EXPECT_NEAR(got[size_t(t)], s, 1e-4 * s) << dtype_name(dt);
    }
    cpu::kv_deviation(kc.data(), vc.data(), dt, kv_dim, slots, n, k.data(), v.data(), got.data());
    for (float d : got) EXPECT_LT(d, b16 ? 1e-3 : 1e-5) << dtype_name(dt);
  }
}

// Every kernel set's vector rounding gives f32_to_f16's bits: ties to even,
// f16 subnormals, overflow to infinity, signed zeros.
TEST(KvF16, WritesRoundLikeTheScalar) {
  std::vector<float> x = {0.f,   -0.f,    1.f + 1.f / 2048, 1.f + 3.f / 2048, 6e-8f,
                          3e-5f, -1e-7f,  65504.f,          65520.f,          -7e4f,
                          1e-3f, 3.14159f};
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 30.f);
  while (x.size() < 70) x.push_back(nd(rng));
  for (const char* isa : {"generic", "avx2", "avx512", "avx512bf16"}) {
    const cpu::SimdKernels* k = cpu::simd_for(isa);
    if (!k) continue;
    std::vector<uint16_t> got(x.size());
    k->f16_from_f32(x.data(), got.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(got[i], f32_to_f16(x[i])) << isa << ": " << x[i];
  }
}

// The GPU's cache follows --gpu-f32 (f32 with it; f16 or q8_0 without);
// asking otherwise is a clear error (even where no GPU is present).
TEST(KvF16, GpuCacheTypeMustMatchGpuF32) {
  BackendOptions o;
  o.device = Device::Cuda;
  auto expect_type_error = [&](const char* what) {
    try {
      make_backend(o);
      ADD_FAILURE() << "accepted " << what;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("--gpu-f32"), std::string::npos) << e.what();
    }
  };
  o.kv_cache_dtype = "f32";
  expect_type_error("an f32 cache with bf16 weights on the GPU");
  o.kv_cache_dtype = "bf16";
  expect_type_error("a bf16 cache on the GPU (the CPU's only)");
  o.gpu_f32 = true;
  o.kv_cache_dtype = "q8_0";
  expect_type_error("a q8_0 cache with --gpu-f32");
  o.gpu_f32 = false;  // taken: any error is about the GPU (none here), not the type
  try {
    make_backend(o);
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).find("--kv-cache-dtype"), std::string::npos) << e.what();
  }
  o.device = Device::Cpu;
  o.kv_cache_dtype = "q4_0";
  EXPECT_THROW(make_backend(o), std::runtime_error);
}

// q8_0: rows of blocks of 32 (34 bytes each); the default model (head dim 64)
// against the numpy float64 reference of SmolLM2.LogitsMatchNumpyReference:
// the same top token at every position, the logits within 5e-2 of their
// scale (measured 2.6e-2; the f16 cache's 1.1e-3, bound 5e-3; the bf16 cache's
// 5.8e-3, 6.5e-3 on AMX tiles, bound 2e-2); in chunks and token by token, the
// one pass's bits.
TEST(KvQ8, DefaultModelNearTheReference) {
  const char* model = std::getenv("WICK_TEST_MODEL");
  const std::string ref = data_dir() + "/smollm2_ref.f32";
  if (!model || !std::filesystem::exists(model) || !std::filesystem::exists(ref))
    WICK_SKIP_OR_FAIL("default model or its numpy reference missing");
  auto m = load_model(model);
  auto dm = prepare_model(*m, make_cpu_backend(DType::Q8_0));
  auto kv = dm->backend->make_kv(2, 4, 16, 128);
  EXPECT_EQ(kv->k.bytes(), size_t(2 * 4 * 16 * 4 * 34));
  std::vector<int32_t> ids;
  std::istringstream list(WICK_SMOLLM2_IDS);
  for (std::string s; std::getline(list, s, ',');) ids.push_back(std::stoi(s));
  const auto want = read_f32(ref);
  const auto one = run_all_logits(*dm->backend, m->config, dm->weights, ids);
  const double err = rel_err(one, want);
  auto dm16 = prepare_model(*m, make_cpu_backend(DType::F16));
  const double err16 = rel_err(run_all_logits(*dm16->backend, m->config, dm16->weights, ids), want);
  auto dmb = prepare_model(*m, make_cpu_backend(DType::BF16));
  const auto one_b = run_all_logits(*dmb->backend, m->config, dmb->weights, ids);
  const double errb = rel_err(one_b, want);
  std::printf(
      "[ report ] smollm2 KV vs numpy float64: relative error q8_0 %.2e, f16 %.2e, bf16 (%s) "
      "%.2e\n",
      err, err16, cpu::simd().isa, errb);
  EXPECT_LT(err, 5e-2);
  EXPECT_LT(err16, 5e-3);
  EXPECT_LT(errb, 2e-2);
  EXPECT_EQ(run_all_logits(*dmb->backend, m->config, dmb->weights, ids, 1), one_b);
  const int64_t V = m->config.n_vocab;
  for (size_t r = 0; r < ids.size(); ++r)
    EXPECT_EQ(
        std::max_element(one.begin() + long(r * V), one.begin() + long((r + 1) * V)) - one.begin(),
        std::max_element(want.begin() + long(r * V), want.begin() + long((r + 1) * V)) -
            want.begin())
        << "position " << r;
  EXPECT_EQ(run_all_logits(*dm->backend, m->config, dm->weights, ids, 6), one);
  EXPECT_EQ(run_all_logits(*dm->backend, m->config, dm->weights, ids, 1), one);
}

// A head dim that is not whole blocks is a clear error at load.
TEST(KvQ8, HeadDimNotAMultipleOf32IsAnError) {
  WICK_REQUIRE_SHARED();
  BackendOptions o;
  o.device = Device::Cpu;
  o.kv_cache_dtype = "q8_0";
  try {
    load_model_and_tokenizer(tiny_dir("llama"), {}, o);
    ADD_FAILURE() << "a q8_0 cache for head dim 16";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wick::test
