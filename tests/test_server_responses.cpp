// The Responses API without a socket: input items read as the chat messages
// they stand for (the same prompt as chat completions'), previous
// conversations, truncation "auto", 400s naming the Responses API's fields;
// the builder's items and events, streamed or whole; the store's bounds.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "helpers.h"
#include "server/parse_openai.h"
#include "server/parse_responses.h"
#include "server/response_store.h"
#include "server/write_responses.h"
#include "server_helpers.h"
#include "text/tokenizer.h"

namespace wick::server {
namespace {

using test::shared_dir;

class Responses : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { qwen3_ = load_qwen3_model(); }
  void SetUp() override {
    if (!qwen3_) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << shared_dir());
  }
  ModelView view(int32_t n_ctx = 4096) const {
    return {.tokenizer = *(*qwen3_)->tokenizer,
            .name = "qwen3",
            .n_ctx = n_ctx,
            .tool_format = ToolFormat::Hermes};
  }
  ResponsesRequest parse(const std::string& body, const json& previous = json::array(),
                         int32_t n_ctx = 4096) const {
    return parse_responses(json::parse(body), view(n_ctx), 1, previous);
  }
  // The prompt chat completions renders for messages (and tools).
  std::vector<int32_t> chat_prompt_of(const json& messages, const json& tools = json()) const {
    json b = {{"messages", messages}};
    if (!tools.is_null()) b["tools"] = tools;
    return parse_openai(b, true, view(), 1).gen.prompt;
  }
  static inline std::shared_ptr<const LoadedModel>* qwen3_ = nullptr;  // never freed
};

TEST_F(Responses, InstructionsAndTextInputAreAChatTurn) {
  const ResponsesRequest r = parse(
      R"({"model": "m", "instructions": "Be brief.", "input": "Hi there", "max_output_tokens": 7,
          "temperature": 0.5, "seed": 3})");
  EXPECT_EQ(r.chat.gen.prompt, chat_prompt_of(json::parse(
                                   R"([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hi there"}])")));
  EXPECT_EQ(r.chat.model, "m");
  EXPECT_EQ(r.chat.n_choices, 1);
  EXPECT_EQ(r.chat.gen.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.chat.gen.sampling.temperature, 0.5f);
  EXPECT_EQ(r.chat.gen.sampling.seed, 3u);
  EXPECT_EQ(r.chat.gen.top_logprobs, -1);
  EXPECT_TRUE(r.store);
  EXPECT_FALSE(r.chat.stream);
  // instructions are not part of what a later request continues
  EXPECT_EQ(r.conversation, json::parse(R"([{"role": "user", "content": "Hi there"}])"));
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["text"]["format"]["type"], "text");
}

TEST_F(Responses, ItemsAreTheMessagesTheyStandFor) {
  const char* tools = R"([{"type": "function", "name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])";
  const ResponsesRequest r = parse(std::string(R"({"tools": )") + tools + R"(, "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris "},
                                                       {"type": "input_text", "text": "and Rome?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Rain"}]}]})");
  const json want = json::parse(R"([
      {"role": "developer", "content": "Use tools."},
      {"role": "user", "content": "Paris and Rome?"},
      {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "Sunny", "name": "get_weather"},
      {"role": "tool", "tool_call_id": "c2", "content": "Rain", "name": "get_weather"}])");
  EXPECT_EQ(r.conversation, want) << r.conversation.dump();
  json chat_tools = json::parse(tools);
  for (json& t : chat_tools)
    t = {{"type", "function"},
         {"function", {{"name", t["name"]}, {"parameters", t["parameters"]}}}};
  EXPECT_EQ(r.chat.gen.prompt, chat_prompt_of(want, chat_tools));
  EXPECT_EQ(r.chat.tools.format, ToolFormat::Hermes);
}

