// Speculative decoding: greedy output equals plain decoding token for token
// (draft = the same model, a bf16 copy, another tiny model of the same
// vocabulary; prompt lookup; mixed with plain requests in one batch, under
// a tiny KV budget); the rejection rule keeps the target's distribution
// (a chi-square test that fails for wrong rules, and one through the
// engine with a deliberately bad draft); every KV block comes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/ngram_proposer.h"
#include "engine/session.h"
#include "engine_run.h"
#include "helpers.h"
#include "io/safetensors.h"
#include "text/chat_template.h"

namespace wick::test {
namespace {

// Prompts of random ids, some with a repeated stretch (prompt lookup finds it).
std::vector<GenerateRequest> prompts(int32_t n_vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    const int len = 4 + int(rng() % 40);
    for (int k = 0; k < len; ++k) r.prompt.push_back(int32_t(rng() % uint32_t(n_vocab)));
    if (i % 2) {
      const auto copy = r.prompt;
      r.prompt.insert(r.prompt.end(), copy.begin(), copy.end());
    }
    r.sampling = SamplingParams::greedy();
    r.max_tokens = 8 + int(rng() % 24);
    r.ignore_eos = true;
    r.prefill_chunk = i % 3 == 0 ? 7 : 0;
    out.push_back(r);
  }
  return out;
}

std::vector<GenerateResult> run_plain(std::shared_ptr<const LoadedModel> m,
                                      const std::vector<GenerateRequest>& reqs) {
  std::vector<GenerateResult> out;
  for (auto r : reqs) {
    r.spec = SpecMethod::Off;
    Session s(m, 512);
    out.push_back(s.generate(r));
  }
  return out;
}

struct Totals {
  int64_t proposed = 0, accepted = 0, tokens = 0, forwards = 0;
};
Totals totals(const std::vector<GenerateResult>& rs) {
  Totals t;
  for (const auto& r : rs) {
    t.proposed += r.n_spec_proposed;
    t.accepted += r.n_spec_accepted;
    t.tokens += int64_t(r.tokens.size());
    t.forwards += r.n_forwards;
  }
  return t;
}

// Another tiny model with the same vocabulary (512 ids), unrelated weights.
std::string other_arch(const std::string& arch) {
  return arch == "llama" ? "qwen2" : "llama";
}

// Greedy through the engine with each draft (and prompt lookup), every
// other request plain, all at once in small steps: the tokens are plain
// decoding's. Rollback is exercised where drafts are rejected.
class SpecArch : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecArch, GreedyEqualsPlainDecoding) {
  WICK_REQUIRE_SHARED();
  const std::string arch = GetParam();
  auto m = load_model_and_tokenizer(tiny_dir(arch));
  auto reqs = prompts(int32_t(m->config().n_vocab), 10, 3);
  const auto want = run_plain(m, reqs);
  struct Case {
    std::string name;
    std::shared_ptr<const LoadedModel> draft;  // null: prompt lookup
  };
  const std::vector<Case> cases = {
      {"draft=same", m},
      {"draft=bf16", load_model_and_tokenizer(tiny_dir(arch) + "/bf16")},
      {"draft=" + other_arch(arch), load_model_and_tokenizer(tiny_dir(other_arch(arch)))},
      {"ngram", nullptr}};
  for (const auto& c : cases) {
    EngineConfig cfg;
    cfg.n_blocks = 256;
    cfg.max_batch_tokens =
        40;  // prefill chunks, decodes and drafts share steps; drafts get dropped
    cfg.max_seqs = 6;
    cfg.spec.draft = c.draft;
    cfg.spec.draft_max = 5;
    cfg.spec.ngram_min = 1;
    Engine e(m, cfg);
    auto mixed = reqs;
    for (size_t i = 0; i < mixed.size(); ++i)
      mixed[i].spec =
          i % 4 == 3 ? SpecMethod::Off : (c.draft ? SpecMethod::Draft : SpecMethod::Ngram);
    const auto got = run_engine(e, mixed);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens, want[i].tokens) << c.name << ", request " << i;
    const Totals t = totals(got);
    EXPECT_GT(t.proposed, 0) << c.name;
    if (c.name == "draft=same") {
      EXPECT_EQ(t.accepted, t.proposed) << "the target's own guesses";
    }
    if (c.name == "draft=" + other_arch(arch)) {
      EXPECT_LT(t.accepted, t.proposed) << "an unrelated draft is rejected";
    }
    EXPECT_EQ(e.blocks().n_used(), 0) << c.name;
    if (c.draft) {
      EXPECT_EQ(e.draft_blocks()->n_used(), 0) << c.name;
    }
    std::printf("[ report ] %s %s: %lld of %lld drafts accepted, %.2f tokens per forward\n",
                arch.c_str(), c.name.c_str(), (long long)t.accepted, (long long)t.proposed,
                double(t.tokens) / double(t.forwards));
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, SpecArch, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

// Prompt lookup under sampling accepts only what the target's own sampler
// draws, one draw per token as plain decoding: the same tokens for a seed.
TEST(Spec, NgramSamplingEqualsPlainSampling) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("qwen3"));
  auto reqs = prompts(int32_t(m->config().n_vocab), 8, 11);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling = SamplingParams{};  // temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
    reqs[i].sampling.seed = 100 + i;
    reqs[i].sampling.repeat_penalty = i % 2 ? 1.1f : 1.0f;
  }
  const auto want = run_plain(m, reqs);
  EngineConfig cfg;
  cfg.n_blocks = 256;
  cfg.spec.method = SpecMethod::Ngram;
  cfg.spec.ngram_min = 1;
  Engine e(m, cfg);
  const auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  EXPECT_GT(totals(got).accepted, 0);
}

