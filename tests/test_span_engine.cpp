// The span cache in the engine: requests whose prompts hold independent
// spans (documents) laid out in blocks, each span computed alone once (a
// span job) and reused by reference at any offset, the first tokens of each
// placed span computed again with full attention. Checked against full
// prefill, against the same layout built by hand with forward(), and
// against a fresh engine; token counts; block accounting under concurrency,
// cancellation and a tiny KV budget; invalid requests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine/session.h"
#include "engine/span_blend.h"
#include "engine/span_prompt.h"
#include "engine_run.h"
#include "helpers.h"
#include "text/chat_template.h"

namespace wick::test {
namespace {

using Tokens = std::vector<int32_t>;

// prefix, the documents as spans, then the question; greedy
GenerateRequest span_request(const Tokens& prefix, const std::vector<Tokens>& docs,
                             const Tokens& question, int32_t recompute = -1, float blend = -1.f) {
  GenerateRequest r = request_with_spans(prefix, docs, question, 8);
  r.span_recompute = recompute;
  r.span_blend = blend;
  return r;
}

EngineConfig span_config() {
  EngineConfig c;
  c.span_cache = true;
  c.n_blocks = 256;       // plenty, and quick to set up
  c.span_recompute = 16;  // the counts below are written for first-16 repair, no blend
  c.span_blend = 0.f;
  return c;
}

int32_t n_tokens(const std::vector<Tokens>& docs) {
  int32_t n = 0;
  for (const auto& d : docs) n += int32_t(d.size());
  return n;
}

class SpanEngineArch : public TinyArchTest {
 protected:
  SpanEngineArch() : TinyArchTest(11) {}
};

// With every span token computed again (span_recompute past the spans'
// lengths), a span request is full prefill: the same tokens and logits as
// the prompt without spans, in one pass and in chunks of 5; also where the
// layout has holes (spans and the question start blocks), since RoPE counts
// only filled slots. A sliding window still counts slots, holes included
// (Mistral's 16 here; thousands in real models, where a few holes are noise).
TEST_P(SpanEngineArch, RecomputingEverySpanTokenEqualsFullPrefill) {
  struct Layout {
    int prefix;
    std::vector<int> docs;
    bool holes;
  };
  for (const Layout& l : {Layout{16, {32, 16, 48}, false}, Layout{0, {16, 32}, false},
                          Layout{5, {20, 9, 33}, true}, Layout{0, {7, 18}, true}}) {
    if (l.holes && m_->config().sliding_window > 0) continue;
    const Tokens prefix = random(l.prefix), question = random(7);
    std::vector<Tokens> docs;
    for (int n : l.docs) docs.push_back(random(n));
    for (int32_t chunk : {0, 5}) {
      GenerateRequest r = span_request(prefix, docs, question, 1000);
      r.prefill_chunk = chunk;
      GenerateRequest plain = r;
      plain.spans.clear();
      Engine e(m_, span_config()), ref(m_, span_config());
      const auto got = run_one(e, r), want = run_one(ref, plain);
      const std::string what =
          "prefix " + std::to_string(l.prefix) + ", chunk " + std::to_string(chunk);
      EXPECT_EQ(got.stop_reason, "length") << what;
      EXPECT_EQ(got.tokens, want.tokens) << what;
      EXPECT_LT(rel_err(got.first_logits, want.first_logits), 1e-5) << what;
      // every span computed by its job, then again in place (but a span at
      // position 0, which has nothing before it)
      const int32_t n_docs = n_tokens(docs), n_first = l.prefix == 0 ? int32_t(docs[0].size()) : 0;
      EXPECT_EQ(got.n_span_misses, int32_t(docs.size())) << what;
      EXPECT_EQ(got.n_span_hits, 0) << what;
      EXPECT_EQ(got.n_span_recomputed, n_docs - n_first) << what;
      EXPECT_EQ(got.n_span_reused, 0) << what;
      EXPECT_EQ(got.n_prompt, int32_t(r.prompt.size())) << what;
      EXPECT_EQ(got.n_prefilled, l.prefix + 2 * n_docs - n_first + 7) << what;
      EXPECT_EQ(e.blocks().n_used(), 0) << what;
    }
  }
}

// Blending every span token (span_blend 1, no fixed prefix) chooses every
// position after a measure pass: full prefill again, in one pass and with
// the measure and redo rows in chunks of 5; holes included.
TEST_P(SpanEngineArch, BlendingEverySpanTokenEqualsFullPrefill) {
  for (bool holes : {false, true}) {
    if (holes && m_->config().sliding_window > 0) continue;
    const Tokens prefix = random(holes ? 5 : 16), question = random(7);
    const std::vector<Tokens> docs = holes ? std::vector<Tokens>{random(20), random(9), random(33)}
                                           : std::vector<Tokens>{random(32), random(16)};
    for (int32_t chunk : {0, 5}) {
      GenerateRequest r = span_request(prefix, docs, question, 0, 1.f);
      r.prefill_chunk = chunk;
      GenerateRequest plain = r;
      plain.spans.clear();
      Engine e(m_, span_config()), ref(m_, span_config());
      const auto got = run_one(e, r), want = run_one(ref, plain);
      const std::string what =
          std::string(holes ? "holes" : "no holes") + ", chunk " + std::to_string(chunk);
      EXPECT_EQ(got.tokens, want.tokens) << what;
      EXPECT_LT(rel_err(got.first_logits, want.first_logits), 1e-5) << what;
      const int32_t n_docs = n_tokens(docs);
      EXPECT_EQ(got.n_span_recomputed, n_docs) << what;
      EXPECT_EQ(got.n_prefilled, int32_t(prefix.size()) + 2 * n_docs + 7) << what;
      EXPECT_EQ(e.blocks().n_used(), 0) << what;
    }
  }
}

// The measure pass gives, for each token of a placed span, the distance
// between its layer-1 K/V in a full prefill of the same layout and the
// cached span's (computed alone): checked against both computed by hand.
TEST_P(SpanEngineArch, MeasurePassGivesTheKvDeviationFromFullPrefill) {
  const auto& c = m_->config();
  if (c.n_layer < 2) GTEST_SKIP() << "one layer";
  const int32_t bs = 16;
  const Tokens prefix = random(16), doc = random(27);
  using Fills = std::vector<std::pair<int32_t, int32_t>>;
  auto forward_rows = [&](KvStore& kv, const Tokens& table, const Fills& fills,
                          const Tokens& tokens, int32_t first, bool measure) {
    Batch b;
    b.block_tables = {table};
    b.block_fills = {fills};
    for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], first + int32_t(i), 0, false);
    ForwardScratch s;
    std::vector<float> out(tokens.size());
    ForwardOptions opt;
    opt.kv_deviation = measure;
    forward(cpu_backend(), c, m_->model->weights, b, kv, s, out.data(), opt);
    return out;
  };
  // blocks 0: prefix; 1-2: the span alone; 3-4: the span after the prefix (full prefill)
  auto kv = cpu_backend().make_kv(c.n_layer, 8, bs, c.kv_dim(), true);
  const Fills span_fills{{0, 16}, {0, 11}};
  forward_rows(*kv, {0}, {{0, 16}}, prefix, 0, false);
  forward_rows(*kv, {1, 2}, span_fills, doc, 0, false);
  forward_rows(*kv, {0, 3, 4}, {{0, 16}, {0, 16}, {0, 11}}, doc, 16, false);
  // measured where the span's cached blocks stand after the prefix
  const auto got = forward_rows(*kv, {0, 1, 2}, {{0, 16}, {0, 16}, {0, 11}}, doc, 16, true);
  const int64_t d = c.kv_dim();
  std::vector<float> want(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const int64_t cached = (1 + int64_t(i) / bs) * bs + int64_t(i) % bs,
                  full = (3 + int64_t(i) / bs) * bs + int64_t(i) % bs;
    double sum = 0;
    for (const float* base : {kv->k_layer<float>(1), kv->v_layer<float>(1)})
      for (int64_t j = 0; j < d; ++j) {
        const double diff = double(base[full * d + j]) - double(base[cached * d + j]);
        sum += diff * diff;
      }
    want[i] = float(sum);
  }
  EXPECT_LT(rel_err(got, want), 1e-4);
  EXPECT_GT(*std::max_element(want.begin(), want.end()), 0.f);  // the context matters
  // and a span measured with nothing before it deviates nowhere
  const auto alone = forward_rows(*kv, {1, 2}, span_fills, doc, 0, true);
  EXPECT_EQ(*std::max_element(alone.begin(), alone.end()), 0.f);
}

