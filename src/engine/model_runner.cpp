#include "engine/model_runner.h"

namespace wick {

ModelRunner::ModelRunner(std::shared_ptr<const LoadedModel> model, int64_t n_blocks,
                         int64_t block_size)
    : model_(std::move(model)),
      kv_(model_->backend().make_kv(model_->config().n_layer, n_blocks, block_size,
                                    model_->config().kv_dim())) {}

ModelRunner::~ModelRunner() {
  scratch_ = ForwardScratch{};  // frees its buffers while the backend is alive
}

std::span<float> ModelRunner::execute(Batch& b) {
  Backend& be = model_->backend();
  const size_t V = size_t(model_->config().n_vocab), n = b.logit_rows.size();
  logits_host_.resize(std::max<size_t>(1, n) * V);
  float* out = logits_host_.data();
  if (be.device() != Device::Cpu) {  // logits land in device memory first
    if (logits_dev_.bytes() < n * V * 4) logits_dev_ = be.alloc(std::max<size_t>(1, n) * V * 4);
    out = logits_dev_.as<float>();
  }
  forward(*model_->device, model_->config(), b, *kv_, scratch_, out);
  if (out != logits_host_.data()) be.copy_to_host(logits_host_.data(), out, n * V * 4);
  return {logits_host_.data(), n * V};
}

}  // namespace wick
