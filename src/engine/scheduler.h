// Decides what each engine step computes, on counts only (no tensors). A
// sequence has n_computed of its tokens in the KV cache and catches up; so
// prefill, chunked prefill, prefix hits and decode are the same kind of work.
// Running sequences go first, oldest first; then waiting ones, first come
// first served, under a token budget and a sequence cap. A waiting sequence
// starts from the longest verified prefix of cached blocks. When blocks run
// out the newest running sequence is preempted: its blocks are freed and it
// is recomputed (prompt and what it generated) when admitted again.
//
// Span layouts (the span cache): once admitted, a sequence holds each of
// its spans' blocks from the span cache (verified, shared by reference) or,
// on a miss, starts a span job that computes the span alone, or after the
// sequence's span context (one job per distinct span and context at a time:
// others wait for its blocks to be cached) and hands the span's blocks over. Jobs run first, in the
// same steps as sequences. When the sequence reaches a span it waits for those blocks, puts them in
// its block table, and computes some of its tokens again, with attention
// over everything before them, into private copies of their blocks; the rest
// of the span is the cache's. Those tokens are the first span_recompute
// and, with span_blend, a fraction of the span chosen by a measure pass over
// all its tokens (their K/V deviation at layer 1: steps whose rows measure,
// ScheduledSeq::measures). A step in which nothing can run (jobs or copies
// found no blocks) preempts the newest sequence.
//
// Speculative decoding: a decoding sequence may carry draft tokens after
// its last one (Sequence::n_draft); they are computed with it when budget
// and blocks allow, else dropped (before any preemption). Their K/V counts
// only once verified (settle_drafts); blocks past it go back.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "engine/sequence.h"
#include "kv/block_pool.h"

namespace wick {

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int32_t n_tokens = 0;  // computed this step, from seq->n_computed on
  bool samples = false;  // reaches the sequence's newest token: its logits choose the next one
  // the last n_draft tokens are draft tokens to verify (speculative
  // decoding): each of them, and the token before, has a logits row
  int32_t n_draft = 0;
  // the rows measure the K/V deviation of a placed span's tokens (the
  // measure pass of span_blend): no K/V written, no logits
  bool measures = false;
  int32_t from = 0;  // seq->n_computed when scheduled: the first row's position
  // rows before the sampling ones whose logits give prompt log-probabilities
  // (GenerateRequest::prompt_logprobs); they come first
  int32_t n_prompt_rows = 0;
};

struct SchedulerOutput {
  // in batch order; logits rows in its order too: per sequence its prompt
  // rows, then the sampling ones (1 + n_draft)
  std::vector<ScheduledSeq> seqs;
  std::unique_ptr<Sequence> rejected;  // fits the cache not even alone (removed, blocks freed)
  // KV blocks to copy (source, destination) before the step runs; the
  // sources are released after it (update)
  std::vector<std::pair<int32_t, int32_t>> copies;
};

// Prompt log-probability rows per step, all sequences together: each is a
// vocabulary-sized logits row, so a step's memory stays bounded.
inline constexpr int32_t kMaxPromptLogitRows = 256;

struct SchedulerLimits {
  int32_t max_batch_tokens = 512;  // tokens per step
  int32_t max_seqs = 64;           // running sequences at once
};

class Scheduler {
 public:
  // The pool's arguments: its blocks are this scheduler's alone.
  Scheduler(int32_t n_blocks, int32_t block_size, uint64_t model_id, bool prefix_cache,
            const SchedulerLimits& lim)
      : pool_(n_blocks, block_size, model_id, prefix_cache), lim_(lim) {}

  void add(std::unique_ptr<Sequence> s);  // waits for its turn
  // Takes a sequence out (frees its blocks); null when it is not here.
  std::unique_ptr<Sequence> remove(int64_t id);
  std::unique_ptr<Sequence> remove_any();  // null when empty
  SchedulerOutput schedule();
  // After the forward pass: counts move on (draft tokens wait for
  // settle_drafts), newly full blocks enter the prefix cache. deviations:
  // one per measure row, in plan order (ModelRunner::deviations).
  void update(const SchedulerOutput& plan, std::span<const float> deviations = {});
  // After verification: the accepted draft tokens' K/V is kept (s.n_accepted
  // of them), the rest is dropped: blocks past the kept tokens go back.
  void settle_drafts(Sequence& s);
  // Running sequences, oldest first (the engine asks proposers for them).
  std::vector<Sequence*> running() const;

  bool uses_adapter(int32_t adapter) const;  // a sequence here has req.adapter == adapter
  bool has_work() const { return !running_.empty() || !waiting_.empty() || !jobs_.empty(); }
  int32_t n_running() const { return int32_t(running_.size()); }
  int32_t n_waiting() const { return int32_t(waiting_.size()); }
  uint64_t n_preemptions() const { return n_preemptions_; }
  const BlockPool& blocks() const { return pool_; }
  void set_kv_event_log(std::vector<BlockPool::Event>* log) { pool_.set_event_log(log); }
  void drop_cached_blocks() { pool_.drop_cached(); }
  // n free blocks outside any sequence (an embedding batch's scratch KV,
  // given back before the next step), all or none: empty when short.
  std::vector<int32_t> borrow_blocks(int32_t n);
  void return_blocks(std::span<const int32_t> blocks) {
    for (int32_t b : blocks) pool_.release(b);
  }

 private:
  int32_t catch_up(const Sequence& s) const;
  bool ensure_blocks(Sequence& s, int32_t n_tokens);
  void admit(Sequence& s);
  void preempt(Sequence& s);
  void free_blocks(Sequence& s);
  void drop_drafts(Sequence& s);                       // draft tokens that do not fit this step
  void trim_blocks(Sequence& s, int32_t n_positions);  // blocks past n_positions go back
  void commit_full_blocks(Sequence& s);
  // Finds or starts the blocks of the spans s has not placed yet.
  void resolve_spans(Sequence& s);
  // Places the spans s has reached; false while one waits (for its blocks,
  // or for free blocks to copy into).
  bool place_spans(Sequence& s);
  bool place_span(Sequence& s, Sequence::Span& sp);
  void choose_redo(Sequence& s);       // the placed span's rows to compute again, counted
  bool copy_redo_blocks(Sequence& s);  // false while no blocks are free
  void start_job(Sequence& s, size_t span);
  bool job_computes(const Sequence& s, const Sequence::Span& sp) const;  // after s's context
  void drop_span_state(Sequence& s);  // jobs, held blocks, placement

  BlockPool pool_;
  SchedulerLimits lim_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<std::unique_ptr<Sequence>> jobs_;  // span jobs, prefill only
  uint64_t n_preemptions_ = 0;
  bool short_of_blocks_ = false;  // this step: a span job or a span's copies found no blocks
};

}  // namespace wick