// The engine's layout built by hand (forward() on a KV store with pre-RoPE
// keys): each span computed alone at positions 0.., its first blocks copied
// and its first k tokens computed again in place, the question after; each
// span and the question start a block. Returns the last token's logits.
std::vector<float> hand_built(const Model& m, const Tokens& prefix, const std::vector<Tokens>& docs,
                              const Tokens& question, int32_t k, float blend = 0.f) {
  const auto& c = m.config;
  const int32_t bs = 16;
  auto kv = cpu_backend().make_kv(c.n_layer, 64, bs, c.kv_dim(), true);
  int32_t next_block = 0;
  using Fills = std::vector<std::pair<int32_t, int32_t>>;
  // tokens at positions (default first, first + 1, ...); the last one's logits
  // (measure: every row's deviation)
  auto run = [&](const Tokens& table, const Fills& fills, const Tokens& tokens, int32_t first,
                 Tokens positions = {}, bool measure = false) {
    Batch b;
    b.block_tables = {table};
    b.block_fills = {fills};
    for (size_t i = 0; i < tokens.size(); ++i)
      b.add(tokens[i], positions.empty() ? first + int32_t(i) : positions[i], 0,
            !measure && i + 1 == tokens.size());
    ForwardScratch s;
    std::vector<float> out(measure ? tokens.size() : size_t(c.n_vocab));
    ForwardOptions opt;
    opt.kv_deviation = measure;
    forward(cpu_backend(), c, m.weights, b, *kv, s, out.data(), opt);
    return out;
  };
  // blocks for n tokens from a block start: new ones, each filled up to n
  auto blocks_for = [&](int32_t n, Tokens& table, Fills& fills) {
    for (int32_t at = 0; at < n; at += bs) {
      table.push_back(next_block++);
      fills.push_back({0, std::min(bs, n - at)});
    }
  };
  Tokens table;
  Fills fills;
  blocks_for(int32_t(prefix.size()), table, fills);
  if (!prefix.empty()) run(table, fills, prefix, 0);
  for (const auto& d : docs) {
    const int32_t pos = int32_t(table.size()) * bs, n = int32_t(d.size());
    Tokens alone;
    Fills alone_fills;
    blocks_for(n, alone, alone_fills);
    run(alone, alone_fills, d, 0);
    Tokens with = table;  // the span's shared blocks placed
    with.insert(with.end(), alone.begin(), alone.end());
    Fills with_fills = fills;
    with_fills.insert(with_fills.end(), alone_fills.begin(), alone_fills.end());
    std::vector<float> dev;
    if (pos > 0 && blend > 0.f) dev = run(with, with_fills, d, pos, {}, true);
    const Tokens rows = pos == 0 ? Tokens{} : choose_span_rows(dev, n, k, blend);
    for (size_t i = 0; i < alone.size(); ++i) {
      int32_t b = alone[i];
      const bool redone =
          std::any_of(rows.begin(), rows.end(), [&](int32_t r) { return r / bs == int32_t(i); });
      if (redone) {  // a private copy
        const std::pair<int32_t, int32_t> copy{b, next_block};
        cpu_backend().copy_blocks(*kv, std::span(&copy, 1));
        b = next_block++;
      }
      table.push_back(b);
      fills.push_back(alone_fills[i]);
    }
    Tokens toks, positions;
    for (int32_t r : rows) toks.push_back(d[size_t(r)]), positions.push_back(pos + r);
    if (!rows.empty()) run(table, fills, toks, 0, positions);
  }
  const int32_t q_pos = int32_t(table.size()) * bs;
  blocks_for(int32_t(question.size()), table, fills);
  fills.back().second = bs;  // the last block has room for what is generated
  return run(table, fills, question, q_pos);
}

