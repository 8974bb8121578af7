// The server's request parsers and response writers, called directly on JSON
// (no socket, no engine): each API's fields and defaults map to the right
// GenerateRequest, invalid bodies are 400s naming the field, and the stream
// writers produce the bytes clients parse.
#include <gtest/gtest.h>

#include <memory>
#include <string>

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

constexpr uint64_t kRandomSeed = 0xABCDEF;  // what the server would draw when no seed is sent

class ServerParse : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::exists(shared_dir() + "/tokenizers/qwen3"))
      qwen3_ = Tokenizer::load(shared_dir() + "/tokenizers/qwen3").release();
  }
  void SetUp() override {
    if (!qwen3_) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << shared_dir());
  }
  ModelView view(int32_t n_ctx = 4096) const { return {*qwen3_, "qwen3", n_ctx}; }
  // What the chat template makes of one user turn.
  std::vector<int32_t> user_turn(const std::string& text, const std::string& system = "") const {
    std::string s;
    if (!system.empty()) s += "<|im_start|>system\n" + system + "<|im_end|>\n";
    s += "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
    return qwen3_->encode(s, {.add_special = false, .parse_special = true});
  }
  OpenAiRequest openai(const std::string& body, bool chat, int32_t n_ctx = 4096) const {
    return parse_openai(json::parse(body), chat, view(n_ctx), kRandomSeed);
  }
  OllamaRequest ollama(const std::string& body, bool chat, int32_t n_ctx = 4096) const {
    return parse_ollama(json::parse(body), chat, view(n_ctx), kRandomSeed);
  }
  static inline Tokenizer* qwen3_ = nullptr;  // loaded once, never freed (like the model pool)
};

#define EXPECT_CONTAINS(s, piece)                          \
  EXPECT_NE(std::string(s).find(piece), std::string::npos) \
      << "'" << (s) << "' lacks '" << (piece) << "'"

TEST_F(ServerParse, OpenAiChatDefaults) {
  const OpenAiRequest r =
      openai(R"({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})", true);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "smollm2");
  EXPECT_EQ(r.gen.prompt, user_turn("hi"));
  const SamplingParams& s = r.gen.sampling;  // OpenAI's: plain sampling at temperature 1
  EXPECT_FLOAT_EQ(s.temperature, 1.0f);
  EXPECT_FLOAT_EQ(s.top_p, 1.0f);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_FLOAT_EQ(s.min_p, 0.0f);
  EXPECT_FLOAT_EQ(s.repeat_penalty, 1.0f);
  EXPECT_EQ(s.repeat_last_n, 0);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.0f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, 0.0f);
  EXPECT_EQ(s.seed, kRandomSeed);
  EXPECT_EQ(r.gen.max_tokens, 4096 - int32_t(r.gen.prompt.size()));  // the room left
  EXPECT_TRUE(r.gen.stop.empty());
  EXPECT_EQ(r.gen.top_logprobs, -1);
  EXPECT_EQ(r.n_choices, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.usage_in_stream);
}

TEST_F(ServerParse, OpenAiChatFields) {
  const OpenAiRequest r = openai(R"({
      "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
                   {"role": "user", "content": "hi"}],
      "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repeat_penalty": 1.2,
      "presence_penalty": 1.5, "frequency_penalty": -0.5, "seed": 42, "max_tokens": 17,
      "stop": "###", "n": 3, "stream": true, "stream_options": {"include_usage": true}})",
                                 true);
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.gen.prompt, user_turn("hi", "Be brief."));  // developer -> system, parts joined
  const SamplingParams& s = r.gen.sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 5);
  EXPECT_FLOAT_EQ(s.min_p, 0.1f);
  EXPECT_FLOAT_EQ(s.repeat_penalty, 1.2f);
  EXPECT_EQ(s.repeat_last_n, 0);
  EXPECT_FLOAT_EQ(s.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_EQ(s.seed, 42u);
  EXPECT_EQ(r.gen.max_tokens, 17);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"###"});
  EXPECT_EQ(r.n_choices, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.usage_in_stream);
}

TEST_F(ServerParse, OpenAiChatTemplateKwargs) {
  const OpenAiRequest r = openai(R"({"messages": [{"role": "user", "content": "hi"}],
                                     "chat_template_kwargs": {"enable_thinking": false}})",
                                 true);
  std::vector<int32_t> want = user_turn("hi");
  const auto think = qwen3_->encode("<think>\n\n</think>\n\n", {.parse_special = true});
  want.insert(want.end(), think.begin(), think.end());
  EXPECT_EQ(r.gen.prompt, want);
}

