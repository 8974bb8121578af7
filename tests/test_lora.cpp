// LoRA adapters against PEFT's rule, y = W x + scale * B (A x): the tiny
// llama with an adapter against the float64 numpy forward on the weights with
// scale * B @ A merged in (as PEFT's merge_and_unload gives them), the same
// adapter read from a PEFT folder and from a GGUF adapter laid out as
// llama.cpp's converter writes one, stacked adapters, every architecture
// against its merged weights, batch invariance, and the refusals.
// Fixtures: tests/python/make_lora_fixtures.py (setup.lora_fixtures).
#include <filesystem>

#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine/runtime_lora.h"
#include "engine/session.h"
#include "engine_run.h"
#include "helpers.h"
#include "io/error.h"
#include "kv/block_pool.h"
#include "model/convert.h"
#include "model/lora.h"
#include "model/quant_plan.h"

namespace wick::test {
namespace {

namespace fs = std::filesystem;
using Adapters = std::vector<std::pair<std::string, float>>;

std::string lora_dir() {
  return data_dir() + "/lora";
}

#define WICK_REQUIRE_LORA_FIXTURES()                                                         \
  do {                                                                                       \
    if (!fs::exists(lora_dir() + "/ids.json"))                                               \
      WICK_SKIP_OR_FAIL("lora fixtures missing at " << lora_dir()                            \
                                                    << " (ctest runs setup.lora_fixtures)"); \
  } while (0)

std::vector<int32_t> lora_ids() {
  return read_json(lora_dir() + "/ids.json").get<std::vector<int32_t>>();
}

std::unique_ptr<Model> with_adapters(const std::string& model, const Adapters& adapters) {
  auto m = load_model(model);
  apply_lora(*m, adapters);
  return m;
}

// The ModelError or IoError message of applying `adapters` to `model`.
std::string refusal(const std::string& model, const Adapters& adapters) {
  try {
    with_adapters(model, adapters);
  } catch (const ModelError& e) {
    return e.what();
  } catch (const IoError& e) {
    return e.what();
  }
  return "(applied)";
}

// The tiny llama with `adapters` applied to every row, through the pool's loader.
std::shared_ptr<const LoadedModel> lora_model(
    const Adapters& adapters, std::vector<std::pair<std::string, std::string>> named = {}) {
  BackendOptions opt;
  opt.device = Device::Cpu;
  opt.lora = adapters;
  opt.lora_modules = std::move(named);
  return load_model_at("tiny-llama", tiny_dir("llama"), {}, opt);
}

TEST(Lora, PeftAdapterMatchesTheMergedNumpyReference) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  const auto want = read_f32(lora_dir() + "/llama/ref_one.f32");
  auto m = with_adapters(tiny_dir("llama"), {{lora_dir() + "/llama/peft", 1.f}});
  ASSERT_EQ(m->adapters.size(), 1u);
  const double err = rel_err(run_all_logits(*m, ids), want);
  std::printf("[ report ] PEFT adapter, %zu positions: relative error %.2e\n", ids.size(), err);
  EXPECT_LT(err, 1e-4);
  EXPECT_LT(rel_err(run_all_logits(*m, ids, 7), want), 1e-4);  // prefill in chunks
  // the adapter is not idle at this bound
  EXPECT_GT(rel_err(run_all_logits(*load_model(tiny_dir("llama")), ids), want), 1e-2);
}

// llama.cpp's GGUF adapter of the same A and B (q/k rows interleaved, lora_a
// f16, alpha in the metadata), on the HF folder and on a GGUF of the model.
TEST(Lora, GgufAdapterMatchesTheSameReference) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  const auto want = read_f32(lora_dir() + "/llama/ref_one.f32");
  const Adapters gguf{{lora_dir() + "/llama/adapter.gguf", 1.f}};
  EXPECT_LT(rel_err(run_all_logits(*with_adapters(tiny_dir("llama"), gguf), ids), want), 1e-4);
  const std::string base = lora_dir() + "/llama-gguf-base.gguf";
  convert_hf_to_gguf(tiny_dir("llama"), base, DType::F32);
  EXPECT_LT(rel_err(run_all_logits(*with_adapters(base, gguf), ids), want), 1e-4);
  const Adapters peft{{lora_dir() + "/llama/peft", 1.f}};
  EXPECT_LT(rel_err(run_all_logits(*with_adapters(base, peft), ids), want), 1e-4);
  // scale 0 leaves the model as it is
  EXPECT_EQ(run_all_logits(*with_adapters(base, {{gguf[0].first, 0.f}}), ids),
            run_all_logits(*load_model(base), ids));
  fs::remove(base);
}