// The engine gives the hand-built layout's logits: spans of 20 and 9 tokens
// after a 5-token prefix (holes after each), with 0, 4 (part of a block) and
// 20 (whole spans) tokens computed again; and one document twice (one job,
// then a hit on its blocks, shared at two places of one table).
TEST_P(SpanEngineArch, EqualsTheLayoutBuiltByHand) {
  const Tokens prefix = random(5), question = random(3), twice = random(18);
  for (const auto& docs : {std::vector<Tokens>{random(20), random(9)}, {twice, twice}}) {
    const bool dup = docs[0] == docs[1];
    for (int32_t k : {0, 4, 20}) {
      Engine e(m_, span_config());
      const auto got = run_one(e, span_request(prefix, docs, question, k));
      const auto want = hand_built(*m_->model, prefix, docs, question, k);
      const std::string what = std::string(dup ? "twice" : "two") + ", k " + std::to_string(k);
      EXPECT_LT(rel_err(got.first_logits, want), 1e-5) << what;
      const int32_t n0 = int32_t(docs[0].size()), n1 = int32_t(docs[1].size());
      EXPECT_EQ(got.n_span_misses, dup ? 1 : 2) << what;
      EXPECT_EQ(got.n_span_hits, dup ? 1 : 0) << what;
      EXPECT_EQ(got.n_span_recomputed, std::min(k, n0) + std::min(k, n1)) << what;
      EXPECT_EQ(got.n_prefilled, 5 + n0 + (dup ? 0 : n1) + got.n_span_recomputed + 3) << what;
    }
  }
}