TEST_F(ServerParse, OpenAiMaxTokens) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  // max_completion_tokens wins over max_tokens; both are capped to the room left.
  EXPECT_EQ(
      openai("{" + msgs + R"(, "max_completion_tokens": 5, "max_tokens": 9})", true).gen.max_tokens,
      5);
  EXPECT_EQ(openai("{" + msgs + R"(, "max_completion_tokens": null, "max_tokens": 9})", true)
                .gen.max_tokens,
            9);
  const OpenAiRequest small = openai("{" + msgs + R"(, "max_tokens": 16777216})", true, 64);
  EXPECT_EQ(small.gen.max_tokens, 64 - int32_t(small.gen.prompt.size()));
}

TEST_F(ServerParse, OpenAiLogprobs) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(openai("{" + msgs + R"(, "logprobs": true, "top_logprobs": 3})", true).gen.top_logprobs,
            3);
  EXPECT_EQ(openai("{" + msgs + R"(, "logprobs": true})", true).gen.top_logprobs, 0);
  EXPECT_EQ(openai("{" + msgs + R"(, "logprobs": false})", true).gen.top_logprobs, -1);
  EXPECT_EQ(openai(R"({"prompt": "x", "logprobs": 2})", false).gen.top_logprobs, 2);
  EXPECT_EQ(openai(R"({"prompt": "x", "logprobs": 0})", false).gen.top_logprobs, 0);
  EXPECT_EQ(openai(R"({"prompt": "x"})", false).gen.top_logprobs, -1);
  // and while streaming
  EXPECT_EQ(openai("{" + msgs + R"(, "logprobs": true, "top_logprobs": 2, "stream": true})", true)
                .gen.top_logprobs,
            2);
  EXPECT_EQ(openai(R"({"prompt": "x", "logprobs": 1, "stream": true})", false).gen.top_logprobs, 1);
}

TEST_F(ServerParse, OpenAiCompletions) {
  const OpenAiRequest text = openai(
      R"({"prompt": "The capital of France is", "stop": ["\n", "."], "seed": 7, "temperature": 0})",
      false);
  EXPECT_FALSE(text.chat);
  EXPECT_EQ(text.gen.prompt, qwen3_->encode("The capital of France is", {.add_special = true}));
  EXPECT_EQ(text.gen.stop, (std::vector<std::string>{"\n", "."}));
  EXPECT_EQ(text.gen.sampling.seed, 7u);
  EXPECT_FLOAT_EQ(text.gen.sampling.temperature, 0.0f);
  const OpenAiRequest ids = openai(R"({"prompt": [1, 504, 3575], "max_tokens": 4, "n": 2})", false);
  EXPECT_EQ(ids.gen.prompt, (std::vector<int32_t>{1, 504, 3575}));
  EXPECT_EQ(ids.gen.max_tokens, 4);
  EXPECT_EQ(ids.n_choices, 2);
  EXPECT_TRUE(ids.token_prompts);  // ids the client laid out (--span-markers reads them)
  EXPECT_FALSE(text.token_prompts);
  const OpenAiRequest lists = openai(R"({"prompt": [[1, 504], [3575]]})", false);
  EXPECT_EQ(lists.gen.prompt, (std::vector<int32_t>{1, 504}));
  EXPECT_EQ(lists.more_prompts, (std::vector<std::vector<int32_t>>{{3575}}));
  EXPECT_TRUE(lists.token_prompts);
  EXPECT_FALSE(openai(R"({"prompt": ["a", "b"]})", false).token_prompts);
}

struct BadBody {
  bool chat;
  std::string body;
  const char* param;
  const char* message;  // a piece of it
};