// An adapter stored in f16 is held in f16 (half the bytes a token reads), and
// answers as its merged weights; an f32 file's B stays f32 (its A values are
// all f16 ones: held in f16, exactly).
TEST(Lora, HalfPrecisionAdapterIsHeldInHalf) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  auto m = with_adapters(tiny_dir("llama"), {{lora_dir() + "/llama/peft-f16", 1.f}});
  ASSERT_FALSE(m->lora.empty());
  EXPECT_EQ(m->lora.front().a.dtype, DType::F16);
  EXPECT_EQ(m->lora.front().b.dtype, DType::F16);
  const auto want = read_f32(lora_dir() + "/llama/ref_f16.f32");
  const double err = rel_err(run_all_logits(*m, ids), want);
  std::printf("[ report ] f16 PEFT adapter: relative error %.2e\n", err);
  EXPECT_LT(err, 1e-4);
  auto f32 = with_adapters(tiny_dir("llama"), {{lora_dir() + "/llama/peft", 1.f}});
  EXPECT_EQ(f32->lora.front().a.dtype, DType::F16);
  EXPECT_EQ(f32->lora.front().b.dtype, DType::F32);
}

// Two adapters at once, the second rsLoRA (alpha / sqrt(r)) at scale 0.5.
TEST(Lora, StackedAdaptersAddTheirTerms) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  auto m = with_adapters(tiny_dir("llama"), {{lora_dir() + "/llama/peft", 1.f},
                                             {lora_dir() + "/llama/peft-rslora", 0.5f}});
  const auto want = read_f32(lora_dir() + "/llama/ref_both.f32");
  EXPECT_LT(rel_err(run_all_logits(*m, ids), want), 1e-4);
  EXPECT_GT(rel_err(read_f32(lora_dir() + "/llama/ref_one.f32"), want), 1e-3);
}

// Biases (qwen2), q/k norms after the projections (qwen3), sliding windows
// (mistral) and MoE models' attention: the adapter equals its merged weights.
TEST(Lora, EveryArchitectureEqualsItsMergedWeights) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  for (const char* arch : {"mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    const std::string d = lora_dir() + "/" + arch;
    const auto want = run_all_logits(*load_model(d + "/merged"), ids);
    const double err =
        rel_err(run_all_logits(*with_adapters(tiny_dir(arch), {{d + "/peft", 1.f}}), ids), want);
    std::printf("[ report ] %s: relative error %.2e against the merged weights\n", arch, err);
    EXPECT_LT(err, 1e-5);
    EXPECT_GT(rel_err(run_all_logits(*load_model(tiny_dir(arch)), ids), want), 1e-3);
  }
}

// A token's tokens do not depend on its batch with an adapter either.
TEST(Lora, EngineBatchedEqualsSequential) {
  WICK_REQUIRE_LORA_FIXTURES();
  auto m = lora_model({{lora_dir() + "/llama/peft", 1.f}});
  ASSERT_FALSE(m->model->lora.empty());
  EngineConfig cfg;
  cfg.max_batch_tokens = 40;
  cfg.max_seqs = 4;
  expect_engine_equals_sessions(m, 5, 6, cfg);
}

