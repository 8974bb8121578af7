// Spans computed after the prompt's first tokens (GenerateRequest::
// span_context, e.g. the system prompt) instead of alone: the cached K/V
// against context + span computed by hand; the cache key holds the context
// (another context misses, the same one hits at any offset and order); the
// pool's hashes without a context are the ones from before contexts;
// repair over everything is still full prefill; blocks all come back under
// concurrency and cancellation; bad values are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine_run.h"
#include "helpers.h"
#include "kv/block_pool.h"

namespace wick::test {
namespace {

using Tokens = std::vector<int32_t>;
using Fills = std::vector<std::pair<int32_t, int32_t>>;
constexpr int32_t kBs = 16;  // the engine's default block size

// prefix, the documents as spans, then the question; greedy; each span
// computed after the prefix's first n_ctx tokens
GenerateRequest ctx_request(const Tokens& prefix, const std::vector<Tokens>& docs,
                            const Tokens& question, int32_t n_ctx, int32_t recompute = 0,
                            float blend = 0.f) {
  GenerateRequest r = request_with_spans(prefix, docs, question, 6);
  r.span_context = n_ctx;
  r.span_recompute = recompute;
  r.span_blend = blend;
  return r;
}

EngineConfig ctx_config() {
  EngineConfig c;
  c.span_cache = true;
  c.n_blocks = 256;
  return c;
}

class SpanContextArch : public TinyArchTest {
 protected:
  SpanContextArch() : TinyArchTest(23) {}
};

// The K/V (every layer) of `span` computed by forward() on a fresh store:
// after `ctx` (its blocks first, the last one partly filled, then holes up
// to the span's block), or alone when ctx is empty. [layer][token][K, V].
std::vector<std::vector<float>> kv_by_hand(const Model& m, const Tokens& ctx, const Tokens& span) {
  const auto& c = m.config;
  auto kv = cpu_backend().make_kv(c.n_layer, 16, kBs, c.kv_dim(), true);
  Tokens table;
  Fills fills;
  auto add_blocks = [&](int32_t n) {
    for (int32_t at = 0; at < n; at += kBs) {
      fills.push_back({0, std::min(kBs, n - at)});
      table.push_back(int32_t(table.size()));
    }
  };
  add_blocks(int32_t(ctx.size()));
  const int32_t span_block = int32_t(table.size());
  add_blocks(int32_t(span.size()));
  auto run = [&](const Tokens& tokens, int32_t first) {
    Batch b;
    b.block_tables = {table};
    b.block_fills = {fills};
    for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], first + int32_t(i), 0, false);
    ForwardScratch s;
    std::vector<float> out(1);
    forward(cpu_backend(), c, m.weights, b, *kv, s, out.data(), ForwardOptions{});
  };
  if (!ctx.empty()) run(ctx, 0);
  run(span, span_block * kBs);
  return [&] {
    std::vector<std::vector<float>> out(size_t(c.n_layer));
    const int64_t d = c.kv_dim();
    for (int64_t l = 0; l < c.n_layer; ++l)
      for (size_t i = 0; i < span.size(); ++i) {
        const int64_t slot = span_block * kBs + int64_t(i);
        for (const float* base : {kv->k_layer<float>(l), kv->v_layer<float>(l)})
          out[size_t(l)].insert(out[size_t(l)].end(), base + slot * d, base + (slot + 1) * d);
      }
    return out;
  }();
}

// The same rows read from the engine's store, for the blocks holding a span.
std::vector<std::vector<float>> kv_of_blocks(const KvStore& kv, const Tokens& blocks,
                                             size_t n_tokens) {
  std::vector<std::vector<float>> out(size_t(kv.n_layer));
  const int64_t d = kv.kv_dim;
  for (int64_t l = 0; l < kv.n_layer; ++l)
    for (size_t i = 0; i < n_tokens; ++i) {
      const int64_t slot = blocks[i / size_t(kBs)] * kBs + int64_t(i % size_t(kBs));
      for (const float* base : {kv.k_layer<float>(l), kv.v_layer<float>(l)})
        out[size_t(l)].insert(out[size_t(l)].end(), base + slot * d, base + (slot + 1) * d);
    }
  return out;
}

