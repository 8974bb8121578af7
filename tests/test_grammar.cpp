// The grammar engine: GBNF parsing (accepts, rejects, errors with their
// position), the pushdown matcher, the token trie's mask against a token by
// token check on a real 150k vocabulary, and the JSON-schema compiler.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_trie.h"
#include "text/tokenizer.h"

using namespace wick::grammar;
using ojson = nlohmann::ordered_json;

namespace {

bool full_match(const std::string& gbnf, const std::string& text) {
  Matcher m(compile_gbnf(gbnf));
  return m.advance(text) && m.can_end();
}

bool prefix_ok(const std::string& gbnf, const std::string& text) {
  Matcher m(compile_gbnf(gbnf));
  return m.advance(text);
}

std::string error_of(const std::string& gbnf) {
  try {
    compile_gbnf(gbnf);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "no error";
}

bool schema_match(const ojson& schema, const std::string& text) {
  return full_match(json_schema_to_gbnf(schema), text);
}

std::string schema_error(const ojson& schema) {
  try {
    json_schema_to_gbnf(schema);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Gbnf, LiteralsAlternationAndGroups) {
  const std::string g = "root ::= \"ab\" (\"c\" | \"de\") x\nx ::= \"!\" | \"?\"\n";
  EXPECT_TRUE(full_match(g, "abc!"));
  EXPECT_TRUE(full_match(g, "abde?"));
  EXPECT_FALSE(full_match(g, "abd?"));
  EXPECT_FALSE(full_match(g, "abc"));  // a prefix, not a match
  EXPECT_TRUE(prefix_ok(g, "abc"));
  EXPECT_FALSE(prefix_ok(g, "abx"));
}

TEST(Gbnf, Repetitions) {
  EXPECT_TRUE(full_match("root ::= \"a\"*", ""));
  EXPECT_TRUE(full_match("root ::= \"a\"*", "aaaa"));
  EXPECT_FALSE(full_match("root ::= \"a\"+", ""));
  EXPECT_TRUE(full_match("root ::= \"a\"+ \"b\"?", "aab"));
  EXPECT_TRUE(full_match("root ::= \"a\"+ \"b\"?", "aa"));
  const std::string g = "root ::= [0-9]{2,4}";
  EXPECT_FALSE(full_match(g, "1"));
  EXPECT_TRUE(full_match(g, "12"));
  EXPECT_TRUE(full_match(g, "1234"));
  EXPECT_FALSE(prefix_ok(g, "12345"));
  EXPECT_TRUE(full_match("root ::= \"x\"{3}", "xxx"));
  EXPECT_FALSE(full_match("root ::= \"x\"{3}", "xx"));
  EXPECT_TRUE(full_match("root ::= \"x\"{2,}", "xxxxxx"));
  EXPECT_FALSE(full_match("root ::= \"x\"{2,}", "x"));
  EXPECT_TRUE(full_match("root ::= \"x\"{,2}", ""));
  EXPECT_FALSE(prefix_ok("root ::= \"x\"{,2}", "xxx"));
  EXPECT_TRUE(full_match("root ::= (\"ab\" \"c\")+", "abcabc"));  // a group repeated
  EXPECT_TRUE(full_match("root ::= \"ab\"*", "abab"));            // a literal repeated whole
  EXPECT_FALSE(full_match("root ::= \"ab\"*", "aba"));
}

TEST(Gbnf, CharacterClassesAndUtf8) {
  EXPECT_TRUE(full_match("root ::= [a-c]+", "abcabc"));
  EXPECT_FALSE(full_match("root ::= [a-c]+", "abd"));
  EXPECT_TRUE(full_match("root ::= [^a-c]+", "xyz"));
  EXPECT_FALSE(full_match("root ::= [^a-c]+", "xaz"));
  // non-ASCII: a class over characters matches their UTF-8 bytes
  EXPECT_TRUE(full_match("root ::= [α-ω]+", "λμ"));
  EXPECT_FALSE(full_match("root ::= [α-ω]+", "λA"));
  EXPECT_TRUE(full_match("root ::= [^\"]*", "héllo 世界 🙂"));
  EXPECT_FALSE(full_match("root ::= [^\"]*", "a\"b"));
  EXPECT_TRUE(full_match("root ::= .", "🙂"));
  EXPECT_TRUE(prefix_ok("root ::= .", "\xF0\x9F"));        // half a character so far
  EXPECT_FALSE(prefix_ok("root ::= .", "\xF0\x20"));       // never valid UTF-8
  EXPECT_FALSE(prefix_ok("root ::= .*", "\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(full_match("root ::= .", "ab"));
}

TEST(Gbnf, EscapesCommentsAndLayout) {
  EXPECT_TRUE(full_match("root ::= \"\\n\\t\\\"\\\\\\x41\\u00e9\"", "\n\t\"\\Aé"));
  EXPECT_TRUE(full_match("root ::= [\\]\\[]+", "][]"));
  const std::string g =
      "# a comment\n"
      "root ::= item (\",\" item)*  # trailing comment\n"
      "item ::= (\n"
      "    \"a\"\n"
      "  | \"b\"\n"
      ")\n"
      "other ::= \"x\"\n"
      "  | \"y\"\n";
  EXPECT_TRUE(full_match(g, "a,b,a"));
  EXPECT_FALSE(full_match(g, "a,,b"));
  EXPECT_TRUE(full_match("root ::= x\nx ::= \"1\" x | \"\"", "111"));  // right recursion
}

TEST(Gbnf, ErrorsSayWhereAndWhat) {
  EXPECT_EQ(error_of("x ::= \"a\""), "grammar line 1, column 1: the grammar has no 'root' rule");
  EXPECT_EQ(error_of("root ::= \"a\" missing\n"),
            "grammar line 1, column 14: undefined rule 'missing'");
  EXPECT_EQ(error_of("root ::= \"a\n"), "grammar line 1, column 10: unterminated string literal");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "grammar line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(error_of("root ::= [z-a]"),
            "grammar line 1, column 14: character range 0x7a-0x61 is reversed");
  EXPECT_EQ(error_of("root := \"a\""),
            "grammar line 1, column 6: expected '::=' after rule name 'root'");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""),
            "grammar line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(error_of("root ::= (\"a\""),
            "grammar line 1, column 14: expected ')' to close the group");
  EXPECT_EQ(error_of("root ::= * \"a\""),
            "grammar line 1, column 10: '*' with nothing before it to repeat");
  EXPECT_EQ(error_of("root ::= \"a\"{3,1}"),
            "grammar line 1, column 18: repetition {3,1}: max below min");
  EXPECT_EQ(error_of("root ::= [^\\x00-\\U0010FFFF]"),
            "grammar line 1, column 10: the character class matches nothing");
  EXPECT_EQ(error_of("root ::= a\na ::= a \"x\" | \"y\""),
            "grammar: left recursion (a -> a) would never end; rewrite it with repetition");
  EXPECT_EQ(error_of("root ::= \"a\"{200000}"),
            "grammar line 1, column 19: repetition count too large (at most 100000)");
}

TEST(Matcher, EndStates) {
  Matcher m(compile_gbnf("root ::= \"a\" \"b\"?"));
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.advance("a"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.must_end());  // "b" may follow
  EXPECT_FALSE(m.advance("c"));
  EXPECT_TRUE(m.can_end());  // a rejected advance leaves the state
  ASSERT_TRUE(m.advance("b"));
  EXPECT_TRUE(m.must_end());
}

TEST(Matcher, MaskOfASmallVocabulary) {
  TokenTrie trie({"{", "}", "\"", "a", "ab", "{\"", "\"}", "", "b", "\xC3", "\xA9", "ab\""});
  Matcher m(compile_gbnf("root ::= \"{\" (\"\\\"\" [a-zé]* \"\\\"\")? \"}\""));
  auto bits = [&] {
    const auto& mask = m.allowed(trie);
    std::vector<int> ids;
    for (int id = 0; id < trie.n_vocab(); ++id)
      if ((mask[size_t(id) >> 6] >> (id & 63)) & 1) ids.push_back(id);
    return ids;
  };
  EXPECT_EQ(bits(), (std::vector<int>{0, 5}));  // "{" and "{\""
  ASSERT_TRUE(m.advance("{"));
  EXPECT_EQ(bits(), (std::vector<int>{1, 2}));  // not "} : a key is a string
  ASSERT_TRUE(m.advance("\""));
  // letters, the first byte of é (a token may end inside a character), closing quotes
  EXPECT_EQ(bits(), (std::vector<int>{2, 3, 4, 6, 8, 9, 11}));
  ASSERT_TRUE(m.advance("\xC3"));
  EXPECT_EQ(bits(), (std::vector<int>{10}));
}

// The trie walk gives, on the real Qwen3 vocabulary, exactly the tokens
// that a token-by-token check accepts, in the states a JSON output passes.
TEST(Matcher, MaskEqualsTokenByTokenCheckOnQwen3) {
  const std::string dir = std::string(WICK_SHARED_DIR) + "/tokenizers/qwen3";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  auto tk = wick::Tokenizer::load(dir);
  auto trie = TokenTrie::from_tokenizer(*tk);
  ASSERT_EQ(trie->n_vocab(), tk->n_vocab());
  const ojson schema = ojson::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},
      "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},"required":["name","age"]})");
  Matcher m(compile_gbnf(json_schema_to_gbnf(schema)));
  const std::string text = "{\"name\": \"Zoë \\\"Z\\\"\", \"age\": -12, \"tags\": [\"a\", \"b\"]}";
  size_t n_checked = 0;
  for (size_t cut = 0; cut <= text.size(); cut += 3) {
    Matcher at = m;
    ASSERT_TRUE(at.advance(text.substr(0, cut))) << cut;
    const auto mask = at.allowed(*trie);
    size_t n_allowed = 0;
    for (int32_t id = 0; id < trie->n_vocab(); ++id) {
      const bool in_mask = (mask[size_t(id) >> 6] >> (id & 63)) & 1;
      const bool expect = !trie->bytes(id).empty() && at.would_accept(trie->bytes(id));
      ASSERT_EQ(in_mask, expect) << "cut " << cut << " token " << id << " '" << trie->bytes(id)
                                 << "'";
      n_allowed += in_mask;
    }
    if (!at.must_end()) {
      EXPECT_GT(n_allowed, 0u) << cut;
    }
    ++n_checked;
  }
  EXPECT_GT(n_checked, 10u);
  ASSERT_TRUE(m.advance(text));
  EXPECT_TRUE(m.must_end());
}