// Many rejections (an unrelated draft), a KV budget that preempts, requests
// cancelled while they speculate: every block of both caches comes back,
// and the requests that finish still give plain decoding's tokens.
TEST(Spec, KvBlocksReturnAfterRejectionsPreemptionsAndCancels) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("mistral"));
  auto reqs = prompts(int32_t(m->config().n_vocab), 12, 5);
  const auto want = run_plain(m, reqs);
  EngineConfig cfg;
  cfg.n_blocks = 12;
  cfg.max_batch_tokens = 48;
  cfg.spec.method = SpecMethod::Draft;
  cfg.spec.draft = load_model_and_tokenizer(tiny_dir("qwen3"));
  cfg.spec.draft_max = 6;
  Engine e(m, cfg);
  std::vector<GenerateResult> got(reqs.size());
  std::vector<int64_t> ids;
  for (size_t i = 0; i < reqs.size(); ++i)
    ids.push_back(
        e.add_request(reqs[i], {nullptr, [&got, i](const GenerateResult& r) { got[i] = r; }}));
  for (int k = 0; k < 12; ++k) e.step();
  EXPECT_GT(e.draft_blocks()->n_used(), 0) << "drafting while cancelled";
  e.cancel(ids[0]);
  e.cancel(ids[5]);
  e.run_until_idle();
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (got[i].stop_reason == "cancelled") continue;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  }
  EXPECT_EQ(got[0].stop_reason, "cancelled");
  const Totals t = totals(got);
  EXPECT_LT(t.accepted, t.proposed / 2) << "most drafts are rejected";
  EXPECT_GT(e.n_preemptions(), 0u);
  EXPECT_EQ(e.blocks().n_used(), 0);
  EXPECT_EQ(e.blocks().n_free(), 12);
  EXPECT_EQ(e.draft_blocks()->n_used(), 0);
  std::printf("[ report ] %lld of %lld drafts accepted, %llu preemptions\n", (long long)t.accepted,
              (long long)t.proposed, (unsigned long long)e.n_preemptions());
}

TEST(Spec, BadConfigsAndRequestsAreErrors) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.spec = SpecMethod::Draft;
  Engine plain(m, EngineConfig{});
  EXPECT_THROW(plain.add_request(r, {}), GenerateError);  // no draft model
  r.spec = SpecMethod::Ngram;
  r.draft_max = kMaxDraft + 1;
  EXPECT_THROW(plain.add_request(r, {}), GenerateError);
  EngineConfig cfg;
  cfg.spec.method = SpecMethod::Draft;  // without a draft
  EXPECT_THROW(Engine(m, cfg), std::runtime_error);
  cfg.spec.method = SpecMethod::Ngram;
  cfg.spec.ngram_min = 0;
  EXPECT_THROW(Engine(m, cfg), std::runtime_error);
}

