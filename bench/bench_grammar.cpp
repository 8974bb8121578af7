// The allowed-token mask of a JSON-schema grammar over the Qwen3 vocabulary
// (151k tokens), in the states a JSON answer passes through. "walk" is the
// trie walk alone (the cache of masks by state dropped each time, the
// state transitions already known); "cached" is a state met before;
// "cold" is a fresh matcher (no transitions known yet). "answer" is what a
// request sees: a fresh matcher follows a whole JSON answer token by token
// (Qwen3's tokens of it), computing the mask before each; the time per
// token is the average mask (plus advancing over the token).
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

std::shared_ptr<const wick::Tokenizer> qwen3_tokenizer() {
  static std::shared_ptr<const wick::Tokenizer> tk =
      []() -> std::shared_ptr<const wick::Tokenizer> {
    const char* p = std::getenv("WICK_BENCH_TOKENIZER");
    try {
      return wick::Tokenizer::load(p ? p : "../shared/tokenizers/qwen3");
    } catch (const std::exception&) {
      return nullptr;
    }
  }();
  return tk;
}

std::shared_ptr<const TokenTrie> qwen3_trie() {
  static std::shared_ptr<const TokenTrie> trie = [] {
    auto tk = qwen3_tokenizer();
    return tk ? std::shared_ptr<const TokenTrie>(TokenTrie::from_tokenizer(*tk))
              : std::shared_ptr<const TokenTrie>();
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
    "{\"name\": \"Ada\", \"age\": 36, \"email\": \"ada.l",  // in an email: no '@' twice
    "{\"name\": \"Ad\xC3",                                  // inside a character
};
const char* kStateNames[] = {"start",       "key",      "in_string", "in_number",
                             "after_value", "in_array", "in_email",  "mid_char"};

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

// A book review: short and long strings (non-ASCII, escapes), numbers, an
// array, an enum; with_limits puts a maxLength on the title and the summary
// (a state per character: the plain-text path cannot apply there).
std::shared_ptr<const Grammar> review_grammar(bool with_limits) {
  auto make = [](bool limits) {
    auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "title": {"type": "string"},
      "author": {"type": "string"},
      "year": {"type": "integer"},
      "rating": {"type": "number"},
      "verdict": {"enum": ["recommended", "mixed", "skip"]},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 6},
      "summary": {"type": "string"}
    },
    "required": ["title", "author", "year", "rating", "verdict", "summary"]})");
    if (limits) {
      schema["properties"]["title"]["maxLength"] = 100;
      schema["properties"]["summary"]["maxLength"] = 600;
    }
    return compile_gbnf(json_schema_to_gbnf(schema));
  };
  static auto plain = make(false), limited = make(true);
  return with_limits ? limited : plain;
}

const char* kReview =
    R"({"title": "Les Misérables", "author": "Victor Hugo", "year": 1862, "rating": 4.5, )"
    R"("verdict": "recommended", "tags": ["novel", "history", "France"], "summary": "Jean )"
    R"(Valjean, a former convict, spends decades evading the obsessive inspector Javert while )"
    R"(raising Cosette in 19th-century Paris; Hugo's \"digressions\" on Waterloo and the sewers )"
    R"(are long but rewarding — a humane, sweeping story about mercy and justice."})";

void BM_GrammarMaskAnswer(benchmark::State& st, bool with_limits) {
  auto tk = qwen3_tokenizer();
  auto trie = qwen3_trie();
  if (!tk || !trie) {
    st.SkipWithError("no Qwen3 tokenizer: set WICK_BENCH_TOKENIZER");
    return;
  }
  const std::vector<int32_t> ids = tk->encode(kReview);
  size_t n_allowed = 0, n_plain = 0, n_states = 0;
  for (auto _ : st) {
    Matcher m(review_grammar(with_limits));
    n_allowed = 0;
    for (int32_t id : ids) {
      const auto& mask = m.allowed(*trie);
      n_allowed += size_t((mask[size_t(id) >> 6] >> (id & 63)) & 1);
      if (!m.accept_token(*trie, id)) {
        st.SkipWithError("the answer does not match its schema");
        return;
      }
    }
    n_plain = m.n_plain_masks();
    n_states = m.n_states();
    benchmark::DoNotOptimize(n_allowed);
  }
  if (n_allowed != ids.size()) st.SkipWithError("a token of the answer was masked");
  st.SetItemsProcessed(int64_t(st.iterations()) * int64_t(ids.size()));
  st.counters["tokens"] = double(ids.size());
  st.counters["plain_masks"] = double(n_plain);
  st.counters["states"] = double(n_states);
  st.counters["per_token"] =
      benchmark::Counter(double(st.iterations()) * double(ids.size()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
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
  std::shared_ptr<const TokenTrie> trie;
  for (auto _ : st) benchmark::DoNotOptimize(trie = TokenTrie::from_tokenizer(*tk));
  st.counters["nodes"] = double(trie->n_nodes());
  st.counters["plain_tokens"] = double(trie->n_plain());
  st.counters["rest_tokens"] = double(trie->rest_nodes().tokens.size());
  st.counters["rest_nodes"] = double(trie->rest_nodes().n_nodes());
}

}  // namespace

BENCHMARK(BM_TokenTrieBuild)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GrammarMaskAnswer, review, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GrammarMaskAnswer, review_max_length, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GrammarMask, start_walk, 0, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, key_walk, 1, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_string_walk, 2, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_number_walk, 3, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, after_value_walk, 4, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_array_walk, 5, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_email_walk, 6, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, mid_char_walk, 7, "walk")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_string_cached, 2, "cached")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, in_string_cold, 2, "cold")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_GrammarMask, key_cold, 1, "cold")->Unit(benchmark::kMicrosecond);
