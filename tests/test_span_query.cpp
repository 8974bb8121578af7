// spnl's span queries: the JSON tree parsed (bad nodes are 400s naming their
// path), flattened into pieces, and laid out as prompt ids whose independent
// pieces are spans with the same ids wherever they stand.
#include <gtest/gtest.h>

#include <memory>

#include "helpers.h"
#include "server/chat_prompt.h"
#include "server/span_query.h"
#include "text/tokenizer.h"

namespace wick::server {
namespace {

using test::shared_dir;

json q(const char* text) {
  return json::parse(text);
}

int status_of(const std::function<void()>& f, std::string* param = nullptr) {
  try {
    f();
  } catch (const ApiError& e) {
    if (param) *param = e.param;
    return e.status;
  }
  return 200;
}

TEST(SpanQuery, ParsesTheTopLevelsAndDefaults) {
  auto g = parse_span_query(q(R"({"g": {"model": "spnl/smollm2", "input": {"cross": [
      {"system": "S"}, {"plus": [{"user": "doc A"}, {"user": "doc B"}]}, {"user": "Q"}]},
      "max_tokens": 48, "temperature": 0}})"));
  EXPECT_EQ(g.top, SpanQuery::Top::G);
  EXPECT_EQ(g.g.model, "smollm2");
  EXPECT_EQ(g.g.max_tokens, 48);
  EXPECT_EQ(g.g.temperature, 0.f);
  ASSERT_EQ(g.g.input.kind, SpanNode::Kind::Cross);
  ASSERT_EQ(g.g.input.children.size(), 3u);
  EXPECT_EQ(g.g.input.children[1].kind, SpanNode::Kind::Plus);

  auto r =
      parse_span_query(q(R"({"repeat": {"n": 3, "g": {"model": "m", "input": {"user": "hi"}}}})"));
  EXPECT_EQ(r.top, SpanQuery::Top::Repeat);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.g.max_tokens, 2048);  // spnl's defaults
  EXPECT_FLOAT_EQ(r.g.temperature, 0.6f);

  auto m = parse_span_query(
      q(R"({"map": {"metadata": {"model": "m", "max_tokens": 5}, "inputs": ["a", "b"]}})"));
  EXPECT_EQ(m.top, SpanQuery::Top::Map);
  EXPECT_EQ(m.inputs, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(m.g.max_tokens, 5);
}

TEST(SpanQuery, BadQueriesAre400sNamingThePath) {
  std::string param;
  EXPECT_EQ(status_of([] { parse_span_query(q(R"({"par": []})")); }), 400);
  EXPECT_EQ(status_of([] { parse_span_query(q(R"({"g": {"input": {"user": "x"}}})")); }, &param),
            400);
  EXPECT_EQ(param, "g.model");
  EXPECT_EQ(status_of(
                [] {
                  parse_span_query(q(R"({"g": {"model": "m", "input": {"cross": [{"user": "a"},
                      {"plus": [{"user": 3}]}]}}})"));
                },
                &param),
            400);
  EXPECT_EQ(param, "g.input.cross[1].plus[0]");
  EXPECT_EQ(
      status_of([] { parse_span_query(q(R"({"g": {"model": "m", "input": {"tool": "x"}}})")); }),
      400);
  EXPECT_EQ(status_of([] { parse_span_query(q(R"({"repeat": {"n": 0, "g": {}}})")); }), 400);
  EXPECT_EQ(status_of([] {
              parse_span_query(q(R"({"map": {"metadata": {"model": "m"}, "inputs": []}})"));
            }),
            400);
  // nesting is bounded
  std::string deep = R"({"user": "x"})";
  for (int i = 0; i < 40; ++i) deep = R"({"seq": [)" + deep + "]}";
  const json body = {{"g", {{"model", "m"}, {"input", json::parse(deep)}}}};
  EXPECT_EQ(status_of([&] { parse_span_query(body); }), 400);
}

TEST(SpanQuery, FlattensPlusChildrenIntoIndependentPieces) {
  auto g = parse_span_query(q(R"({"g": {"model": "m", "input": {"cross": [
      {"system": "S"}, {"plus": [{"user": "doc A"}, {"seq": [{"user": "B1"}, {"user": "B2"}]}]},
      {"user": "Q"}]}}})"));
  auto pieces = flatten(g.g.input);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_FALSE(pieces[0].independent);
  EXPECT_TRUE(pieces[1].independent);
  EXPECT_TRUE(pieces[2].independent);
  EXPECT_EQ(pieces[2].messages.size(), 2u);  // one span of two messages
  EXPECT_FALSE(pieces[3].independent);
  EXPECT_EQ(pieces[3].messages[0]["content"], "Q");
}

class SpanLayout : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::filesystem::exists(shared_dir() + "/tokenizers/qwen3"))
      tk_ = Tokenizer::load(shared_dir() + "/tokenizers/qwen3").release();
  }
  void SetUp() override {
    if (!tk_) WICK_SKIP_OR_FAIL("shared tokenizers not found at " << shared_dir());
  }
  ModelView view() const { return {*tk_, "qwen3", 4096}; }
  std::vector<int32_t> span_ids(const std::vector<int32_t>& ids,
                                std::pair<int32_t, int32_t> s) const {
    return {ids.begin() + s.first, ids.begin() + s.second};
  }
  static inline Tokenizer* tk_ = nullptr;
};

