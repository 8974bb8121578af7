// The server's engine thread and the submit path, without a socket: engines
// of evicted models are freed, a failing step fails its own requests (500)
// and the loop serves the rest, and choices nobody will read are cancelled
// (a client that hung up, a 429 on a later choice).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "engine/session.h"
#include "helpers.h"
#include "io/error.h"
#include "server/engine_loop.h"
#include "server/submit.h"

namespace wick::server {
namespace {

using test::tiny_dir;
using namespace std::chrono_literals;

GenerateRequest request(int32_t first_token, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt = {first_token, 11, 12, 13, 14};
  r.sampling = SamplingParams::greedy();
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// The last event of a channel: its result, or its error.
Event last_event(Channel& ch) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < until)
    if (auto e = ch.pop(100ms); e && (e->done || !e->error.empty())) return *e;
  ADD_FAILURE() << "no result within 30 s";
  return {};
}

// Tries cond until it holds, for up to 5 s.
template <typename F>
bool eventually(F&& cond) {
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

EngineConfig small_engine() {
  EngineConfig cfg;
  cfg.n_blocks = 64;
  cfg.n_ctx = 512;
  return cfg;
}

class EvictionFreesEngines : public ::testing::TestWithParam<size_t> {};

// Three models rotated through a pool of 1 or 2: the engines held never
// outnumber the pool, and every evicted model's memory is gone.
TEST_P(EvictionFreesEngines, RotatingModels) {
  WICK_REQUIRE_SHARED();
  const size_t pool_size = GetParam();
  ModelPool pool(pool_size, 0);
  Metrics metrics;
  EngineLoop loop(small_engine(), 16, metrics, pool);
  std::vector<std::weak_ptr<const LoadedModel>> used;
  for (int round = 0; round < 2; ++round)
    for (const char* arch : {"llama", "qwen2", "mistral"}) {
      auto m = pool.get(tiny_dir(arch));
      used.push_back(m);
      auto ch = std::make_shared<Channel>();
      ASSERT_TRUE(loop.submit(m, request(5, 4), ch));
      m.reset();
      const Event e = last_event(*ch);
      ASSERT_TRUE(e.done) << e.error;
      EXPECT_TRUE(eventually([&] { return loop.n_engines() <= pool_size; }))
          << loop.n_engines() << " engines held with a pool of " << pool_size;
    }
  EXPECT_TRUE(eventually([&] { return loop.gauges().engines <= int64_t(pool_size); }));
  // Only the models still in the pool are alive: the rest freed weights and KV.
  for (size_t i = 0; i + pool_size < used.size(); ++i)
    EXPECT_TRUE(used[i].expired()) << "model " << i << " is still held";
}

INSTANTIATE_TEST_SUITE_P(PoolSizes, EvictionFreesEngines, ::testing::Values(1, 2));

// A step that throws (an injected fault, as a failing kernel would) fails the
// requests it computed, as a 500; the loop goes on with the others.
TEST(EngineLoopFaults, AFailingStepFailsItsRequestsOnly) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(1, 0);
  Metrics metrics;
  EngineConfig cfg = small_engine();
  cfg.max_seqs = 1;  // one request per step: the poisoned one never shares a step
  constexpr int32_t kPoison = 7;
  cfg.before_execute = [](std::span<const ScheduledSeq> seqs) {
    for (const auto& w : seqs)
      if (w.seq->tokens[0] == kPoison) throw std::runtime_error("injected fault");
  };
  EngineLoop loop(cfg, 16, metrics, pool);
  Submitter sub(loop, nullptr);
  auto m = pool.get(tiny_dir("qwen2"));
  const Channels poisoned = sub.submit(m, request(kPoison, 8), 1);
  const Channels healthy = sub.submit(m, request(5, 8), 1);
  try {
    sub.wait(poisoned);
    ADD_FAILURE() << "the failed request succeeded";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 500);
    EXPECT_NE(e.message.find("injected fault"), std::string::npos) << e.message;
  }
  const auto results = sub.wait(healthy);
  EXPECT_EQ(results[0].stop_reason, "length");
  EXPECT_EQ(results[0].tokens.size(), 8u);
  EXPECT_TRUE(loop.alive());
  EXPECT_TRUE(eventually([&] { return loop.gauges().blocks_used == 0; }));
}

// Slows each step (20 ms) so that a long request runs for seconds: more than
// eventually() waits, unless it is cancelled.
EngineConfig slow_engine() {
  EngineConfig cfg = small_engine();
  cfg.before_execute = [](std::span<const ScheduledSeq>) { std::this_thread::sleep_for(20ms); };
  return cfg;
}

