#include "engine/scheduler.h"

#include <algorithm>
#include <stdexcept>

namespace wick {

std::vector<Sequence*> SchedulerOutput::sampling() const {
  std::vector<Sequence*> out;
  for (const auto& w : seqs)
    if (w.samples) out.push_back(w.seq);
  return out;
}

void Scheduler::add(std::unique_ptr<Sequence> s) {
  waiting_.push_back(std::move(s));
}

std::unique_ptr<Sequence> Scheduler::remove(int64_t id) {
  auto take = [id](auto& seqs) -> std::unique_ptr<Sequence> {
    auto it = std::find_if(seqs.begin(), seqs.end(), [id](const auto& s) { return s->id == id; });
    if (it == seqs.end()) return nullptr;
    auto s = std::move(*it);
    seqs.erase(it);
    return s;
  };
  auto s = take(waiting_);
  if (!s) s = take(running_);
  if (s) free_blocks(*s);
  return s;
}

std::unique_ptr<Sequence> Scheduler::remove_any() {
  if (!running_.empty()) return remove(running_.back()->id);
  if (!waiting_.empty()) return remove(waiting_.back()->id);
  return nullptr;
}

void Scheduler::free_blocks(Sequence& s) {
  for (int32_t b : s.block_table) pool_.release(b);
  s.block_table.clear();
  s.n_computed = 0;
  s.n_committed = 0;
  s.last_hash = 0;
}

// Takes the longest verified cached prefix; at least one token is left to
// compute (its logits start the generation).
void Scheduler::admit(Sequence& s) {
  const int32_t bs = pool_.block_size();
  std::vector<int32_t> hit = pool_.match_prefix(s.tokens);
  if (!hit.empty() && int32_t(hit.size()) * bs >= int32_t(s.tokens.size())) {
    pool_.release(hit.back());
    hit.pop_back();
  }
  s.block_table = hit;
  s.n_computed = int32_t(hit.size()) * bs;
  s.n_committed = int32_t(hit.size());
  s.last_hash = 0;
  for (int32_t k = 0; k < s.n_committed; ++k)
    s.last_hash = pool_.chain_hash(
        s.last_hash, std::span<const int32_t>(s.tokens).subspan(size_t(k * bs), size_t(bs)));
  if (s.result.n_reused == 0) s.result.n_reused = s.n_computed;
}

void Scheduler::preempt(Sequence& s) {
  free_blocks(s);  // recomputed from the prompt (and what it generated) when readmitted
  ++n_preemptions_;
}

// Tokens a sequence computes this step: all it lacks, in prefill chunks of
// at most req.prefill_chunk (0 = no limit) while it is still in its prompt.
int32_t Scheduler::catch_up(const Sequence& s) const {
  const int32_t lack = int32_t(s.tokens.size()) - s.n_computed;
  if (s.req.prefill_chunk > 0 && s.n_computed < s.n_prompt)
    return std::min(lack, s.req.prefill_chunk);
  return lack;
}

bool Scheduler::ensure_blocks(Sequence& s, int32_t n_tokens) {
  const int32_t bs = pool_.block_size();
  const int32_t need = (s.n_computed + n_tokens + bs - 1) / bs;
  while (int32_t(s.block_table.size()) < need) {
    const int32_t b = pool_.allocate();
    if (b < 0) return false;
    s.block_table.push_back(b);
  }
  return true;
}

void Scheduler::commit_full_blocks(Sequence& s) {
  const int32_t bs = pool_.block_size();
  const int32_t full = s.n_computed / bs;
  for (; s.n_committed < full; ++s.n_committed) {
    auto toks = std::span<const int32_t>(s.tokens).subspan(size_t(s.n_committed * bs), size_t(bs));
    s.last_hash = pool_.commit(s.block_table[size_t(s.n_committed)], s.last_hash, toks);
  }
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int32_t budget = lim_.max_batch_tokens;
  auto take = [&](Sequence& s, int32_t n) {
    out.seqs.push_back({&s, n, s.n_computed + n == int32_t(s.tokens.size())});
    budget -= n;
    if (!s.was_scheduled) {
      s.was_scheduled = true;
      s.first_scheduled = Sequence::clock::now();
    }
  };
  // Running sequences first, oldest first; preempt the newest when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const int32_t n = std::min(catch_up(s), budget);
    if (ensure_blocks(s, n)) {
      take(s, n);
      ++i;
      continue;
    }
    // out of blocks: preempt the newest running sequence (possibly this one)
    auto victim = std::move(running_.back());
    running_.pop_back();
    for (auto& w : out.seqs)
      if (w.seq == victim.get()) throw std::logic_error("preempting a scheduled sequence");
    preempt(*victim);
    waiting_.push_front(std::move(victim));
  }
  // Then waiting sequences, first come first served.
  while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < lim_.max_seqs) {
    Sequence& s = *waiting_.front();
    admit(s);
    const int32_t n = std::min(catch_up(s), budget);
    if (!ensure_blocks(s, n)) {
      free_blocks(s);  // not enough room yet: wait for blocks to come back
      break;
    }
    take(s, n);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // Nothing runs and the first in line cannot start: it never fits.
  if (out.seqs.empty() && running_.empty() && !waiting_.empty()) {
    out.rejected = std::move(waiting_.front());
    waiting_.pop_front();
    free_blocks(*out.rejected);
  }
  return out;
}

void Scheduler::update(const SchedulerOutput& plan) {
  for (const auto& w : plan.seqs) {
    Sequence& s = *w.seq;
    s.n_computed += w.n_tokens;
    if (s.n_computed <= s.n_prompt) s.result.n_prefilled += w.n_tokens;
    commit_full_blocks(s);
  }
}

}  // namespace wick
