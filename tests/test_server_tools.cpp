// Tools in the server without a socket: tools / tool_choice /
// parallel_tool_calls parsed (and their 400s), the forcing grammar set for
// "required" and named functions, history calls rendered, calls in each
// API's response and stream, and logprobs carried by streamed chunks.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "grammar/matcher.h"
#include "grammar/tool_call_grammar.h"
#include "helpers.h"
#include "server/parse_ollama.h"
#include "server/parse_openai.h"
#include "server/write_ollama.h"
#include "server/write_openai.h"
#include "server_helpers.h"
#include "text/tokenizer.h"

namespace wick::server {
namespace {

using test::shared_dir;

const char* kTools = R"("tools": [
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
   "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add"}}])";
const char* kMsgs = R"("messages": [{"role": "user", "content": "Weather in Paris?"}])";

class ServerTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { qwen3_ = load_qwen3_model(); }
  void SetUp() override {
    if (!qwen3_) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << shared_dir());
  }
  const Tokenizer& tk() const { return *(*qwen3_)->tokenizer; }
  ModelView view() const {
    return {.tokenizer = tk(), .name = "qwen3", .n_ctx = 4096, .tool_format = ToolFormat::Hermes};
  }
  OpenAiRequest openai(const std::string& body) const {
    return parse_openai(json::parse(body), true, view(), 1);
  }
  static inline std::shared_ptr<const LoadedModel>* qwen3_ = nullptr;  // never freed
};

TEST_F(ServerTools, ToolChoiceModes) {
  const std::string base = std::string("{") + kMsgs + ", " + kTools;
  const OpenAiRequest def = openai(base + "}");  // auto
  EXPECT_EQ(def.tools.format, ToolFormat::Hermes);
  EXPECT_TRUE(def.tools.parallel);
  EXPECT_FALSE(def.gen.grammar);
  // the tools reach the template (Qwen3 lists them in a system turn)
  EXPECT_NE(tk().decode(def.gen.prompt, false).find("\"get_weather\""), std::string::npos);

  const OpenAiRequest none = openai(base + R"(, "tool_choice": "none"})");
  EXPECT_EQ(none.tools.format, ToolFormat::None);  // not parsed, not offered
  EXPECT_EQ(none.gen.prompt, openai(std::string("{") + kMsgs + "}").gen.prompt);

  const OpenAiRequest req = openai(base + R"(, "tool_choice": "required"})");
  // required: a Hermes call to get_weather or add, arguments per the function's schema
  auto matches = [](const GenerateRequest& g, const std::string& text) {
    grammar::Matcher mt(g.grammar);
    return mt.advance(text) && mt.can_end();
  };
  const std::string add = R"(<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>)";
  const std::string weather =
      R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>)";
  ASSERT_TRUE(req.gen.grammar);
  EXPECT_TRUE(matches(req.gen, add));
  EXPECT_TRUE(matches(req.gen, add + "\n" + weather));
  EXPECT_FALSE(matches(req.gen, "The capital is Paris."));
  EXPECT_FALSE(matches(req.gen, R"(<tool_call>{"name": "nope", "arguments": {}}</tool_call>)"));
  // get_weather's schema: "city" is required and a string, no other keys
  for (const char* args : {"{}", R"({"city": 3})", R"({"town": "Paris"})"})
    EXPECT_FALSE(matches(req.gen, fmt::format(R"(<tool_call>{{"name": "get_weather", )"
                                              R"("arguments": {}}}</tool_call>)",
                                              args)))
        << args;
  // add has no parameters schema: any object
  EXPECT_TRUE(
      matches(req.gen, R"(<tool_call>{"name": "add", "arguments": {"x": [1]}}</tool_call>)"));
  const OpenAiRequest named =
      openai(base + R"(, "tool_choice": {"type": "function", "function": {"name": "add"}},
                 "parallel_tool_calls": false})");
  EXPECT_FALSE(named.tools.parallel);
  ASSERT_TRUE(named.gen.grammar);
  EXPECT_TRUE(matches(named.gen, add));
  EXPECT_FALSE(matches(named.gen, weather));
  EXPECT_FALSE(matches(named.gen, add + "\n" + add));  // parallel_tool_calls false: one call
  // Ollama: tools, no tool_choice
  const OllamaRequest o =
      parse_ollama(json::parse(std::string(R"({"model": "m", )") + kMsgs + ", " + kTools + "}"),
                   true, view(), 1);
  EXPECT_EQ(o.tools.format, ToolFormat::Hermes);
  EXPECT_EQ(o.gen.prompt, def.gen.prompt);
}

