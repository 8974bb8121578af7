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

void Scheduler::drop_span_state(Sequence& s) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if ((*it)->parent == &s) {
      for (int32_t b : (*it)->block_table) pool_.release(b);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& sp : s.spans) {
    for (int32_t b : sp.ready) pool_.release(b);
    sp.ready.clear();
    sp.job_running = false;
  }
  for (auto [src, dst] : s.pending_copies) pool_.release(src);  // dst is in the table
  s.pending_copies.clear();
  s.next_span = 0;
  s.skip_from = s.skip_to = -1;
}

void Scheduler::free_blocks(Sequence& s) {
  drop_span_state(s);
  for (int32_t b : s.block_table) pool_.release(b);
  s.block_table.clear();
  s.n_computed = 0;
  s.n_committed = 0;
  s.last_hash = 0;
}

// Takes the longest verified cached prefix (of the part before any span);
// at least one token is left to compute (its logits start the generation).
void Scheduler::admit(Sequence& s) {
  const int32_t bs = pool_.block_size();
  const size_t n_match = std::min(s.tokens.size(), size_t(std::max(0, s.commit_limit)));
  std::vector<int32_t> hit = pool_.match_prefix(std::span<const int32_t>(s.tokens).first(n_match));
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
// at most req.prefill_chunk (0 = no limit) while it is still in its prompt,
// and never past an unplaced span or into a cached stretch.
int32_t Scheduler::catch_up(const Sequence& s) const {
  int32_t lack = int32_t(s.tokens.size()) - s.n_computed;
  if (s.next_span < s.spans.size())
    lack = std::min(lack, s.spans[s.next_span].pos - s.n_computed);
  if (s.skip_from > s.n_computed) lack = std::min(lack, s.skip_from - s.n_computed);
  if (s.req.prefill_chunk > 0 && s.n_computed < s.n_prompt)
    return std::min(lack, s.req.prefill_chunk);
  return lack;
}

void Scheduler::start_job(Sequence& s, size_t span) {
  auto job = std::make_unique<Sequence>();
  job->id = -s.id;  // never looked up by id
  job->req.prefill_chunk = s.req.prefill_chunk;
  job->tokens = s.spans[span].tokens;
  job->n_prompt = int32_t(job->tokens.size());
  job->parent = &s;
  job->parent_span = span;
  s.spans[span].job_running = true;
  jobs_.push_back(std::move(job));
}

bool Scheduler::place_spans(Sequence& s, SchedulerOutput& out) {
  const int32_t bs = pool_.block_size();
  while (s.next_span < s.spans.size() && s.n_computed >= s.spans[s.next_span].pos) {
    auto& sp = s.spans[s.next_span];
    std::vector<int32_t> blocks = std::move(sp.ready);
    sp.ready.clear();
    const bool from_job = !blocks.empty();
    if (!from_job) blocks = pool_.match_span(sp.tokens);
    if (blocks.empty()) {
      if (!sp.job_running) start_job(s, s.next_span);
      return false;  // wait for the job
    }
    const int32_t n = int32_t(sp.tokens.size()), first_block = sp.pos / bs;
    while (int32_t(s.block_table.size()) > first_block) {  // blocks allocated past the span start
      pool_.release(s.block_table.back());
      s.block_table.pop_back();
    }
    // the first tokens are recomputed into private copies of their blocks
    // (as many as there is room for)
    const int32_t k = std::min(s.span_recompute, n);
    int32_t n_copied = 0;
    for (; n_copied < (k + bs - 1) / bs; ++n_copied) {
      const int32_t copy = pool_.allocate();
      if (copy < 0) break;
      s.pending_copies.push_back({blocks[size_t(n_copied)], copy});
      blocks[size_t(n_copied)] = copy;
    }
    const int32_t k_done = std::min(k, n_copied * bs);
    s.block_table.insert(s.block_table.end(), blocks.begin(), blocks.end());
    const int32_t end = sp.pos + int32_t(blocks.size()) * bs;  // the span's last block ends here
    if (k_done > 0) {
      s.skip_from = sp.pos + k_done;
      s.skip_to = end;
    } else {
      s.n_computed = end;
    }
    (from_job ? s.result.n_span_misses : s.result.n_span_hits) += 1;
    s.result.n_span_reused += n - k_done;
    s.result.n_span_recomputed += k_done;
    ++s.next_span;
  }
  return true;
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
  if (s.is_span_job()) return;  // committed as a span when done
  const int32_t bs = pool_.block_size();
  const int32_t full = std::min(s.n_computed, s.commit_limit) / bs;
  for (; s.n_committed < full; ++s.n_committed) {
    auto toks = std::span<const int32_t>(s.tokens).subspan(size_t(s.n_committed * bs), size_t(bs));
    s.last_hash = pool_.commit(s.block_table[size_t(s.n_committed)], s.last_hash, toks);
  }
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int32_t budget = lim_.max_batch_tokens;
  auto take = [&](Sequence& s, int32_t n) {
    out.seqs.push_back(
        {&s, n, !s.is_span_job() && s.n_computed + n == int32_t(s.tokens.size())});
    out.copies.insert(out.copies.end(), s.pending_copies.begin(), s.pending_copies.end());
    s.pending_copies.clear();
    budget -= n;
    if (!s.was_scheduled) {
      s.was_scheduled = true;
      s.first_scheduled = Sequence::clock::now();
    }
  };
  // Span jobs first: sequences wait for them.
  for (auto& job : jobs_) {
    if (budget <= 0) break;
    const int32_t n = std::min(catch_up(*job), budget);
    if (n > 0 && ensure_blocks(*job, n)) take(*job, n);
  }
  // Running sequences, oldest first; preempt the newest when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    if (!place_spans(s, out)) {  // waits for a span job
      ++i;
      continue;
    }
    const int32_t n = std::min(catch_up(s), budget);
    if (n <= 0) {
      ++i;
      continue;
    }
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
    unschedule_jobs(*victim, out, budget);
    preempt(*victim);
    waiting_.push_front(std::move(victim));
  }
  // Then waiting sequences, first come first served.
  while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < lim_.max_seqs) {
    Sequence& s = *waiting_.front();
    admit(s);
    int32_t n = 0;
    if (place_spans(s, out)) {
      n = std::min(catch_up(s), budget);
      if (n > 0 && !ensure_blocks(s, n)) {
        free_blocks(s);  // not enough room yet: wait for blocks to come back
        break;
      }
      if (n > 0) take(s, n);
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // Nothing runs and the first in line cannot start: it never fits.
  if (out.seqs.empty() && running_.empty() && jobs_.empty() && !waiting_.empty()) {
    out.rejected = std::move(waiting_.front());
    waiting_.pop_front();
    free_blocks(*out.rejected);
  }
  // Span jobs found no blocks and nothing else runs: make room by preempting
  // the newest sequence, or, alone, the request is too large for the cache.
  if (out.seqs.empty() && !jobs_.empty() && !running_.empty()) {
    auto victim = std::move(running_.back());
    running_.pop_back();
    if (running_.empty()) {
      free_blocks(*victim);
      out.rejected = std::move(victim);
    } else {
      preempt(*victim);
      waiting_.push_front(std::move(victim));
    }
  }
  return out;
}

void Scheduler::unschedule_jobs(Sequence& parent, SchedulerOutput& out, int32_t& budget) {
  auto it = std::remove_if(out.seqs.begin(), out.seqs.end(), [&](const ScheduledSeq& w) {
    if (w.seq->parent != &parent) return false;
    budget += w.n_tokens;
    return true;
  });
  out.seqs.erase(it, out.seqs.end());
}

void Scheduler::update(const SchedulerOutput& plan) {
  for (auto [src, dst] : plan.copies) pool_.release(src);  // copied by now
  for (const auto& w : plan.seqs) {
    Sequence& s = *w.seq;
    int32_t n_real = 0;  // holes are not prefilled tokens
    for (int32_t i = 0; i < w.n_tokens; ++i) n_real += s.tokens[size_t(s.n_computed + i)] != kHole;
    s.n_computed += w.n_tokens;
    if (s.n_computed == s.skip_from) {
      s.n_computed = s.skip_to;
      s.skip_from = s.skip_to = -1;
    }
    Sequence& owner = s.is_span_job() ? *s.parent : s;
    if (s.is_span_job() || s.n_computed <= s.n_prompt) owner.result.n_prefilled += n_real;
    commit_full_blocks(s);
  }
  // Finished span jobs register their span and hand its blocks over.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Sequence& job = **it;
    if (job.n_computed < int32_t(job.tokens.size())) {
      ++it;
      continue;
    }
    pool_.commit_span(job.block_table, job.tokens);
    auto& sp = job.parent->spans[job.parent_span];
    sp.ready = std::move(job.block_table);
    sp.job_running = false;
    it = jobs_.erase(it);
  }
}

}  // namespace wick