// A span job with a context of n tokens (n < the first span's begin, a
// whole block, or exactly the begin) caches the span's K/V as context +
// span computed by hand with the span at its own block, every layer; it
// differs from the span computed alone past layer 0 (the context matters).
TEST_P(SpanContextArch, CachedSpanKvIsContextThenSpanByHand) {
  const auto& c = m_->config();
  const Tokens prefix = random(21), question = random(4);
  const std::vector<Tokens> docs{random(20), random(9)};
  for (int32_t n_ctx : {5, 16, 21}) {
    Engine e(m_, ctx_config());
    ASSERT_EQ(e.kv().dtype, DType::F32);
    const auto got = run_one(e, ctx_request(prefix, docs, question, n_ctx));
    EXPECT_EQ(got.n_span_misses, 2);
    const Tokens ctx(prefix.begin(), prefix.begin() + n_ctx);
    for (const auto& d : docs) {
      const Tokens blocks = e.blocks().find_span(d, ctx);
      ASSERT_EQ(blocks.size(), (d.size() + kBs - 1) / kBs) << "n_ctx " << n_ctx;
      EXPECT_TRUE(e.blocks().find_span(d).empty());  // not cached as computed alone
      const auto cached = kv_of_blocks(e.kv(), blocks, d.size());
      const auto want = kv_by_hand(*m_->model, ctx, d);
      for (int64_t l = 0; l < c.n_layer; ++l)
        EXPECT_LT(rel_err(cached[size_t(l)], want[size_t(l)]), 1e-5)
            << "n_ctx " << n_ctx << ", layer " << l;
      const auto alone = kv_by_hand(*m_->model, {}, d);
      EXPECT_GT(rel_err(alone.back(), want.back()), 1e-3) << "n_ctx " << n_ctx;
    }
    EXPECT_EQ(e.blocks().n_used(), 0);
  }
}

// Blending every span token (span_blend 1) is still full prefill with a
// context, in one pass and in chunks of 5; the first span, when all before
// it is its context, already is (nothing to measure or compute again).
TEST_P(SpanContextArch, BlendingEverySpanTokenEqualsFullPrefill) {
  if (m_->config().sliding_window > 0) GTEST_SKIP() << "holes inside a window of 16";
  const Tokens prefix = random(21), question = random(7);
  const std::vector<Tokens> docs{random(20), random(9), random(33)};
  for (int32_t n_ctx : {7, 21})
    for (int32_t chunk : {0, 5}) {
      GenerateRequest r = ctx_request(prefix, docs, question, n_ctx, 0, 1.f);
      r.prefill_chunk = chunk;
      GenerateRequest plain = r;
      plain.spans.clear();
      plain.span_context = -1;
      Engine e(m_, ctx_config()), ref(m_, ctx_config());
      const auto got = run_one(e, r), want = run_one(ref, plain);
      const std::string what =
          "n_ctx " + std::to_string(n_ctx) + ", chunk " + std::to_string(chunk);
      EXPECT_EQ(got.tokens, want.tokens) << what;
      EXPECT_LT(rel_err(got.first_logits, want.first_logits), 1e-5) << what;
      const int32_t n_docs = 20 + 9 + 33, exact = n_ctx == 21 ? 20 : 0;
      EXPECT_EQ(got.n_span_recomputed, n_docs - exact) << what;
      // each job computes its context again, then its span
      EXPECT_EQ(got.n_prefilled, 21 + 3 * n_ctx + 2 * n_docs - exact + 7) << what;
      EXPECT_EQ(e.blocks().n_used(), 0) << what;
    }
}

