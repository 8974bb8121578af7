// Whole models on the GPU: every tiny fixture against HF transformers'
// logits, greedy continuations of the f32 models, the engine's batched run
// equal to sequential sessions, the default model's greedy answer equal to
// the CPU's, and a tensor-by-tensor comparison with the CPU through the
// trace hook (printed, to point at the first kernel that drifts).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/cuda/kernels.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/session.h"
#include "engine_run.h"
#include "gpu/gpu_helpers.h"
#include "helpers.h"
#include "sampling/logprobs.h"
#include "text/chat_template.h"

namespace wick::test {
namespace {

class TinyOnGpu : public ::testing::TestWithParam<std::string> {};

// bf16 on the GPU (weights, activations into the products, f16 K/V) against
// the reference computed with bf16 weights: relative error (max abs diff /
// max abs logit) under 3e-2. --gpu-f32 against the f32 reference: 1e-4.
TEST_P(TinyOnGpu, LogitsMatchTransformers) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  const std::string dir = tiny_dir(GetParam());
  auto ref = read_json(dir + "/reference.json");
  for (bool f32 : {false, true}) {
    auto m = load_model(f32 ? dir : dir + "/bf16");
    auto dm = prepare_model(*m, make_backend(cuda_opts(f32)));
    double worst = 0;
    for (auto& p : ref["prompts"]) {
      auto ids = p["ids"].get<std::vector<int32_t>>();
      auto want =
          read_f32(dir + "/" + p[f32 ? "logits" : "logits_bf16_weights"].get<std::string>());
      for (int64_t chunk : {0, 5}) {
        auto got = run_all_logits(*dm->backend, m->config, dm->weights, ids, chunk);
        ASSERT_EQ(got.size(), want.size());
        worst = std::max(worst, rel_err(got, want));
      }
    }
    std::printf("[ report ] gpu %-10s %-8s worst relative error %.2e\n", GetParam().c_str(),
                f32 ? "gpu-f32" : "bf16", worst);
    EXPECT_LT(worst, f32 ? 1e-4 : 3e-2) << GetParam() << (f32 ? " gpu-f32" : " bf16");
  }
}

TEST_P(TinyOnGpu, GreedyContinuationMatchesTransformers) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  const std::string dir = tiny_dir(GetParam());
  expect_reference_greedy(load_model_and_tokenizer(dir, {}, cuda_opts(true)), dir, GetParam());
}

