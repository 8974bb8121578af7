// The allowed-token mask's plain-text path (grammar/plain_text.h): the
// automaton's class against a code point by code point definition, the
// trie's split of the vocabulary, and masks equal to a token-by-token check
// in states that take the path and in states that must fall back to the
// full walk (a maxLength, a pattern, an enum, GBNF strings that exclude
// characters, mid-character states).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/plain_text.h"
#include "grammar/token_trie.h"
#include "grammar/utf8_ranges.h"
#include "text/tokenizer.h"

using namespace wick::grammar;
using ojson = nlohmann::ordered_json;

namespace {

std::string encode_cp(uint32_t cp) {
  std::vector<uint8_t> b;
  append_utf8(cp, b);
  return std::string(b.begin(), b.end());
}

bool bit(const std::vector<uint64_t>& mask, int32_t id) {
  return (mask[size_t(id) >> 6] >> (id & 63)) & 1;
}

// The tokens of the mask that a token-by-token check disagrees with ("" when none).
std::string mask_mismatch(Matcher& m, const TokenTrie& trie) {
  const auto mask = m.allowed(trie);
  for (int32_t id = 0; id < trie.n_vocab(); ++id) {
    const bool expect = !trie.bytes(id).empty() && m.would_accept(trie.bytes(id));
    if (bit(mask, id) != expect)
      return "token " + std::to_string(id) + " '" + trie.bytes(id) + "' in mask " +
             std::to_string(bit(mask, id));
  }
  return "";
}

struct MaskRun {
  size_t n_cuts = 0, n_plain = 0;
};

// The mask against the token-by-token check after every prefix of text
// (stride bytes apart), with a fresh matcher each time (no cached masks).
MaskRun check_masks(const std::shared_ptr<const Grammar>& g, const TokenTrie& trie,
                    const std::string& text, size_t stride) {
  MaskRun run;
  for (size_t cut = 0; cut <= text.size(); cut += stride) {
    Matcher m(g);
    EXPECT_TRUE(m.advance(text.substr(0, cut))) << "cut " << cut;
    EXPECT_EQ(mask_mismatch(m, trie), "") << "cut " << cut << " of " << text;
    run.n_plain += m.n_plain_masks();
    ++run.n_cuts;
  }
  return run;
}

std::shared_ptr<const TokenTrie> qwen3_trie() {
  static std::shared_ptr<const TokenTrie> trie = [] {
    const std::string dir = std::string(WICK_SHARED_DIR) + "/tokenizers/qwen3";
    if (!std::filesystem::exists(dir)) return std::shared_ptr<const TokenTrie>();
    return std::shared_ptr<const TokenTrie>(TokenTrie::from_tokenizer(*wick::Tokenizer::load(dir)));
  }();
  return trie;
}

std::shared_ptr<const Grammar> schema(const char* json) {
  return compile_gbnf(json_schema_to_gbnf(ojson::parse(json)));
}

}  // namespace