// The cache key holds the context: spans cached after context A miss after
// context B (same length, other tokens) and when computed alone, and hit
// after A again at another offset (more text between A and the spans) and
// in another order, equal to a fresh engine bit for bit.
TEST_P(SpanContextArch, SpansAreReusedAfterTheSameContextAlone) {
  const Tokens A = random(12), B = random(12), X = random(20), Y = random(30);
  Engine e(m_, ctx_config());
  const auto a1 = run_one(e, ctx_request(A, {X, Y}, random(5), 12));
  EXPECT_EQ(a1.n_span_misses, 2);
  EXPECT_EQ(a1.n_span_recomputed, 0);
  const auto b1 = run_one(e, ctx_request(B, {Y, X}, random(5), 12));
  EXPECT_EQ(b1.n_span_misses, 2);
  EXPECT_EQ(b1.n_span_hits, 0);
  const auto alone = run_one(e, ctx_request(A, {X, Y}, random(5), 0));
  EXPECT_EQ(alone.n_span_misses, 2);

  Tokens later = A;  // A, then text before the spans: another offset
  for (int32_t t : random(9)) later.push_back(t);
  const auto req = ctx_request(later, {Y, X}, random(5), 12);
  const auto a2 = run_one(e, req);
  EXPECT_EQ(a2.n_span_hits, 2);
  EXPECT_EQ(a2.n_span_misses, 0);
  EXPECT_EQ(a2.n_span_reused + a2.n_span_recomputed, 50);
  EXPECT_GT(a2.n_span_reused, 0);
  Engine fresh(m_, ctx_config());
  const auto f2 = run_one(fresh, req);
  EXPECT_EQ(f2.n_span_misses, 2);
  EXPECT_EQ(a2.tokens, f2.tokens);
  EXPECT_EQ(a2.first_logits, f2.first_logits);
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// EngineConfig::span_context: a request that leaves span_context at -1 is
// computed after everything before its first span, as if it asked.
TEST_P(SpanContextArch, EngineDefaultIsTheTextBeforeTheFirstSpan) {
  const Tokens prefix = random(19), question = random(4);
  const std::vector<Tokens> docs{random(17), random(26)};
  EngineConfig cfg = ctx_config();
  cfg.span_context = true;
  Engine by_default(m_, cfg), asked(m_, ctx_config());
  const auto got = run_one(by_default, ctx_request(prefix, docs, question, -1));
  const auto want = run_one(asked, ctx_request(prefix, docs, question, 19));
  EXPECT_EQ(got.first_logits, want.first_logits);
  EXPECT_EQ(got.n_span_recomputed, want.n_span_recomputed);
  const Tokens ctx = prefix;
  EXPECT_FALSE(by_default.blocks().find_span(docs[1], ctx).empty());
}

INSTANTIATE_TEST_SUITE_P(AllArchs, SpanContextArch, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

// Requests over 5 documents after one of two system prompts, computed after
// it or alone, some blending, some prefilled in chunks of 5.
std::vector<GenerateRequest> shared_ctx_requests(int64_t n_vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tokens> docs, systems;
  for (int i = 0; i < 5; ++i) docs.push_back(random_tokens(rng, 10 + int(rng() % 31), n_vocab));
  for (int i = 0; i < 2; ++i) systems.push_back(random_tokens(rng, 9 + 10 * i, n_vocab));
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    std::vector<Tokens> picked = docs;
    std::shuffle(picked.begin(), picked.end(), rng);
    picked.resize(2 + rng() % 3);
    const Tokens& sys = systems[rng() % 2];
    const int32_t n_ctx = i % 4 == 3 ? 0 : int32_t(sys.size());
    auto r = ctx_request(sys, picked, random_tokens(rng, 3 + int(rng() % 8), n_vocab), n_ctx,
                         i % 3 == 1 ? 4 : 0, i % 2 ? 0.3f : 0.f);
    r.max_tokens = 4 + int(rng() % 9);
    r.keep_first_logits = false;
    r.prefill_chunk = i % 3 == 0 ? 5 : 0;
    out.push_back(r);
  }
  return out;
}

class SpanContextConcurrent : public SpanContextArch {};

// At once, each distinct (context, document) is computed by one job; the
// results equal one-by-one runs and every block comes back.
TEST_P(SpanContextConcurrent, RequestsShareSpansPerContext) {
  const auto reqs = shared_ctx_requests(m_->config().n_vocab, 12, 3);
  const auto want = run_one_by_one(m_, ctx_config(), reqs);
  EngineConfig cfg = ctx_config();
  cfg.max_batch_tokens = 48;
  cfg.max_seqs = 6;
  Engine e(m_, cfg);
  const auto got = run_engine(e, reqs);
  int32_t n_misses = 0;
  std::set<std::pair<Tokens, Tokens>> used;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    n_misses += got[i].n_span_misses;
    const auto& r = reqs[i];
    const Tokens ctx(r.prompt.begin(), r.prompt.begin() + r.span_context);
    for (auto [b, e2] : r.spans)
      used.insert({ctx, Tokens(r.prompt.begin() + b, r.prompt.begin() + e2)});
  }
  EXPECT_EQ(n_misses, int32_t(used.size()));
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// Cancelled while their jobs (context and span) run, while they wait for
// another's job, repair or decode: everything they hold comes back, the
// others are unaffected; then under a tiny KV budget (preemption).
TEST_P(SpanContextConcurrent, CancelledAndPreemptedRequestsReturnTheirBlocks) {
  const auto reqs = shared_ctx_requests(m_->config().n_vocab, 12, 5);
  const auto want = run_one_by_one(m_, ctx_config(), reqs);
  EngineConfig cfg = ctx_config();
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
    if (step == 0) e.cancel(ids[0]);  // its span jobs are under way
    if (step == 2) e.cancel(ids[3]);
    if (step == 5) e.cancel(ids[6]);
    if (step == 9) e.cancel(ids[10]);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (cancelled.count(i))
      EXPECT_EQ(got[i].stop_reason, "cancelled") << "request " << i;
    else
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  }
  EXPECT_EQ(e.blocks().n_used(), 0);

  EngineConfig tiny = ctx_config();
  tiny.n_blocks = 24;
  tiny.max_batch_tokens = 64;
  Engine small(m_, tiny);
  const auto squeezed = run_engine(small, reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(squeezed[i].tokens, want[i].tokens)
        << "request " << i << " (tiny budget): " << squeezed[i].stop_reason;
  EXPECT_EQ(small.blocks().n_used(), 0);
  EXPECT_GT(small.n_preemptions(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Archs, SpanContextConcurrent,
                         ::testing::Values("llama", "mistral", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

// Without a context a span's hashes are those from before contexts (a root
// of "SPANROOT", no parent for the first block) and so are its events; with
// one they chain from a root hashing the context, the first block still
// without a parent, and the span is found after that context alone.
TEST(SpanContextPool, TheContextIsPartOfTheKey) {
  BlockPool pool(8, 4, 77);
  std::vector<BlockPool::Event> events;
  pool.set_event_log(&events);
  const Tokens span{5, 6, 7, 8, 9, 10}, ctx{1, 2, 3}, other{1, 2, 4};
  Tokens alone{pool.allocate(), pool.allocate()}, after{pool.allocate(), pool.allocate()};
  pool.commit_span(alone, span);
  constexpr uint64_t kRoot = 0x5350414e524f4f54ull;  // "SPANROOT"
  const uint64_t h0 = pool.chain_hash(kRoot, Tokens{5, 6, 7, 8});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].hash, h0);
  EXPECT_FALSE(events[0].parent.has_value());
  EXPECT_EQ(events[1].hash, pool.chain_hash(h0, Tokens{9, 10}));
  EXPECT_EQ(events[1].parent, h0);

  pool.commit_span(after, span, ctx);
  ASSERT_EQ(events.size(), 4u);
  const uint64_t c0 = pool.chain_hash(pool.chain_hash(kRoot, ctx), Tokens{5, 6, 7, 8});
  EXPECT_EQ(events[2].hash, c0);
  EXPECT_FALSE(events[2].parent.has_value());
  EXPECT_EQ(events[2].tokens, (Tokens{5, 6, 7, 8}));
  EXPECT_EQ(events[3].parent, c0);

  EXPECT_EQ(pool.find_span(span), alone);
  EXPECT_EQ(pool.find_span(span, ctx), after);
  EXPECT_TRUE(pool.find_span(span, other).empty());
  EXPECT_TRUE(pool.find_span(span, Tokens{1, 2}).empty());
  EXPECT_TRUE(pool.find_span(Tokens{5, 6, 7, 8, 9}, ctx).empty());
  for (int32_t b : alone) pool.release(b);
  for (int32_t b : after) pool.release(b);
  EXPECT_EQ(pool.match_span(span, ctx), after);  // referenced again, counted
  EXPECT_EQ(pool.n_span_hits, 1u);
  EXPECT_TRUE(pool.match_span(span, other).empty());
  EXPECT_EQ(pool.n_span_queries, 2u);
  EXPECT_EQ(pool.n_used(), 2);
}

TEST(SpanContext, BadValuesAreClearErrors) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  Engine e(m, ctx_config());
  GenerateRequest r;
  for (int i = 0; i < 40; ++i) r.prompt.push_back(i + 1);
  auto error_of = [&](std::vector<std::pair<int32_t, int32_t>> spans, int32_t n_ctx) {
    GenerateRequest q = r;
    q.spans = std::move(spans);
    q.span_context = n_ctx;
    try {
      e.add_request(q, {});
    } catch (const GenerateError& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  EXPECT_PRED2(has, error_of({{10, 20}}, 11),
               "span_context 11 reaches past the first span's begin 10");
  EXPECT_PRED2(has, error_of({{10, 20}}, -2), "span_context must be >= 0");
  EXPECT_PRED2(has, error_of({}, 3), "span_context needs spans");
  EXPECT_EQ(error_of({{10, 20}}, 10), "");
  EXPECT_EQ(error_of({}, 0), "");
  e.run_until_idle();
  EXPECT_EQ(e.blocks().n_used(), 0);
}

}  // namespace
}  // namespace wick::test
