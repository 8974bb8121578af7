// Tokenizer encode speed on the conformance corpus (one string at a time,
// one thread). Compare with tests/python/bench_tokenizers.py on the same
// corpus: `make bench` prints both.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace {

std::vector<std::string> corpus() {
  const char* path = std::getenv("WICK_BENCH_CORPUS");
  std::ifstream in(path ? path : "build/testdata/text/corpus.json");
  if (!in) return {};
  return nlohmann::json::parse(in).get<std::vector<std::string>>();
}

void BM_Encode(benchmark::State& st, const std::string& source) {
  static const auto texts = corpus();
  if (texts.empty()) {
    st.SkipWithError("corpus missing: run the tests first or set WICK_BENCH_CORPUS");
    return;
  }
  std::unique_ptr<wick::Tokenizer> tk;
  try {
    tk = wick::Tokenizer::load(source);
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  size_t bytes = 0, n_tok = 0;
  for (auto _ : st) {
    for (const auto& t : texts) {
      auto ids = tk->encode(t);
      n_tok += ids.size();
      bytes += t.size();
    }
  }
  st.counters["MB/s"] = benchmark::Counter(double(bytes) / 1e6, benchmark::Counter::kIsRate);
  st.counters["tok/s"] = benchmark::Counter(double(n_tok), benchmark::Counter::kIsRate);
}

// The whole corpus as one text: no per-call overhead on either side.
void BM_EncodeWhole(benchmark::State& st, const std::string& source) {
  static const auto texts = corpus();
  std::string whole;
  for (size_t i = 0; i < texts.size(); ++i) whole += (i ? "\n" : "") + texts[i];
  auto tk = wick::Tokenizer::load(source);
  for (auto _ : st) benchmark::DoNotOptimize(tk->encode(whole));
  st.counters["MB/s"] =
      benchmark::Counter(double(whole.size()) / 1e6, benchmark::Counter::kIsIterationInvariantRate);
}

const std::string kShared = std::getenv("WICK_SHARED") ? std::getenv("WICK_SHARED") : "../shared";
BENCHMARK_CAPTURE(BM_Encode, qwen3, kShared + "/tokenizers/qwen3/tokenizer.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama3, kShared + "/tokenizers/llama3/tokenizer.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama2, kShared + "/tokenizers/llama2/tokenizer.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeWhole, qwen3, kShared + "/tokenizers/qwen3/tokenizer.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeWhole, llama3, kShared + "/tokenizers/llama3/tokenizer.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeWhole, llama2, kShared + "/tokenizers/llama2/tokenizer.json")
    ->Unit(benchmark::kMillisecond);

}  // namespace