TEST_F(ServerTools, BadToolsAre400sNamingTheField) {
  const std::string m = std::string("{") + kMsgs + ", ";
  struct Bad {
    std::string body, param, says;
  };
  for (const Bad& b : std::vector<Bad>{
           {m + R"("tools": {}})", "tools", "must be an array"},
           {m + R"("tools": [1]})", "tools[0]", "must be an object"},
           {m + R"("tools": [{"type": "code"}]})", "tools[0].type", "\"function\""},
           {m + R"("tools": [{"function": {"name": ""}}]})", "tools[0].function.name",
            "non-empty string"},
           {m + R"("tools": [{"function": {"name": "f", "parameters": 3}}]})",
            "tools[0].function.parameters", "must be an object"},
           {m + R"("tool_choice": "required"})", "tool_choice", "needs 'tools'"},
           {m + kTools + R"(, "tool_choice": "always"})", "tool_choice", "\"required\""},
           {m + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}}})",
            "tool_choice", "'nope', which is not in 'tools'"},
           {m + kTools + R"(, "parallel_tool_calls": 1})", "parallel_tool_calls", "boolean"},
       }) {
    const ApiError e = error_of([&] { openai(b.body); });
    EXPECT_EQ(e.status, 400) << b.body;
    EXPECT_EQ(e.param, b.param) << b.body;
    EXPECT_NE(e.message.find(b.says), std::string::npos) << e.message;
  }
}

// An assistant turn with calls and the tool results render as the template
// writes them; OpenAI's string arguments render as the object would.
TEST_F(ServerTools, HistoryWithCallsAndResults) {
  auto body = [](const std::string& args) {
    return std::string("{") + kTools + R"(, "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": )" +
           args + R"(}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]})";
  };
  const OpenAiRequest as_string = openai(body(R"("{\"city\":\"Paris\"}")"));
  const OpenAiRequest as_object = openai(body(R"({"city": "Paris"})"));
  EXPECT_EQ(as_string.gen.prompt, as_object.gen.prompt);
  const std::string text = tk().decode(as_object.gen.prompt, false);
  EXPECT_NE(text.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                      "\"Paris\"}}\n</tool_call>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<tool_response>\n{\"temp\": 21}\n</tool_response>"), std::string::npos)
      << text;
}

const std::string kTwoCalls =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";

TEST_F(ServerTools, OpenAiResponseCalls) {
  OpenAiRequest r;
  r.chat = true;
  r.tools.format = ToolFormat::Hermes;
  const GenerateResult g{.tokens = {1, 2}, .text = kTwoCalls, .stop_reason = "eos", .n_prompt = 4};
  json c = openai_response(r, {"chatcmpl-9", 1, "m"}, {g}, tk())["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_TRUE(c["message"]["content"].is_null());
  EXPECT_EQ(
      c["message"]["tool_calls"].dump(),
      R"([{"id":"call_9_0_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},)"
      R"({"id":"call_9_0_1","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}}])");
  r.tools.parallel = false;
  c = openai_response(r, {"chatcmpl-9", 1, "m"}, {g}, tk())["choices"][0];
  EXPECT_EQ(c["message"]["tool_calls"].size(), 1u);
  // no call: plain content, finish "stop"
  const GenerateResult plain{.tokens = {1}, .text = "Sunny.", .stop_reason = "eos"};
  c = openai_response(r, {"chatcmpl-9", 1, "m"}, {plain}, tk())["choices"][0];
  EXPECT_EQ(c["message"].dump(), R"({"role":"assistant","content":"Sunny."})");
  EXPECT_EQ(c["finish_reason"], "stop");
}

