#include "engine/scheduler.h"

#include <algorithm>
#include <stdexcept>

#include "engine/span_blend.h"
#include "engine/span_layout.h"

namespace wick {

namespace {

// Prompt tokens (holes left out) among positions [from, from + n).
int32_t prompt_tokens_in(const Sequence& s, int32_t from, int32_t n) {
  int32_t count = 0;
  for (int32_t p = from; p < std::min(from + n, s.n_prompt); ++p)
    count += s.tokens[size_t(p)] != kHole;
  return count;
}

}  // namespace

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
    sp.hit = sp.job_running = false;
  }
  for (auto [src, dst] : s.pending_copies) pool_.release(src);  // dst is in the table
  s.pending_copies.clear();
  s.next_span = 0;
  s.placing = {};  // its blocks are in the table (freed with it)
}

bool Scheduler::uses_adapter(int32_t adapter) const {
  auto uses = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(),
                       [&](const auto& s) { return s->req.adapter == adapter; });
  };
  return uses(waiting_) || uses(running_) || uses(jobs_);
}

std::vector<Sequence*> Scheduler::running() const {
  std::vector<Sequence*> out;
  for (const auto& s : running_) out.push_back(s.get());
  return out;
}

void Scheduler::drop_drafts(Sequence& s) {
  s.tokens.resize(s.tokens.size() - size_t(s.n_draft));
  s.n_draft = 0;
  s.draft_q.clear();
  trim_blocks(s, int32_t(s.tokens.size()));
}

void Scheduler::trim_blocks(Sequence& s, int32_t n_positions) {
  const int32_t bs = pool_.block_size();
  const size_t keep = size_t((n_positions + bs - 1) / bs);
  while (s.block_table.size() > keep) {
    pool_.release(s.block_table.back());
    s.block_table.pop_back();
  }
}

void Scheduler::settle_drafts(Sequence& s) {
  s.n_computed += s.n_accepted;
  s.n_accepted = 0;
  trim_blocks(s, s.n_computed);
  commit_full_blocks(s);
}

std::vector<int32_t> Scheduler::borrow_blocks(int32_t n) {
  std::vector<int32_t> out;
  if (n > pool_.n_free()) return out;
  for (int32_t i = 0; i < n; ++i) out.push_back(pool_.allocate());
  return out;
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
  // prompt log-probabilities need every row computed
  const size_t n_match = s.req.prompt_logprobs >= 0
                             ? 0
                             : std::min(s.tokens.size(), size_t(std::max(0, s.commit_limit)));
  std::vector<int32_t> hit =
      pool_.match_prefix(std::span<const int32_t>(s.tokens).first(n_match), s.req.adapter);
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
        s.last_hash, std::span<const int32_t>(s.tokens).subspan(size_t(k * bs), size_t(bs)),
        s.req.adapter);
  if (s.result.n_reused == 0) s.result.n_reused = prompt_tokens_in(s, 0, s.n_computed);
}

void Scheduler::preempt(Sequence& s) {
  if (s.n_draft) drop_drafts(s);
  free_blocks(s);  // recomputed from the prompt (and what it generated) when readmitted
  // spans are placed again then: count that placement alone
  GenerateResult& r = s.result;
  r.n_reused -= r.n_span_reused;
  r.n_span_hits = r.n_span_misses = r.n_span_reused = r.n_span_recomputed = 0;
  ++n_preemptions_;
}

// Tokens a sequence computes this step: all it lacks, in prefill chunks of
// at most req.prefill_chunk (0 = no limit) while it is still in its prompt,
// and never past an unplaced span or into a cached stretch.
int32_t Scheduler::catch_up(const Sequence& s) const {
  int32_t lack = int32_t(s.tokens.size()) - s.n_computed;
  if (s.next_span < s.spans.size()) lack = std::min(lack, s.spans[s.next_span].pos - s.n_computed);
  if (const auto& pl = s.placing; pl.pos >= 0)  // a placed span's rows: measured, then redone
    lack = int32_t(pl.measure.empty() ? pl.redo.size() : pl.measure.size());
  if (s.req.prefill_chunk > 0 && s.n_computed < s.n_prompt)
    return std::min(lack, s.req.prefill_chunk);
  return lack;
}

