// The span cache's foundations: keys kept before RoPE and rotated when read
// give the logits of the rotated path; holes in a block table are skipped;
// a span's KV computed once at positions 0.. serves it at any place in a
// prompt (position independence), as a fresh computation of the span there
// with the same restricted attention would.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "helpers.h"

namespace wick::test {
namespace {

class SpanModel : public ::testing::TestWithParam<std::string> {};

// Pre-RoPE keys rotated in attention: the same logits as keys rotated on
// write (the rotation is the same float expression; 1e-6 allows for none).
TEST_P(SpanModel, PreRopeKeysGiveTheSameLogits) {
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir(GetParam()));
  auto ids = read_json(tiny_dir(GetParam()) + "/reference.json")["prompts"][2]["ids"]
                 .get<std::vector<int32_t>>();
  auto dm = cpu_model(*m);
  for (int64_t chunk : {0, 5}) {
    auto post = run_all_logits(*dm->backend, m->config, dm->weights, ids, chunk, false);
    auto pre = run_all_logits(*dm->backend, m->config, dm->weights, ids, chunk, true);
    EXPECT_LT(rel_err(pre, post), 1e-6) << GetParam() << " chunk " << chunk;
  }
}

// Runs tokens at positions [first, first + n) of a sequence with this table
// (and block fills); returns the logits of the last token.
std::vector<float> run_tokens(const Model& m, KvStore& kv, const std::vector<int32_t>& table,
                              const std::vector<std::pair<int32_t, int32_t>>& fills,
                              const std::vector<int32_t>& tokens, int32_t first) {
  Batch b;
  b.block_tables = {table};
  b.block_fills = {fills};
  for (size_t i = 0; i < tokens.size(); ++i)
    b.add(tokens[i], first + int32_t(i), 0, i + 1 == tokens.size());
  ForwardScratch s;
  std::vector<float> logits(size_t(m.config.n_vocab));
  forward(cpu_backend(), m.config, m.weights, b, kv, s, logits.data());
  return logits;
}

// A span computed once at positions 0..L-1, then placed after 0, 17 and 300
// prompt tokens (at the next block boundary: holes fill the rest of the
// last prompt block and of the span's last block), answers a question token
// exactly as the same span computed afresh at that place, attending only to
// itself, does.
TEST_P(SpanModel, SpanKvIsPositionIndependent) {
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir(GetParam()));
  const auto& c = m->config;
  const int32_t bs = 16, L = 20, n_blocks = 64;
  std::mt19937 rng(5);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint32_t(c.n_vocab));
    return t;
  };
  const auto span = random_tokens(L), question = random_tokens(1);
  auto kv = cpu_backend().make_kv(c.n_layer, n_blocks, bs, c.kv_dim(), true);
  // the span alone at positions 0.., in blocks 0 and 1 (the second holds 4 tokens)
  run_tokens(*m, *kv, {0, 1}, {{0, 16}, {0, L - 16}}, span, 0);
  int32_t next_block = 2;
  auto take = [&](int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(next_block++);
    return t;
  };
  for (int32_t n_pre : {0, 17, 300}) {
    const auto prefix = random_tokens(n_pre);
    const int32_t n_pre_blocks = (n_pre + bs - 1) / bs, P = n_pre_blocks * bs;
    const int32_t Q = P + 2 * bs;  // the span takes 2 blocks; the question starts the next
    // the prompt before the span, computed normally
    std::vector<int32_t> pre_table = take(n_pre_blocks);
    std::vector<std::pair<int32_t, int32_t>> pre_fill(pre_table.size(), {0, bs});
    if (n_pre % bs) pre_fill.back().second = n_pre % bs;
    if (n_pre) run_tokens(*m, *kv, pre_table, pre_fill, prefix, 0);
    // cached: the span's blocks from position 0, placed at P
    auto table = pre_table;
    table.push_back(0);
    table.push_back(1);
    auto fill = pre_fill;
    fill.push_back({0, bs});
    fill.push_back({0, L - bs});
    const auto q_block = take(1);
    table.push_back(q_block[0]);
    fill.push_back({0, bs});
    const auto cached = run_tokens(*m, *kv, table, fill, question, Q);
    // fresh: the span computed at P, attending only to itself (empty blocks before it)
    const auto span_blocks = take(2);
    std::vector<int32_t> alone(size_t(n_pre_blocks), span_blocks[0]);
    std::vector<std::pair<int32_t, int32_t>> alone_fill(size_t(n_pre_blocks), {0, 0});
    alone.insert(alone.end(), span_blocks.begin(), span_blocks.end());
    alone_fill.push_back({0, bs});
    alone_fill.push_back({0, L - bs});
    run_tokens(*m, *kv, alone, alone_fill, span, P);
    auto table2 = pre_table;
    table2.insert(table2.end(), span_blocks.begin(), span_blocks.end());
    const auto q_block2 = take(1);
    table2.push_back(q_block2[0]);
    const auto fresh = run_tokens(*m, *kv, table2, fill, question, Q);
    const double err = rel_err(cached, fresh);
    std::printf("[ report ] %-10s span after %3d tokens: cached vs fresh relative error %.2e\n",
                GetParam().c_str(), n_pre, err);
    EXPECT_LT(err, 1e-5) << GetParam() << " after " << n_pre << " tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchs, SpanModel, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace wick::test