TEST_F(ServerParse, OpenAiErrorsNameTheField) {
  const std::string m = R"("messages": [{"role": "user", "content": "hi"}], )";
  const BadBody cases[] = {
      {true, R"({})", "messages", "'messages' is required"},
      {true, R"({"messages": "hi"})", "messages", "'messages' must be an array"},
      {true, R"({"messages": []})", "messages", "must not be empty"},
      {true, R"({"messages": [{"content": "x"}]})", "messages[0].role", "must be a string"},
      {true, R"({"messages": [{"role": "user"}, {"role": "wizard"}]})", "messages[1].role",
       "'wizard' is not one of"},
      {true, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "a string or an array of parts"},
      {true, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages",
       "only text content parts"},
      {true, R"({"messages": [{"role": "user", "content": [{"type": -9223372036854775808}]}]})",
       "messages", "only text content parts"},  // a type that is not a string (fuzz_request)
      {true, "{" + m + R"("tools": [{"type": "function", "function": {"name": "f"}}],
                        "tool_choice": {"type": 7}})",
       "tool_choice", "tool_choice must be"},
      {true, "{" + m + R"("model": 5})", "model", "'model' must be a string"},
      {true, "{" + m + R"("tools": {}})", "tools", "'tools' must be an array"},
      {true, "{" + m + R"("temperature": "hot"})", "temperature", "'temperature' must be a number"},
      {true, "{" + m + R"("temperature": -1})", "temperature", "temperature must be in [0, 100]"},
      {true, "{" + m + R"("temperature": 3})", "temperature", "temperature must be in [0, 2]"},
      {true, "{" + m + R"("top_p": 5})", "top_p", "top_p must be in (0, 1]"},
      {true, "{" + m + R"("top_k": -2})", "top_k", "top_k must be >= 0"},
      {true, "{" + m + R"("top_k": 1.5})", "top_k", "'top_k' must be an integer"},
      {true, "{" + m + R"("seed": "x"})", "seed", "'seed' must be an integer"},
      {true, "{" + m + R"("presence_penalty": 9})", "presence_penalty", "in [-2, 2]"},
      {true, "{" + m + R"("frequency_penalty": -3})", "frequency_penalty", "in [-2, 2]"},
      {true, "{" + m + R"("max_tokens": -5})", "max_tokens", "max_tokens must be in [1, 16777216]"},
      {true, "{" + m + R"("max_tokens": 1000000000000})", "max_tokens", "[1, 16777216]"},
      {true, "{" + m + R"("max_completion_tokens": 0})", "max_completion_tokens", "[1, 16777216]"},
      {true, "{" + m + R"("n": 9})", "n", "'n' must be in [1, 8]"},
      {true, "{" + m + R"("stop": 7})", "stop", "a string or an array of strings"},
      {true, "{" + m + R"("stop": ["a", 1]})", "stop", "a string or an array of strings"},
      {true, "{" + m + R"("stop": ["a", "b", "c", "d", "e"]})", "stop", "at most 4 strings"},
      {true, "{" + m + R"("stop": [""]})", "stop", "must not be empty"},
      {true, "{" + m + R"("stream": "yes"})", "stream", "'stream' must be a boolean"},
      {true, "{" + m + R"("logprobs": true, "top_logprobs": 50})", "top_logprobs", "[0, 20]"},
      {true, "{" + m + R"("top_logprobs": 2})", "top_logprobs", "needs logprobs: true"},
      {true, "{" + m + R"("logprobs": 1})", "logprobs", "'logprobs' must be a boolean"},
      {false, R"({})", "prompt", "'prompt' is required"},
      {false, R"({"prompt": 42})", "prompt", "an array of token ids, or an array of either"},
      {false, R"({"prompt": ""})", "prompt", "'prompt' is empty"},
      {false, R"({"prompt": [1, 2, 99999999]})", "prompt", "token id 99999999 is outside"},
      {false, R"({"prompt": [-1]})", "prompt", "token id -1 is outside"},
      {false, R"({"prompt": []})", "prompt", "an array of token ids, or an array of either"},
      {false, R"({"prompt": [1, "x"]})", "prompt", "an array of token ids, or an array of either"},
      {false, R"({"prompt": [1, 2.5]})", "prompt", "an array of token ids, or an array of either"},
      {false, R"({"prompt": [1, 4294967297]})", "prompt", "token id 4294967297 is outside"},
      {false, R"({"prompt": [[1, 2], "x"]})", "prompt", "strings or arrays of token ids, not both"},
      {false, R"({"prompt": [[1, [2]]]})", "prompt",
       "an array of token ids, or an array of either"},
      {false, R"({"prompt": [[1], []]})", "prompt", "an array of token ids, or an array of either"},
      {false, R"({"prompt": "x", "stream_options": {"include_usage": "yes"}})", "include_usage",
       "'include_usage' must be a boolean"},
      {false, R"({"prompt": "x", "logprobs": 9})", "logprobs", "logprobs must be in [0, 5]"},
      {true, "{" + m + R"("logit_bias": [1]})", "logit_bias", "must be an object"},
      {true, "{" + m + R"("logit_bias": {"-1": 1}})", "logit_bias", "'-1' is not a token id"},
      {true, "{" + m + R"("logit_bias": {"01": 1}})", "logit_bias", "'01' is not a token id"},
      {true, "{" + m + R"("logit_bias": {"hello": 1}})", "logit_bias", "'hello' is not a token id"},
      {true, "{" + m + R"("logit_bias": {"99999999": 1}})", "logit_bias", "outside the vocabulary"},
      {true, "{" + m + R"("logit_bias": {"5": "x"}})", "logit_bias", "must be a number"},
      {true, "{" + m + R"("logit_bias": {"5": 100.5}})", "logit_bias", "in [-100, 100]"},
      {false, R"({"prompt": "x", "min_tokens": -1})", "min_tokens", "min_tokens must be in [0, "},
      {false, R"({"prompt": "x", "max_tokens": 4, "min_tokens": 5})", "min_tokens",
       "min_tokens must be in [0, 4]"},
      {false, R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos", "must be a boolean"},
      {false, R"({"prompt": "x", "guided_choice": "yes"})", "guided_choice", "array of 1 to 4096"},
      {false, R"({"prompt": "x", "guided_choice": ["a", ""]})", "guided_choice",
       "choice 1 is empty"},
      {false, R"({"prompt": "x", "guided_regex": "a{2"})", "guided_regex", "regex \"a{2\""},
      {false, R"({"prompt": "x", "guided_json": {"minimum": 1}})", "guided_json", "minimum"},
      {false, R"({"prompt": "x", "guided_grammar": "root ::= nope"})", "guided_grammar", "nope"},
      {false, R"({"prompt": "x", "grammar": "root ::= \"a\"", "guided_regex": "a"})",
       "guided_regex", "use either 'guided_regex' or 'grammar'"},
      {false, R"({"prompt": "x", "structured_outputs": {"json_object": true, "regex": "a"}})",
       "structured_outputs.json_object", "not both"},
  };
  for (const BadBody& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = error_of([&] { openai(c.body, c.chat); });
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, c.param);
    EXPECT_CONTAINS(e.message, c.message);
  }
}