// With span_blend the engine still gives the hand-built layout's logits
// (the measure pass, the choice, copies of the blocks holding the chosen
// positions, those rows computed at their positions), alone and with a
// fixed prefix; a fresh engine gives the same bits.
TEST_P(SpanEngineArch, BlendEqualsTheLayoutBuiltByHand) {
  const Tokens prefix = random(5), question = random(3);
  const std::vector<Tokens> docs{random(40), random(9), random(23)};
  for (auto [k, blend] : {std::pair{0, 0.3f}, {4, 0.25f}, {0, 0.05f}}) {
    Engine e(m_, span_config());
    const auto req = span_request(prefix, docs, question, k, blend);
    const auto got = run_one(e, req);
    const auto want = hand_built(*m_->model, prefix, docs, question, k, blend);
    const std::string what = "k " + std::to_string(k) + ", blend " + std::to_string(blend);
    EXPECT_LT(rel_err(got.first_logits, want), 1e-5) << what;
    int32_t n_chosen = 0;
    for (const auto& d : docs)
      n_chosen +=
          std::min(int32_t(d.size()), k + int32_t(std::ceil(blend * float(d.size()) - 1e-6f)));
    EXPECT_EQ(got.n_span_recomputed, n_chosen) << what;
    EXPECT_EQ(e.blocks().n_used(), 0) << what;
    Engine fresh(m_, span_config());
    EXPECT_EQ(run_one(fresh, req).first_logits, got.first_logits) << what;
  }
}

