// Tool-call parsers on fixed model outputs of each family's format: the
// calls and content at once, and the same when the output streams in split
// at every byte boundary (markup never reaches content); the format chosen
// from chat templates; the GBNF that forces a call.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "grammar/grammar.h"
#include "grammar/tool_call_grammar.h"
#include "helpers.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"

using namespace wick;
using wick::test::shared_dir;

namespace {

struct Case {
  const char* label;
  ToolFormat format;
  std::string output;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (compact JSON)
};

std::vector<Case> cases() {
  const auto H = ToolFormat::Hermes, L = ToolFormat::Llama3Json, M = ToolFormat::Mistral,
             A = ToolFormat::MistralArgs, G = ToolFormat::Granite;
  return {
      {"hermes one",
       H,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>",
       "",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {"hermes text then two calls, string arguments",
       H,
       "Let me check.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
       "\"{\\\"city\\\": \\\"Zürich\\\"}\"}\n</tool_call>",
       "Let me check.",
       {{"add", R"({"a":1,"b":2})"}, {"get_weather", R"({"city":"Zürich"})"}}},
      {"hermes think block stays content",
       H,
       "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
       "\"arguments\": {}}\n</tool_call>\n",
       "<think>\nI need the weather.\n</think>",
       {{"get_weather", "{}"}}},
      {"hermes text after a call",
       H,
       "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [1, \"}\"]}}</tool_call>\nDone.",
       "\nDone.",
       {{"f", R"({"x":[1,"}"]})"}}},
      {"hermes unclosed but complete",
       H,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n",
       "",
       {{"f", "{}"}}},
      {"hermes lookalikes",
       H,
       "a < b, <tool> and <tool_calls are text <",
       "a < b, <tool> and <tool_calls are text <",
       {}},
      {"hermes malformed kept as content",
       H,
       "Hm <tool_call>{\"name\": \"f\", \"arguments\": {oops}}</tool_call> end",
       "Hm <tool_call>{\"name\": \"f\", \"arguments\": {oops}}</tool_call> end",
       {}},
      {"hermes unfinished kept as content",
       H,
       "<tool_call>{\"name\": \"f\", \"argu",
       "<tool_call>{\"name\": \"f\", \"argu",
       {}},
      {"llama3 bare",
       L,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       "",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {"llama3 python tag",
       L,
       "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"a;b\"}}",
       "",
       {{"f", R"({"q":"a;b"})"}}},
      {"llama3 two calls",
       L,
       " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}",
       "",
       {{"a", "{}"}, {"b", R"({"x":1})"}}},
      {"llama3 plain JSON answer",
       L,
       "{\"answer\": 42, \"name\": \"x\"}",
       "{\"answer\": 42, \"name\": \"x\"}",
       {}},
      {"llama3 text with braces",
       L,
       "The set {1, 2} has {\"name\": 1}",
       "The set {1, 2} has {\"name\": 1}",
       {}},
      {"llama3 python code",
       L,
       "<|python_tag|>brave_search.call(query=\"x\")",
       "<|python_tag|>brave_search.call(query=\"x\")",
       {}},
      {"mistral two calls",
       M,
       "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}}, {\"name\": \"b\", "
       "\"arguments\": {}}]",
       "",
       {{"add", R"({"a":1})"}, {"b", "{}"}}},
      {"mistral marker hidden",
       M,
       "[{\"name\": \"add\", \"arguments\": {\"a\": 1}}]",
       "",
       {{"add", R"({"a":1})"}}},
      {"mistral text", M, "[a link](x) and [TOOL", "[a link](x) and [TOOL", {}},
      {"mistral args two calls",
       A,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]add[ARGS]{\"a\": 1}",
       "",
       {{"get_weather", R"({"city":"Paris"})"}, {"add", R"({"a":1})"}}},
      {"mistral args markers hidden",
       A,
       "get_weather{\"city\": \"Paris\"}",
       "",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {"mistral args text", A, "Hello world{x}", "Hello world{x}", {}},
      {"granite two calls",
       G,
       "<|tool_call|>[{\"name\": \"add\", \"arguments\": {\"a\": 1}}, {\"name\": \"b\", "
       "\"arguments\": {}}]",
       "",
       {{"add", R"({"a":1})"}, {"b", "{}"}}},
      {"granite text then a call",
       G,
       "Checking.<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}]",
       "Checking.",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {"granite marker hidden",
       G,
       " [{\"name\": \"add\", \"arguments\": {\"a\": 1}}]",
       "",
       {{"add", R"({"a":1})"}}},
      {"granite lists and brackets stay text",
       G,
       "[1, 2] and <|tool or [x]",
       "[1, 2] and <|tool or [x]",
       {}},
      {"granite malformed kept as content",
       G,
       "<|tool_call|>[{\"name\": \"f\", \"arguments\": {oops}}]",
       "<|tool_call|>[{\"name\": \"f\", \"arguments\": {oops}}]",
       {}},
      {"none parses nothing",
       ToolFormat::None,
       "<tool_call>{\"name\": \"f\"}</tool_call>",
       "<tool_call>{\"name\": \"f\"}</tool_call>",
       {}},
  };
}

// Content and calls of `output` pushed in the given pieces.
ParsedOutput run_pieces(ToolFormat f, const std::vector<std::string>& pieces,
                        std::vector<ToolEvent>* events = nullptr) {
  ToolCallParser p(f, "call_");
  ParsedOutput r;
  auto take = [&](std::vector<ToolEvent> ev) {
    for (auto& e : ev) {
      if (!e.is_call) r.content += e.content;
      if (events) events->push_back(e);
    }
  };
  for (auto& piece : pieces) take(p.push(piece));
  take(p.finish());
  r.calls = p.calls();
  return r;
}

void expect_case(const Case& c, const ParsedOutput& got, const std::string& how) {
  EXPECT_EQ(got.content, c.content) << c.label << " " << how;
  ASSERT_EQ(got.calls.size(), c.calls.size()) << c.label << " " << how;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, c.calls[i].first) << c.label << " " << how;
    EXPECT_EQ(got.calls[i].arguments, c.calls[i].second) << c.label << " " << how;
    EXPECT_EQ(got.calls[i].id, "call_" + std::to_string(i));
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(ToolCalls, FixedOutputsAtOnce) {
  for (const auto& c : cases()) expect_case(c, parse_tool_calls(c.format, c.output, "call_"), "");
}

TEST(ToolCalls, StreamedSplitAtEveryByte) {
  for (const auto& c : cases()) {
    for (size_t k = 0; k <= c.output.size(); ++k) {
      expect_case(c, run_pieces(c.format, {c.output.substr(0, k), c.output.substr(k)}),
                  "split at " + std::to_string(k));
      // and three pieces: the markup's bytes arriving one by one around k
      if (k + 1 < c.output.size())
        expect_case(c,
                    run_pieces(c.format, {c.output.substr(0, k), c.output.substr(k, 1),
                                          c.output.substr(k + 1)}),
                    "byte " + std::to_string(k) + " alone");
    }
    std::vector<std::string> bytes;
    for (char ch : c.output) bytes.emplace_back(1, ch);
    std::vector<ToolEvent> events;
    expect_case(c, run_pieces(c.format, bytes, &events), "byte by byte");
    // calls come in order, each once
    size_t next = 0;
    for (auto& e : events) {
      if (e.is_call) {
        EXPECT_EQ(e.index, next++) << c.label;
      }
    }
    EXPECT_EQ(next, c.calls.size()) << c.label;
  }
}

TEST(ToolCalls, ContentBeforeACallStreamsBeforeTheCallEnds) {
  ToolCallParser p(ToolFormat::Hermes, "c");
  auto ev = p.push("Sure, checking. <tool_");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].content, "Sure, checking.");  // the space and the tag's start held back
  EXPECT_TRUE(p.push("call>{\"name\": \"f\", ").empty());
  ev = p.push("\"arguments\": {}}</tool_call>");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].is_call);
  EXPECT_EQ(p.calls()[0].name, "f");
  // a held-back '<' that is not a tag is released as soon as that is certain
  EXPECT_TRUE(p.push(" ").empty());  // whitespace after a call waits for text
  ev = p.push("x <b");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].content, " x <b");
}