// Batch invariance on the GPU: concurrent requests (chunked prefills mixed
// with decodes, some recorded as graphs) give the tokens of one-at-a-time sessions.
TEST_P(TinyOnGpu, EngineBatchedEqualsSequential) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir(GetParam()), {}, cuda_opts(false));
  std::mt19937 rng(1);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    GenerateRequest r;
    const int len = 3 + int(rng() % 60);
    for (int k = 0; k < len; ++k) r.prompt.push_back(int32_t(rng() % 512));
    r.sampling = SamplingParams::greedy();
    r.max_tokens = 4 + int(rng() % 20);
    r.ignore_eos = true;
    r.prefill_chunk = i % 3 == 0 ? 5 : 0;
    reqs.push_back(r);
  }
  std::vector<GenerateResult> want;
  for (auto& r : reqs) {
    Session s(m, 512);
    want.push_back(s.generate(r));
  }
  EngineConfig cfg;
  cfg.max_batch_tokens = 48;
  cfg.max_seqs = 6;
  cfg.n_blocks = 256;
  Engine e(m, cfg);
  std::vector<GenerateResult> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.add_request(reqs[i], {nullptr, [&got, i](const GenerateResult& r) { got[i] = r; }});
  e.run_until_idle();
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// Token controls where the backend samples: biased and held-back requests
// take their rows to the host, the plain ones beside them stay on the
// device, and each equals its run alone; a ban gives the best of the rest
// of the GPU's own first logits.
TEST_P(TinyOnGpu, TokenControlsSampleOnTheHostBesideDeviceRows) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir(GetParam()), {}, cuda_opts(false));
  ASSERT_FALSE(m->eog_ids.empty());
  std::mt19937 rng(3);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r = greedy_request(random_tokens(rng, 4 + 5 * i, 512), 10);
    if (i % 4 == 1) r.sampling.logit_bias = {{7 * i, 4.f}, {7 * i + 1, -100.f}};
    if (i % 4 == 2) {
      r.ignore_eos = false;
      r.min_tokens = 4;
      r.sampling.logit_bias = {{m->eog_ids.front(), 100.f}};
    }
    if (i % 4 == 3) {
      r.sampling = SamplingParams{};
      r.sampling.seed = uint64_t(i);
      r.sampling.logit_bias = {{i, 2.f}};
    }
    reqs.push_back(r);
  }
  EngineConfig cfg;
  cfg.max_batch_tokens = 32;
  cfg.n_blocks = 256;
  const auto alone = run_one_by_one(m, cfg, reqs);
  Engine e(m, cfg);
  const auto together = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
  EXPECT_EQ(alone[2].tokens.size(), 5u);  // four held back, then the forced end
  GenerateRequest plain = reqs[0];
  plain.keep_first_logits = true;
  const GenerateResult p = run_one_by_one(m, cfg, {plain})[0];
  std::vector<float> rest = p.first_logits;
  rest[size_t(p.tokens[0])] = -INFINITY;
  plain.sampling.logit_bias = {{p.tokens[0], -100.f}};
  const GenerateResult banned = run_one_by_one(m, cfg, {plain})[0];
  EXPECT_EQ(banned.tokens[0], int32_t(std::max_element(rest.begin(), rest.end()) - rest.begin()));
}

// A prompt's logits from one prefill (the tiled matmul, forced for these
// small shapes) have the bits of the same tokens decoded one at a time (the
// decode kernel, one-row attention): prefill and decode are one computation.
TEST_P(TinyOnGpu, PrefillLogitsEqualTokenByToken) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir(GetParam()) + "/bf16");
  auto dm = prepare_model(*m, make_backend(cuda_opts(false)));
  std::mt19937 rng(3);
  std::vector<int32_t> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(int32_t(rng() % 256));
  cuda::set_matmul_path(cuda::MatmulPath::Tiled);
  auto prefill = run_all_logits(*dm->backend, m->config, dm->weights, ids, 0);
  cuda::set_matmul_path(cuda::MatmulPath::Auto);
  auto decode = run_all_logits(*dm->backend, m->config, dm->weights, ids, 1);
  ASSERT_EQ(prefill.size(), decode.size());
  size_t n_diff = 0;
  for (size_t i = 0; i < prefill.size(); ++i) n_diff += prefill[i] != decode[i];
  EXPECT_EQ(n_diff, 0u) << GetParam() << ": logits differing between prefill and decode";
}

// Greedy tokens of one order of a bf16 model's sums against another's:
// equal up to the first step where the reference's best two tokens are
// within `margin` (their log-probabilities) and the other order took the
// second. From there the two continue different texts, so the rest is not
// compared. (A flip needs a gap under twice the logits' difference, which
// the callers bound; a greedy test on random tiny models must allow it,
// as the emulator's and the H100's rounding of mma differ from the H200's.)
// Both requests need top_logprobs >= 2.
constexpr float kTieMargin = 1e-2f;
void expect_greedy_equal_but_near_ties(const GenerateResult& got, const GenerateResult& want,
                                       float margin, const std::string& what) {
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
  ASSERT_EQ(want.logprobs.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    if (got.tokens[i] == want.tokens[i]) continue;
    const auto& top = want.logprobs[i].top;
    ASSERT_GE(top.size(), 2u) << what;
    const float gap = top[0].second - top[1].second;
    std::printf("[ report ] %s: step %zu took the runner-up (gap %.2e)\n", what.c_str(), i, gap);
    EXPECT_EQ(got.tokens[i], top[1].first) << what << ", step " << i;
    EXPECT_LE(gap, margin) << what << ", step " << i << ": not a near tie";
    return;
  }
}