// Merged into a file (wick quantize --lora, llama.cpp's export-lora): the
// written model alone answers as the model with the adapter.
TEST(Lora, MergedIntoAFileAnswersAsTheAdapter) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  const auto want = read_f32(lora_dir() + "/llama/ref_one.f32");
  const Adapters peft{{lora_dir() + "/llama/peft", 1.f}};
  const Adapters gguf{{lora_dir() + "/llama/adapter.gguf", 1.f}};
  const QuantPlan f32 = *quant_plan_from_name("f32"), q8 = *quant_plan_from_name("q8_0");
  const std::string d = lora_dir() + "/merged-", base = d + "base.gguf";
  convert_hf_to_gguf(tiny_dir("llama"), d + "hf.gguf", f32, {}, peft);
  EXPECT_LT(rel_err(run_all_logits(*load_model(d + "hf.gguf"), ids), want), 1e-4);
  // GGUF to GGUF: the adapter's q/k rows and the file's both interleaved
  convert_hf_to_gguf(tiny_dir("llama"), base, DType::F32);
  convert_gguf(base, d + "gguf.gguf", f32, {}, gguf);
  EXPECT_LT(rel_err(run_all_logits(*load_model(d + "gguf.gguf"), ids), want), 1e-4);
  // quantized after the merge: within q8_0's error, far closer than without the adapter
  convert_gguf(base, d + "q8.gguf", q8, {}, gguf);
  convert_gguf(base, d + "q8-plain.gguf", q8, {});
  const double err = rel_err(run_all_logits(*load_model(d + "q8.gguf"), ids), want);
  const double plain = rel_err(run_all_logits(*load_model(d + "q8-plain.gguf"), ids), want);
  std::printf("[ report ] merged then q8_0: relative error %.2e (without the adapter %.2e)\n", err,
              plain);
  EXPECT_LT(err, 4e-2);
  EXPECT_GT(plain, 5 * err);
  for (const char* f : {"hf.gguf", "base.gguf", "gguf.gguf", "q8.gguf", "q8-plain.gguf"})
    fs::remove(d + f);
}

TEST(Lora, RefusalsNameWhatDoesNotFit) {
  WICK_REQUIRE_LORA_FIXTURES();
  const std::string llama = tiny_dir("llama"), d = lora_dir();
  EXPECT_NE(refusal(llama, {{d + "/bad/dora", 1.f}}).find("use_dora"), std::string::npos);
  // an expert's projection is not a target
  const std::string experts = refusal(tiny_dir("qwen3_moe"), {{d + "/bad/experts", 1.f}});
  EXPECT_NE(experts.find("experts.0.gate_proj"), std::string::npos) << experts;
  EXPECT_NE(experts.find("attention (q, k, v, o)"), std::string::npos) << experts;
  // a dense-MLP adapter on a MoE model
  const std::string moe = refusal(tiny_dir("qwen3_moe"), {{d + "/qwen3/peft", 1.f}});
  EXPECT_NE(moe.find("mixture of experts"), std::string::npos) << moe;
  // another architecture's GGUF adapter
  EXPECT_NE(refusal(tiny_dir("qwen3"), {{d + "/llama/adapter.gguf", 1.f}})
                .find("an adapter for 'llama' models"),
            std::string::npos);
  // a model where an adapter belongs
  const std::string base = d + "/llama-not-an-adapter.gguf";
  convert_hf_to_gguf(llama, base, DType::F32);
  EXPECT_NE(refusal(llama, {{base, 1.f}}).find("not a LoRA adapter"), std::string::npos);
  fs::remove(base);
  EXPECT_NE(refusal(llama, {{d + "/nowhere", 1.f}}).find("no such adapter"), std::string::npos);
  // a folder without adapter_config.json
  EXPECT_NE(refusal(llama, {{d + "/llama", 1.f}}).find("adapter_config.json"), std::string::npos);
  // applied once
  auto m = with_adapters(llama, {{d + "/llama/peft", 1.f}});
  EXPECT_THROW(apply_lora(*m, Adapters{{d + "/llama/peft", 1.f}}), ModelError);
}

// ---- named adapters (serve's --lora-modules): chosen per request ----