TEST_F(Responses, PreviousConversationComesFirst) {
  const json previous = json::parse(R"([{"role": "user", "content": "I am Ada."},
                                        {"role": "assistant", "content": "Hello Ada."}])");
  const ResponsesRequest r = parse(
      R"({"instructions": "Be kind.", "input": "Who am I?", "previous_response_id": "resp_1"})",
      previous);
  json conv = previous;
  conv.push_back({{"role", "user"}, {"content", "Who am I?"}});
  EXPECT_EQ(r.conversation, conv);
  json msgs = conv;
  msgs.insert(msgs.begin(), json{{"role", "system"}, {"content", "Be kind."}});
  EXPECT_EQ(r.chat.gen.prompt, chat_prompt_of(msgs));
  EXPECT_EQ(r.echo["previous_response_id"], "resp_1");
}

TEST_F(Responses, ToolChoiceFormatAndLogprobs) {
  const std::string tools =
      R"("tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}])";
  EXPECT_FALSE(parse("{\"input\": \"x\", " + tools + "}").chat.gen.grammar);
  EXPECT_TRUE(
      parse("{\"input\": \"x\", " + tools + R"(, "tool_choice": "required"})").chat.gen.grammar);
  const ResponsesRequest named = parse("{\"input\": \"x\", " + tools +
                                       R"(, "tool_choice": {"type": "function", "name": "f"}})");
  EXPECT_TRUE(named.chat.gen.grammar);
  EXPECT_EQ(named.echo["tool_choice"]["name"], "f");  // echoed in the Responses API's shape
  EXPECT_EQ(parse("{\"input\": \"x\", " + tools + R"(, "tool_choice": "none"})").chat.tools.format,
            ToolFormat::None);
  EXPECT_FALSE(
      parse(R"({"input": "x", "parallel_tool_calls": false, )" + tools + "}").chat.tools.parallel);
  EXPECT_TRUE(
      parse(R"({"input": "x", "text": {"format": {"type": "json_object"}}})").chat.gen.grammar);
  const ResponsesRequest schema = parse(R"({"input": "x", "text": {"format": {"type": "json_schema",
      "name": "n", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})");
  EXPECT_TRUE(schema.chat.gen.grammar);
  EXPECT_EQ(schema.echo["text"]["format"]["name"], "n");
  EXPECT_EQ(
      parse(R"({"input": "x", "include": ["message.output_text.logprobs"]})").chat.gen.top_logprobs,
      0);
  EXPECT_EQ(
      parse(R"({"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 3})")
          .chat.gen.top_logprobs,
      3);
  EXPECT_EQ(parse(R"({"input": "x", "top_logprobs": 2})").chat.gen.top_logprobs, 2);
  EXPECT_EQ(
      parse(R"({"input": "x", "include": ["reasoning.encrypted_content"]})").chat.gen.top_logprobs,
      -1);
  EXPECT_TRUE(parse(R"({"input": "x", "stream": true, "store": false})").chat.stream);
  EXPECT_FALSE(parse(R"({"input": "x", "store": false})").store);
}