// SpanCacheEqualsFullPrefillAndAFreshEngine for one precision.
void expect_span_cache_equals_full_prefill(const std::string& arch, bool f32) {
  auto m = load_model_and_tokenizer(tiny_dir(arch), {}, cuda_opts(f32));
  const std::string dtype = f32 ? "gpu-f32" : "bf16";
  std::mt19937 rng(7);
  auto random = [&](int n) { return random_tokens(rng, n, 256); };
  auto request = [](const std::vector<int32_t>& prefix,
                    const std::vector<std::vector<int32_t>>& docs,
                    const std::vector<int32_t>& question, int32_t recompute) {
    GenerateRequest r = request_with_spans(prefix, docs, question, 8);
    r.span_recompute = recompute;
    r.top_logprobs = 2;
    return r;
  };
  EngineConfig cfg;
  cfg.span_cache = true;
  cfg.n_blocks = 256;
  cfg.span_recompute = 16;
  cfg.span_blend = 0.f;
  // Every span token computed again (recompute past the spans, or blend 1:
  // chosen after forward's measure pass) is full prefill: block-aligned
  // spans, and layouts with holes, where RoPE counts only filled slots (not
  // under a sliding window, which counts slots). Chunks follow slots, so
  // the sums differ from the plain prompt's within bf16's tolerance.
  struct Layout {
    int prefix;
    std::vector<int> docs;
    bool holes;
    int32_t recompute;
    float blend;
  };
  for (const Layout& l :
       {Layout{16, {32, 16}, false, 1000, 0.f}, Layout{5, {20, 9, 33}, true, 1000, 0.f},
        Layout{0, {7, 18}, true, 1000, 0.f}, Layout{16, {32, 16}, false, 0, 1.f},
        Layout{5, {20, 9, 33}, true, 0, 1.f}}) {
    if (l.holes && m->config().sliding_window > 0) continue;
    const auto prefix = random(l.prefix), question = random(7);
    std::vector<std::vector<int32_t>> docs;
    for (int n : l.docs) docs.push_back(random(n));
    GenerateRequest r = request(prefix, docs, question, l.recompute), plain = r;
    r.span_blend = l.blend;
    plain.spans.clear();
    Engine e(m, cfg), ref(m, cfg);
    const auto got = run_one(e, r), want = run_one(ref, plain);
    const std::string what = arch + " " + dtype + ", prefix " + std::to_string(l.prefix) + ", " +
                             (l.blend > 0 ? "blend 1" : "recompute all");
    const double err = rel_err(got.first_logits, want.first_logits);
    std::printf("[ report ] span cache %s: relative error %.2e\n", what.c_str(), err);
    if (f32)
      EXPECT_EQ(got.tokens, want.tokens) << what;
    else
      expect_greedy_equal_but_near_ties(got, want, kTieMargin, what);
    EXPECT_LT(err, f32 ? 1e-4 : 2e-2) << what;
    EXPECT_EQ(got.n_span_misses, int32_t(docs.size())) << what;
    if (l.blend > 0) {  // every document token chosen
      EXPECT_EQ(got.n_span_recomputed, int32_t(r.prompt.size()) - l.prefix - 7) << what;
    }
    EXPECT_EQ(e.blocks().n_used(), 0) << what;
  }
  {  // reuse in another order equals a fresh engine
    const auto prefix = random(5);
    const auto A = random(20), B = random(37), C = random(9);
    Engine e(m, cfg);
    run_one(e, request(prefix, {A, B, C}, random(6), -1));
    const auto req2 = request(prefix, {C, A, B}, random(6), -1);
    const auto r2 = run_one(e, req2);
    EXPECT_EQ(r2.n_span_hits, 3) << arch;
    Engine fresh(m, cfg);
    const auto f2 = run_one(fresh, req2);
    EXPECT_EQ(r2.tokens, f2.tokens) << arch;
    EXPECT_EQ(r2.first_logits, f2.first_logits) << arch;
    EXPECT_EQ(e.blocks().n_used(), 0);
  }
}