void Scheduler::start_job(Sequence& s, size_t span) {
  auto job = std::make_unique<Sequence>();
  job->id = -s.id;  // never looked up by id
  job->req.prefill_chunk = s.req.prefill_chunk;
  job->req.adapter = s.req.adapter;
  // after the context, if any: its blocks are the job's own (computed
  // again, not taken from the prefix cache) and go back when it ends
  job->tokens = span_job_tokens(s.span_ctx, s.spans[span].tokens, pool_.block_size());
  if (!s.span_ctx.empty()) job->fills = block_fills(job->tokens, pool_.block_size());
  job->n_prompt = int32_t(job->tokens.size());
  job->parent = &s;
  job->parent_span = span;
  s.spans[span].job_running = true;
  jobs_.push_back(std::move(job));
}

bool Scheduler::job_computes(const Sequence& s, const Sequence::Span& sp) const {
  return std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& job) {
    return job->parent->spans[job->parent_span].tokens == sp.tokens &&
           job->parent->span_ctx == s.span_ctx && job->req.adapter == s.req.adapter;
  });
}

// A span is looked up until found: a span that another job computes is
// found in the span cache once that job ends (or, if that job is dropped,
// gets a job of its own).
void Scheduler::resolve_spans(Sequence& s) {
  for (size_t i = s.next_span; i < s.spans.size(); ++i) {
    auto& sp = s.spans[i];
    if (!sp.ready.empty() || sp.job_running) continue;
    sp.ready = pool_.match_span(sp.tokens, s.span_ctx, s.req.adapter);
    sp.hit = !sp.ready.empty();
    if (!sp.hit && !job_computes(s, sp)) start_job(s, i);
  }
}

bool Scheduler::place_spans(Sequence& s) {
  resolve_spans(s);
  for (;;) {
    Sequence::Placing& pl = s.placing;
    if (pl.pos >= 0) {
      if (!pl.measure.empty()) return true;  // measure rows run
      if (!pl.copied && !copy_redo_blocks(s)) return false;
      if (!pl.redo.empty()) return true;  // rows to compute again
      s.n_computed = pl.end;              // the rest of the span is the cache's
      s.placing = {};
      while (s.n_computed < int32_t(s.tokens.size()) && s.tokens[size_t(s.n_computed)] == kHole)
        ++s.n_computed;
      continue;
    }
    if (s.next_span == s.spans.size() || s.n_computed < s.spans[s.next_span].pos) return true;
    if (!place_span(s, s.spans[s.next_span])) return false;
    ++s.next_span;
  }
}

bool Scheduler::place_span(Sequence& s, Sequence::Span& sp) {
  if (sp.ready.empty()) return false;  // its job runs, or another's
  const int32_t bs = pool_.block_size(), n = int32_t(sp.tokens.size());
  if (int32_t(s.block_table.size()) != sp.pos / bs || s.n_computed != sp.pos)
    throw std::logic_error("placing a span: the sequence is not at the span's first block");
  s.block_table.insert(s.block_table.end(), sp.ready.begin(), sp.ready.end());
  Sequence::Placing& pl = s.placing;
  pl = {};
  pl.pos = sp.pos;
  pl.end = sp.pos + int32_t(sp.ready.size()) * bs;  // the span's last block ends here
  pl.n_tokens = n;
  pl.hit = sp.hit;
  // A span with nothing before it already has the K/V of a full prefill;
  // so has the first span when all before it is the context it was computed after.
  pl.exact = sp.pos == 0 || (&sp == &s.spans.front() && !s.span_ctx.empty() &&
                             int32_t(s.span_ctx.size()) == s.req.spans.front().first);
  sp.ready.clear();
  GenerateResult& r = s.result;
  ++(sp.hit ? r.n_span_hits : r.n_span_misses);
  if (!pl.exact && s.span_blend > 0.f) {  // measure every token first
    pl.deviation.assign(size_t(n), 0.f);
    for (int32_t i = 0; i < n; ++i) pl.measure.push_back(sp.pos + i);
  } else {
    choose_redo(s);
  }
  return true;
}

