// The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against an
// independent numpy forward over weights dequantized by the `gguf` package
// (tests/python/ref_forward.py, itself checked on the tiny llama fixture).
#include <gtest/gtest.h>

#include <sstream>

#include "helpers.h"

namespace wick::test {
namespace {

TEST(SmolLM2, LogitsMatchNumpyReference) {
  const char* model = std::getenv("WICK_TEST_MODEL");
  const std::string ref = data_dir() + "/smollm2_ref.f32";
  if (!model || !std::filesystem::exists(model) || !std::filesystem::exists(ref))
    WICK_SKIP_OR_FAIL(
        "default model or its numpy reference missing (run scripts/fetch_model; "
        "WICK_TEST_MODEL="
        << (model ? model : "unset") << ", reference " << ref << ")");
  auto m = load_model(model);
  EXPECT_EQ(m->config.arch, Arch::Llama);
  EXPECT_EQ(m->config.n_layer, 30);
  std::vector<int32_t> ids;
  std::istringstream list(WICK_SMOLLM2_IDS);
  for (std::string s; std::getline(list, s, ',');) ids.push_back(std::stoi(s));
  auto got = run_all_logits(*m, ids);
  auto want = read_f32(ref);
  ASSERT_EQ(got.size(), want.size());
  const double err = rel_err(got, want);
  std::printf("[ report ] smollm2 q4_1 vs numpy float64 reference: relative error %.2e\n", err);
  EXPECT_LT(err, 1e-4);
  // and the same argmax at every position
  const int64_t V = m->config.n_vocab;
  for (size_t r = 0; r < ids.size(); ++r) {
    auto a =
        std::max_element(got.begin() + long(r * V), got.begin() + long((r + 1) * V)) - got.begin();
    auto b = std::max_element(want.begin() + long(r * V), want.begin() + long((r + 1) * V)) -
             want.begin();
    EXPECT_EQ(a, b) << "position " << r;
  }
}

}  // namespace
}  // namespace wick::test
