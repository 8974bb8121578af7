#include "engine/draft_proposer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace wick {

namespace {

// Mixed into the request's seed: the draft's draws are its own.
constexpr uint64_t kDraftSeed = 0x9E3779B97F4A7C15ull;

// Probability of id under the softmax of row.
float softmax_prob(std::span<const float> row, int32_t id) {
  const float mx = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float l : row) sum += std::exp(double(l - mx));
  return float(std::exp(double(row[size_t(id)] - mx)) / sum);
}

}  // namespace

void check_same_vocab(const LoadedModel& target, const LoadedModel& draft) {
  const int64_t nt = target.config().n_vocab, nd = draft.config().n_vocab;
  if (nt != nd)
    throw std::runtime_error(
        fmt::format("the draft model {} has {} tokens in its vocabulary, the target {} has {}: a "
                    "draft must share the target's vocabulary",
                    draft.name, nd, target.name, nt));
  if (!target.tokenizer || !draft.tokenizer) return;
  const Tokenizer &a = *target.tokenizer, &b = *draft.tokenizer;
  const int32_t n = std::min(a.n_vocab(), b.n_vocab());
  for (int32_t id = 0; id < n; ++id)
    if (a.token(id) != b.token(id))
      throw std::runtime_error(fmt::format(
          "the draft model {} differs from the target {} at token {}: '{}' against '{}' (a draft "
          "must share the target's vocabulary)",
          draft.name, target.name, id, b.token(id), a.token(id)));
  if (a.n_vocab() != b.n_vocab())
    throw std::runtime_error(
        fmt::format("the draft model {} has {} tokenizer tokens, the target {} has {}: a draft "
                    "must share the target's vocabulary",
                    draft.name, b.n_vocab(), target.name, a.n_vocab()));
}

DraftModelProposer::DraftModelProposer(std::shared_ptr<const LoadedModel> draft, int32_t n_blocks,
                                       int32_t block_size, int32_t max_batch_tokens, float p_min)
    : model_(std::move(draft)),
      pool_(n_blocks, block_size, 0, /*prefix_cache=*/false),
      runner_(model_, RunnerLimits{n_blocks, block_size}),
      max_batch_tokens_(std::max(1, max_batch_tokens)),
      p_min_(p_min) {}

void DraftModelProposer::forget(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second.block_table) pool_.release(b);
  seqs_.erase(it);
}

bool DraftModelProposer::prepare(DraftSeq& d, const Sequence& s, int32_t n_max) {
  // What the draft computed stays valid up to where the target's tokens differ.
  const auto diff =
      std::mismatch(d.tokens.begin(), d.tokens.end(), s.tokens.begin(), s.tokens.end());
  size_t keep = size_t(diff.first - d.tokens.begin());
  keep = std::min(keep, s.tokens.size() - 1);  // the last token is fed: its logits guess
  d.tokens.resize(keep);
  // Positions written: the sequence's tokens, and every guess but the last.
  const size_t bs = size_t(pool_.block_size());
  const size_t need = (s.tokens.size() + size_t(n_max) - 1 + bs - 1) / bs;
  while (d.block_table.size() > need) {
    pool_.release(d.block_table.back());
    d.block_table.pop_back();
  }
  while (d.block_table.size() < need) {
    const int32_t b = pool_.allocate();
    if (b < 0) return false;
    d.block_table.push_back(b);
  }
  return true;
}

void DraftModelProposer::propose(std::span<Sequence* const> seqs, std::span<const int32_t> n_max,
                                 std::span<Proposal> out) {
  std::vector<Guess> guesses;
  for (size_t i = 0; i < seqs.size(); ++i) {
    out[i] = {};
    const Sequence& s = *seqs[i];
    if (n_max[i] <= 0 || !s.fills.empty()) continue;  // span layouts (holes) are not guessed
    auto [it, fresh] = seqs_.try_emplace(s.id);
    DraftSeq& d = it->second;
    if (fresh) {
      SamplingParams p = s.req.sampling;
      p.seed ^= kDraftSeed;
      d.sampler = std::make_unique<Sampler>(p, int32_t(model_->config().n_vocab));
    }
    if (!prepare(d, s, n_max[i])) {  // no room in the draft's cache: no guesses this time
      forget(s.id);
      continue;
    }
    guesses.push_back({i, &d, s.tokens, n_max[i]});
  }
  // Catch up: every token the draft lacks, in passes of at most
  // max_batch_tokens; the last one of a sequence gives its first guess.
  std::vector<size_t> rows;
  for (size_t g = 0; g < guesses.size();) {
    batch_.clear();
    rows.clear();
    int32_t room = max_batch_tokens_;
    while (g < guesses.size() && room > 0) {
      Guess& x = guesses[g];
      const int32_t seq = int32_t(batch_.block_tables.size());
      batch_.block_tables.push_back(x.d->block_table);
      for (; x.d->tokens.size() < x.history.size() && room > 0; --room) {
        const size_t pos = x.d->tokens.size();
        const bool last = pos + 1 == x.history.size();
        batch_.add(x.history[pos], int32_t(pos), seq, last);
        x.d->tokens.push_back(x.history[pos]);
        if (last) rows.push_back(g);
      }
      if (x.d->tokens.size() == x.history.size()) ++g;
    }
    run_and_guess(guesses, rows, out);
  }
  // Then one token per sequence and pass: its newest guess, for the next one.
  for (size_t n_have = 1;; ++n_have) {
    batch_.clear();
    rows.clear();
    for (size_t g = 0; g < guesses.size(); ++g) {
      Guess& x = guesses[g];
      const auto& toks = out[x.index].tokens;
      if (x.stopped || toks.size() != n_have || int32_t(n_have) >= x.n_max) continue;
      const int32_t seq = int32_t(batch_.block_tables.size());
      batch_.block_tables.push_back(x.d->block_table);
      batch_.add(toks.back(), int32_t(x.d->tokens.size()), seq, true);
      x.d->tokens.push_back(toks.back());
      rows.push_back(g);
    }
    if (rows.empty()) break;
    run_and_guess(guesses, rows, out);
  }
}

void DraftModelProposer::run_and_guess(std::vector<Guess>& guesses, const std::vector<size_t>& rows,
                                       std::span<Proposal> out) {
  if (batch_.n_tokens() == 0) return;
  runner_.run(batch_);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (size_t r = 0; r < rows.size(); ++r) {
    Guess& x = guesses[rows[r]];
    Proposal& p = out[x.index];
    Sampler& smp = *x.d->sampler;
    std::span<float> row = runner_.logits_row(r);
    int32_t id = 0;
    float prob = 1;
    if (smp.params().temperature == 0) {
      id = smp.sample(row, x.history);
      if (p_min_ > 0) prob = softmax_prob(row, id);
    } else {
      const auto& dist = smp.distribution(row, x.history);
      SparseDist q;
      ids.clear();
      weights.clear();
      for (const auto& c : dist) {
        q.push_back({c.id, c.p});
        ids.push_back(c.id);
        weights.push_back(c.p);
      }
      id = smp.draw(ids, weights);
      prob = std::find_if(q.begin(), q.end(), [&](const auto& e) { return e.first == id; })->second;
      if (prob >= p_min_) p.q.push_back(std::move(q));
    }
    if (prob < p_min_) {  // unsure: this guess and what would follow are likely wrong
      x.stopped = true;
      continue;
    }
    p.tokens.push_back(id);
    x.history.push_back(id);
  }
}

}  // namespace wick