// A draft must share the target's vocabulary: the error names the first
// token that differs (here: two real tokenizers on same-sized models).
TEST(Spec, DraftWithAnotherVocabularyNamesTheFirstDifferingToken) {
  WICK_REQUIRE_SHARED();
  auto with_tokenizer = [](const std::string& tok) {
    auto lm = load_model_and_tokenizer(tiny_dir("llama"));
    lm->tokenizer = Tokenizer::load(shared_dir() + "/tokenizers/" + tok + "/tokenizer.json");
    return lm;
  };
  auto target = with_tokenizer("qwen3"), draft = with_tokenizer("llama3");
  try {
    check_same_vocab(*target, *draft);
    FAIL() << "different vocabularies were accepted";
  } catch (const std::runtime_error& e) {
    int32_t first = 0;
    while (first < 512 && target->tokenizer->token(first) == draft->tokenizer->token(first))
      ++first;
    ASSERT_LT(first, 512);
    EXPECT_NE(std::string(e.what()).find("at token " + std::to_string(first) + ":"),
              std::string::npos)
        << e.what();
  }
  check_same_vocab(*target, *with_tokenizer("qwen3"));  // the same: no error
  auto bigger = load_model_and_tokenizer(tiny_dir("llama"));
  bigger->model->config.n_vocab = 600;
  EXPECT_THROW(check_same_vocab(*target, *bigger), std::runtime_error);
}

TEST(NgramProposer, ContinuesTheLatestLongestMatch) {
  // ... 5 6 7 8 | 5 6 9 | 5 6 7 8 30 31 | 5 6 7 -> the 3-gram "5 6 7" last
  // occurred before 8 30 31; the 2-gram "6 7" alone would find the same.
  const std::vector<int32_t> t = {1, 5, 6, 7, 8, 2, 5, 6, 9, 3, 5, 6, 7, 8, 30, 31, 4, 5, 6, 7};
  EXPECT_EQ(NgramProposer::lookup(t, 2, 3, 3), (std::vector<int32_t>{8, 30, 31}));
  EXPECT_EQ(NgramProposer::lookup(t, 2, 3, 1), (std::vector<int32_t>{8}));
  // "9 3" never occurred before: with n_min 2 nothing; with 1, "3" did not either
  const std::vector<int32_t> u = {1, 2, 3, 9, 3};
  EXPECT_EQ(NgramProposer::lookup(u, 2, 3, 4), (std::vector<int32_t>{}));
  EXPECT_EQ(NgramProposer::lookup(u, 1, 3, 4), (std::vector<int32_t>{9, 3}));
  // a continuation stops at a hole (span layouts)
  const std::vector<int32_t> h = {7, 8, kHole, 4, 7, 8};
  EXPECT_EQ(NgramProposer::lookup(h, 2, 2, 4), (std::vector<int32_t>{}));
}

// --- the rejection rule's distribution ----------------------------------