// A second request with the same documents in another order finds every
// span cached (and the prefix's block): it computes only each span's first
// k tokens and the question, and answers as a fresh engine given the same
// request does. A third with a new document among them computes that
// document (its job) and nothing else new.
TEST_P(SpanEngineArch, ReusesCachedSpansInAnyOrderAndEqualsAFreshEngine) {
  const Tokens prefix = random(5);
  const Tokens A = random(20), B = random(37), C = random(9), D = random(25);
  const int32_t k = 16;
  Engine e(m_, span_config());
  const auto r1 = run_one(e, span_request(prefix, {A, B, C}, random(6)));
  EXPECT_EQ(r1.n_span_misses, 3);
  EXPECT_EQ(r1.n_span_hits, 0);
  EXPECT_EQ(r1.n_reused, 0);
  EXPECT_EQ(r1.n_prefilled, 5 + 66 + (16 + 16 + 9) + 6);

  const auto req2 = span_request(prefix, {C, A, B}, random(6));
  const auto r2 = run_one(e, req2);
  EXPECT_EQ(r2.n_span_hits, 3);
  EXPECT_EQ(r2.n_span_misses, 0);
  EXPECT_EQ(r2.n_span_recomputed, 9 + k + k);
  EXPECT_EQ(r2.n_span_reused, 0 + (20 - k) + (37 - k));
  EXPECT_EQ(r2.n_reused, 5 + r2.n_span_reused);  // the prefix's block and the spans
  EXPECT_EQ(r2.n_prefilled, r2.n_span_recomputed + 6);
  EXPECT_EQ(r2.n_reused + r2.n_prefilled, r2.n_prompt);
  Engine fresh2(m_, span_config());
  const auto f2 = run_one(fresh2, req2);
  EXPECT_EQ(f2.n_span_misses, 3);
  EXPECT_EQ(r2.tokens, f2.tokens);
  EXPECT_EQ(r2.first_logits, f2.first_logits);  // the same computation, bit for bit

  const auto req3 = span_request(prefix, {A, D, C}, random(6));
  const auto r3 = run_one(e, req3);
  EXPECT_EQ(r3.n_span_hits, 2);
  EXPECT_EQ(r3.n_span_misses, 1);
  EXPECT_EQ(r3.n_prefilled, 25 + (k + k + 9) + 6);  // D, the repairs, the question
  Engine fresh3(m_, span_config());
  const auto f3 = run_one(fresh3, req3);
  EXPECT_EQ(r3.tokens, f3.tokens);
  EXPECT_EQ(r3.first_logits, f3.first_logits);
  EXPECT_EQ(e.blocks().n_used(), 0);
  EXPECT_GT(e.blocks().n_cached(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, SpanEngineArch, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

// Requests drawing 2 to 4 of 5 documents (a shared prefix, their own
// question), some prefilled in chunks of 5.
std::vector<GenerateRequest> shared_doc_requests(int64_t n_vocab, int n, uint32_t seed,
                                                 std::vector<Tokens>& docs) {
  std::mt19937 rng(seed);
  docs.clear();
  for (int i = 0; i < 5; ++i) docs.push_back(random_tokens(rng, 10 + int(rng() % 31), n_vocab));
  const Tokens prefix = random_tokens(rng, 7, n_vocab);
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int> order(docs.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Tokens> picked;
    for (int j = 0; j < 2 + int(rng() % 3); ++j) picked.push_back(docs[size_t(order[size_t(j)])]);
    auto r = span_request(prefix, picked, random_tokens(rng, 3 + int(rng() % 8), n_vocab));
    r.max_tokens = 4 + int(rng() % 9);
    r.keep_first_logits = false;
    r.prefill_chunk = i % 3 == 0 ? 5 : 0;
    if (i % 2 == 1) r.span_blend = 0.3f;  // a measure pass, then positions anywhere in the span
    out.push_back(r);
  }
  return out;
}

class SpanEngineConcurrent : public SpanEngineArch {};

// Many requests at once share the spans by reference: each distinct
// document is computed by one job (the others wait for it and find it
// cached), the results equal one-by-one runs, and every block comes back.
TEST_P(SpanEngineConcurrent, RequestsShareSpansAndEqualOneByOneRuns) {
  std::vector<Tokens> docs;
  const auto reqs = shared_doc_requests(m_->config().n_vocab, 12, 3, docs);
  const auto want = run_one_by_one(m_, span_config(), reqs);
  EngineConfig cfg = span_config();
  cfg.max_batch_tokens = 48;  // spans, repairs, prefills and decodes over many steps
  cfg.max_seqs = 6;
  Engine e(m_, cfg);
  const auto got = run_engine(e, reqs);
  int32_t n_misses = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    n_misses += got[i].n_span_misses;
  }
  std::set<Tokens> used;
  for (const auto& r : reqs)
    for (auto [b, e2] : r.spans) used.insert(Tokens(r.prompt.begin() + b, r.prompt.begin() + e2));
  EXPECT_EQ(n_misses, int32_t(used.size()));
  EXPECT_EQ(e.blocks().n_used(), 0);
  EXPECT_EQ(e.n_preemptions(), 0u);
}

// Requests cancelled while they wait for span jobs, repair or decode free
// everything they hold (their jobs too); the others are unaffected.
TEST_P(SpanEngineConcurrent, CancelledRequestsReturnTheirBlocks) {
  std::vector<Tokens> docs;
  const auto reqs = shared_doc_requests(m_->config().n_vocab, 12, 5, docs);
  const auto want = run_one_by_one(m_, span_config(), reqs);
  EngineConfig cfg = span_config();
  cfg.max_batch_tokens = 40;
  cfg.max_seqs = 8;
  Engine e(m_, cfg);
  std::vector<GenerateResult> got(reqs.size());
  std::vector<int64_t> ids;
  for (size_t i = 0; i < reqs.size(); ++i)
    ids.push_back(
        e.add_request(reqs[i], {nullptr, [&got, i](const GenerateResult& r) { got[i] = r; }}));
  const std::set<size_t> cancelled{0, 3, 6, 10};
  for (int step = 0; e.step(); ++step) {
    if (step == 1) e.cancel(ids[0]);  // its first span job is under way
    if (step == 3) e.cancel(ids[3]);
    if (step == 6) e.cancel(ids[6]);
    if (step == 9) e.cancel(ids[10]);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (cancelled.count(i)) {
      EXPECT_EQ(got[i].stop_reason, "cancelled") << "request " << i;
    } else {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    }
  }
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// A KV cache of 20 blocks for requests of up to 15: span jobs, repairs and
// decodes compete for blocks; sequences are preempted and recomputed, with
// the same results, and every block comes back.
TEST_P(SpanEngineConcurrent, TinyBudgetPreemptsAndStillEqualsOneByOneRuns) {
  std::vector<Tokens> docs;
  const auto reqs = shared_doc_requests(m_->config().n_vocab, 10, 9, docs);
  const auto want = run_one_by_one(m_, span_config(), reqs);
  EngineConfig cfg = span_config();
  cfg.n_blocks = 20;
  cfg.max_batch_tokens = 64;
  Engine e(m_, cfg);
  const auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].stop_reason, want[i].stop_reason) << "request " << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  }
  EXPECT_EQ(e.blocks().n_used(), 0);
  EXPECT_GT(e.n_preemptions(), 0u);
  std::printf("[ report ] %s tiny budget with spans: %llu preemptions over %llu steps\n",
              GetParam().c_str(), (unsigned long long)e.n_preemptions(),
              (unsigned long long)e.n_steps());
}