// An engine on the GPU takes 2,048 tokens a step unless told otherwise
// (the CPU's 512: Engine.StepTokensDefaultToTheBackends).
TEST(TinyOnGpuEngine, StepTokensDefaultToTheGpus) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"), {}, cuda_opts(false));
  EngineConfig cfg;
  cfg.n_blocks = 8;
  EXPECT_EQ(Engine(m, cfg).config().max_batch_tokens, 2048);
  cfg.max_batch_tokens = 100;
  EXPECT_EQ(Engine(m, cfg).config().max_batch_tokens, 100);
}

// The span cache on the GPU (keys stored before RoPE, rotated as attention
// reads them): with every span token computed again a span request is full
// prefill; a second request finds the spans cached in another order and
// answers as a fresh engine does, bit for bit. --gpu-f32 checks the layouts
// tightly; bf16 (f16 K/V) within its rounding: a layout with holes cuts the
// keys into other 64-key chunks, so attention's running max and the f16
// rounding of its probabilities differ, which bf16 activations carry on
// (1.3e-3 to 5.7e-3 measured on an H200 and an H100, the tokens equal; the
// tokens up to a near tie: expect_greedy_equal_but_near_ties).
TEST_P(TinyOnGpu, SpanCacheEqualsFullPrefillAndAFreshEngine) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  for (bool f32 : {true, false}) expect_span_cache_equals_full_prefill(GetParam(), f32);
}

