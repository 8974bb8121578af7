// spnl's marker layout (--span-markers): the markers parsed, the spans a
// marker-laid-out prompt holds, and span queries laid out with the markers
// as spnl's own tokenize_query lays them out (the reference, PyPI spnl, run
// by tests/python/make_span_marker_fixtures.py).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/span_markers.h"
#include "helpers.h"
#include "server/span_query.h"
#include "text/tokenizer.h"

namespace wick {
namespace {

using Spans = std::vector<std::pair<int32_t, int32_t>>;

TEST(SpanMarkers, ParsesIdsAndTheBlockSize) {
  const SpanMarkers m = parse_span_markers("10,13,27");
  EXPECT_EQ(m.plus, 10);
  EXPECT_EQ(m.cross, 13);
  EXPECT_EQ(m.pad, 27);
  EXPECT_EQ(m.block_size, 16);
  EXPECT_TRUE(m.enabled());
  EXPECT_EQ(parse_span_markers("1,2,3,32").block_size, 32);
  EXPECT_FALSE(SpanMarkers{}.enabled());
}

TEST(SpanMarkers, BadSpecificationsAreClearErrors) {
  for (const char* bad :
       {"", "10", "10,13", "10,13,27,16,1", "10,13,x", "10,,27", "-1,13,27", "10,13,27,0",
        "10,13,27,5000", "10,10,27", "10, 13,27", "99999999999,1,2"}) {
    try {
      parse_span_markers(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("span markers"), std::string::npos) << e.what();
    }
  }
}

// A span runs from a PLUS at a block boundary to the next PLUS or CROSS at
// one; the last part is no span; markers off the boundaries are text.
TEST(SpanMarkers, SpansRunFromAnAlignedPlusToTheNextAlignedMarker) {
  const SpanMarkers m{1, 2, 0, 4};
  // blocks:       [5 5 5 0] [1 7 1 0] [1 2 7 0] [2 7 7 7] [1 7]
  const std::vector<int32_t> ids{5, 5, 5, 0, 1, 7, 1, 0, 1, 2, 7, 0, 2, 7, 7, 7, 1, 7};
  EXPECT_EQ(marker_spans(ids, m), (Spans{{4, 8}, {8, 12}}));  // the PLUS at 16 opens the last part
  // without a CROSS the last PLUS's part (the generation prompt) is no span either
  EXPECT_EQ(marker_spans(std::vector<int32_t>{1, 5, 0, 0, 1, 6, 6, 0, 1, 9}, m),
            (Spans{{0, 4}, {4, 8}}));
  EXPECT_TRUE(
      marker_spans(std::vector<int32_t>{5, 1, 2, 1, 5, 2, 1, 2}, m).empty());  // none aligned
  EXPECT_TRUE(marker_spans(std::vector<int32_t>{1, 5, 5, 5, 5}, m).empty());   // one part: the last
  EXPECT_TRUE(marker_spans(ids, SpanMarkers{}).empty());                       // layout off
}

TEST(SpanMarkers, PadsToTheBlockThenPushesTheMarker) {
  const SpanMarkers m{1, 2, 0, 4};
  std::vector<int32_t> ids;
  push_marker(ids, m.plus, m);  // at a boundary already: no PAD
  ids.push_back(7);
  push_marker(ids, m.cross, m);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 7, 0, 0, 2}));
  pad_to_block(ids, m);
  EXPECT_EQ(ids.size(), 8u);
  pad_to_block(ids, m);
  EXPECT_EQ(ids.size(), 8u);
}

