#include "engine/model_runner.h"

#include <algorithm>

namespace wick {

ModelRunner::ModelRunner(std::shared_ptr<const LoadedModel> model, const RunnerLimits& lim)
    : model_(std::move(model)),
      lim_(lim),
      kv_(model_->backend().make_kv(model_->config().n_layer, lim.n_blocks, lim.block_size,
                                    model_->config().kv_dim(), lim.pre_rope)) {
  Backend& be = model_->backend();
  if (lim_.max_tokens > 0 || lim_.max_logit_rows > 0)
    scratch_.reserve(be, model_->config(), std::max(1, lim_.max_tokens),
                     std::max(1, lim_.max_logit_rows));
  if (lim_.max_logit_rows > 0) device_logits(size_t(lim_.max_logit_rows));
}

ModelRunner::~ModelRunner() {
  scratch_ = ForwardScratch{};  // frees its buffers while the backend is alive
}

float* ModelRunner::device_logits(size_t n_rows) {
  Backend& be = model_->backend();
  const size_t V = size_t(model_->config().n_vocab);
  n_rows = std::max<size_t>(1, n_rows);
  if (logits_host_.size() < n_rows * V) logits_host_.resize(n_rows * V);
  if (be.device() == Device::Cpu) return logits_host_.data();
  if (logits_dev_.bytes() < n_rows * V * 4) logits_dev_ = be.alloc(n_rows * V * 4);
  return logits_dev_.as<float>();
}

void ModelRunner::run(Batch& b) {
  n_rows_ = b.logit_rows.size();
  float* out = device_logits(n_rows_);
  ForwardOptions opt;
  const int64_t bs = kv_->block_size;
  if (lim_.n_ctx > 0) opt.table_width = int32_t((lim_.n_ctx + bs - 1) / bs + 1);
  // A pure decode step (each sequence one token, all wanting logits) is
  // recorded once per batch size and replayed.
  const bool decode = b.n_tokens() > 0 && size_t(b.n_tokens()) == b.block_tables.size() &&
                      size_t(b.n_tokens()) == n_rows_;
  if (decode && opt.table_width > 0) {
    // one graph per batch size and context bucket (attention's launch shape)
    constexpr int32_t kCtxRound = 512;
    opt.ctx_round = kCtxRound;
    const int32_t max_pos = *std::max_element(b.positions.begin(), b.positions.end());
    const uint64_t bucket = uint64_t(max_pos / kCtxRound);
    // holes (span layouts) add a table to the batch, and named adapters a
    // row list (their terms' kernels read it): layouts of their own
    bool holes = false;
    for (auto& f : b.block_fills) holes |= !f.empty();
    const bool adapters =
        std::any_of(b.adapters.begin(), b.adapters.end(), [](int32_t a) { return a != 0; });
    opt.graph_key = (uint64_t(reinterpret_cast<uintptr_t>(this)) << 24) ^ (bucket << 14) ^
                    (uint64_t(adapters) << 13) ^ (uint64_t(holes) << 12) ^ uint64_t(b.n_tokens());
  }
  forward(*model_->device, model_->config(), b, *kv_, scratch_, out, opt);
  row_on_host_.assign(n_rows_, model_->backend().device() == Device::Cpu);
}

void ModelRunner::copy_blocks(std::span<const std::pair<int32_t, int32_t>> pairs) {
  if (!pairs.empty()) model_->backend().copy_blocks(*kv_, pairs);
}

namespace {

// The rows of one scheduled sequence into `b` as its sequence `k`.
void add_rows(Batch& b, const ScheduledSeq& w) {
  const Sequence& s = *w.seq;
  const int32_t k = int32_t(b.block_tables.size());
  b.block_tables.push_back(s.block_table);
  b.adapters.push_back(s.req.adapter);
  auto& f = b.block_fills.emplace_back();
  if (!s.fills.empty())  // span layouts: holes (blocks past the layout are full)
    f.assign(s.fills.begin(),
             s.fills.begin() + long(std::min(s.fills.size(), s.block_table.size())));
  if (const auto& pl = s.placing; pl.pos >= 0) {  // a placed span's chosen positions
    const auto& rows = w.measures ? pl.measure : pl.redo;
    for (int32_t i = 0; i < w.n_tokens; ++i)
      b.add(s.tokens[size_t(rows[size_t(i)])], rows[size_t(i)], k, false);
    return;
  }
  // the sampling position, and each draft token after it, give logits;
  // so do prompt rows whose log-probabilities are asked for
  const int32_t first_row = w.n_tokens - 1 - w.n_draft;
  for (int32_t i = 0; i < w.n_tokens; ++i) {
    const int32_t pos = w.from + i;
    if (s.tokens[size_t(pos)] == kHole) continue;
    b.add(s.tokens[size_t(pos)], pos, k,
          (w.samples && i >= first_row) || s.gives_prompt_logprobs(pos));
  }
}

}  // namespace

void ModelRunner::run(std::span<const ScheduledSeq> seqs) {
  batch_.clear();
  measure_batch_.clear();
  for (const ScheduledSeq& w : seqs) add_rows(w.measures ? measure_batch_ : batch_, w);
  deviations_.resize(size_t(measure_batch_.n_tokens()));
  if (!deviations_.empty()) measure(measure_batch_);  // first: the step's logits come after
  if (batch_.n_tokens() > 0)
    run(batch_);
  else
    n_rows_ = 0, row_on_host_.clear();
}

void ModelRunner::measure(Batch& b) {
  Backend& be = model_->backend();
  const size_t n = size_t(b.n_tokens());
  float* out = deviations_.data();
  if (be.device() != Device::Cpu) {
    if (deviation_dev_.bytes() < n * 4) deviation_dev_ = be.alloc(std::max<size_t>(n, 256) * 4);
    out = deviation_dev_.as<float>();
  }
  ForwardOptions opt;
  opt.kv_deviation = true;
  forward(*model_->device, model_->config(), b, *kv_, scratch_, out, opt);
  if (out != deviations_.data()) be.copy_to_host(deviations_.data(), out, n * 4);
}

std::span<float> ModelRunner::logits_row(size_t r) {
  const size_t V = size_t(model_->config().n_vocab);
  if (!row_on_host_[r]) {
    model_->backend().copy_to_host(logits_host_.data() + r * V, logits_dev_.as<float>() + r * V,
                                   V * 4);
    row_on_host_[r] = 1;
  }
  return {logits_host_.data() + r * V, V};
}

std::span<float> ModelRunner::execute(Batch& b) {
  run(b);
  const size_t V = size_t(model_->config().n_vocab);
  if (n_rows_ && !row_on_host_[0]) {  // one copy for all rows
    model_->backend().copy_to_host(logits_host_.data(), logits_dev_.data(), n_rows_ * V * 4);
    std::fill(row_on_host_.begin(), row_on_host_.end(), 1);
  }
  return {logits_host_.data(), n_rows_ * V};
}

std::span<const float> ModelRunner::hidden_states(Batch& b) {
  Backend& be = model_->backend();
  const size_t n = b.logit_rows.size() * size_t(model_->config().n_embd);
  hidden_host_.resize(std::max<size_t>(1, n));
  float* out = hidden_host_.data();
  if (be.device() != Device::Cpu) {
    if (hidden_dev_.bytes() < hidden_host_.size() * 4)
      hidden_dev_ = be.alloc(hidden_host_.size() * 4);
    out = hidden_dev_.as<float>();
  }
  ForwardOptions opt;
  opt.hidden_states = true;
  forward(*model_->device, model_->config(), b, *kv_, scratch_, out, opt);
  if (out != hidden_host_.data()) be.copy_to_host(hidden_host_.data(), out, n * 4);
  return {hidden_host_.data(), n};
}

bool ModelRunner::can_sample() const {
  return model_->backend().can_sample();
}

void ModelRunner::sample(std::span<const SampleRow> rows, std::span<const int32_t> pairs,
                         int32_t* ids) {
  model_->backend().sample(logits_dev_.as<float>(), int64_t(rows.size()), model_->config().n_vocab,
                           rows, pairs, ids);
}

}  // namespace wick