// Without plus the layout is the chat template's prompt of the same messages.
TEST_F(SpanLayout, WithoutPlusEqualsTheChatPrompt) {
  auto g = parse_span_query(q(R"({"g": {"model": "m", "input": {"seq": [
      {"system": "Be brief."}, {"user": "Hello"}, {"assistant": "Hi."}, {"user": "Bye"}]}}})"));
  std::vector<std::pair<int32_t, int32_t>> spans;
  std::vector<int32_t> ids;
  try {
    ids = span_prompt(view(), flatten(g.g.input), spans);
  } catch (const ApiError& e) {
    FAIL() << e.message;
  }
  EXPECT_TRUE(spans.empty());
  const json msgs = json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
      {"role": "user", "content": "Bye"}])");
  EXPECT_EQ(ids, chat_prompt(view(), msgs, nullptr, nullptr));
}

// A document's span has the same ids in any order and at any offset; the
// whole prompt is the template's rendering of the same messages.
TEST_F(SpanLayout, SpansHaveTheSameIdsWhereverTheyStand) {
  auto layout = [&](const char* text, std::vector<std::pair<int32_t, int32_t>>& spans) {
    return span_prompt(view(), flatten(parse_span_query(q(text)).g.input), spans);
  };
  std::vector<std::pair<int32_t, int32_t>> s1, s2;
  auto a = layout(R"({"g": {"model": "m", "input": {"cross": [{"system": "S"},
      {"plus": [{"user": "doc A is here"}, {"user": "doc B"}]}, {"user": "Q?"}]}}})",
                  s1);
  auto b = layout(R"({"g": {"model": "m", "input": {"cross": [{"system": "S"}, {"user": "first"},
      {"plus": [{"user": "doc B"}, {"user": "new doc"}, {"user": "doc A is here"}]}, {"user": "Q?"}]}}})",
                  s2);
  ASSERT_EQ(s1.size(), 2u);
  ASSERT_EQ(s2.size(), 3u);
  EXPECT_EQ(span_ids(a, s1[0]), span_ids(b, s2[2]));  // doc A
  EXPECT_EQ(span_ids(a, s1[1]), span_ids(b, s2[0]));  // doc B
  EXPECT_NE(s1[0].first, s2[2].first);
  const json msgs = json::parse(R"([{"role": "system", "content": "S"},
      {"role": "user", "content": "doc A is here"}, {"role": "user", "content": "doc B"},
      {"role": "user", "content": "Q?"}])");
  EXPECT_EQ(a, chat_prompt(view(), msgs, nullptr, nullptr));
  // spans lie inside the prompt, in order, and none ends it
  for (auto [b0, e0] : s2) {
    EXPECT_LT(b0, e0);
    EXPECT_LT(e0, int32_t(b.size()));
  }
}

// continue_final_message (vLLM's): the prompt ends inside the last message,
// the assistant's, on both the span and the chat path, and equals the full
// rendering cut after that message's text.
TEST_F(SpanLayout, ContinueFinalMessageEndsInsideTheAssistantsMessage) {
  const char* text = R"({"g": {"model": "m", "continue_final_message": true, "input": {"cross": [
      {"system": "S"}, {"plus": [{"user": "doc A"}, {"user": "doc B"}]}, {"user": "Q?"},
      {"assistant": "The answer is"}]}}})";
  const SpanQuery sq = parse_span_query(q(text));
  ASSERT_TRUE(sq.g.continue_final);
  std::vector<std::pair<int32_t, int32_t>> spans;
  std::vector<int32_t> ids;
  try {
    ids = span_prompt(view(), flatten(sq.g.input), spans, true);
  } catch (const ApiError& e) {
    FAIL() << e.message;
  }
  EXPECT_EQ(spans.size(), 2u);
  const json msgs = json::parse(R"([{"role": "system", "content": "S"},
      {"role": "user", "content": "doc A"}, {"role": "user", "content": "doc B"},
      {"role": "user", "content": "Q?"}, {"role": "assistant", "content": "The answer is"}])");
  EXPECT_EQ(ids, chat_prompt(view(), msgs, nullptr, nullptr, PromptEnd::ContinueFinal));
  const std::string prompt =
      chat_prompt_text(view(), msgs, nullptr, nullptr, PromptEnd::ContinueFinal);
  const std::string closed = chat_prompt_text(view(), msgs, nullptr, nullptr, PromptEnd::NewTurn);
  EXPECT_TRUE(prompt.ends_with("The answer is")) << prompt;
  // the closed rendering is the same text and the turn's end after it
  EXPECT_TRUE(closed.starts_with(prompt)) << closed;
  EXPECT_GT(closed.size(), prompt.size());
  // the generation prompt's turn header stands before the continued text
  json open = msgs;
  open.erase(open.size() - 1);
  EXPECT_TRUE(
      prompt.starts_with(chat_prompt_text(view(), open, nullptr, nullptr, PromptEnd::NewTurn)));

  std::string param;
  EXPECT_EQ(400, status_of(
                     [&] {
                       json no_final = msgs;
                       no_final.erase(no_final.size() - 1);
                       chat_prompt(view(), no_final, nullptr, nullptr, PromptEnd::ContinueFinal);
                     },
                     &param));
  EXPECT_EQ(param, "continue_final_message");
  EXPECT_EQ(400, status_of(
                     [&] {
                       auto g = parse_span_query(q(R"({"g": {"model": "m", "input": {"cross": [
                           {"user": "Q?"}, {"plus": [{"assistant": "in a span"}]}]}}})"));
                       span_prompt(view(), flatten(g.g.input), spans, true);
                     },
                     &param));
  EXPECT_EQ(param, "continue_final_message");
  EXPECT_EQ(400, status_of(
                     [&] {
                       parse_span_query(q(R"({"g": {"model": "m", "continue_final_message": 1,
                           "input": {"user": "Q?"}}})"));
                     },
                     &param));
  EXPECT_EQ(param, "g.continue_final_message");
}

}  // namespace
}  // namespace wick::server