TEST_F(ServerParse, OpenAiTokenControls) {
  const OpenAiRequest r = openai(R"({"prompt": "x", "max_tokens": 9, "min_tokens": 3,
                                     "ignore_eos": true, "logit_bias": {"0": -100, "151643": 2.5}})",
                                 false);
  using Bias = std::vector<std::pair<int32_t, float>>;
  EXPECT_EQ(r.gen.sampling.logit_bias, (Bias{{0, -100.f}, {151643, 2.5f}}));
  EXPECT_EQ(r.gen.min_tokens, 3);
  EXPECT_TRUE(r.gen.ignore_eos);
  const OpenAiRequest none =
      openai(R"({"messages": [{"role": "user", "content": "hi"}], "logit_bias": null})", true);
  EXPECT_TRUE(none.gen.sampling.logit_bias.empty());
  EXPECT_EQ(none.gen.min_tokens, 0);
  EXPECT_FALSE(none.gen.ignore_eos);
}

TEST_F(ServerParse, OpenAiPromptPastTheContext) {
  const ApiError chat =
      error_of([&] { openai(R"({"messages": [{"role": "user", "content": "hi"}]})", true, 8); });
  EXPECT_EQ(chat.status, 400);
  EXPECT_EQ(chat.param, "messages");
  EXPECT_EQ(chat.code, "context_length_exceeded");
  EXPECT_CONTAINS(chat.message, "maximum context length is 8 tokens");
  const ApiError completion = error_of([&] { openai(R"({"prompt": [1, 2, 3, 4]})", false, 4); });
  EXPECT_EQ(completion.param, "prompt");
  EXPECT_CONTAINS(completion.message, "the prompt has 4 tokens");
}