// Prompt logprobs on the GPU (rows copied from the device before sampling
// there): entry p is the distribution a request for prompt[0, p) samples its
// first token from, bit for bit, with the prompt in chunks among other
// requests (steps of up to 20 rows: the fused decode kernels) and the
// requests alone (longer prefills).
TEST_P(TinyOnGpu, PromptLogprobsAreTheDistributionAfterThePrefix) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir(GetParam()), {}, cuda_opts(false));
  const int32_t V = int32_t(m->config().n_vocab);
  std::mt19937 rng(11);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint32_t(std::min(V, 500)));
    return t;
  };
  const std::vector<int32_t> prompt = tokens(37);
  GenerateRequest r = greedy_request(prompt, 3);
  r.prompt_logprobs = 3;
  r.prefill_chunk = 9;
  EngineConfig cfg;
  cfg.max_batch_tokens = 20;
  cfg.n_blocks = 256;
  Engine e(m, cfg);
  const GenerateResult got =
      run_engine(e, {greedy_request(tokens(25), 5), r, greedy_request(tokens(30), 4)})[1];
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(got.prompt_logprobs[0].has_value());
  EngineConfig alone_cfg;
  alone_cfg.n_blocks = 256;
  Engine alone(m, alone_cfg);
  for (size_t p = 1; p < prompt.size(); ++p) {
    ASSERT_TRUE(got.prompt_logprobs[p].has_value()) << p;
    const TokenLogprob& lp = *got.prompt_logprobs[p];
    GenerateRequest before =
        greedy_request(std::vector<int32_t>(prompt.begin(), prompt.begin() + long(p)));
    before.keep_first_logits = true;
    before.top_logprobs = 3;
    const GenerateResult want = run_engine(alone, {before})[0];
    const auto& row = want.first_logits;
    ASSERT_EQ(row.size(), size_t(V));
    EXPECT_EQ(lp.id, prompt[p]);
    EXPECT_EQ(lp.logprob, row[size_t(prompt[p])] - log_sum_exp(row)) << GetParam() << " " << p;
    EXPECT_EQ(lp.rank, rank_of(row, prompt[p])) << GetParam() << " " << p;
    EXPECT_EQ(lp.top, want.logprobs[0].top) << GetParam() << " " << p;
  }
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// Decoding with the residual add and norm taken by the previous product's
// last CTA (WICK_CUDA_FUSE_NORM=1) gives the two kernels' tokens and
// log-probabilities, bit for bit (each setting its own backend and graphs).
TEST_P(TinyOnGpu, FusedNormDecodesAsTwoKernels) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  const bool was = cuda::fuse_norm();
  std::vector<GenerateResult> out;
  for (bool fuse : {false, true}) {
    cuda::set_fuse_norm(fuse);
    auto m = load_model_and_tokenizer(tiny_dir(GetParam()), {}, cuda_opts(false));
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back(int32_t(7 * i % 256));
    GenerateRequest r = greedy_request(prompt, 16);
    r.top_logprobs = 4;
    Session s(m, 256);
    out.push_back(s.generate(r));
  }
  cuda::set_fuse_norm(was);
  EXPECT_EQ(out[0].tokens, out[1].tokens) << GetParam();
  ASSERT_EQ(out[0].logprobs.size(), out[1].logprobs.size());
  for (size_t i = 0; i < out[0].logprobs.size(); ++i) {
    EXPECT_EQ(out[0].logprobs[i].logprob, out[1].logprobs[i].logprob) << GetParam() << " " << i;
    EXPECT_EQ(out[0].logprobs[i].top, out[1].logprobs[i].top) << GetParam() << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchs, TinyOnGpu, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

// YaRN (the tiny llama stretched 4x from 64 positions) on the GPU against the
// CPU, past the trained context: the frequencies' divisors and the scores'
// factor reach every attention kernel (prefill, decode; f32 and f16 caches;
// keys rotated when written and before RoPE).
TEST(YarnOnGpu, MatchesTheCpu) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir("llama"));
  set_yarn(m->config, "test", 4.f, 64);
  std::vector<int32_t> ids;
  for (int i = 0; i < 200; ++i) ids.push_back(int32_t(3 + (i * 131 + 7) % 500));
  const auto want = run_all_logits(*m, ids);
  for (bool f32 : {true, false}) {
    auto dm = prepare_model(*m, make_backend(cuda_opts(f32)));
    for (int64_t chunk : {0, 1})
      for (bool pre_rope : {false, true}) {
        const double e = rel_err(
            run_all_logits(*dm->backend, m->config, dm->weights, ids, chunk, pre_rope), want);
        std::printf("[ report ] yarn %-7s chunk %lld %-8s relative error %.2e\n",
                    f32 ? "gpu-f32" : "bf16", (long long)chunk, pre_rope ? "pre-rope" : "rotated",
                    e);
        EXPECT_LT(e, f32 ? 1e-4 : 3e-2)
            << (f32 ? "gpu-f32" : "bf16") << " chunk " << chunk << (pre_rope ? " pre-rope" : "");
      }
  }
}

// An FP8 checkpoint (tests/python/make_fp8_fixtures.py: the tiny llama in
// 48 x 40 blocks of e4m3) on the GPU: the same logits, bit for bit, as the
// bf16 weights it dequantizes to (model/fp8.h), and within bf16 tolerance of
// the CPU.
TEST(Fp8OnGpu, CheckpointEqualsItsDequantizedWeights) {
  WICK_REQUIRE_GPU();
  const std::string d = data_dir() + "/fp8/llama-block";
  if (!std::filesystem::exists(d + "/fp8/config.json"))
    WICK_SKIP_OR_FAIL("fp8 fixtures missing at "
                      << d << " (ctest runs setup.fp8_fixtures; on a "
                      << "GPU machine gpu_check sets WICK_TEST_DATA_DIR)");
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(int32_t(1 + (i * 97 + 5) % 511));
  auto fp8 = load_model(d + "/fp8");
  auto want = load_model(d + "/want");
  auto run = [&](const Model& m, int64_t chunk) {
    auto dm = prepare_model(m, make_backend(cuda_opts(false)));
    return run_all_logits(*dm->backend, m.config, dm->weights, ids, chunk);
  };
  const auto got = run(*fp8, 0);
  EXPECT_EQ(got, run(*want, 0));
  EXPECT_EQ(run(*fp8, 7), run(*want, 7));
  const double e = rel_err(got, run_all_logits(*want, ids));
  std::printf("[ report ] fp8 llama on the gpu against the cpu: relative error %.2e\n", e);
  EXPECT_LT(e, 3e-2);
}