TEST(ToolCalls, FormatFromTemplateText) {
  WICK_REQUIRE_SHARED();
  const std::string tdir = std::string(WICK_SOURCE_DIR) + "/tests/templates/";
  EXPECT_EQ(detect_tool_format(Tokenizer::load(shared_dir() + "/tokenizers/qwen3")->chat_template),
            ToolFormat::Hermes);
  // Llama 3.0's template renders no tools
  EXPECT_EQ(detect_tool_format(Tokenizer::load(shared_dir() + "/tokenizers/llama3")->chat_template),
            ToolFormat::None);
  EXPECT_EQ(detect_tool_format(read_text(tdir + "llama31_tools.jinja")), ToolFormat::Llama3Json);
  EXPECT_EQ(detect_tool_format(read_text(tdir + "mistral_tools.jinja")), ToolFormat::Mistral);
  EXPECT_EQ(detect_tool_format(read_text(tdir + "mistral.jinja")), ToolFormat::None);
  EXPECT_EQ(detect_tool_format("{% for c in m.tool_calls %}[TOOL_CALLS]{{ c.name }}[ARGS]{{ "
                               "c.arguments }}{% endfor %}"),
            ToolFormat::MistralArgs);
  EXPECT_EQ(detect_tool_format(read_text(tdir + "granite_tools.jinja")), ToolFormat::Granite);
  EXPECT_EQ(detect_tool_format("{{'<|im_start|>' + message['role'] + '\\n'}}"), ToolFormat::None);
  EXPECT_STREQ(tool_format_name(ToolFormat::Llama3Json), "llama3_json");
}