void Scheduler::choose_redo(Sequence& s) {
  Sequence::Placing& pl = s.placing;
  const int32_t k = pl.exact ? 0 : s.span_recompute;
  pl.redo = choose_span_rows(pl.deviation, pl.n_tokens, k, s.span_blend);
  for (int32_t& p : pl.redo) p += pl.pos;
  pl.chosen = true;
  const int32_t n_redo = int32_t(pl.redo.size());
  GenerateResult& r = s.result;
  if (pl.hit) {
    r.n_span_reused += pl.n_tokens - n_redo;
    r.n_reused += pl.n_tokens - n_redo;
  }
  r.n_span_recomputed += n_redo;
}

// The blocks of the rows to compute again become private copies (the shared
// ones are never written): all of them or none, so that results do not vary.
bool Scheduler::copy_redo_blocks(Sequence& s) {
  Sequence::Placing& pl = s.placing;
  const int32_t bs = pool_.block_size();
  std::vector<int32_t> at;  // block table indices
  for (int32_t p : pl.redo)
    if (at.empty() || at.back() != p / bs) at.push_back(p / bs);
  std::vector<int32_t> copies;
  for (size_t i = 0; i < at.size(); ++i) {
    copies.push_back(pool_.allocate());
    if (copies.back() < 0) {  // no room yet
      short_of_blocks_ = true;
      copies.pop_back();
      for (int32_t b : copies) pool_.release(b);
      return false;
    }
  }
  for (size_t i = 0; i < at.size(); ++i) {
    int32_t& b = s.block_table[size_t(at[i])];
    s.pending_copies.push_back({b, copies[i]});  // the shared block's reference moves
    b = copies[i];
  }
  pl.copied = true;
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
    s.last_hash =
        pool_.commit(s.block_table[size_t(s.n_committed)], s.last_hash, toks, s.req.adapter);
  }
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int32_t budget = lim_.max_batch_tokens;
  int32_t prompt_rows = kMaxPromptLogitRows;
  short_of_blocks_ = false;
  // n, or fewer while the sequence's prompt rows give log-probabilities
  auto rows_for = [&](const Sequence& s, int32_t n) {
    const bool gives = s.req.prompt_logprobs >= 0 && s.placing.pos < 0 && s.n_computed < s.n_prompt;
    return gives ? std::min(n, prompt_rows) : n;
  };
  auto take = [&](Sequence& s, int32_t n) {
    const bool placing = s.placing.pos >= 0;
    const bool samples =
        !s.is_span_job() && !placing && s.n_computed + n == int32_t(s.tokens.size());
    int32_t n_prompt_rows = 0;
    if (!placing && s.req.prompt_logprobs >= 0)
      for (int32_t p = s.n_computed; p < s.n_computed + n; ++p)
        n_prompt_rows += s.gives_prompt_logprobs(p);
    prompt_rows -= n_prompt_rows;
    out.seqs.push_back({&s, n, samples, samples ? s.n_draft : 0,
                        placing && !s.placing.measure.empty(), s.n_computed, n_prompt_rows});
    out.copies.insert(out.copies.end(), s.pending_copies.begin(), s.pending_copies.end());
    s.pending_copies.clear();
    budget -= n;
    Sequence& owner = s.is_span_job() ? *s.parent : s;  // a job's time is its parent's
    if (!owner.was_scheduled) {
      owner.was_scheduled = true;
      owner.first_scheduled = Sequence::clock::now();
    }
  };
  // Span jobs not in the plan yet, while blocks last.
  auto take_jobs = [&] {
    for (auto& job : jobs_) {
      if (budget <= 0) break;
      const bool planned = std::any_of(out.seqs.begin(), out.seqs.end(),
                                       [&](const ScheduledSeq& w) { return w.seq == job.get(); });
      const int32_t n = std::min(catch_up(*job), budget);
      if (planned || n <= 0) continue;
      if (ensure_blocks(*job, n))
        take(*job, n);
      else
        short_of_blocks_ = true;
    }
  };
  // Running sequences, oldest first; preempt the newest when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    int32_t n = place_spans(s) ? rows_for(s, std::min(catch_up(s), budget)) : 0;
    if (s.n_draft && (n < catch_up(s) || !ensure_blocks(s, n))) {  // drafts go first
      drop_drafts(s);
      n = std::min(catch_up(s), budget);
    }
    if (n <= 0) {  // waits for a span
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
    preempt(*victim);
    waiting_.push_front(std::move(victim));
  }
  take_jobs();  // before new sequences: running ones wait for them
  // Then waiting sequences, first come first served, unless running ones
  // already wait for blocks.
  while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < lim_.max_seqs &&
         !short_of_blocks_) {
    Sequence& s = *waiting_.front();
    admit(s);
    const int32_t n = place_spans(s) ? rows_for(s, std::min(catch_up(s), budget)) : 0;
    if (n > 0 && !ensure_blocks(s, n)) {
      free_blocks(s);  // not enough room yet: wait for blocks to come back
      break;
    }
    if (n > 0) take(s, n);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  take_jobs();  // the ones started this step
  // Nothing runs and the first in line cannot start: it never fits.
  if (out.seqs.empty() && running_.empty() && !waiting_.empty()) {
    out.rejected = std::move(waiting_.front());
    waiting_.pop_front();
    free_blocks(*out.rejected);
  }
  // Running sequences wait for span jobs or copies that found no blocks, and
  // nothing runs: preempt the newest to make room; alone, it never fits.
  if (out.seqs.empty() && !running_.empty()) {
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

void Scheduler::update(const SchedulerOutput& plan, std::span<const float> deviations) {
  for (auto [src, dst] : plan.copies) pool_.release(src);  // copied by now
  size_t n_measured = 0;
  for (const auto& w : plan.seqs) {
    Sequence& s = *w.seq;
    if (Sequence::Placing& pl = s.placing; pl.pos >= 0) {  // a placed span's rows
      const auto n = size_t(w.n_tokens);
      if (w.measures) {
        if (deviations.size() < n_measured + n)
          throw std::logic_error("scheduler update: fewer deviations than measure rows");
        for (size_t i = 0; i < n; ++i)
          pl.deviation[size_t(pl.measure[i] - pl.pos)] = deviations[n_measured + i];
        n_measured += n;
        pl.measure.erase(pl.measure.begin(), pl.measure.begin() + long(n));
        if (pl.measure.empty()) choose_redo(s);
      } else {
        s.result.n_prefilled += w.n_tokens;
        pl.redo.erase(pl.redo.begin(), pl.redo.begin() + long(n));
      }
      continue;
    }
    Sequence& owner = s.is_span_job() ? *s.parent : s;  // a job's tokens are its parent's work
    owner.result.n_prefilled += prompt_tokens_in(s, s.n_computed, w.n_tokens);
    s.n_computed += w.n_tokens - w.n_draft;  // draft tokens count once accepted
    // holes need no computing: a step never starts with one
    while (s.n_computed < int32_t(s.tokens.size()) && s.tokens[size_t(s.n_computed)] == kHole)
      ++s.n_computed;
    commit_full_blocks(s);
  }
  // Finished span jobs register their span and hand its blocks over.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Sequence& job = **it;
    if (job.n_computed < int32_t(job.tokens.size())) {
      ++it;
      continue;
    }
    Sequence& parent = *job.parent;
    auto& sp = parent.spans[job.parent_span];
    // the context's blocks go back; the span's are cached under the context
    const auto n_ctx_blocks = std::ptrdiff_t(
        (parent.span_ctx.size() + size_t(pool_.block_size()) - 1) / size_t(pool_.block_size()));
    for (auto b = job.block_table.begin(); b != job.block_table.begin() + n_ctx_blocks; ++b)
      pool_.release(*b);
    job.block_table.erase(job.block_table.begin(), job.block_table.begin() + n_ctx_blocks);
    pool_.commit_span(job.block_table, sp.tokens, parent.span_ctx, parent.req.adapter);
    sp.ready = std::move(job.block_table);
    sp.hit = sp.job_running = false;
    it = jobs_.erase(it);
  }
}

}  // namespace wick