// Named intermediates of the tiny llama, CPU against GPU: every tensor
// within bf16 tolerance; the table shows where error enters.
TEST(TraceOnGpu, IntermediatesTrackTheCpu) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir("qwen2"));
  auto ids = read_json(tiny_dir("qwen2") + "/reference.json")["prompts"][2]["ids"]
                 .get<std::vector<int32_t>>();
  std::vector<std::pair<std::string, std::vector<float>>> cpu, gpu;
  auto record = [](auto& into) {
    return [&into](std::string_view name, int64_t layer, const float* d, int64_t r, int64_t c) {
      into.emplace_back(std::string(name) + "." + std::to_string(layer),
                        std::vector<float>(d, d + r * c));
    };
  };
  auto dm = prepare_model(*m, make_backend(cuda_opts(false)));
  cpu_backend().trace = record(cpu);
  run_all_logits(cpu_backend(), m->config, m->weights, ids);
  cpu_backend().trace = nullptr;
  dm->backend->trace = record(gpu);
  run_all_logits(*dm->backend, m->config, dm->weights, ids);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].first, gpu[i].first);
    const double e = rel_err(gpu[i].second, cpu[i].second);
    std::printf("[ trace ] %-14s %.2e\n", cpu[i].first.c_str(), e);
    EXPECT_LT(e, 3e-2) << cpu[i].first;
  }
}

// Two span-cache runners of one model take turns on its backend, each
// recording its decode steps as graphs (keys before RoPE: each reads its
// rope table inside the graph): every step's logits have the bits of the
// same steps by a runner alone.
TEST_P(TinyOnGpu, SpanRunnersTakingTurnsKeepTheirGraphs) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir(GetParam()), {}, cuda_opts(false));
  const RunnerLimits lim{64, 16, 512, 64, 1, true};
  std::mt19937 rng(11);
  const std::vector<std::vector<int32_t>> prompts{random_tokens(rng, 20, 256),
                                                  random_tokens(rng, 45, 256)};
  const auto next = random_tokens(rng, 8, 256);  // decode inputs, the same for both
  // one step of sequence `who`: its prompt (step 0) or its next decode token
  auto step = [&](ModelRunner& r, size_t who, int i) {
    const auto& p = prompts[who];
    Batch b;
    b.block_tables = {{0, 1, 2, 3, 4}};
    if (i == 0)
      for (size_t t = 0; t < p.size(); ++t) b.add(p[t], int32_t(t), 0, t + 1 == p.size());
    else
      b.add(next[size_t(i - 1)], int32_t(p.size()) + i - 1, 0, true);
    const auto l = r.execute(b);
    return std::vector<float>(l.begin(), l.end());
  };
  ModelRunner a(m, lim), b(m, lim);
  std::vector<std::vector<float>> turns[2];
  for (int i = 0; i <= int(next.size()); ++i)
    for (size_t who : {0, 1}) turns[who].push_back(step(who ? b : a, who, i));
  for (size_t who : {0, 1}) {
    ModelRunner alone(m, lim);
    for (int i = 0; i <= int(next.size()); ++i)
      EXPECT_EQ(step(alone, who, i), turns[who][size_t(i)])
          << GetParam() << ": runner " << who << ", step " << i;
  }
}