TEST(ToolCallGrammar, HermesText) {
  const std::string g = tool_call_gbnf(ToolFormat::Hermes, {"get_weather", "add"}, false);
  EXPECT_EQ(g.substr(0, g.find("object ::=")),
            "root ::= call\n"
            "call ::= \"<tool_call>\" ws call-json ws \"</tool_call>\"\n"
            "call-json ::= fn-0 | fn-1\n"
            "fn-0 ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws \"\\\"get_weather\\\"\" ws \",\" ws "
            "\"\\\"arguments\\\"\" ws \":\" ws object ws \"}\"\n"
            "fn-1 ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws \"\\\"add\\\"\" ws \",\" ws "
            "\"\\\"arguments\\\"\" ws \":\" ws object ws \"}\"\n");
  for (const char* rule :
       {"object ::=", "array ::=", "value ::=", "string ::=", "number ::=", "ws ::="})
    EXPECT_NE(g.find(std::string("\n") + rule), std::string::npos) << rule;
  EXPECT_NE(tool_call_gbnf(ToolFormat::Hermes, {"f"}, true).find("root ::= call ( ws call )*\n"),
            std::string::npos);
}

TEST(ToolCallGrammar, EachFormatsMarkup) {
  const std::string l = tool_call_gbnf(ToolFormat::Llama3Json, {"f"}, true);
  EXPECT_NE(l.find("root ::= call-json ( ws \";\" ws call-json )*"), std::string::npos);
  EXPECT_NE(l.find("\\\"parameters\\\""), std::string::npos);
  const std::string m = tool_call_gbnf(ToolFormat::Mistral, {"f"}, false);
  EXPECT_NE(m.find("root ::= \"[TOOL_CALLS]\" ws \"[\" ws call-json ws \"]\""), std::string::npos);
  const std::string a = tool_call_gbnf(ToolFormat::MistralArgs, {"f", "g"}, false);
  EXPECT_NE(a.find("call ::= \"[TOOL_CALLS]\" ( fn-0 | fn-1 )\n"), std::string::npos) << a;
  EXPECT_NE(a.find("fn-1 ::= \"g\" \"[ARGS]\" object\n"), std::string::npos) << a;  // bare names
  const std::string g = tool_call_gbnf(ToolFormat::Granite, {"f"}, true);
  EXPECT_NE(g.find("root ::= \"<|tool_call|>\" ws \"[\" ws call-json ( ws \",\" ws call-json )* ws "
                   "\"]\"\n"),
            std::string::npos)
      << g;
  // the template-less default is Hermes markup
  EXPECT_EQ(tool_call_gbnf(ToolFormat::None, {"f"}, false),
            tool_call_gbnf(ToolFormat::Hermes, {"f"}, false));
  EXPECT_THROW(tool_call_gbnf(ToolFormat::Hermes, {}, false), std::invalid_argument);
}

TEST(ToolCallGrammar, NamesEscaped) {
  EXPECT_EQ(grammar::gbnf_literal("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\x01\"");
  // a name with a quote: JSON-escaped inside the call, then GBNF-escaped
  const std::string g = tool_call_gbnf(ToolFormat::Hermes, {"we\"ird"}, false);
  EXPECT_NE(g.find("ws \"\\\"we\\\\\\\"ird\\\"\" ws"), std::string::npos) << g;
}
