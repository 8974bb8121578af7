// Reasoning split from answers: the parser alone (streamed at every split
// point equals the whole), which prompts open it, and each API's writer
// (OpenAI chat reasoning_content, Ollama thinking, a Responses reasoning item)
// streamed and whole, with tool calls after the reasoning.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "helpers.h"
#include "server/parse_ollama.h"
#include "server/parse_openai.h"
#include "server/parse_responses.h"
#include "server/write_ollama.h"
#include "server/write_openai.h"
#include "server/write_responses.h"
#include "server_helpers.h"
#include "text/reasoning.h"
#include "text/tokenizer.h"

namespace wick {
namespace {

using test::shared_dir;

struct Case {
  const char* text;
  bool open;
  const char* reasoning;
  const char* content;
};

TEST(Reasoning, SplitsTheLeadingThinkBlock) {
  const Case cases[] = {
      {"<think>\nLet me see.\n</think>\n\nParis.", false, "\nLet me see.\n", "Paris."},
      {"\n<think>a</think>b", false, "a", "b"},  // whitespace before the tag
      {"Paris. <think>x</think>", false, "", "Paris. <think>x</think>"},  // only at the start
      {"  Paris.", false, "", "  Paris."},  // leading whitespace stays content
      {"<thinking>x", false, "", "<thinking>x"},
      {"<thi", false, "", "<thi"},  // a prefix of the tag at the end
      {"<think>never closed", false, "never closed", ""},
      {"<think>a</think", false, "a</think", ""},  // a prefix of the close tag at the end
      {"<think></think>\n\nHi", false, "", "Hi"},
      {"I should answer.\n</think>\n\nHi", true, "I should answer.\n",
       "Hi"},  // opened by the prompt
      {"", false, "", ""},
  };
  for (const Case& c : cases) {
    const SplitReasoning whole = split_reasoning(c.text, c.open);
    EXPECT_EQ(whole.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(whole.content, c.content) << c.text;
    // streamed in two pieces at every split point, and byte by byte
    const std::string text = c.text;
    for (size_t at = 0; at <= text.size(); ++at) {
      ReasoningParser p(c.open);
      SplitReasoning got;
      for (auto pieces : {p.push(text.substr(0, at)), p.push(text.substr(at)), p.finish()})
        for (auto& piece : pieces) (piece.reasoning ? got.reasoning : got.content) += piece.text;
      EXPECT_EQ(got.reasoning, whole.reasoning) << text << " split at " << at;
      EXPECT_EQ(got.content, whole.content) << text << " split at " << at;
    }
    ReasoningParser p(c.open);
    SplitReasoning got;
    auto take = [&](const std::vector<ReasoningPiece>& pieces) {
      for (auto& piece : pieces) {
        EXPECT_FALSE(piece.text.empty());
        (piece.reasoning ? got.reasoning : got.content) += piece.text;
      }
    };
    for (char ch : text) take(p.push(std::string(1, ch)));
    take(p.finish());
    EXPECT_EQ(got.reasoning, whole.reasoning) << text;
    EXPECT_EQ(got.content, whole.content) << text;
  }
}

TEST(Reasoning, PromptsThatOpenIt) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
  EXPECT_TRUE(template_has_reasoning("{% if x %}<think>\n\n</think>{% endif %}"));
  EXPECT_FALSE(template_has_reasoning("<|im_start|>{{ message.content }}"));
}

}  // namespace

namespace server {
namespace {

const char* kAnswer =
    "<think>\nThe user wants the weather.\n</think>\n\nChecking.\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

class ReasoningWriters : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { qwen3_ = load_qwen3_model(); }
  void SetUp() override {
    if (!qwen3_) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << shared_dir());
  }
  ModelView view(bool reasoning = true) const {
    return {.tokenizer = *(*qwen3_)->tokenizer,
            .name = "qwen3",
            .n_ctx = 4096,
            .tool_format = ToolFormat::Hermes,
            .reasoning = reasoning};
  }
  // kAnswer in pieces of 5 bytes, then its end.
  template <typename Writer>
  static std::string stream(Writer& w, const GenerateResult& g) {
    std::string out;
    const std::string text = kAnswer;
    for (size_t at = 0; at < text.size(); at += 5) out += w.text(0, text.substr(at, 5), {});
    return out + w.done(0, g);
  }
  static inline std::shared_ptr<const LoadedModel>* qwen3_ = nullptr;  // never freed
  const GenerateResult g_{.tokens = {1, 2}, .text = kAnswer, .stop_reason = "eos", .n_prompt = 5};
};

TEST_F(ReasoningWriters, ParsersSetItFromTheModelAndThePrompt) {
  const json chat = json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_TRUE(parse_openai(chat, true, view(), 1).reasoning.split);
  EXPECT_FALSE(parse_openai(chat, true, view(), 1).reasoning.open);  // Qwen3 lets the model open it
  EXPECT_FALSE(
      parse_openai(chat, true, view(false), 1).reasoning.split);  // --reasoning-format none
  EXPECT_FALSE(parse_openai(json::parse(R"({"prompt": "hi"})"), false, view(), 1).reasoning.split);
  const json ollama =
      json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_TRUE(parse_ollama(ollama, true, view(), 1).reasoning.split);
  // Ollama's think: false is Qwen3's enable_thinking false (the template closes the block)
  json no_think = ollama;
  no_think["think"] = false;
  json kwargs = json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
                                "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(parse_ollama(no_think, true, view(), 1).gen.prompt,
            parse_openai(kwargs, true, view(), 1).gen.prompt);
  json think = ollama;
  think["think"] = true;
  EXPECT_EQ(error_of([&] { parse_ollama(think, true, view(false), 1); }).param, "think");
  json raw = json::parse(R"({"model": "m", "prompt": "hi", "raw": true})");
  EXPECT_FALSE(parse_ollama(raw, false, view(), 1).reasoning.split);
}