// The default model answers the same on the GPU as on the CPU (greedy), for
// a question through its chat template, as `wick run` asks it; and again
// with q8_0 KV caches on both (their blocks quantized with the same bits).
void expect_default_answer_equal(const std::string& kv_cache_dtype) {
  const char* model = std::getenv("WICK_TEST_MODEL");
  if (!model || !std::filesystem::exists(model))
    WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  auto answer = [&](BackendOptions o) {
    o.kv_cache_dtype = kv_cache_dtype;
    auto m = load_model_and_tokenizer(model, {}, o);
    const Tokenizer& tk = *m->tokenizer;
    ChatTemplate t(tk.chat_template, "smollm2");
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array(
        {{{"role", "user"}, {"content", "What is the capital of France?"}}});
    const std::string text = t.render({{"messages", msgs},
                                       {"add_generation_prompt", true},
                                       {"bos_token", tk.bos_token},
                                       {"eos_token", tk.eos_token}});
    GenerateRequest req;
    req.prompt = tk.encode(text, {.add_special = false, .parse_special = true});
    req.sampling = SamplingParams::greedy();
    req.max_tokens = 64;
    Session s(m, 1024);
    return s.generate(req);
  };
  auto cpu = answer(cpu_options());
  auto gpu = answer(cuda_opts(false));
  std::printf("[ report ] cpu (%zu tokens): %s\n[ report ] gpu (%zu tokens): %s\n",
              cpu.tokens.size(), cpu.text.c_str(), gpu.tokens.size(), gpu.text.c_str());
  EXPECT_GT(cpu.tokens.size(), 2u);
  EXPECT_NE(cpu.text.find("Paris"), std::string::npos);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
}
TEST(DefaultModelOnGpu, GreedyAnswerEqualsCpu) {
  WICK_REQUIRE_GPU();
  expect_default_answer_equal("");
}
TEST(DefaultModelOnGpu, GreedyAnswerWithQ8CachesEqualsCpu) {
  WICK_REQUIRE_GPU();
  expect_default_answer_equal("q8_0");
}

// With integer products (the default model: Q4_1, Q6_K and Q8_0 weights),
// the integer forms the norms and (decode steps) gate/up write
// (cuda::set_norm_int) give the tokens and log-probabilities of each
// product quantizing x itself, bit for bit, with fewer quantization launches.
TEST(DefaultModelOnGpu, NormsIntegerFormKeepsTheBits) {
  WICK_REQUIRE_GPU();
  const char* model = std::getenv("WICK_TEST_MODEL");
  if (!model || !std::filesystem::exists(model))
    WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  IntProducts on(true);
  std::vector<GenerateResult> out;
  std::vector<uint64_t> launched;
  for (bool norm_int : {false, true}) {
    NormInts scope(norm_int);
    auto m = load_model_and_tokenizer(model, {}, cuda_opts(false));
    std::vector<int32_t> prompt;
    for (int i = 0; i < 80; ++i) prompt.push_back(int32_t(100 + 37 * i % 5000));  // (tiled prefill)
    GenerateRequest r = greedy_request(prompt, 24);
    r.top_logprobs = 4;
    Session s(m, 512);
    const uint64_t before = cuda::quantize_act_launches();
    out.push_back(s.generate(r));
    launched.push_back(cuda::quantize_act_launches() - before);
  }
  std::printf("[ report ] quantization launches: %llu each product, %llu with the forms\n",
              static_cast<unsigned long long>(launched[0]),
              static_cast<unsigned long long>(launched[1]));
  EXPECT_LT(launched[1], launched[0]);
  EXPECT_EQ(out[0].tokens, out[1].tokens);
  ASSERT_EQ(out[0].logprobs.size(), out[1].logprobs.size());
  for (size_t i = 0; i < out[0].logprobs.size(); ++i) {
    EXPECT_EQ(out[0].logprobs[i].logprob, out[1].logprobs[i].logprob) << i;
    EXPECT_EQ(out[0].logprobs[i].top, out[1].logprobs[i].top) << i;
  }
}

}  // namespace
}  // namespace wick::test