// The class is exactly the shortest-form UTF-8 of U+0020.. without '"',
// '\\' and surrogates, and the prefixes of those sequences.
TEST(PlainText, ClassIsEveryCodePointFromSpaceButQuoteAndBackslash) {
  size_t n_plain = 0;
  for (uint32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // no encoding: append_utf8 would make one
    const std::string s = encode_cp(cp);
    const bool expect = cp >= 0x20 && cp != '"' && cp != '\\';
    ASSERT_EQ(is_plain_text(s), expect) << std::hex << cp;
    for (size_t n = 1; n < s.size(); ++n)  // a token may end inside a character
      ASSERT_TRUE(is_plain_text(s.substr(0, n))) << std::hex << cp << " prefix " << n;
    n_plain += expect;
  }
  EXPECT_EQ(n_plain, 0x110000u - 0x800 - 0x20 - 2);
  EXPECT_TRUE(is_plain_text("Zoë said: hi 🙂 — 中文"));
  EXPECT_FALSE(is_plain_text(""));
  EXPECT_FALSE(is_plain_text("a\"b"));
  EXPECT_FALSE(is_plain_text("a\\n"));
  EXPECT_FALSE(is_plain_text("a\nb"));
  EXPECT_FALSE(is_plain_text("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(is_plain_text("\xC1\xBF"));          // overlong
  EXPECT_FALSE(is_plain_text("\xE0\x80"));          // overlong 3-byte
  EXPECT_FALSE(is_plain_text("\xF0\x80"));          // overlong 4-byte
  EXPECT_FALSE(is_plain_text("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(is_plain_text("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(is_plain_text("\xF5"));
  EXPECT_FALSE(is_plain_text("\x80"));  // a continuation first
  EXPECT_FALSE(is_plain_text("\xC3 "));
}

TEST(PlainText, TrieSplitsTheVocabulary) {
  TokenTrie trie({"a", "\"", "é", "\xC3", "\xA9", "", "a\"", "\n", " b", "é\\"});
  EXPECT_EQ(trie.n_plain(), 4u);  // a, é, \xC3, " b"
  size_t n_rest = trie.rest_nodes().tokens.size();
  EXPECT_EQ(n_rest, 5u);  // ", \xA9, a", \n, é\ (not the empty one)
  for (int32_t id = 0; id < trie.n_vocab(); ++id)
    EXPECT_EQ(bit(trie.plain_mask(), id), is_plain_text(trie.bytes(id))) << id;
  for (int32_t id : trie.rest_nodes().tokens) EXPECT_FALSE(bit(trie.plain_mask(), id));
  EXPECT_EQ(trie.plain_nodes().tokens.size(), 4u);
}

// On a small vocabulary: the path is taken inside a string of any
// character (all of plain text, or up to a length), not where a character
// is excluded; the masks equal the token by token check.
TEST(PlainText, MaskPathOnASmallVocabulary) {
  const std::string a20(20, 'a');  // more characters than kPlainLevels
  static_assert(TokenTrie::kPlainLevels < 20);
  TokenTrie trie({"\"", "a", "ab", "a\"", "é", "\xC3", "\xA9", " ", "\n", "\\", "\\\"", "z ",
                  "🙂", "\xF0\x9F", "\"\n", "\x7F", a20, a20 + "\"", "abc"});
  auto plain_masks = [&](const std::string& gbnf, const std::string& text) {
    const MaskRun run = check_masks(compile_gbnf(gbnf), trie, text, 1);
    return run.n_plain;
  };
  // any character but '"' and '\\': the path inside (not mid-character)
  EXPECT_GT(plain_masks("root ::= \"\\\"\" [^\"\\\\]* \"\\\"\" \"\\n\"", "\"a é🙂z \"\n"), 0u);
  EXPECT_EQ(plain_masks("root ::= \"\\\"\" [^\"\\\\ ]* \"\\\"\"", "\"aé\""), 0u);  // no spaces
  EXPECT_EQ(plain_masks("root ::= \"\\\"\" [ -~]* \"\\\"\"", "\"a b\""), 0u);      // ASCII only
  EXPECT_GT(plain_masks("root ::= \"\\\"\" [^\"\\\\]{3,} \"\\\"\"", "\"abcd\""), 0u);
  // up to a length: a20 allowed while 20 more characters fit (walked: past
  // kPlainLevels), "abc" while 3 do, neither at the end
  EXPECT_EQ(plain_masks("root ::= \"\\\"\" [^\"\\\\]{0,21} \"\\\"\"", "\"a\""), 2u);
  EXPECT_EQ(plain_masks("root ::= \"\\\"\" [^\"\\\\]{0,20} \"\\\"\"", "\"a\""), 2u);
  EXPECT_EQ(plain_masks("root ::= \"\\\"\" [^\"\\\\]{0,3} \"\\\"\"", "\"abc\""), 3u);
  EXPECT_EQ(plain_masks("root ::= \"\\\"\" [^\"\\\\]{0,3} \"\\\"\"", "\"a🙂é\""), 3u);
}

// The Qwen3 vocabulary (151,669 tokens): the path taken inside plain
// strings (JSON and GBNF), the full walk elsewhere, masks always equal to
// the token by token check.
TEST(PlainText, MaskEqualsTokenByTokenCheckOnQwen3) {
  auto trie = qwen3_trie();
  if (!trie) GTEST_SKIP() << "no Qwen3 tokenizer in " << WICK_SHARED_DIR;
  EXPECT_GT(trie->n_plain(), 100000u);
  EXPECT_LT(trie->rest_nodes().n_nodes(), trie->n_nodes() / 3);
  // a string and a string with minLength (several states before the loop): the path
  const auto person = schema(R"({"type":"object","properties":{"name":{"type":"string"},
      "bio":{"type":"string","minLength":3}},"required":["name","bio"]})");
  const std::string answer = "{\"name\": \"Zoë 中文 🙂\", \"bio\": \"a \\\"b\\\" c\"}";
  const MaskRun on_person = check_masks(person, *trie, answer, 2);
  EXPECT_GE(on_person.n_plain, 10u);
  EXPECT_LT(on_person.n_plain, on_person.n_cuts);  // structural states walk all
  // a maxLength: the path up to the characters left, at each character
  // boundary inside (not mid-character, not where none is left)
  EXPECT_EQ(
      check_masks(schema(R"({"type":"string","maxLength":80})"), *trie, "\"abc dé\"", 1).n_plain,
      7u);
  EXPECT_EQ(check_masks(schema(R"({"type":"string","maxLength":3})"), *trie, "\"abc\"", 1).n_plain,
            3u);
  EXPECT_EQ(check_masks(schema(R"({"type":"string","maxLength":20})"), *trie,
                        "\"" + std::string(18, ' ') + "\"", 1)
                .n_plain,
            19u);
  // fall back: a pattern and GBNF classes exclude characters, an enum is a few words
  EXPECT_EQ(check_masks(schema(R"({"type":"string","pattern":"^[a-z ]+$"})"), *trie, "\"ab c\"", 1)
                .n_plain,
            0u);
  EXPECT_EQ(check_masks(schema(R"({"enum":["red","green","blue"]})"), *trie, "\"gre", 1).n_plain,
            0u);
  EXPECT_EQ(
      check_masks(compile_gbnf("root ::= \"<\" [^<>\"\\\\ ]* \">\""), *trie, "<abé>", 1).n_plain,
      0u);
  EXPECT_EQ(
      check_masks(compile_gbnf("root ::= \"<\" [\\x20-\\x7E]* \">\""), *trie, "<a b>", 1).n_plain,
      0u);
  // a non-JSON grammar whose text is any line: the path
  EXPECT_GT(
      check_masks(compile_gbnf("root ::= \"say: \" [^\\n]* \"\\n\""), *trie, "say: hé 🙂\n", 1)
          .n_plain,
      0u);
}

// Two bytes share a class exactly when every set of the grammar holds both
// or neither (the matcher computes one transition per class).
TEST(Gbnf, ByteClassesAreTheBytesInTheSameSets) {
  for (const std::string& gbnf :
       {std::string("root ::= \"\\\"\" [^\"\\\\]* \"\\\"\""),
        std::string("root ::= [a-c] [b-d]+ \"é\""),
        json_schema_to_gbnf(ojson::parse(
            R"({"type":"object","properties":{"a":{"type":"string","pattern":"^[0-9]{2}$"}}})"))}) {
    const auto g = compile_gbnf(gbnf);
    size_t n_bytes = 0;
    for (size_t c = 0; c < g->class_bytes.size(); ++c) {
      EXPECT_FALSE(g->class_bytes[c].empty());
      for (uint8_t b : g->class_bytes[c]) EXPECT_EQ(g->byte_class[b], c);
      n_bytes += g->class_bytes[c].size();
    }
    EXPECT_EQ(n_bytes, 256u);
    for (unsigned a = 0; a < 256; ++a)
      for (unsigned b = a + 1; b < 256; ++b) {
        bool same = true;
        for (const ByteSet& s : g->sets) same &= has_byte(s, uint8_t(a)) == has_byte(s, uint8_t(b));
        ASSERT_EQ(g->byte_class[a] == g->byte_class[b], same) << gbnf << " " << a << " " << b;
      }
    EXPECT_GT(g->class_bytes.size(), 2u);
  }
}