TEST_F(ServerParse, OllamaGenerateDefaults) {
  const OllamaRequest r = ollama(R"({"model": "smollm2:latest", "prompt": "hi"})", false);
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.model, "smollm2:latest");
  EXPECT_EQ(r.gen.prompt, user_turn("hi"));
  const SamplingParams& s = r.gen.sampling;  // Ollama's defaults
  EXPECT_FLOAT_EQ(s.temperature, 0.8f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_FLOAT_EQ(s.min_p, 0.0f);
  EXPECT_FLOAT_EQ(s.repeat_penalty, 1.1f);
  EXPECT_EQ(s.repeat_last_n, 64);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.0f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, 0.0f);
  EXPECT_EQ(s.seed, kRandomSeed);
  EXPECT_EQ(r.gen.max_tokens, 4096 - int32_t(r.gen.prompt.size()));  // num_predict -1
  EXPECT_TRUE(r.gen.stop.empty());
  EXPECT_EQ(r.gen.top_logprobs, -1);
  EXPECT_TRUE(r.stream);
}

TEST_F(ServerParse, OllamaGeneratePrompts) {
  EXPECT_EQ(ollama(R"({"model": "m", "prompt": "hi", "system": "Be brief."})", false).gen.prompt,
            user_turn("hi", "Be brief."));
  EXPECT_EQ(ollama(R"({"model": "m", "prompt": "The sky is", "raw": true})", false).gen.prompt,
            qwen3_->encode("The sky is", {.add_special = true}));
}

TEST_F(ServerParse, OllamaOptions) {
  const OllamaRequest r = ollama(R"({"model": "m", "prompt": "hi", "stream": false, "options": {
      "temperature": 0, "top_k": 3, "top_p": 0.5, "min_p": 0.2, "repeat_penalty": 1.3,
      "repeat_last_n": -1, "presence_penalty": 0.5, "frequency_penalty": 0.25, "seed": 7,
      "num_predict": 10, "stop": ["\n", "User:"]}})",
                                 false);
  const SamplingParams& s = r.gen.sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_k, 3);
  EXPECT_FLOAT_EQ(s.top_p, 0.5f);
  EXPECT_FLOAT_EQ(s.min_p, 0.2f);
  EXPECT_FLOAT_EQ(s.repeat_penalty, 1.3f);
  EXPECT_EQ(s.repeat_last_n, 0);  // -1: the whole history
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, 0.25f);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(r.gen.max_tokens, 10);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"\n", "User:"}));
  EXPECT_FALSE(r.stream);
  // Ollama takes what OpenAI refuses (temperature over 2, penalties over 2).
  const OllamaRequest hot = ollama(
      R"({"model": "m", "prompt": "hi", "options": {"temperature": 5, "presence_penalty": 9}})",
      false);
  EXPECT_FLOAT_EQ(hot.gen.sampling.temperature, 5.0f);
  EXPECT_FLOAT_EQ(hot.gen.sampling.presence_penalty, 9.0f);
}

TEST_F(ServerParse, OllamaContextAndLimits) {
  const std::string head = R"({"model": "m", "prompt": "hi", "options": )";
  const int32_t n_prompt = int32_t(user_turn("hi").size());
  EXPECT_EQ(ollama(head + R"({"num_ctx": 100}})", false).gen.max_tokens, 100 - n_prompt);
  EXPECT_EQ(ollama(head + R"({"num_ctx": 100000}})", false, 200).gen.max_tokens, 200 - n_prompt);
  EXPECT_EQ(ollama(head + R"({"num_predict": -2}})", false, 300).gen.max_tokens, 300 - n_prompt);
  EXPECT_EQ(ollama(head + R"({"num_ctx": 50, "num_predict": 1000}})", false).gen.max_tokens,
            50 - n_prompt);
}

TEST_F(ServerParse, OllamaChat) {
  const OllamaRequest r =
      ollama(R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "hi"}], "options": {"num_predict": 3}})",
             true);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.gen.prompt, user_turn("hi", "Be brief."));
  EXPECT_EQ(r.gen.max_tokens, 3);
  EXPECT_TRUE(r.stream);
}