// A non-streaming request whose client hung up stops (every choice) instead
// of running on to max_tokens.
TEST(EngineLoopCancel, ClientGoneCancelsAWaitingRequest) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(1, 0);
  Metrics metrics;
  EngineLoop loop(slow_engine(), 16, metrics, pool);
  std::atomic<bool> gone{false};
  Submitter sub(loop, [&] { return gone.load(); });
  auto m = pool.get(tiny_dir("qwen2"));
  const Channels chans = sub.submit(m, request(5, 400), 2);  // 400 steps: 8 s
  std::thread hang_up([&] {
    std::this_thread::sleep_for(100ms);
    gone = true;
  });
  try {
    sub.wait(chans);
    ADD_FAILURE() << "the request ran to its end";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 499);
  }
  hang_up.join();
  EXPECT_TRUE(eventually([&] {
    auto g = loop.gauges();
    return g.running == 0 && g.waiting == 0 && g.blocks_used == 0;
  }));
  for (auto& ch : chans) {
    const Event e = last_event(*ch);
    ASSERT_TRUE(e.done);
    EXPECT_EQ(e.done->stop_reason, "cancelled");
    EXPECT_LT(e.done->tokens.size(), 400u);
  }
}

// n = 3 with room for 2 in the queue: a 429, and the two choices already
// queued are cancelled (nobody would read them), so the queue empties.
TEST(EngineLoopCancel, A429OnALaterChoiceCancelsTheEarlierOnes) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(1, 0);
  Metrics metrics;
  EngineLoop loop(slow_engine(), 2, metrics, pool);
  Submitter sub(loop, nullptr);
  auto m = pool.get(tiny_dir("qwen2"));
  try {
    sub.submit(m, request(5, 400), 3);
    ADD_FAILURE() << "no 429";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 429);
  }
  // The queue has room for two again within 5 s: uncancelled, the two
  // choices would hold it for the 8 s their 400 steps take.
  Channels again;
  EXPECT_TRUE(eventually([&] {
    try {
      again = sub.submit(m, request(5, 4), 2);
      return true;
    } catch (const ApiError&) {
      return false;
    }
  }));
  if (!again.empty()) {
    EXPECT_EQ(sub.wait(again).size(), 2u);
  }
}

// Adapters loaded and unloaded while serving (vLLM's runtime LoRA updating):
// a request running with an adapter that is unloaded finishes with it (the
// tokens of a model loaded with it), its terms go once it ends, new requests
// for it are refused, and a model the pool loads later gets the adapters.
TEST(EngineLoopAdapters, UnloadWaitsForTheRequestsThatUseIt) {
  WICK_REQUIRE_SHARED();
  const std::string one = test::data_dir() + "/lora/llama/peft";
  const std::string two = test::data_dir() + "/lora/llama/peft-rslora";
  if (!std::filesystem::exists(one))
    WICK_SKIP_OR_FAIL("lora fixtures missing at " << one << " (ctest runs setup.lora_fixtures)");
  BackendOptions opt = cpu_options();
  opt.lora_modules_model = tiny_dir("llama");
  ModelPool pool(1, 0, opt);
  Metrics metrics;
  auto m = pool.get(tiny_dir("llama"));
  GenerateRequest r = request(5, 40);
  r.adapter = 1;
  BackendOptions with_one = cpu_options();
  with_one.lora = {{one, 1.f}};
  GenerateRequest plain = r;
  plain.adapter = 0;
  const GenerateResult want =
      Session(load_model_at("with-one", tiny_dir("llama"), {}, with_one), 512).generate(plain);
  {
    EngineLoop loop(slow_engine(), 16, metrics, pool);
    loop.load_adapter(m, "one", one, false).get();
    EXPECT_THROW(loop.load_adapter(m, "one", one, false).get(), EngineLoop::AdapterTaken);
    EXPECT_THROW(loop.load_adapter(m, "x", test::data_dir() + "/lora/bad/dora", false).get(),
                 ModelError);
    auto ch = std::make_shared<Channel>();
    ASSERT_TRUE(loop.submit(m, r, ch));  // queued first: it runs with the adapter
    EXPECT_TRUE(loop.unload_adapter("one").get());
    EXPECT_FALSE(loop.unload_adapter("one").get());
    EXPECT_EQ(pool.lora_modules().at(0).first, "");
    auto late = std::make_shared<Channel>();
    ASSERT_TRUE(loop.submit(m, r, late));
    const Event refused = last_event(*late);
    EXPECT_NE(refused.error.find("was unloaded"), std::string::npos) << refused.error;
    const Event e = last_event(*ch);
    ASSERT_TRUE(e.done) << e.error;
    EXPECT_EQ(e.done->tokens, want.tokens);
  }  // the loop's thread has ended; the step that ended the request freed the adapter
  EXPECT_TRUE(m->model->lora.empty());
  EXPECT_TRUE(m->device->lora.empty());
  EXPECT_TRUE(m->model->adapter_bytes.empty());
  {
    EngineLoop loop(small_engine(), 16, metrics, pool);
    loop.load_adapter(m, "two", two, false).get();
  }
  EXPECT_EQ(m->model->adapter_names, (std::vector<std::string>{"", "two"}));
  ASSERT_TRUE(pool.unload(m->path));
  auto again = pool.get(tiny_dir("llama"));
  EXPECT_NE(again.get(), m.get());
  EXPECT_EQ(again->model->adapter_names, (std::vector<std::string>{"", "two"}));
}

}  // namespace
}  // namespace wick::server