// Requests choosing two named adapters, or none, batched together in one
// engine, each give the bits of a model with that adapter on every row (the
// PEFT reference above) run alone: a term reaches its own rows only.
TEST(LoraNamed, BatchedRequestsEachGetTheirAdaptersBits) {
  WICK_REQUIRE_LORA_FIXTURES();
  const std::string one = lora_dir() + "/llama/peft", rs = lora_dir() + "/llama/peft-rslora";
  auto named = lora_model({}, {{"one", one}, {"rs", rs}});
  ASSERT_EQ(named->model->adapter_names, (std::vector<std::string>{"one", "rs"}));
  std::shared_ptr<const LoadedModel> alone[3] = {lora_model({}), lora_model({{one, 1.f}}),
                                                 lora_model({{rs, 1.f}})};
  const auto reqs = adapter_requests(11, 9);
  EngineConfig cfg;
  cfg.max_batch_tokens = 48;
  cfg.max_seqs = 5;
  Engine e(named, cfg);
  expect_batched_equal_alone(e, reqs, alone);
  // and the adapters are not idle: each answers differently on one prompt
  auto first = [&](int32_t adapter) {
    GenerateRequest r = reqs[0];
    r.adapter = adapter;
    return run_one(e, r).first_logits;
  };
  EXPECT_NE(first(0), first(1));
  EXPECT_NE(first(1), first(2));
  // embeddings too
  const std::vector<std::vector<int32_t>> inputs{reqs[1].prompt, reqs[2].prompt};
  Engine plain_engine(alone[1], cfg);
  EXPECT_EQ(e.embed(inputs, Pooling::Mean, 1)[1].values,
            plain_engine.embed(inputs, Pooling::Mean)[1].values);
  GenerateRequest bad = greedy_request({1, 2, 3});
  bad.adapter = 3;
  EXPECT_THROW(e.add_request(bad, {}), GenerateError);
}

// The prefix and span caches keep each adapter's K/V apart: a prompt cached
// under one adapter is computed again for another, and reused for its own.
TEST(LoraNamed, CachesKeepAdaptersApart) {
  WICK_REQUIRE_LORA_FIXTURES();
  const std::string one = lora_dir() + "/llama/peft";
  auto named = lora_model({}, {{"one", one}});
  auto with_one = lora_model({{one, 1.f}}), plain = lora_model({});
  EngineConfig cfg;
  cfg.span_cache = true;  // keys before RoPE: the same path for both caches
  std::mt19937 rng(5);
  GenerateRequest r = greedy_request(random_tokens(rng, 70, 512), 4);
  r.keep_first_logits = true;
  Engine e(named, cfg);
  Engine want_one(with_one, cfg), want_plain(plain, cfg);
  r.adapter = 1;
  const GenerateResult a1 = run_one(e, r);
  r.adapter = 0;
  const GenerateResult a0 = run_one(e, r);
  EXPECT_EQ(a0.n_reused, 0) << "the adapter's blocks served a request without it";
  r.adapter = 1;
  const GenerateResult again = run_one(e, r);
  EXPECT_GT(again.n_reused, 0);
  r.adapter = 0;
  expect_same_result(a0, run_one(want_plain, r), 0);
  expect_same_result(a1, run_one(want_one, r), 1);
  expect_same_result(again, a1, 2);
  // spans: a span computed under one adapter is not found under another
  const auto doc = random_tokens(rng, 20, 512), q = random_tokens(rng, 5, 512);
  GenerateRequest sr = request_with_spans({1, 2, 3}, {doc}, q, 3);
  sr.span_recompute = 0;
  sr.adapter = 1;
  const GenerateResult s1 = run_one(e, sr);
  sr.adapter = 0;
  const GenerateResult s0 = run_one(e, sr);
  EXPECT_EQ(s0.n_span_hits, 0);
  EXPECT_EQ(s0.n_span_misses, 1);
  expect_same_result(s0, run_one(want_plain, sr), 3);
  sr.adapter = 1;
  EXPECT_EQ(run_one(e, sr).n_span_hits, 1);
  sr.adapter = 0;
  expect_same_result(s1, run_one(want_one, sr), 4);
}