TEST_F(ServerParse, OllamaErrorsNameTheField) {
  const std::string p = R"("model": "m", "prompt": "hi", )";
  const BadBody cases[] = {
      {false, R"({"prompt": "hi"})", "model", "'model' is required"},
      {false, R"({"model": 3, "prompt": "hi"})", "model", "'model' must be a string"},
      {false, R"({"model": "m"})", "prompt", "'prompt' is required"},
      {false, "{" + p + R"("raw": "yes"})", "raw", "'raw' must be a boolean"},
      {false, "{" + p + R"("stream": 1})", "stream", "'stream' must be a boolean"},
      {false, "{" + p + R"("options": "x"})", "options", "'options' must be an object"},
      {false, "{" + p + R"("options": {"temperature": -3}})", "options.temperature",
       "temperature must be in [0, 100]"},
      {false, "{" + p + R"("options": {"top_k": "many"}})", "top_k", "'top_k' must be an integer"},
      {false, "{" + p + R"("options": {"repeat_last_n": -5}})", "options.repeat_last_n",
       "repeat_last_n must be >= 0"},
      {false, "{" + p + R"("options": {"num_predict": 0}})", "options.num_predict",
       "num_predict must be -1 (no limit) or in [1, 16777216]"},
      {false, "{" + p + R"("options": {"num_predict": -3}})", "options.num_predict", "num_predict"},
      {false, "{" + p + R"("options": {"num_ctx": 0}})", "options.num_ctx",
       "num_ctx must be positive"},
      {false, "{" + p + R"("options": {"stop": 5}})", "stop", "a string or an array of strings"},
      {true, R"({"model": "m", "messages": []})", "messages", "must not be empty"},
      {true, R"({"model": "m"})", "messages", "'messages' is required"},
  };
  for (const BadBody& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = error_of([&] { ollama(c.body, c.chat); });
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, c.param);
    EXPECT_CONTAINS(e.message, c.message);
  }
  std::string many_stops = R"({"model": "m", "prompt": "hi", "options": {"stop": [)";
  for (int i = 0; i < 17; ++i) many_stops += std::string(i ? "," : "") + "\"s\"";
  const ApiError stops = error_of([&] { ollama(many_stops + "]}}", false); });
  EXPECT_CONTAINS(stops.message, "'stop' takes at most 16 strings");
  const ApiError ctx = error_of([&] { ollama("{" + p + R"("options": {"num_ctx": 3}})", false); });
  EXPECT_EQ(ctx.param, "options.num_ctx");
  EXPECT_EQ(ctx.code, "context_length_exceeded");
  EXPECT_CONTAINS(ctx.message, "but the context holds 3");
}

TEST_F(ServerParse, ModelNames) {
  EXPECT_EQ(openai_model_name(json::parse(R"({})")), "");
  EXPECT_EQ(ollama_show_model_name(json::parse(R"({"name": "smollm2:latest"})")), "smollm2:latest");
  EXPECT_EQ(ollama_show_model_name(json::parse(R"({"model": "a", "name": "b"})")), "a");
  EXPECT_EQ(error_of([] { ollama_show_model_name(json::parse("{}")); }).param, "model");
}

TEST_F(ServerParse, NoChatTemplate) {
  auto llama2 = Tokenizer::load(shared_dir() + "/tokenizers/llama2");
  ASSERT_TRUE(llama2->chat_template.empty());
  const ModelView m{*llama2, "llama2", 4096};
  const ApiError e = error_of([&] {
    parse_openai(json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), true, m, 1);
  });
  EXPECT_EQ(e.param, "messages");
  EXPECT_CONTAINS(e.message, "no chat template");
}

TEST(ServerBody, NotJsonOrNotAnObject) {
  const ApiError syntax = error_of([] { parse_body("{not json"); });
  EXPECT_EQ(syntax.status, 400);
  EXPECT_EQ(syntax.code, "invalid_json");
  EXPECT_CONTAINS(syntax.message, "the request body is not valid JSON");
  EXPECT_CONTAINS(error_of([] { parse_body("[1, 2]"); }).message, "must be a JSON object");
  EXPECT_EQ(parse_body(R"({"a": 1})")["a"], 1);
  // a number past a double is nlohmann's out_of_range, not a parse_error: still a 400
  // (found by fuzz_request; it was a 500)
  const ApiError huge = error_of([] { parse_body(R"({"max_tokens": 1e308686018427387904})"); });
  EXPECT_EQ(huge.status, 400);
  EXPECT_EQ(huge.code, "invalid_json");
  EXPECT_CONTAINS(huge.message, "number overflow");
}

