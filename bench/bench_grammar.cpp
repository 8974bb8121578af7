// The allowed-token mask of a JSON-schema grammar over the Qwen3 vocabulary
// (151k tokens), in the states a JSON answer passes through. "walk" is the
// trie walk alone (the cache of masks by state dropped each time, the
// state transitions already known); "cached" is a state met before;
// "cold" is a fresh matcher (no transitions known yet).
// WICK_BENCH_TOKENIZER overrides the tokenizer (default ../shared/tokenizers/qwen3).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_trie.h"
#include "text/tokenizer.h"

namespace {

using namespace wick::grammar;

std::shared_ptr<const TokenTrie> qwen3_trie() {
  static std::shared_ptr<const TokenTrie> trie = [] {
    const char* p = std::getenv("WICK_BENCH_TOKENIZER");
    try {
      auto tk = wick::Tokenizer::load(p ? p : "../shared/tokenizers/qwen3");
      return std::shared_ptr<const TokenTrie>(TokenTrie::from_tokenizer(*tk));
    } catch (const std::exception&) {
      return std::shared_ptr<const TokenTrie>();
    }
  }();
  return trie;
}

std::shared_ptr<const Grammar> person_grammar() {
  static auto g = compile_gbnf(json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string"},
      "age": {"type": "integer"},
      "email": {"type": "string", "format": "email"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
      "address": {"type": "object", "properties": {"city": {"type": "string"},
                  "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city"]}
    },
    "required": ["name", "age"]})")));
  return g;
}

// The matcher after `prefix` of an answer.
const char* kPrefixes[] = {
    "",                                                     // start: only "{"
    "{",                                                    // expecting the first key
    "{\"name\": \"Ada Love",                                // inside a string value
    "{\"name\": \"Ada\", \"age\": 3",                       // inside a number
    "{\"name\": \"Ada\", \"age\": 36",                      // after a value: , or } or digits
    "{\"name\": \"Ada\", \"age\": 36, \"tags\": [\"x\", ",  // in an array
};
const char* kStateNames[] = {"start", "key", "in_string", "in_number", "after_value", "in_array"};

void BM_GrammarMask(benchmark::State& st, int which, const char* mode) {
  auto trie = qwen3_trie();
  if (!trie) {
    st.SkipWithError("no Qwen3 tokenizer: set WICK_BENCH_TOKENIZER");
    return;
  }
  const std::string m_name = mode;
  Matcher m(person_grammar());
  if (!m.advance(kPrefixes[which])) {
    st.SkipWithError("prefix rejected");
    return;
  }
  m.allowed(*trie);  // transitions known, mask cached
  size_t n_allowed = 0;
  for (auto _ : st) {
    if (m_name == "cold") {
      st.PauseTiming();
      m = Matcher(person_grammar());
      m.advance(kPrefixes[which]);
      st.ResumeTiming();
    } else if (m_name == "walk") {
      m.drop_mask_cache();
    }
    const auto& mask = m.allowed(*trie);
    benchmark::DoNotOptimize(mask.data());
    n_allowed = 0;
    for (uint64_t w : mask) n_allowed += size_t(__builtin_popcountll(w));
  }
  st.counters["allowed"] = double(n_allowed);
  st.counters["vocab"] = double(trie->n_vocab());
  st.counters["trie_nodes"] = double(trie->n_nodes());
  st.SetLabel(kStateNames[which]);
}

void BM_TokenTrieBuild(benchmark::State& st) {
  const char* p = std::getenv("WICK_BENCH_TOKENIZER");
  std::unique_ptr<wick::Tokenizer> tk;
  try {
    tk = wick::Tokenizer::load(p ? p : "../shared/tokenizers/qwen3");
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  for (auto _ : st) benchmark::DoNotOptimize(TokenTrie::from_tokenizer(*tk));
}

}  // namespace

BENCHMARK(BM_TokenTrieBuild)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GrammarMask, start_walk, 0, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, key_walk, 1, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_string_walk, 2, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_number_walk, 3, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, after_value_walk, 4, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_array_walk, 5, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_string_cached, 2, "cached")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_string_cold, 2, "cold")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, key_cold, 1, "cold")->Unit(benchmark::kMicrosecond);