// Every data line of an SSE string as JSON.
std::vector<json> sse(const std::string& s) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = s.find("data: ", at)) != std::string::npos) {
    const size_t end = s.find("\n\n", at);
    out.push_back(json::parse(s.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}

TEST_F(ServerTools, OpenAiStreamCalls) {
  OpenAiRequest r;
  r.chat = true;
  r.tools.format = ToolFormat::Hermes;
  OpenAiStream w(r, {"chatcmpl-5", 1, "m"}, *qwen3_);
  std::vector<json> chunks;
  // the output arrives in pieces that split the markup
  for (const std::string piece :
       {"Checking.\n<tool", "_call>\n{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>",
        "\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"})
    for (auto& c : sse(w.text(0, piece, {}))) chunks.push_back(c);
  for (auto& c : sse(w.done(0, GenerateResult{.tokens = {1}, .stop_reason = "eos"})))
    chunks.push_back(c);
  std::string content;
  json calls = json::array();
  for (auto& c : chunks) {
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    EXPECT_EQ(d.dump().find("<tool_call"), std::string::npos) << "markup leaked: " << d.dump();
    if (d.contains("tool_calls")) calls.push_back(d["tool_calls"][0]);
  }
  EXPECT_EQ(content, "Checking.");
  ASSERT_EQ(calls.size(), 4u);  // per call: name first, then the arguments
  EXPECT_EQ(
      calls[0].dump(),
      R"({"index":0,"id":"call_5_0_0","type":"function","function":{"name":"get_weather","arguments":""}})");
  EXPECT_EQ(calls[1].dump(), R"({"index":0,"function":{"arguments":"{\"city\":\"Paris\"}"}})");
  EXPECT_EQ(calls[2]["index"], 1);
  EXPECT_EQ(calls[2]["function"]["name"], "add");
  EXPECT_EQ(calls[3]["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");
}

// Each chunk carries the logprobs of its tokens; a token whose text never
// came (the end token) rides on the last chunk; together they are the
// non-streaming answer's.
TEST_F(ServerTools, OpenAiStreamLogprobs) {
  const int32_t hello = tk().encode("Hello")[0], world = tk().encode(" world")[0];
  const std::vector<TokenLogprob> lps = {{hello, -0.5f, {{hello, -0.5f}, {world, -2.0f}}},
                                         {world, -0.25f, {{world, -0.25f}}},
                                         {hello, -0.125f, {{hello, -0.125f}}}};
  const GenerateResult g{.tokens = {hello, world, hello},
                         .text = "Hello world",
                         .stop_reason = "eos",
                         .logprobs = lps};
  for (bool chat : {true, false}) {
    OpenAiRequest r;
    r.chat = chat;
    r.gen.top_logprobs = 2;
    OpenAiStream w(r, {"x-1", 1, "m"}, *qwen3_);
    std::string s = w.text(0, "Hello", {lps[0]});
    s += w.text(0, " world", {lps[1]});
    s += w.done(0, g);
    json streamed = chat ? json::array() : json::object();
    for (auto& c : sse(s)) {
      const json& lp = c["choices"][0]["logprobs"];
      if (lp.is_null()) continue;
      if (chat) {
        for (auto& t : lp["content"]) streamed.push_back(t);
      } else {
        for (auto& [k, v] : lp.items())
          for (auto& x : v) streamed[k].push_back(x);
      }
    }
    const json whole = openai_response(r, {"x-1", 1, "m"}, {g}, tk())["choices"][0]["logprobs"];
    EXPECT_EQ(streamed, chat ? whole["content"] : whole) << "chat " << chat;
  }
}

// Ollama's logprobs, top level: each line carries its tokens' (the final
// line the end token's), together the whole answer's; top_logprobs appear
// only when asked for, and nothing when logprobs are off.
TEST_F(ServerTools, OllamaStreamLogprobs) {
  const int32_t hello = tk().encode("Hello")[0], world = tk().encode(" world")[0];
  for (int32_t n_top : {-1, 0, 2}) {
    std::vector<TokenLogprob> lps = {{hello, -0.5f, {{hello, -0.5f}, {world, -2.0f}}},
                                     {world, -0.25f, {{world, -0.25f}, {hello, -3.0f}}},
                                     {hello, -0.125f, {{hello, -0.125f}, {world, -4.0f}}}};
    if (n_top < 1)
      for (auto& t : lps) t.top.clear();
    const GenerateResult g{.tokens = {hello, world, hello},
                           .text = "Hello world",
                           .stop_reason = "eos",
                           .logprobs = n_top < 0 ? std::vector<TokenLogprob>{} : lps};
    for (bool chat : {true, false}) {
      OllamaRequest r;
      r.chat = chat;
      r.model = "m";
      r.gen.top_logprobs = n_top;
      // what the engine hands each piece: token k's logprobs when asked
      auto of = [&](size_t k) { return n_top < 0 ? g.logprobs : std::vector{lps[k]}; };
      OllamaStream w(r, *qwen3_, Clock::now());
      std::string s = w.text(0, "Hello", of(0));
      s += w.text(0, " world", of(1));
      s += w.done(0, g);
      json streamed = json::array();
      size_t n_lines = 0;
      for (size_t at = 0, end; (end = s.find('\n', at)) != std::string::npos; at = end + 1) {
        const json o = json::parse(s.substr(at, end - at));
        ++n_lines;
        EXPECT_EQ(o.contains("logprobs"), n_top >= 0) << o.dump();
        if (o.contains("logprobs"))
          for (auto& t : o["logprobs"]) streamed.push_back(t);
      }
      EXPECT_EQ(n_lines, 3u);
      const json whole = ollama_response(r, tk(), Clock::now(), g);
      if (n_top < 0) {
        EXPECT_FALSE(whole.contains("logprobs"));
        continue;
      }
      EXPECT_EQ(streamed, whole["logprobs"]) << "chat " << chat;
      ASSERT_EQ(whole["logprobs"].size(), 3u);
      EXPECT_EQ(whole["logprobs"][1]["token"], " world");
      EXPECT_EQ(whole["logprobs"][1]["logprob"], -0.25);
      EXPECT_EQ(whole["logprobs"][1]["bytes"], json::array({32, 119, 111, 114, 108, 100}));
      EXPECT_EQ(whole["logprobs"][0].contains("top_logprobs"), n_top > 0);
      if (n_top > 0) {
        EXPECT_EQ(whole["logprobs"][2]["top_logprobs"][1]["token"], " world");
      }
    }
  }
}

TEST_F(ServerTools, OllamaCalls) {
  OllamaRequest r;
  r.chat = true;
  r.model = "m";
  r.tools.format = ToolFormat::Hermes;
  const GenerateResult g{.tokens = {1}, .text = kTwoCalls, .stop_reason = "eos"};
  const json fin = ollama_final(r, Clock::now(), g, true);
  EXPECT_EQ(fin["message"]["content"], "");
  EXPECT_EQ(fin["message"]["tool_calls"].dump(),
            R"([{"function":{"name":"get_weather","arguments":{"city":"Paris"}}},)"
            R"({"function":{"name":"add","arguments":{"a":1}}}])");
  OllamaStream w(r, *qwen3_, Clock::now());
  std::string s = w.text(0, kTwoCalls.substr(0, 30), {});
  s += w.text(0, kTwoCalls.substr(30), {});
  s += w.done(0, g);
  std::vector<json> lines;
  for (size_t at = 0, end; (end = s.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(json::parse(s.substr(at, end - at)));
  ASSERT_EQ(lines.size(), 3u);  // a line per call, then the final one
  EXPECT_EQ(lines[0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(lines[0]["message"]["content"], "");
  EXPECT_EQ(lines[1]["message"]["tool_calls"][0]["function"]["arguments"], json({{"a", 1}}));
  EXPECT_EQ(lines[2]["done"], true);
}

}  // namespace
}  // namespace wick::server