// An adapter added to a model while it serves (vLLM's /v1/load_lora_adapter)
// gives the bits of one loaded with the model, and leaves the others' alone.
// Removed, its terms, memory and name go; loaded again it takes a new number,
// so the blocks cached under the old one do not serve it.
TEST(LoraNamed, AddedAndRemovedWhileServingEqualsLoadedAtStart) {
  WICK_REQUIRE_LORA_FIXTURES();
  const std::string one = lora_dir() + "/llama/peft", rs = lora_dir() + "/llama/peft-rslora";
  auto at_start = lora_model({}, {{"one", one}, {"rs", rs}});
  auto serving = lora_model({}, {{"one", one}});
  const auto reqs = adapter_requests(12, 9);
  EngineConfig cfg;
  cfg.max_batch_tokens = 48;
  cfg.max_seqs = 5;
  Engine e(serving, cfg), start(at_start, cfg);
  const auto want = run_engine(start, reqs);
  EXPECT_THROW(e.add_request(reqs[2], {}), GenerateError);  // adapter 2: not yet
  const size_t n_terms = serving->model->lora.size();
  add_serving_adapter(*serving, "rs", rs, 2);
  EXPECT_EQ(serving->model->adapter_names, at_start->model->adapter_names);
  EXPECT_GT(serving->model->lora.size(), n_terms);
  const auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) expect_same_result(got[i], want[i], i);

  remove_serving_adapter(*serving, 2);
  EXPECT_EQ(serving->model->lora.size(), n_terms);
  EXPECT_EQ(serving->device->lora.size(), n_terms);
  EXPECT_EQ(serving->model->adapter_bytes.count(2), 0u);
  EXPECT_EQ(serving->model->adapter_names, (std::vector<std::string>{"one", ""}));
  try {
    e.add_request(reqs[2], {});
    ADD_FAILURE() << "a request for a removed adapter ran";
  } catch (const GenerateError& ex) {
    EXPECT_NE(std::string(ex.what()).find("was unloaded"), std::string::npos) << ex.what();
  }
  std::vector<GenerateRequest> rest;
  std::vector<size_t> at;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (reqs[i].adapter != 2) rest.push_back(reqs[i]), at.push_back(i);
  const auto kept = run_engine(e, rest);
  for (size_t i = 0; i < rest.size(); ++i) expect_same_result(kept[i], want[at[i]], at[i]);

  add_serving_adapter(*serving, "rs", rs, 3);
  GenerateRequest again = reqs[2];
  again.adapter = 3;
  const GenerateResult r3 = run_one(e, again);
  EXPECT_EQ(r3.n_reused, 0) << "blocks cached under the removed number served its successor";
  expect_same_result(r3, want[2], 2);
  // a file that does not fit changes nothing
  EXPECT_THROW(add_serving_adapter(*serving, "x", lora_dir() + "/nowhere", 4), IoError);
  EXPECT_THROW(add_serving_adapter(*serving, "x", lora_dir() + "/bad/dora", 4), ModelError);
  EXPECT_EQ(serving->model->adapter_names, (std::vector<std::string>{"one", "", "rs"}));
  expect_same_result(run_one(e, again), want[2], 2);
}

// The block pool alone: a block is found under its own adapter only, and its
// stored event carries the adapter (vLLM's lora_id).
TEST(LoraNamed, BlocksAreFoundUnderTheirAdapterAlone) {
  BlockPool pool(8, 4, 77);
  std::vector<BlockPool::Event> log;
  pool.set_event_log(&log);
  const std::vector<int32_t> toks{5, 6, 7, 8};
  const int32_t b = pool.allocate();
  const uint64_t h = pool.commit(b, 0, toks, 2);
  EXPECT_NE(h, pool.chain_hash(0, toks));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].adapter, 2);
  pool.release(b);
  EXPECT_TRUE(pool.match_prefix(toks).empty());
  EXPECT_TRUE(pool.match_prefix(toks, 1).empty());
  EXPECT_EQ(pool.match_prefix(toks, 2), std::vector<int32_t>{b});
}

TEST(LoraNamed, RefusalsNameWhatDoesNotFit) {
  WICK_REQUIRE_LORA_FIXTURES();
  const std::string llama = tiny_dir("llama"), one = lora_dir() + "/llama/peft";
  auto m = load_model(llama);
  const Adapters a{{one, 1.f}};
  EXPECT_EQ(add_named_lora(*m, "one", a), 1);
  try {
    add_named_lora(*m, "one", a);
    ADD_FAILURE() << "a second adapter of one name";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("two adapters are named 'one'"), std::string::npos);
  }
  EXPECT_THROW(add_named_lora(*m, "", a), ModelError);
  EXPECT_THROW(add_named_lora(*m, "x", Adapters{{lora_dir() + "/nowhere", 1.f}}), IoError);
  EXPECT_EQ(m->adapter_names.size(), 1u);  // a refused one takes no number
}

}  // namespace
}  // namespace wick::test