// Invalid UTF-8 inside a string is a 400 naming its byte offset (it was a 500
// when the error message quoting the bytes failed to serialize).
TEST(ServerBody, InvalidUtf8NamesTheByteOffset) {
  const std::string body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\xff\"}]}";
  const ApiError e = error_of([&] { parse_body(body); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_utf8");
  EXPECT_CONTAINS(e.message, fmt::format("byte offset {}", body.find('\xff')));
  // overlong and surrogate encodings are invalid too
  EXPECT_EQ(error_of([] { parse_body("{\"a\": \"\xc0\xaf\"}"); }).code, "invalid_utf8");
  EXPECT_EQ(error_of([] { parse_body("{\"a\": \"\xed\xa0\x80\"}"); }).code, "invalid_utf8");
  EXPECT_EQ(parse_body("{\"a\": \"caf\xc3\xa9\"}")["a"], "caf\xc3\xa9");
}

TEST(ServerBody, NestingPastTheLimitNamesTheByteOffset) {
  const std::string ok = std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']');
  EXPECT_NO_THROW(parse_body("{\"a\": " + ok + "}"));
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const ApiError e = error_of([&] { parse_body(deep); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "json_too_deep");
  EXPECT_CONTAINS(e.message, fmt::format("byte offset {}", 6 + kMaxJsonDepth - 1));
  // brackets inside strings do not count
  EXPECT_NO_THROW(parse_body("{\"a\": \"" + std::string(1000, '[') + "\\\"{\"}"));
}

TEST_F(ServerParse, RequestLimits) {
  const std::string msg = R"({"role": "user", "content": "hi"})";
  std::string many = "[";
  for (size_t i = 0; i <= kMaxMessages; ++i) many += (i ? "," : "") + msg;
  many += "]";
  EXPECT_EQ(error_of([&] { openai(R"({"messages": )" + many + "}", true); }).param, "messages");
  std::string tools = "[";
  for (size_t i = 0; i <= kMaxTools; ++i)
    tools += std::string(i ? "," : "") + R"({"type": "function"})";
  tools += "]";
  EXPECT_EQ(error_of([&] {
              openai(R"({"messages": [)" + msg + R"(], "tools": )" + tools + "}", true);
            }).param,
            "tools");
  const std::string long_stop(kMaxStopBytes + 1, 'x');
  const ApiError stop = error_of(
      [&] { openai(R"({"messages": [)" + msg + R"(], "stop": [")" + long_stop + R"("]})", true); });
  EXPECT_EQ(stop.param, "stop");
  EXPECT_CONTAINS(stop.message, "at most 512 bytes");
  EXPECT_EQ(
      error_of([&] {
        ollama(R"({"model": "m", "prompt": "hi", "options": {"stop": [")" + long_stop + R"("]}})",
               false);
      }).param,
      "stop");
}

// chat_template_kwargs add template variables; they cannot replace the
// conversation or what the server and the template themselves define.
TEST_F(ServerParse, ChatTemplateKwargsCannotReplaceReservedNames) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  for (const char* name : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                           "raise_exception", "range", "namespace"}) {
    const ApiError e = error_of([&] {
      openai("{" + msgs + R"(, "chat_template_kwargs": {")" + name + R"(": []}})", true);
    });
    EXPECT_EQ(e.param, "chat_template_kwargs") << name;
    EXPECT_CONTAINS(e.message, std::string("chat_template_kwargs.") + name + " is reserved");
  }
  EXPECT_EQ(error_of([&] { openai("{" + msgs + R"(, "chat_template_kwargs": [1]})", true); }).code,
            "invalid_type");
}

// The SSE bytes of a chat stream with two choices: a role chunk before each
// choice's first text, a finish chunk each, the usage, then [DONE].
TEST(ServerWrite, OpenAiChatStream) {
  OpenAiRequest r;
  r.chat = true;
  r.n_choices = 2;
  r.usage_in_stream = true;
  OpenAiStream w(r, {"chatcmpl-7", 1700000000, "smollm2"}, nullptr);
  const std::string head =
      R"(data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"smollm2",)";
  auto chunk = [&](int i, const std::string& delta, const std::string& finish) {
    return head + fmt::format(R"("choices":[{{"index":{},"delta":{},"logprobs":null,)", i, delta) +
           fmt::format(R"("finish_reason":{}}}]}})", finish) + "\n\n";
  };
  const std::string role = R"({"role":"assistant","content":""})";
  EXPECT_EQ(w.text(1, "Hi", {}), chunk(1, role, "null") + chunk(1, R"({"content":"Hi"})", "null"));
  EXPECT_EQ(w.text(1, "!", {}), chunk(1, R"({"content":"!"})", "null"));
  EXPECT_EQ(w.done(1, GenerateResult{.tokens = {1, 2, 3}, .stop_reason = "eos", .n_prompt = 5}),
            chunk(1, "{}", R"("stop")"));
  // Choice 0 ends without text: its role chunk still comes first.
  EXPECT_EQ(w.done(0, GenerateResult{.tokens = {4}, .stop_reason = "length", .n_prompt = 5}),
            chunk(0, role, "null") + chunk(0, "{}", R"("length")"));
  EXPECT_EQ(
      w.end(),
      head +
          R"("choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}})" +
          "\n\ndata: [DONE]\n\n");
}