class MarkerLayout : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string fx = test::data_dir() + "/spans/span_markers.json";
    if (!std::filesystem::exists(fx) ||
        !std::filesystem::exists(test::shared_dir() + "/tokenizers/qwen3"))
      return;
    fx_ = new nlohmann::json(test::read_json(fx));
    tk_ = Tokenizer::load(test::shared_dir() + "/tokenizers/qwen3").release();
    tk_->chat_template = (*fx_)["template"];  // spnl's ChatML, as Jinja
    const auto& mk = (*fx_)["markers"];
    markers_ = {mk[0], mk[1], mk[2], mk[3]};
  }
  void SetUp() override {
    if (!tk_)
      WICK_SKIP_OR_FAIL("no " << test::data_dir()
                              << "/spans/span_markers.json (setup.span_marker_fixtures) or "
                                 "shared tokenizers");
  }
  server::ModelView view() const { return {*tk_, "qwen3", 32768}; }
  static inline nlohmann::json* fx_ = nullptr;
  static inline Tokenizer* tk_ = nullptr;
  static inline SpanMarkers markers_;
};

std::vector<int32_t> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

TEST_F(MarkerLayout, EqualsSpnlsTokenizeQuery) {
  ASSERT_GE((*fx_)["cases"].size(), 10u);
  for (const auto& c : (*fx_)["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const server::SpanQuery q = server::parse_span_query(c["query"]);
    if (q.top == server::SpanQuery::Top::Map) {
      ASSERT_EQ(q.inputs.size(), c["inputs"].size());
      for (size_t i = 0; i < q.inputs.size(); ++i)
        EXPECT_EQ(server::marker_map_prompt(view(), q.inputs[i], markers_), ids_of(c["inputs"][i]));
      continue;
    }
    const auto ids = server::marker_prompt(view(), q.g.input, markers_);
    EXPECT_EQ(ids, ids_of(c["ids"]));
    // every span starts with PLUS at a block boundary and ends at one
    for (auto [b, e] : marker_spans(ids, markers_)) {
      EXPECT_EQ(b % markers_.block_size, 0);
      EXPECT_EQ(e % markers_.block_size, 0);
      EXPECT_EQ(ids[size_t(b)], markers_.plus);
    }
  }
}

// What the layout is for: a document's span has the same ids wherever it
// stands, and the question after the CROSS is no span.
TEST_F(MarkerLayout, ADocumentsSpanHasTheSameIdsWhereverItStands) {
  auto layout = [&](const char* text) {
    return server::marker_prompt(
        view(), server::parse_span_query(nlohmann::json::parse(text)).g.input, markers_);
  };
  const auto a = layout(R"({"g": {"model": "m", "input": {"cross": [{"system": "S"},
      {"plus": [{"user": "doc A is here"}, {"user": "doc B"}]}, {"user": "Q?"}]}}})");
  const auto b = layout(R"({"g": {"model": "m", "input": {"cross": [{"system": "S"},
      {"user": "a longer text before the documents, in no span"},
      {"plus": [{"user": "doc B"}, {"user": "new doc"}, {"user": "doc A is here"}]}, {"user": "Q?"}]}}})");
  const Spans sa = marker_spans(a, markers_), sb = marker_spans(b, markers_);
  ASSERT_EQ(sa.size(), 2u);
  ASSERT_EQ(sb.size(), 3u);
  auto part = [](const std::vector<int32_t>& ids, std::pair<int32_t, int32_t> s) {
    return std::vector<int32_t>(ids.begin() + s.first, ids.begin() + s.second);
  };
  EXPECT_EQ(part(a, sa[0]), part(b, sb[2]));  // doc A
  EXPECT_EQ(part(a, sa[1]), part(b, sb[0]));  // doc B
  EXPECT_NE(sa[0].first, sb[2].first);
  EXPECT_EQ(a[size_t(sa[1].second)], markers_.cross);
}

TEST_F(MarkerLayout, AQueryWithoutMessagesIsA400) {
  try {
    server::marker_prompt(
        view(),
        server::parse_span_query(
            nlohmann::json::parse(R"({"g": {"model": "m", "input": {"plus": []}}})"))
            .g.input,
        markers_);
    FAIL() << "accepted";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status, 400);
  }
}

}  // namespace
}  // namespace wick
