// forward's graph protocol (the CUDA backend's decode steps), on the CPU
// through a backend that says it records: a step's first run goes plainly,
// its second is recorded, and a step that fails while recorded ends the
// recording and runs plainly with the same logits; the next one records.
#include <gtest/gtest.h>

#include <stdexcept>

#include "backend/cpu/cpu_backend.h"
#include "helpers.h"
#include "model/forward.h"

namespace wick::test {
namespace {

// The CPU backend, passing as one that records steps: it counts what
// forward asks of it and can fail the attention of the next recorded step.
// (The CPU runs each kernel as it comes, so a "recorded" step has run.)
class RecordingCpu final : public Backend {
 public:
  int n_begin = 0, n_end = 0, n_abort = 0;
  bool fail_next_capture = false;

  std::string name() const override { return "recording " + in_->name(); }
  Device device() const override { return in_->device(); }
  Buffer alloc(size_t bytes) override { return in_->alloc(bytes); }
  void release(void* p) override { in_->release(p); }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    in_->copy_to_device(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    in_->copy_to_host(dst, src, n);
  }
  Weight prepare_matrix(const Weight& host) override { return in_->prepare_matrix(host); }
  Weight prepare_vector(const Weight& host) override { return in_->prepare_vector(host); }
  void prepare_experts(std::span<const ExpertWeights> host, std::span<ExpertWeights> out) override {
    in_->prepare_experts(host, out);
  }
  std::unique_ptr<KvStore> create_kv(const KvSpec& spec) override { return in_->create_kv(spec); }
  void copy_blocks(KvStore& kv, std::span<const std::pair<int32_t, int32_t>> pairs) override {
    in_->copy_blocks(kv, pairs);
  }
  BatchArgs upload(const Batch& b) override { return in_->upload(b); }

  bool can_graph() const override { return true; }
  bool replay(uint64_t) override { return false; }
  void capture_begin() override {
    ++n_begin;
    capturing_ = true;
  }
  void capture_end(uint64_t) override {
    ++n_end;
    capturing_ = false;
  }
  void capture_abort() override {
    ++n_abort;
    capturing_ = false;
  }

  void embed(const Weight& tok, const BatchArgs& b, float* out) override {
    in_->embed(tok, b, out);
  }
  void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps,
               float* y) override {
    in_->rmsnorm(x, w, n_rows, n, eps, y);
  }
  void matmul(const Weight& w, const float* x, int64_t n_rows, float* y) override {
    in_->matmul(w, x, n_rows, y);
  }
  void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) override {
    in_->add_bias(y, b, n_rows, n);
  }
  void add(float* y, const float* x, int64_t n) override { in_->add(y, x, n); }
  void scale(float* x, float s, int64_t n) override { in_->scale(x, s, n); }
  void silu_mul(float* gate, const float* up, int64_t n) override { in_->silu_mul(gate, up, n); }
  void rope(float* x, const BatchArgs& b, int64_t n_heads, int64_t head_dim,
            const float* inv_freq) override {
    in_->rope(x, b, n_heads, head_dim, inv_freq);
  }
  void kv_write(KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                const float* v) override {
    in_->kv_write(kv, il, b, k, v);
  }
  void kv_deviation(const KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                    const float* v, float* out) override {
    in_->kv_deviation(kv, il, b, k, v, out);
  }
  void attention(const float* q, const KvStore& kv, int64_t il, const BatchArgs& b,
                 const AttnShape& s, float* out) override {
    if (capturing_ && fail_next_capture) {
      fail_next_capture = false;
      throw std::logic_error("a buffer allocated while recorded");
    }
    in_->attention(q, kv, il, b, s, out);
  }
  void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, bool norm,
                 int32_t* ids, float* w) override {
    in_->moe_route(logits, n_tokens, n_expert, k, norm, ids, w);
  }
  void moe_mlp(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens, int64_t k,
               const int32_t* ids, const float* w, float* out) override {
    in_->moe_mlp(experts, x, n_tokens, k, ids, w, out);
  }
  void gather_logit_rows(const float* x, const BatchArgs& b, int64_t n, float* out) override {
    in_->gather_logit_rows(x, b, n, out);
  }

 private:
  std::unique_ptr<Backend> in_ = make_cpu_backend();
  bool capturing_ = false;
};

TEST(ForwardGraphs, AStepThatFailsWhileRecordedRunsPlainlyAndTheNextRecords) {
  WICK_REQUIRE_SHARED();
  auto m = load_model(tiny_dir("llama"));
  const ModelConfig& c = m->config;
  auto dm = prepare_model(*m, std::make_unique<RecordingCpu>());
  auto& be = static_cast<RecordingCpu&>(*dm->backend);
  const std::vector<int32_t> prompt{5, 17, 99, 3, 42};
  // the prompt, then decode steps of one key: each step's logits
  auto decode = [&](int n_steps, bool fail_second) {
    auto kv = be.make_kv(c.n_layer, 4, 16, c.kv_dim());
    ForwardScratch s;
    Buffer dev = be.alloc(size_t(c.n_vocab) * 4);
    std::vector<std::vector<float>> out;
    for (int i = 0; i <= n_steps; ++i) {
      Batch b;
      b.block_tables = {{0, 1, 2, 3}};
      ForwardOptions opt;
      opt.table_width = 4;
      if (i == 0) {
        for (size_t t = 0; t < prompt.size(); ++t)
          b.add(prompt[t], int32_t(t), 0, t + 1 == prompt.size());
      } else {
        b.add(int32_t(7 * i), int32_t(prompt.size()) + i - 1, 0, true);
        opt.graph_key = 1;
      }
      be.fail_next_capture = fail_second && i == 2;
      forward(be, c, dm->weights, b, *kv, s, dev.as<float>(), opt);
      out.emplace_back(size_t(c.n_vocab));
      be.copy_to_host(out.back().data(), dev.data(), out.back().size() * 4);
    }
    s = ForwardScratch{};
    return out;
  };
  const auto plain = decode(4, false);
  EXPECT_EQ(be.n_begin, 3);  // steps 2, 3 and 4: recorded (replay finds no graph here)
  EXPECT_EQ(be.n_end, 3);
  EXPECT_EQ(be.n_abort, 0);
  be.n_begin = be.n_end = 0;
  const auto failed = decode(4, true);
  EXPECT_EQ(be.n_begin, 3);
  EXPECT_EQ(be.n_end, 2);  // steps 3 and 4
  EXPECT_EQ(be.n_abort, 1);
  EXPECT_FALSE(be.fail_next_capture);
  EXPECT_EQ(failed, plain);
}

}  // namespace
}  // namespace wick::test