TEST_F(ServerParse, OpenAiResponses) {
  OpenAiRequest r;
  const GenerateResult g{
      .tokens = {1, 2}, .text = " Paris", .stop_reason = "context", .n_prompt = 4};
  EXPECT_EQ(
      openai_response(r, {"cmpl-3", 12, "m"}, {g}, *qwen3_).dump(),
      R"({"id":"cmpl-3","object":"text_completion","created":12,"model":"m","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":0}}})");
  // Logprobs in each endpoint's shape, tokens as the tokenizer spells them.
  const int32_t hello = qwen3_->encode("Hello")[0], world = qwen3_->encode(" world")[0];
  GenerateResult lp = g;
  lp.logprobs = {{hello, -0.5f, {{hello, -0.5f}, {world, -2.0f}}},
                 {world, -0.25f, {{world, -0.25f}, {hello, -3.0f}}}};
  r.gen.top_logprobs = 2;
  EXPECT_EQ(
      openai_response(r, {"cmpl-3", 12, "m"}, {lp}, *qwen3_)["choices"][0]["logprobs"].dump(),
      R"({"tokens":["Hello"," world"],"token_logprobs":[-0.5,-0.25],"top_logprobs":[{"Hello":-0.5," world":-2.0},{" world":-0.25,"Hello":-3.0}],"text_offset":[0,5]})");
  r.chat = true;
  const json chat = openai_response(r, {"chatcmpl-3", 12, "m"}, {lp}, *qwen3_);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"].dump(), R"({"role":"assistant","content":" Paris"})");
  EXPECT_EQ(
      chat["choices"][0]["logprobs"]["content"][1].dump(),
      R"({"token":" world","logprob":-0.25,"bytes":[32,119,111,114,108,100],"top_logprobs":[{"token":" world","logprob":-0.25,"bytes":[32,119,111,114,108,100]},{"token":"Hello","logprob":-3.0,"bytes":[72,101,108,108,111]}]})");
  EXPECT_EQ(
      openai_error(ApiError{429, "busy", "rate_limit_exceeded", "", "queue_full"}).dump(),
      R"({"error":{"message":"busy","type":"rate_limit_exceeded","param":null,"code":"queue_full"}})");
}

TEST(ServerWrite, OllamaStreamLines) {
  OllamaRequest r;
  r.chat = true;
  r.model = "smollm2:latest";
  OllamaStream w(r, nullptr, Clock::now());
  const json piece = json::parse(w.text(0, "Hi", {}));
  EXPECT_EQ(piece["model"], "smollm2:latest");
  EXPECT_EQ(piece["message"], (json{{"role", "assistant"}, {"content", "Hi"}}));
  EXPECT_EQ(piece["done"], false);
  const std::string last =
      w.done(0, GenerateResult{.tokens = {1, 2}, .stop_reason = "eos", .n_prompt = 3});
  ASSERT_EQ(last.back(), '\n');
  const json fin = json::parse(last);
  std::vector<std::string> keys;
  for (auto& [k, v] : fin.items()) keys.push_back(k);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"model", "created_at", "message", "done", "done_reason",
                                      "total_duration", "load_duration", "prompt_eval_count",
                                      "prompt_eval_duration", "eval_count", "eval_duration"}));
  EXPECT_EQ(fin["message"]["content"], "");
  EXPECT_EQ(fin["done_reason"], "stop");
  EXPECT_EQ(fin["prompt_eval_count"], 3);
  EXPECT_EQ(fin["eval_count"], 2);
  EXPECT_EQ(w.done(0, GenerateResult{.stop_reason = "error: the KV cache is too small"}),
            "{\"error\":\"error: the KV cache is too small\"}\n");
  EXPECT_EQ(w.end(), "");
}

}  // namespace
}  // namespace wick::server
