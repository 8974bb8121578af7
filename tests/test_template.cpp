// Chat templates against transformers' apply_chat_template
// (tests/python/make_template_fixtures.py): exact string equality, and the
// same raise_exception errors. Plus text bad-input cases.
#include <gtest/gtest.h>

#include "helpers.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace wick::test {
namespace {

TEST(ChatTemplate, MatchesTransformers) {
  const std::string path = data_dir() + "/text/templates.json";
  if (!std::filesystem::exists(path)) WICK_SKIP_OR_FAIL("fixtures missing: " << path);
  std::ifstream in(path);
  auto cases = nlohmann::ordered_json::parse(in);
  std::map<std::string, std::pair<int, int>> per;  // template -> (passed, total)
  int shown = 0;
  std::map<std::string, std::string> shipped;  // templates in ../shared tokenizer configs
  for (auto& c : cases) {
    const std::string name = c["template"];
    std::string source;
    if (c.contains("source")) {
      source = c["source"];
    } else {
      const std::string dir = shared_dir() + "/tokenizers/" + c["file"].get<std::string>();
      if (!shipped.count(dir)) shipped[dir] = Tokenizer::load(dir)->chat_template;
      source = shipped[dir];
    }
    ChatTemplate t(source, name);
    auto& [ok, total] = per[name];
    ++total;
    std::string got, err;
    try {
      got = t.render(c["vars"]);
    } catch (const jinja::TemplateError& e) {
      err = e.what();
    }
    bool pass = c.contains("error") ? err.find(c["error"].get<std::string>()) != std::string::npos
                                    : err.empty() && got == c["expect"].get<std::string>();
    ok += pass;
    if (!pass && shown++ < 4)
      ADD_FAILURE() << name << " / " << c["conversation"]
                    << "\n got:  " << nlohmann::json(got).dump() << "\n err:  " << err
                    << "\n want: "
                    << (c.contains("expect") ? c["expect"].dump() : c["error"].dump());
  }
  for (auto& [name, r] : per) {
    std::printf("[ report ] template %-9s %d/%d equal to transformers\n", name.c_str(), r.first,
                r.second);
    EXPECT_EQ(r.first, r.second) << name;
  }
  EXPECT_GE(per.size(), 6u);
}

TEST(ChatTemplate, SyntaxErrorsNameTheLine) {
  auto expect_error = [](const std::string& src, const std::string& piece) {
    try {
      ChatTemplate t(src, "t.jinja");
      t.render(nlohmann::ordered_json{{"messages", nlohmann::ordered_json::array()}});
      ADD_FAILURE() << "no error for: " << src;
    } catch (const jinja::TemplateError& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    }
  };
  expect_error("line one\n{% if x %}\nno end", "line 3");
  expect_error("a\nb\n{{ 1 + }}", "line 3");
  expect_error("{% for x in y %}{% endif %}", "missing '{% endfor %}'");
  expect_error("\n\n\n{{ x | nosuchfilter }}", "line 4: unknown filter 'nosuchfilter'");
  expect_error("{% frobnicate %}", "unknown statement 'frobnicate'");
  expect_error("{{ 'unterminated }}", "unterminated string");
  expect_error("{{ raise_exception('boom') }}", "boom");
  expect_error("{{ 1 / 0 }}", "division by zero");
  expect_error("{{ (1, 1, 2)[ ] }}", "empty subscript");  // found by fuzz_jinja
  expect_error("{{ [1, 2][0 1] }}", "expected ':' or ']'");
}

// A render is bounded: loops, range(), strings, lists, macro recursion,
// nesting in the source and cycles through a namespace each fail with an
// error naming the bound instead of hanging or exhausting memory.
TEST(ChatTemplate, RendersAreBounded) {
  auto expect_error = [](const std::string& src, const std::string& piece) {
    try {
      ChatTemplate t(src, "t.jinja");
      t.render(nlohmann::ordered_json{{"messages", nlohmann::ordered_json::array()}});
      ADD_FAILURE() << "no error for: " << src;
    } catch (const jinja::TemplateError& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    }
  };
  expect_error("{% for i in range(10 ** 12) %}x{% endfor %}", "range() of 1000000000000 items");
  expect_error("{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}",
               "past 100000 loop iterations");
  expect_error("{% for i in range(1000) %}{{ 'x' * 20000 }}{% endfor %}",
               "would pass 16777216 bytes");
  expect_error("{{ 'x' * 1000000000 }}", "would pass 16777216 bytes");
  expect_error("{{ [1, 2] * 1000000000 }}", "a list would pass 100000 items");
  expect_error(
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      "would pass 16777216 bytes");
  expect_error("{% set s = 'a' * 10000 %}{{ s.replace('a', s) }}", "would pass 16777216 bytes");
  expect_error("{{ 'a\nb' | indent(1000000000) }}", "width must be in [0, 1024]");
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
               "macro calls nest deeper than 100 levels");
  expect_error("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}",
               "nest deeper than 100 levels");
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  expect_error(ifs, "nest deeper than 100 levels");
  expect_error("{{ " + std::string(1000, '-') + "1 }}", "nest deeper than 100 levels");
  expect_error("{{ '\\uZZZZ' }}", "\\u needs four hexadecimal digits");  // fuzz_jinja
  expect_error("{% set ns = namespace(x=none) %}{% set ns.x = ns %}{{ ns | tojson }}",
               "nesting deeper than 256 levels");
  expect_error("{% set ns = namespace(x=none) %}{% set ns.x = ns %}{{ ns == ns }}",
               "nests deeper than 256 levels");
  // a huge exponent takes no time (squaring); what is in bounds still renders; an empty
  // string or list repeated 4**15 times is empty at once (fuzz_jinja: once a hang)
  ChatTemplate ok(
      "{{ (2 ** 999999999999) is number }}{% for i in range(1000) %}{% endfor %}x"
      "{{ '' * 4 ** 15 }}{{ ([] * 4 ** 15) | length }}",
      "ok");
  EXPECT_EQ(ok.render(nlohmann::ordered_json::object()), "Truex0");
}

TEST(TextBadInput, ClearErrors) {
  WICK_REQUIRE_SHARED();
  auto tk = Tokenizer::load(shared_dir() + "/tokenizers/qwen3/tokenizer.json");
  try {
    tk->encode("ok \xff\xfe bad");
    ADD_FAILURE() << "invalid UTF-8 accepted";
  } catch (const TextError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tk->decode(std::vector<int32_t>{1, 999999}), TextError);
  EXPECT_THROW(tk->decode(std::vector<int32_t>{-1}), TextError);
  auto expect_load_error = [](const std::string& json, const std::string& piece) {
    try {
      Tokenizer::from_json(json, "bad/tokenizer.json");
      ADD_FAILURE() << "accepted: " << json;
    } catch (const TextError& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad/tokenizer.json"), std::string::npos) << e.what();
    }
  };
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {", "not valid JSON");
  expect_load_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
                    "unsupported model type 'WordPiece'");
  expect_load_error("{\"model\": {\"type\": \"BPE\"}}", "malformed tokenizer");
  expect_load_error(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": "
      "{\"type\": \"Whatever\"}}",
      "unsupported pre-tokenizer 'Whatever'");
  expect_load_error(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": "
      "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"}}}",
      "regex");
  EXPECT_THROW(Tokenizer::load(data_dir() + "/no/such/tokenizer.json"), TextError);
}

}  // namespace
}  // namespace wick::test
