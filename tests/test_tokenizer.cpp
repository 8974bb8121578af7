// Tokenizers against HF `tokenizers` on a corpus of several thousand strings
// (tests/python/make_text_fixtures.py): encode with and without special-token
// parsing, decode with and without special tokens, and streaming decode.
#include <gtest/gtest.h>

#include "helpers.h"
#include "text/detokenizer.h"
#include "text/regex.h"
#include "text/tokenizer.h"

namespace wick::test {
namespace {

struct Case {
  std::string name, source, expect;
};

std::vector<Case> cases() {
  const std::string t = shared_dir() + "/tokenizers/", d = data_dir() + "/text/";
  return {
      {"qwen3", t + "qwen3/tokenizer.json", d + "qwen3.expect.json"},
      {"llama3", t + "llama3", d + "llama3.expect.json"},
      {"llama2", t + "llama2/tokenizer.json", d + "llama2.expect.json"},
      {"smollm2_gguf", std::getenv("WICK_TEST_MODEL") ? std::getenv("WICK_TEST_MODEL") : "",
       d + "smollm2.expect.json"},
      {"llama2_gguf", d + "llama2-vocab.gguf", d + "llama2.expect.json"},
      // SmolLM2's tokenizer named as Granite's GGUF files name theirs (the
      // same pre-tokenizer: single digits, then GPT-2's split)
      {"refact_gguf", data_dir() + "/granite/refact-tokenizer.gguf", d + "smollm2.expect.json"}};
}

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, EncodeDecodeAndStreamMatchTokenizers) {
  const Case& c = GetParam();
  if (!std::filesystem::exists(c.expect) || !std::filesystem::exists(c.source))
    WICK_SKIP_OR_FAIL("fixtures missing: " << c.source << " / " << c.expect);
  auto tk = Tokenizer::load(c.source);
  auto corpus = read_json(data_dir() + "/text/corpus.json").get<std::vector<std::string>>();
  auto exp = read_json(c.expect);
  ASSERT_EQ(exp.size(), corpus.size());
  size_t ok_plain = 0, ok_parsed = 0, ok_dec = 0, ok_dec_skip = 0, ok_stream = 0, shown = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto& e = exp[i];
    auto plain = tk->encode(corpus[i], {.add_special = false, .parse_special = false});
    auto parsed = tk->encode(corpus[i], {.add_special = true, .parse_special = true});
    auto want_plain = e["plain"].get<std::vector<int32_t>>();
    auto want_parsed = e["parsed"].get<std::vector<int32_t>>();
    std::string dec = tk->decode(want_plain, false), dec_skip = tk->decode(want_parsed, true);
    ok_plain += plain == want_plain;
    ok_parsed += parsed == want_parsed;
    ok_dec += dec == e["decode"].get<std::string>();
    ok_dec_skip += dec_skip == e["decode_skip"].get<std::string>();
    // streaming, token by token, special tokens hidden
    StreamDecoder sd(*tk, true);
    std::string streamed;
    for (int32_t id : want_parsed) streamed += sd.push(id);
    streamed += sd.finish();
    ok_stream += streamed == tk->decode(want_parsed, true);
    if (shown < 5 &&
        (plain != want_plain || parsed != want_parsed || dec != e["decode"].get<std::string>() ||
         dec_skip != e["decode_skip"].get<std::string>())) {
      ++shown;
      ADD_FAILURE() << c.name << " string " << i << ": " << nlohmann::json(corpus[i]).dump()
                    << "\n plain " << nlohmann::json(plain).dump() << "\n want  "
                    << nlohmann::json(want_plain).dump() << "\n parsed "
                    << nlohmann::json(parsed).dump() << "\n want   "
                    << nlohmann::json(want_parsed).dump() << "\n decode "
                    << nlohmann::json(dec).dump() << "\n want   " << e["decode"].dump();
    }
  }
  const size_t n = corpus.size();
  std::printf(
      "[ report ] %-13s %zu strings: encode %zu/%zu, encode+specials %zu/%zu, decode %zu/%zu, "
      "decode-skip %zu/%zu, stream %zu/%zu\n",
      c.name.c_str(), n, ok_plain, n, ok_parsed, n, ok_dec, n, ok_dec_skip, n, ok_stream, n);
  EXPECT_EQ(ok_plain, n);
  EXPECT_EQ(ok_parsed, n);
  EXPECT_EQ(ok_dec, n);
  EXPECT_EQ(ok_dec_skip, n);
  EXPECT_EQ(ok_stream, n);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Conformance, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Pre-tokenizer patterns come from tokenizer files: one that backtracks
// without end fails with an error naming it, and long ordinary input still matches.
// A model's rows past the tokenizer's ids (Qwen's 151,936 for 151,669
// tokens) can be sampled from a random or badly trained model: they stream no
// text, and the text around them is the tokens' own.
TEST(StreamDecoder, IdsPastTheVocabularyHaveNoText) {
  const std::string path = shared_dir() + "/tokenizers/qwen3";
  if (!std::filesystem::exists(path)) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << path);
  auto tk = Tokenizer::load(path);
  const auto ids = tk->encode("Hello, world");
  StreamDecoder sd(*tk);
  std::string streamed = sd.push(ids[0]);
  streamed += sd.push(tk->n_vocab() + 5);
  for (size_t i = 1; i < ids.size(); ++i) streamed += sd.push(ids[i]);
  streamed += sd.push(-1);
  streamed += sd.finish();
  EXPECT_EQ(streamed, "Hello, world");
}

TEST(Regex, RunsUnderMatchLimits) {
  const Regex bad("(a+)+$");
  std::vector<std::pair<size_t, size_t>> out;
  try {
    bad.find_all(std::string(40, 'a') + "!", out);
    ADD_FAILURE() << "catastrophic backtracking ran to its end";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("(a+)+$"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("limit"), std::string::npos) << e.what();
  }
  const Regex words("\\p{L}+| ?[^\\s\\p{L}]+|\\s+(?!\\S)|\\s+");
  out.clear();
  words.find_all(std::string(1 << 20, 'a') + std::string(1 << 16, ' ') + "b", out);
  ASSERT_EQ(out.size(), 4u);  // the letters, 65535 spaces, the space before b, b
  EXPECT_EQ(out[0], std::make_pair(size_t(0), size_t(1) << 20));
}

}  // namespace
}  // namespace wick::test