TEST(Matcher, TokenBytesOfByteLevelAndSpecialTokens) {
  const std::string dir = std::string(WICK_SHARED_DIR) + "/tokenizers/qwen3";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  auto tk = wick::Tokenizer::load(dir);
  const auto ids = tk->encode(" héllo");
  std::string joined;
  for (int32_t id : ids) joined += tk->token_bytes(id);
  EXPECT_EQ(joined, " héllo");
  auto trie = TokenTrie::from_tokenizer(*tk);
  EXPECT_EQ(trie->bytes(151645), "");  // <|im_end|>: special, never in a mask
}

TEST(JsonSchema, TypesAndObjects) {
  const ojson s = ojson::parse(R"({"type":"object","properties":{
      "a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["a"]})");
  EXPECT_TRUE(schema_match(s, R"({"a": 1})"));
  EXPECT_TRUE(schema_match(s, R"({"a":-3,"b":"x","c":true})"));
  EXPECT_TRUE(schema_match(s, R"({"a": 0, "c": false})"));  // optional b left out
  EXPECT_FALSE(schema_match(s, R"({"b": "x"})"));           // required a missing
  EXPECT_FALSE(schema_match(s, R"({"a": 1.5})"));
  EXPECT_FALSE(schema_match(s, R"({"a": 01})"));
  EXPECT_FALSE(schema_match(s, R"({"a": 1, "d": 2})"));    // undeclared
  EXPECT_FALSE(schema_match(s, R"({"b": "x", "a": 1})"));  // the schema's order
  EXPECT_TRUE(schema_match(ojson::parse(R"({"type":"number"})"), "-1.25e+3"));
  EXPECT_TRUE(schema_match(ojson::parse(R"({"type":["string","null"]})"), "null"));
  EXPECT_TRUE(schema_match(ojson::parse(R"({"type":"string"})"), R"("a\"b\\c\u00e9 ü")"));
  EXPECT_FALSE(schema_match(ojson::parse(R"({"type":"string"})"), "\"a\nb\""));  // raw control
}

TEST(JsonSchema, BoundedWhitespace) {
  const ojson s = ojson::parse(R"({"type":"object","properties":{"a":{"type":"null"}}})");
  EXPECT_TRUE(schema_match(s, "{\n  \"a\" : null\n}"));
  EXPECT_FALSE(prefix_ok(json_schema_to_gbnf(s), "{" + std::string(40, ' ')));
}

TEST(JsonSchema, EnumConstArraysAnyOf) {
  EXPECT_TRUE(
      schema_match(ojson::parse(R"({"enum":["red",1,null,{"k":[true]}]})"), R"({"k":[true]})"));
  EXPECT_FALSE(schema_match(ojson::parse(R"({"enum":["red","green"]})"), R"("blue")"));
  EXPECT_TRUE(schema_match(ojson::parse(R"({"const":"x"})"), R"("x")"));
  const ojson arr =
      ojson::parse(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
  EXPECT_FALSE(schema_match(arr, "[1]"));
  EXPECT_TRUE(schema_match(arr, "[1, 2]"));
  EXPECT_TRUE(schema_match(arr, "[1,2,3]"));
  EXPECT_FALSE(schema_match(arr, "[1,2,3,4]"));
  EXPECT_TRUE(schema_match(ojson::parse(R"({"type":"array"})"), "[]"));
  const ojson any = ojson::parse(
      R"({"anyOf":[{"type":"integer"},{"type":"object","properties":{"x":{"type":"string"}},"required":["x"]}]})");
  EXPECT_TRUE(schema_match(any, "7"));
  EXPECT_TRUE(schema_match(any, R"({"x":"y"})"));
  EXPECT_FALSE(schema_match(any, R"("7")"));
}

TEST(JsonSchema, RefsPatternsFormats) {
  const ojson tree = ojson::parse(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
      "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"]}}})");
  EXPECT_TRUE(schema_match(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(schema_match(tree, R"({"v":1,"kids":[{}]})"));
  const ojson code = ojson::parse(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}(x|yz)?$"})");
  EXPECT_TRUE(schema_match(code, R"("AB-123")"));
  EXPECT_TRUE(schema_match(code, R"("AB-123yz")"));
  EXPECT_FALSE(schema_match(code, R"("AB-12")"));
  EXPECT_FALSE(schema_match(code, R"("ab-123")"));
  EXPECT_TRUE(schema_match(ojson::parse(R"({"type":"string","pattern":"a\"b"})"), R"("a\"b")"));
  EXPECT_TRUE(
      schema_match(ojson::parse(R"({"type":"string","format":"date"})"), R"("2024-02-29")"));
  EXPECT_FALSE(
      schema_match(ojson::parse(R"({"type":"string","format":"date"})"), R"("2024-13-01")"));
  EXPECT_TRUE(schema_match(ojson::parse(R"({"type":"string","format":"uuid"})"),
                           R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(schema_match(ojson::parse(R"({"type":"string","format":"date-time"})"),
                           R"("2024-01-02T03:04:05Z")"));
  EXPECT_TRUE(
      schema_match(ojson::parse(R"({"type":"string","format":"email"})"), R"("a.b@example.com")"));
  EXPECT_TRUE(
      schema_match(ojson::parse(R"({"type":"string","minLength":2,"maxLength":3})"), R"("abc")"));
  EXPECT_FALSE(
      schema_match(ojson::parse(R"({"type":"string","minLength":2,"maxLength":3})"), R"("a")"));
}

// vLLM's guided_regex: the plain-text strings a regex matches as a whole,
// against std::regex (ECMAScript) on strings of an alphabet that holds the
// patterns' characters and the ones a JSON string would escape.
TEST(GuidedRegex, MatchesWhatStdRegexMatches) {
  const char* patterns[] = {"[A-Z]{2}-\\d{3}(x|yz)?",
                            "a\"b\\\\c",
                            "(ab|a)*b",
                            "\\(\\d{3}\\) \\d{2}-\\d",
                            ".{2,4}",
                            "[^a-c]+",
                            "\\w+\\s\\w*",
                            "^(yes|no)!?$",
                            "a{0,2}b{2}",
                            "x.y",
                            "[\"\\\\]z",
                            "(?:0|1)+\\n?"};
  const std::string alphabet = "abcxyz019AZ -()!\"\\\n\t";
  std::mt19937 rng(5);
  for (const char* p : patterns) {
    SCOPED_TRACE(p);
    const auto g = compile_gbnf(regex_to_gbnf(p));
    const std::regex re(p);
    int n_matched = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s(rng() % 9, ' ');
      for (char& c : s) c = alphabet[rng() % alphabet.size()];
      Matcher m(g);
      const bool got = m.advance(s) && m.can_end();
      ASSERT_EQ(got, std::regex_match(s, re)) << "'" << s << "'";
      n_matched += got;
    }
    for (const char* yes : {"AB-123yz", "a\"b\\c", "aabab", "(123) 45-6", "yes!", "bb", "x\"y",
                            "\"z", "0110\n", "ab c", "xyz"})
      if (std::regex_match(yes, re)) {
        Matcher m(g);
        EXPECT_TRUE(m.advance(yes) && m.can_end()) << yes;
        ++n_matched;
      }
    EXPECT_GT(n_matched, 0);  // the check saw matches, not only misses
  }
  EXPECT_THROW(regex_to_gbnf("(?=a)b"), GrammarError);
  EXPECT_THROW(regex_to_gbnf("a{2"), GrammarError);
  EXPECT_THROW(regex_to_gbnf("*a"), GrammarError);
}

TEST(GuidedRegex, ChoicesAreExactlyTheirStrings) {
  const std::vector<std::string> choices = {"yes", "no", "a \"quoted\" \\ one", "\u591a", "no way"};
  const auto g = choice_to_gbnf(choices);
  for (const auto& c : choices) EXPECT_TRUE(full_match(g, c)) << c;
  for (const char* other : {"", "ye", "yesno", "No", "no wa", "a \"quoted\" one"})
    EXPECT_FALSE(full_match(g, other)) << other;
  EXPECT_TRUE(prefix_ok(g, "no w"));
  EXPECT_THROW(choice_to_gbnf({}), GrammarError);
  EXPECT_THROW(choice_to_gbnf({"a", ""}), GrammarError);
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  EXPECT_EQ(
      schema_error(ojson::parse(
          R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}},"minProperties":1})")),
      "unsupported JSON schema keywords: minProperties (at /), minimum (at /properties/n)");
  EXPECT_EQ(schema_error(ojson::parse(R"({"type":"string","format":"hostname"})")),
            "unsupported JSON schema keywords: format \"hostname\" (at /; supported: date, time, "
            "date-time, uuid, email, ipv4)");
  EXPECT_EQ(schema_error(ojson::parse(R"({"type":"strin"})")),
            "JSON schema at /type: unknown type \"strin\"");
  EXPECT_EQ(schema_error(ojson::parse(R"({"$ref":"#/$defs/missing"})")),
            "JSON schema at /$ref: \"#/$defs/missing\" is not defined");
  EXPECT_EQ(schema_error(ojson::parse(R"~({"type":"string","pattern":"(?=a)"})~")),
            "JSON schema at /pattern: pattern \"(?=a)\" (offset 1): lookarounds and named groups "
            "are not supported");
}

TEST(JsonSchema, EmbedsInALargerGrammar) {
  // the seam for tool calls: a schema's rules under another name, inside GBNF
  const std::string call = json_schema_to_gbnf(
      ojson::parse(
          R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"),
      {.root_name = "call", .rule_prefix = "call-"});
  const std::string g = "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n" + call;
  EXPECT_TRUE(full_match(g, "<tool_call>\n{\"city\": \"Paris\"}\n</tool_call>"));
  EXPECT_FALSE(full_match(g, "<tool_call>\n{}\n</tool_call>"));
  EXPECT_TRUE(full_match(json_object_gbnf(), R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(full_match(json_object_gbnf(), "[1]"));
}

// A request's grammar is user input: what would blow up is refused or bounded.
TEST(Gbnf, HostileGrammarsStayCheap) {
  EXPECT_NE(error_of("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'))
                .find("groups nest deeper than 256 levels"),
            std::string::npos);
  // a long chain of rules: checked without recursion; matched up to the
  // expansion limit, past it the matcher matches nothing (and does not crash)
  auto chain = [](int n) {
    std::string g = "root ::= r0\n";
    for (int i = 0; i < n; ++i)
      g += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
    return g + "r" + std::to_string(n) + " ::= \"x\"\n";
  };
  EXPECT_TRUE(full_match(chain(2000), "x"));
  Matcher too_deep(compile_gbnf(chain(20000)));
  EXPECT_FALSE(too_deep.advance("x"));
  EXPECT_FALSE(too_deep.can_end());
  TokenTrie trie({"x"});
  EXPECT_EQ(too_deep.allowed(trie)[0], 0u);
  // alternatives that double at every level meet again: expanded once each
  std::string twice = "root ::= d0\n";
  for (int i = 0; i < 40; ++i)
    twice += "d" + std::to_string(i) + " ::= d" + std::to_string(i + 1) + " | d" +
             std::to_string(i + 1) + "\n";
  twice += "d40 ::= \"y\"\n";
  EXPECT_TRUE(full_match(twice, "y"));
  ojson deep = ojson::parse(R"({"$ref":"#/$defs/d0","$defs":{}})");
  for (int i = 0; i < 300; ++i)
    deep["$defs"]["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  deep["$defs"]["d300"] = {{"type", "null"}};
  EXPECT_NE(schema_error(deep).find("nests deeper than 128 levels"), std::string::npos);
}