TEST_F(Responses, TruncationAutoDropsTheFewestOldestMessages) {
  json input = json::array();
  for (int i = 0; i < 12; ++i) {
    input.push_back(
        {{"role", "user"}, {"content", fmt::format("Question {} about the weather in town?", i)}});
    input.push_back(
        {{"role", "assistant"}, {"content", fmt::format("Answer {}: it is mild and dry.", i)}});
  }
  input.push_back({{"role", "user"}, {"content", "And tomorrow?"}});
  const int32_t n_ctx = 120;
  json body = {{"input", input}, {"instructions", "Be brief."}};
  const ApiError e = error_of([&] { parse_responses(body, view(n_ctx), 1, json::array()); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "input");
  EXPECT_EQ(e.code, "context_length_exceeded");
  body["truncation"] = "auto";
  const ResponsesRequest r = parse_responses(body, view(n_ctx), 1, json::array());
  EXPECT_LT(int32_t(r.chat.gen.prompt.size()), n_ctx);
  EXPECT_EQ(r.conversation.size(), input.size());  // stored whole: truncation is per request
  // the prompt is the instructions and the newest k messages, for the largest k that fits
  auto prompt_of_last = [&](size_t k) {
    json msgs = {{{"role", "system"}, {"content", "Be brief."}}};
    for (size_t i = input.size() - k; i < input.size(); ++i) msgs.push_back(input[i]);
    return parse_openai({{"messages", msgs}}, true, view(), 1).gen.prompt;
  };
  size_t k = 1;
  while (prompt_of_last(k) != r.chat.gen.prompt) ASSERT_LT(++k, input.size());
  EXPECT_GE(int32_t(prompt_of_last(k + 1).size()), n_ctx) << "dropped more than needed";
}

TEST_F(Responses, BadRequestsNameTheirField) {
  auto param_of = [&](const std::string& body) { return error_of([&] { parse(body); }).param; };
  EXPECT_EQ(param_of(R"({})"), "input");
  EXPECT_EQ(param_of(R"({"input": {"a": 1}})"), "input");
  EXPECT_EQ(param_of(R"({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]})"),
            "input[0].content[0].type");
  EXPECT_EQ(param_of(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"),
            "input[0].output");
  EXPECT_EQ(param_of(R"({"input": [{"type": "computer_call"}]})"), "input[0].type");
  EXPECT_EQ(param_of(R"({"input": "x", "tools": [{"type": "file_search"}]})"), "tools[0].type");
  EXPECT_EQ(
      param_of(R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 1}]})"),
      "tools[0].parameters");
  EXPECT_EQ(param_of(R"({"input": "x", "tool_choice": {"type": "mcp"}})"), "tool_choice");
  EXPECT_EQ(param_of(R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": 3}}})"),
            "text.format.schema");
  EXPECT_EQ(param_of(R"({"input": "x", "max_output_tokens": -1})"), "max_output_tokens");
  EXPECT_EQ(param_of(R"({"input": "x", "background": true})"), "background");
  EXPECT_EQ(param_of(R"({"input": "x", "prompt": {"id": "p"}})"), "prompt");
  EXPECT_EQ(param_of(R"({"input": "x", "top_p": 2})"), "top_p");
  EXPECT_EQ(param_of(R"({"input": "x", "metadata": {"a": "b", "c": 1}})"), "metadata");
}

// SSE text -> the events' JSON.
std::vector<json> events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}

TEST_F(Responses, StreamedAndWholeAnswersHaveTheSameItems) {
  const ResponsesRequest r = parse(R"({"input": "x", "tools": [
      {"type": "function", "name": "get_weather"}, {"type": "function", "name": "add"}]})");
  const std::string text =
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  const GenerateResult g{.tokens = {1, 2, 3}, .text = text, .stop_reason = "eos", .n_prompt = 9};
  ResponseBuilder whole(r, "resp_ab", "m", *qwen3_);
  whole.text(text, {});
  whole.finish(g);
  ResponseBuilder streamed(r, "resp_ab", "m", *qwen3_);
  std::string sse = streamed.start();
  for (size_t at = 0; at < text.size(); at += 7) sse += streamed.text(text.substr(at, 7), {});
  sse += streamed.finish(g);
  EXPECT_EQ(streamed.response()["output"], whole.response()["output"]);
  const json& out = whole.response()["output"];
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_EQ(out[0]["type"], "message");
  EXPECT_EQ(out[0]["content"][0]["text"], "Checking.");
  EXPECT_EQ(out[1]["type"], "function_call");
  EXPECT_EQ(out[1]["call_id"], "call_ab_0");
  EXPECT_EQ(out[1]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(out[2]["name"], "add");
  EXPECT_EQ(whole.response()["status"], "completed");
  EXPECT_EQ(whole.response()["usage"]["input_tokens"], 9);
  EXPECT_EQ(whole.response()["usage"]["output_tokens"], 3);
  // the events, numbered in order; each item added before its deltas and done after
  const std::vector<json> evs = events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < evs.size(); ++i) {
    EXPECT_EQ(evs[i]["sequence_number"], int64_t(i));
    types.push_back(evs[i]["type"]);
  }
  const std::vector<std::string> want_start = {"response.created", "response.in_progress",
                                               "response.output_item.added",
                                               "response.content_part.added"};
  EXPECT_EQ(std::vector<std::string>(types.begin(), types.begin() + 4), want_start);
  EXPECT_EQ(types.back(), "response.completed");
  EXPECT_EQ(evs.back()["response"]["status"], "completed");
  EXPECT_EQ(evs.back()["response"]["output"], out);
  int n_added = 0, n_done = 0;
  for (const std::string& t : types) {
    n_added += t == "response.output_item.added";
    n_done += t == "response.output_item.done";
  }
  EXPECT_EQ(n_added, 3);
  EXPECT_EQ(n_done, 3);
  // the answer as a chat message: text and calls, for the next turn
  const json msg = whole.assistant_message();
  EXPECT_EQ(msg["content"], "Checking.");
  EXPECT_EQ(msg["tool_calls"][1]["function"]["name"], "add");
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_ab_0");
}