double chi2_critical(int df, double z) {  // Wilson-Hilferty: the 1 - alpha quantile for z
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Chi-square of counts against expected probabilities; cells expecting
// fewer than 5 draws are pooled. Returns (statistic, degrees of freedom).
std::pair<double, int> chi_square(const std::map<int32_t, int64_t>& counts,
                                  const std::map<int32_t, double>& expect, int64_t n) {
  double chi2 = 0, pooled_e = 0;
  int64_t pooled_c = 0;
  int cells = 0;
  for (auto [id, p] : expect) {
    const double e = p * double(n);
    const int64_t c = counts.count(id) ? counts.at(id) : 0;
    if (e < 5) {
      pooled_e += e;
      pooled_c += c;
      continue;
    }
    chi2 += (double(c) - e) * (double(c) - e) / e;
    ++cells;
  }
  for (auto [id, c] : counts)  // drawn where the target has no mass: impossible
    if (!expect.count(id) || expect.at(id) == 0) pooled_c += c, pooled_e += 1e-9;
  if (pooled_e > 0) {
    chi2 += (double(pooled_c) - pooled_e) * (double(pooled_c) - pooled_e) / pooled_e;
    ++cells;
  }
  return {chi2, cells - 1};
}

enum class Rule { Speculative, AcceptIfArgmax, AcceptAlways, RejectToTarget };

// One verified draft token: d ~ q, kept by `rule`, else drawn from the
// residual (RejectToTarget: from p itself, a common mistake).
int32_t verify_once(Rule rule, const std::vector<Sampler::Cand>& p, const std::vector<float>& q,
                    std::mt19937_64& rng) {
  std::discrete_distribution<int32_t> draw_q(q.begin(), q.end());
  std::uniform_real_distribution<double> u01(0, 1);
  const int32_t d = draw_q(rng);
  std::vector<float> p_dense(q.size(), 0.f);
  for (const auto& c : p) p_dense[size_t(c.id)] = c.p;
  bool keep = false;
  switch (rule) {
    case Rule::Speculative:
    case Rule::RejectToTarget:
      keep = accept_draft(p_dense[size_t(d)], q[size_t(d)], u01(rng));
      break;
    case Rule::AcceptIfArgmax:
      keep = d == p.front().id;
      break;
    case Rule::AcceptAlways:
      keep = true;
      break;
  }
  if (keep) return d;
  std::vector<int32_t> ids;
  std::vector<float> w;
  if (rule == Rule::RejectToTarget)
    residual(p, std::vector<float>(q.size(), 0.f), ids, w);
  else
    residual(p, q, ids, w);
  std::discrete_distribution<size_t> pick(w.begin(), w.end());
  return ids[pick(rng)];
}

TEST(SpecRule, RejectionSamplingFollowsTheTargetAndWrongRulesFail) {
  // p: the target's distribution (best first, as Sampler gives it); q: a bad draft's
  const std::vector<Sampler::Cand> p = {{0, 0.40f, 0}, {0, 0.25f, 3}, {0, 0.15f, 1},
                                        {0, 0.10f, 5}, {0, 0.06f, 2}, {0, 0.04f, 4}};
  const std::vector<float> q = {0.05f, 0.02f, 0.30f, 0.40f, 0.20f, 0.03f};
  std::map<int32_t, double> expect;
  for (const auto& c : p) expect[c.id] = c.p;
  const int64_t n = 60000;
  const double limit = chi2_critical(5, 3.719);  // alpha = 1e-4
  for (Rule rule :
       {Rule::Speculative, Rule::AcceptIfArgmax, Rule::AcceptAlways, Rule::RejectToTarget}) {
    std::mt19937_64 rng(7);
    std::map<int32_t, int64_t> counts;
    for (int64_t i = 0; i < n; ++i) ++counts[verify_once(rule, p, q, rng)];
    const auto [chi2, df] = chi_square(counts, expect, n);
    ASSERT_EQ(df, 5);
    if (rule == Rule::Speculative) {
      EXPECT_LT(chi2, limit) << "the rule of speculative sampling";
    } else {
      EXPECT_GT(chi2, limit) << "a wrong rule " << int(rule) << " went unnoticed";
    }
    std::printf("[ report ] rule %d: chi-square %.1f (limit %.1f)\n", int(rule), chi2, limit);
  }
}

// A copy of a tiny model whose final norm is scaled: its logits are the
// model's times `scale`, a distribution far sharper than the target's.
std::string sharpened_copy(const std::string& arch, float scale) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(data_dir()) / ("sharp-" + arch);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json"})
    fs::copy_file(fs::path(tiny_dir(arch)) / f, dir / f, fs::copy_options::overwrite_existing);
  TensorSet ts = read_safetensors_dir(tiny_dir(arch));
  std::vector<StTensor> out;
  for (const auto& [name, t] : ts.all()) {
    if (t.dtype != DType::F32) throw std::runtime_error("expected f32 weights");
    StTensor st{name, "F32", t.shape, {}};
    const auto* src = static_cast<const uint8_t*>(t.data);
    st.bytes.assign(src, src + t.n_bytes);
    if (name == "model.norm.weight")
      for (size_t i = 0; i < st.bytes.size() / 4; ++i)
        reinterpret_cast<float*>(st.bytes.data())[i] *= scale;
    out.push_back(std::move(st));
  }
  write_safetensors((dir / "model.safetensors").string(), out);
  return dir.string();
}

// The target's distribution for the token after `ids`, under `sp`.
std::vector<Sampler::Cand> target_dist(const LoadedModel& m, const SamplingParams& sp,
                                       const std::vector<int32_t>& ids) {
  auto all = run_all_logits(*m.model, ids);
  const size_t V = size_t(m.config().n_vocab);
  std::vector<float> row(all.end() - long(V), all.end());
  Sampler s(sp, int32_t(V));
  return s.distribution(row, ids);
}