TEST_F(ReasoningWriters, OpenAiChatHasReasoningContent) {
  OpenAiRequest r;
  r.chat = true;
  r.tools.format = ToolFormat::Hermes;
  r.reasoning.split = true;
  const json whole = openai_response(r, {"chatcmpl-1", 1, "m"}, {g_}, *(*qwen3_)->tokenizer);
  const json& msg = whole["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "\nThe user wants the weather.\n");
  EXPECT_EQ(msg["content"], "Checking.");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");

  OpenAiStream w(r, {"chatcmpl-1", 1, "m"}, *qwen3_);
  std::string reasoning, content;
  int n_calls = 0;
  const std::string sse = stream(w, g_);
  for (size_t at = 0; (at = sse.find("data: {", at)) != std::string::npos; ++at) {
    const json c = json::parse(sse.substr(at + 6, sse.find("\n\n", at) - at - 6));
    const json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls") && d["tool_calls"][0].contains("id")) ++n_calls;
  }
  EXPECT_EQ(reasoning, msg["reasoning_content"]);
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(n_calls, 1);

  r.reasoning.split = false;  // off: the tags stay in the content
  const json plain = openai_response(r, {"chatcmpl-2", 1, "m"}, {g_}, *(*qwen3_)->tokenizer);
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_NE(plain["choices"][0]["message"]["content"].get<std::string>().find("<think>"),
            std::string::npos);
}

TEST_F(ReasoningWriters, OllamaHasThinking) {
  for (bool chat : {true, false}) {
    OllamaRequest r;
    r.chat = chat;
    r.model = "m";
    r.reasoning.split = true;
    GenerateResult g = g_;
    g.text = "<think>hmm</think>\n\nParis.";
    const json whole = ollama_final(r, Clock::now(), g, true);
    const json& where = chat ? whole["message"] : whole;
    EXPECT_EQ(where["thinking"], "hmm");
    EXPECT_EQ(where[chat ? "content" : "response"], "Paris.");
    OllamaStream w(r, *qwen3_, Clock::now());
    std::string thinking, text;
    std::string lines;  // in order: the writer keeps state
    for (const char* piece : {"<think>h", "mm</thi", "nk>\n\nParis."})
      lines += w.text(0, piece, {});
    lines += w.done(0, g);
    for (size_t at = 0, end; (end = lines.find('\n', at)) != std::string::npos; at = end + 1) {
      const json o = json::parse(lines.substr(at, end - at));
      const json& x = chat ? o["message"] : o;
      if (x.contains("thinking")) thinking += x["thinking"].get<std::string>();
      text += x[chat ? "content" : "response"].get<std::string>();
    }
    EXPECT_EQ(thinking, "hmm");
    EXPECT_EQ(text, "Paris.");
  }
}

TEST_F(ReasoningWriters, ResponsesHaveAReasoningItem) {
  const ResponsesRequest r = parse_responses(
      json::parse(R"({"input": "x", "tools": [{"type": "function", "name": "get_weather"}]})"),
      view(), 1, json::array());
  ASSERT_TRUE(r.chat.reasoning.split);
  ResponseBuilder whole(r, "resp_ab", "m", *qwen3_);
  whole.text(kAnswer, {});
  whole.finish(g_);
  const json& out = whole.response()["output"];
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["content"][0]["text"], "\nThe user wants the weather.\n");
  EXPECT_EQ(out[0]["status"], "completed");
  EXPECT_EQ(out[1]["content"][0]["text"], "Checking.");
  EXPECT_EQ(out[2]["type"], "function_call");
  ResponseBuilder streamed(r, "resp_ab", "m", *qwen3_);
  std::string sse = streamed.start();
  const std::string text = kAnswer;
  for (size_t at = 0; at < text.size(); at += 3) sse += streamed.text(text.substr(at, 3), {});
  sse += streamed.finish(g_);
  EXPECT_EQ(streamed.response()["output"], out);
  EXPECT_NE(sse.find("event: response.reasoning_text.delta"), std::string::npos);
  // the next turn replays the answer without its reasoning (templates drop it)
  EXPECT_EQ(whole.assistant_message()["content"], "Checking.");
  EXPECT_EQ(whole.assistant_message()["tool_calls"].size(), 1u);
}

}  // namespace
}  // namespace server
}  // namespace wick