TEST_F(Responses, CutAndFailedAnswers) {
  const ResponsesRequest r = parse(R"({"input": "x", "max_output_tokens": 2})");
  ResponseBuilder cut(r, "resp_1", "m", *qwen3_);
  cut.text("Once upon", {});
  const std::vector<json> evs = events(
      cut.finish(GenerateResult{.tokens = {1, 2}, .text = "Once upon", .stop_reason = "length"}));
  EXPECT_EQ(evs.back()["type"], "response.incomplete");
  EXPECT_EQ(cut.response()["status"], "incomplete");
  EXPECT_EQ(cut.response()["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(cut.response()["output"][0]["status"], "incomplete");

  ResponseBuilder failed(r, "resp_2", "m", *qwen3_);
  failed.text("Once", {});
  const std::vector<json> f =
      events(failed.finish(GenerateResult{.stop_reason = "error: the engine step failed"}));
  EXPECT_EQ(f.back()["type"], "response.failed");
  EXPECT_EQ(failed.response()["error"]["code"], "server_error");

  ResponseBuilder empty(r, "resp_3", "m", *qwen3_);  // nothing said: one empty message
  empty.finish(GenerateResult{.stop_reason = "eos"});
  EXPECT_EQ(empty.response()["output"].size(), 1u);
  EXPECT_EQ(empty.response()["output"][0]["content"][0]["text"], "");
  EXPECT_EQ(empty.response()["status"], "completed");
}

TEST(ResponseStore, KeepsTheNewestWithinItsBounds) {
  ResponseStore by_count(2, 1 << 20);
  for (const char* id : {"a", "b", "c"}) by_count.put(id, {{"id", id}}, json::array());
  EXPECT_FALSE(by_count.response("a"));
  EXPECT_EQ((*by_count.response("c"))["id"], "c");
  EXPECT_TRUE(by_count.conversation("b"));
  EXPECT_TRUE(by_count.erase("b"));
  EXPECT_FALSE(by_count.erase("b"));
  EXPECT_EQ(by_count.size(), 1u);

  const std::string kb(1000, 'x');
  ResponseStore by_bytes(100, 2500);  // room for two entries of ~1 KB
  for (const char* id : {"a", "b", "c"}) by_bytes.put(id, {{"t", kb}}, json::array());
  EXPECT_FALSE(by_bytes.response("a"));
  EXPECT_TRUE(by_bytes.response("b") && by_bytes.response("c"));
  by_bytes.put("big", {{"t", std::string(3000, 'y')}}, json::array());  // larger than the store
  EXPECT_FALSE(by_bytes.response("big"));
  EXPECT_TRUE(by_bytes.response("c"));

  ResponseStore none(0, 1 << 20);  // --responses-store 0
  none.put("a", json::object(), json::array());
  EXPECT_FALSE(none.response("a"));
}

}  // namespace
}  // namespace wick::server