// Through the engine: a sampled request verified against a sharpened draft
// gives tokens 2 and 3 (the first decided by speculation; token 1 comes
// from the prefill) with the target's marginal distributions, computed
// exactly by enumerating the tokens before them.
TEST(Spec, SampledOutputFollowsTheTargetWithABadDraft) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  auto draft = load_model_and_tokenizer(sharpened_copy("llama", 4.f));
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 12;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 9, 128, 77};
  // expected marginals of tokens 2 and 3
  std::map<int32_t, double> p2, p3;
  for (const auto& c1 : target_dist(*m, sp, prompt)) {
    auto h1 = prompt;
    h1.push_back(c1.id);
    for (const auto& c2 : target_dist(*m, sp, h1)) {
      p2[c2.id] += double(c1.p) * c2.p;
      auto h2 = h1;
      h2.push_back(c2.id);
      for (const auto& c3 : target_dist(*m, sp, h2)) p3[c3.id] += double(c1.p) * c2.p * c3.p;
    }
  }
  EngineConfig cfg;
  cfg.n_blocks = 1024;
  cfg.max_seqs = 64;
  cfg.max_batch_tokens = 1024;
  cfg.spec.method = SpecMethod::Draft;
  cfg.spec.draft = draft;
  cfg.spec.draft_max = 2;
  Engine e(m, cfg);
  const int64_t n = 6000;
  std::vector<GenerateRequest> reqs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    reqs[size_t(i)].prompt = prompt;
    reqs[size_t(i)].sampling = sp;
    reqs[size_t(i)].sampling.seed = uint64_t(1000 + i);
    reqs[size_t(i)].max_tokens = 4;
    reqs[size_t(i)].ignore_eos = true;
  }
  const auto got = run_engine(e, reqs);
  std::map<int32_t, int64_t> c2, c3;
  for (const auto& r : got) {
    ASSERT_EQ(r.tokens.size(), 4u);
    ++c2[r.tokens[1]];
    ++c3[r.tokens[2]];
  }
  const Totals t = totals(got);
  // the rule matters here: many drafts kept, many rejected
  EXPECT_GT(t.accepted, t.proposed / 5);
  EXPECT_LT(t.accepted, t.proposed * 9 / 10);
  using Check =
      std::tuple<const char*, const std::map<int32_t, int64_t>*, const std::map<int32_t, double>*>;
  for (const auto& [name, counts, expect] :
       std::vector<Check>{{"token 2", &c2, &p2}, {"token 3", &c3, &p3}}) {
    const auto [chi2, df] = chi_square(*counts, *expect, n);
    const double limit = chi2_critical(df, 3.719);  // alpha = 1e-4
    EXPECT_LT(chi2, limit) << name << ": chi-square " << chi2 << " over " << df << " df";
    std::printf("[ report ] %s: chi-square %.1f over %d df (limit %.1f)\n", name, chi2, df, limit);
  }
  std::printf("[ report ] bad draft: %lld of %lld drafts accepted\n", (long long)t.accepted,
              (long long)t.proposed);
}

// --- the default model ---------------------------------------------------

std::vector<int32_t> chat_ids(const LoadedModel& m, const std::string& user) {
  ChatTemplate t(m.tokenizer->chat_template, "smollm2");
  auto text = t.render(
      {{"messages", nlohmann::ordered_json::array({{{"role", "user"}, {"content", user}}})},
       {"add_generation_prompt", true}});
  return m.tokenizer->encode(text, {.add_special = false, .parse_special = true});
}

// Prompt lookup on the default model, prompts that copy from themselves,
// alongside plain requests: greedy tokens equal plain decoding's, and the
// copying makes the target accept most guesses.
TEST(SpecDefaultModel, PromptLookupEqualsPlainDecodingInAMixedBatch) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  const std::string passage =
      "The river runs past the old mill, under the stone bridge and through the town, where "
      "the market opens every Saturday morning and the bakers sell bread still warm from the "
      "oven.";
  const std::vector<std::string> users = {
      "Repeat this text exactly, word for word:\n\n" + passage,
      "What is the capital of France?",
      "Rewrite this text with 'river' replaced by 'stream':\n\n" + passage,
      "Name three colours.",
  };
  std::vector<GenerateRequest> reqs;
  for (size_t i = 0; i < users.size(); ++i) {
    GenerateRequest r;
    r.prompt = chat_ids(*m, users[i]);
    r.sampling = SamplingParams::greedy();
    r.max_tokens = 48;
    r.spec = i % 2 == 0 ? SpecMethod::Ngram : SpecMethod::Off;
    reqs.push_back(r);
  }
  const auto want = run_plain(m, reqs);
  EngineConfig cfg;
  cfg.n_blocks = 256;
  Engine e(m, cfg);
  const auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << users[i];
    EXPECT_EQ(got[i].text, want[i].text);
  }
  EXPECT_EQ(got[1].n_spec_proposed, 0);
  const GenerateResult& copy = got[0];
  EXPECT_GT(copy.n_spec_accepted, copy.n_spec_proposed / 2) << copy.text;
  EXPECT_LT(copy.n_forwards, int32_t(copy.tokens.size()) / 2) << "more than 2 tokens per forward";
  EXPECT_EQ(e.blocks().n_used(), 0);
  for (size_t i : {0, 2})
    std::printf(
        "[ report ] smollm2 prompt lookup: %d of %d accepted, %.2f tokens per forward: %s\n",
        got[i].n_spec_accepted, got[i].n_spec_proposed,
        double(got[i].tokens.size()) / got[i].n_forwards, got[i].text.c_str());
}

}  // namespace
}  // namespace wick::test