INSTANTIATE_TEST_SUITE_P(Archs, SpanEngineConcurrent,
                         ::testing::Values("llama", "mistral", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

// A request whose layout fits the cache but whose span repair (private
// copies) does not ends with an error instead of waiting forever.
TEST(SpanEngine, RepairThatNeverFitsIsAnError) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("qwen2"));
  std::mt19937 rng(2);
  const int64_t V = m->config().n_vocab;
  // 1 + 2 + 1 blocks of layout; the repair of the whole span copies 2
  // blocks while the span's own 2 are held: 5
  auto r = span_request(random_tokens(rng, 16, V), {random_tokens(rng, 32, V)},
                        random_tokens(rng, 4, V), 32);
  EngineConfig cfg = span_config();
  cfg.n_blocks = 4;
  Engine e(m, cfg);
  const auto got = run_one(e, r);
  EXPECT_EQ(got.stop_reason.rfind("error", 0), 0u) << got.stop_reason;
  EXPECT_EQ(e.blocks().n_used(), 0);
  // without the repair it fits
  r.span_recompute = 0;
  r.max_tokens = 12;
  const auto ok = run_one(e, r);
  EXPECT_EQ(ok.stop_reason, "length");
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// The first n_first offsets, then the largest deviations among the rest
// (ceil(fraction * n) of them, ties to the earlier, NaN first), in order.
TEST(SpanBlend, ChoosesTheFirstTokensThenTheLargestDeviations) {
  const std::vector<float> dev{9, 0, 5, 1, 5, 7, 0, 2, 3, 0};
  EXPECT_EQ(choose_span_rows({}, 10, 3, 0.5f), (Tokens{0, 1, 2}));
  EXPECT_EQ(choose_span_rows({}, 2, 3, 0.f), (Tokens{0, 1}));
  EXPECT_EQ(choose_span_rows(dev, 10, 0, 0.3f), (Tokens{0, 2, 5}));
  EXPECT_EQ(choose_span_rows(dev, 10, 0, 0.25f), (Tokens{0, 2, 5}));    // ceil(2.5)
  EXPECT_EQ(choose_span_rows(dev, 10, 0, 0.4f), (Tokens{0, 2, 4, 5}));  // 5 and 5: both
  EXPECT_EQ(choose_span_rows(dev, 10, 2, 0.2f), (Tokens{0, 1, 2, 5}));
  EXPECT_EQ(choose_span_rows(dev, 10, 8, 0.5f), (Tokens{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(choose_span_rows(dev, 10, 0, 1.f).size(), 10u);
  EXPECT_TRUE(choose_span_rows(dev, 10, 0, 0.f).empty());
  std::vector<float> nan = dev;
  nan[6] = NAN;
  EXPECT_EQ(choose_span_rows(nan, 10, 0, 0.1f), (Tokens{6}));
  EXPECT_THROW(choose_span_rows(dev, 9, 0, 0.1f), std::logic_error);
}

TEST(SpanEngine, InvalidSpanRequestsAreClearErrors) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  EngineConfig cfg = span_config();
  cfg.n_ctx = 128;
  Engine e(m, cfg);
  GenerateRequest base;
  for (int i = 0; i < 40; ++i) base.prompt.push_back(i + 1);
  auto error_of = [&](Engine& eng, std::vector<std::pair<int32_t, int32_t>> spans,
                      int32_t recompute = -1) -> std::string {
    GenerateRequest r = base;
    r.spans = std::move(spans);
    r.span_recompute = recompute;
    try {
      eng.add_request(r, {});
    } catch (const GenerateError& err) {
      return err.what();
    }
    return "";
  };
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  EXPECT_PRED2(has, error_of(e, {{5, 10}, {8, 20}}), "span 1 [8, 20) overlaps or precedes span 0");
  EXPECT_PRED2(has, error_of(e, {{20, 30}, {5, 10}}), "span 1 [5, 10) overlaps or precedes");
  EXPECT_PRED2(has, error_of(e, {{30, 50}}), "span 0 [30, 50) is outside the prompt of 40");
  EXPECT_PRED2(has, error_of(e, {{-1, 5}}), "is outside the prompt");
  EXPECT_PRED2(has, error_of(e, {{7, 7}}), "span 0 [7, 7) is empty");
  EXPECT_PRED2(has, error_of(e, {{30, 40}}), "ends the prompt");
  EXPECT_PRED2(has, error_of(e, {{1, 5}}, -2), "span_recompute must be >= 0");
  {
    GenerateRequest r = base;
    r.spans = {{1, 5}};
    r.span_blend = 1.5f;
    EXPECT_THROW(e.add_request(r, {}), GenerateError);
  }
  // 1 token and 15 holes, 6 spans of 17 tokens (2 blocks each), 7 more: 215 positions
  std::vector<std::pair<int32_t, int32_t>> many;
  GenerateRequest longer = base;
  for (int i = 40; i < 110; ++i) longer.prompt.push_back(i);
  for (int i = 0; i < 6; ++i) many.push_back({1 + 17 * i, 1 + 17 * (i + 1)});
  longer.spans = many;
  try {
    e.add_request(longer, {});
    ADD_FAILURE() << "a layout past the context was accepted";
  } catch (const GenerateError& err) {
    EXPECT_PRED2(has, std::string(err.what()), "span layout takes 215 positions");
  }
  longer.spans.clear();
  longer.truncate = true;
  GenerateRequest too_long = longer;
  for (int i = 0; i < 30; ++i) too_long.prompt.push_back(i);
  too_long.spans = {{1, 5}};
  try {
    e.add_request(too_long, {});
    ADD_FAILURE() << "a span request was truncated";
  } catch (const GenerateError& err) {
    EXPECT_PRED2(has, std::string(err.what()), "but the context holds 128");
  }
  Engine plain(m, EngineConfig{});
  EXPECT_PRED2(has, error_of(plain, {{1, 5}}), "spans need the engine's span cache");
  EXPECT_EQ(error_of(e, {{1, 5}, {5, 9}, {20, 39}}), "");  // adjacent spans are fine
  e.run_until_idle();
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// ---- the default model

// The chat prompt of a question over documents, the documents as spans.
SpanPrompt chat_span_prompt(const LoadedModel& m, const std::vector<std::string>& texts,
                            const std::string& question) {
  std::vector<std::string> docs;
  for (const auto& t : texts) docs.push_back(span_document(t));
  ChatTemplate t(m.tokenizer->chat_template, "smollm2");
  const auto messages = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", span_message(docs.size(), question)}}});
  const auto text = t.render({{"messages", messages}, {"add_generation_prompt", true}});
  return tokenize_span_prompt(*m.tokenizer, text, docs,
                              {.add_special = false, .parse_special = true});
}

TEST(SpanEngineDefaultModel, AnswersFromCachedDocumentsInAnyOrder) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  const std::vector<std::string> docs{
      "Berlin is the capital of Germany. It is known for the Brandenburg Gate.",
      "Paris is the capital of France. It is known for the Eiffel Tower and the Louvre.",
      "Madrid is the capital of Spain. It is known for the Prado museum."};
  const std::string question = "What is the capital of France?";
  Session s(m, 2048, true);
  auto ask = [&](Session& session, const std::vector<std::string>& d) {
    const auto p = chat_span_prompt(*m, d, question);
    GenerateRequest r;
    r.prompt = p.ids;
    r.spans = p.spans;
    r.sampling = SamplingParams::greedy();
    r.max_tokens = 24;
    return session.generate(r);
  };
  const auto r1 = ask(s, docs);
  EXPECT_NE(r1.text.find("Paris"), std::string::npos) << r1.text;
  EXPECT_EQ(r1.n_span_misses, 3);
  const auto r2 = ask(s, {docs[2], docs[1], docs[0]});
  EXPECT_NE(r2.text.find("Paris"), std::string::npos) << r2.text;
  EXPECT_EQ(r2.n_span_hits, 3);
  EXPECT_EQ(r2.n_reused + r2.n_prefilled, r2.n_prompt);
  Session fresh(m, 2048, true);
  const auto f2 = ask(fresh, {docs[2], docs[1], docs[0]});
  EXPECT_EQ(r2.tokens, f2.tokens);
  std::printf("[ report ] smollm2 over 3 documents: %d prompt tokens, %d reused, %d computed: %s\n",
              r2.n_prompt, r2.n_reused, r2.n_prefilled, r2.text.c_str());
}

}  // namespace
}  // namespace wick::test
