// Fill-in-the-middle: the FIM tokens found by name in real vocabularies and
// from GGUF metadata, and the prompt laid out as the model's tokenizer lays
// out the same text with the special tokens written in.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "helpers.h"
#include "io/gguf.h"
#include "text/infill.h"

namespace wick {
namespace {

using test::data_dir;
using test::shared_dir;

std::unique_ptr<Tokenizer> shared_tokenizer(const std::string& name) {
  const std::string path = shared_dir() + "/tokenizers/" + name;
  if (!std::filesystem::exists(path)) return nullptr;
  return Tokenizer::load(path);
}

TEST(Infill, Qwen3HasFimTokensAndLaysOutPrefixSuffixMiddle) {
  auto tk = shared_tokenizer("qwen3");
  if (!tk) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << shared_dir());
  const auto fim = find_fim_tokens(*tk);
  ASSERT_TRUE(fim);
  EXPECT_EQ(fim->prefix, tk->token_id("<|fim_prefix|>"));
  EXPECT_EQ(fim->suffix, tk->token_id("<|fim_suffix|>"));
  EXPECT_EQ(fim->middle, tk->token_id("<|fim_middle|>"));
  EXPECT_EQ(fim->file_sep, tk->token_id("<|file_sep|>"));
  const EncodeOptions special{.add_special = true, .parse_special = true};
  EXPECT_EQ(infill_prompt(*tk, *fim, "def add(a, b):\n    ", "\n\nprint(add(1, 2))"),
            tk->encode("<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))"
                       "<|fim_middle|>",
                       special));
  // context files, then the text the answer starts with
  EXPECT_EQ(infill_prompt(*tk, *fim, "x = ", "\n", "util.", {{"util.py", "def f(): pass\n"}}),
            tk->encode("<|file_sep|>util.py\ndef f(): pass\n<|fim_prefix|>x = <|fim_suffix|>\n"
                       "<|fim_middle|>util.",
                       special));
}

TEST(Infill, VocabulariesWithoutThemHaveNone) {
  auto llama2 = shared_tokenizer("llama2");
  if (!llama2) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << shared_dir());
  EXPECT_FALSE(find_fim_tokens(*llama2));
  const char* model = std::getenv("WICK_TEST_MODEL");
  if (!model || !std::filesystem::exists(model)) WICK_SKIP_OR_FAIL("default model missing");
  // SmolLM2's vocabulary has <file_sep> and <repo_name> but no FIM tokens
  auto smol = Tokenizer::from_gguf(GgufFile(model));
  EXPECT_TRUE(smol->token_id("<file_sep>"));
  EXPECT_FALSE(find_fim_tokens(*smol));
}

// GGUF's tokenizer.ggml.fim_*_token_id keys name the ids whatever the tokens'
// names (here the default model's vocabulary with three of its ids named).
TEST(Infill, GgufMetadataNamesTheIds) {
  const char* model = std::getenv("WICK_TEST_MODEL");
  if (!model || !std::filesystem::exists(model)) WICK_SKIP_OR_FAIL("default model missing");
  GgufFile src(model);
  GgufWriter w;
  for (const auto& [key, v] : src.metadata())
    if (key.starts_with("tokenizer.") || key == "general.architecture") w.set(key, v);
  w.set("tokenizer.ggml.fim_pre_token_id", GgufValue::u32(3));
  w.set("tokenizer.ggml.fim_suf_token_id", GgufValue::u32(4));
  w.set("tokenizer.ggml.middle_token_id", GgufValue::u32(6));  // the older key
  w.set("tokenizer.ggml.fim_sep_token_id", GgufValue::u32(5));
  std::filesystem::create_directories(data_dir());
  const std::string path = data_dir() + "/fim-vocab.gguf";
  w.write(path);
  auto tk = Tokenizer::from_gguf(GgufFile(path));
  const auto fim = find_fim_tokens(*tk);
  ASSERT_TRUE(fim);
  EXPECT_EQ(fim->prefix, 3);
  EXPECT_EQ(fim->suffix, 4);
  EXPECT_EQ(fim->middle, 6);
  EXPECT_EQ(fim->file_sep, 5);
  auto ids = infill_prompt(*tk, *fim, "a", "b");
  std::vector<int32_t> want = {3};
  for (int32_t id : tk->encode("a")) want.push_back(id);
  want.push_back(4);
  for (int32_t id : tk->encode("b")) want.push_back(id);
  want.push_back(6);
  EXPECT_EQ(ids, want);
}

}  // namespace
}  // namespace wick
