// Malformed and unsupported model files: each gives an error naming the file,
// the tensor and what was expected; none crashes.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "helpers.h"
#include "io/error.h"
#include "io/gguf.h"
#include "model/convert.h"

namespace wick::test {
namespace {

namespace fs = std::filesystem;

std::vector<StTensor> tiny_llama_tensors() {
  TensorSet set;
  read_safetensors(tiny_dir("llama") + "/model.safetensors", set);
  std::vector<StTensor> out;
  for (auto& [name, t] : set.all()) {
    auto* p = static_cast<const uint8_t*>(t.data);
    out.push_back({name, "F32", t.shape, std::vector<uint8_t>(p, p + t.n_bytes)});
  }
  return out;
}

// A copy of the tiny llama folder with the given tensors and config edit.
std::string make_folder(const std::string& name, const std::vector<StTensor>& ts,
                        std::function<void(nlohmann::json&)> edit_config = nullptr) {
  std::string dir = data_dir() + "/bad/" + name;
  fs::create_directories(dir);
  auto cfg = read_json(tiny_dir("llama") + "/config.json");
  if (edit_config) edit_config(cfg);
  std::ofstream(dir + "/config.json") << cfg.dump();
  write_safetensors(dir + "/model.safetensors", ts);
  return dir;
}

// Expects load_model(path) to throw an error whose message holds every piece.
void expect_load_error(const std::string& path, const std::vector<std::string>& pieces) {
  try {
    load_model(path);
    ADD_FAILURE() << "loading " << path << " did not fail";
  } catch (const IoError& e) {
    for (auto& p : pieces)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nmissing: " << p;
  } catch (const ModelError& e) {
    for (auto& p : pieces)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nmissing: " << p;
  }
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(tiny_dir("llama")))
      WICK_SKIP_OR_FAIL("../shared/fixtures not found at " << shared_dir());
  }
};

TEST_F(BadInput, TruncatedSafetensors) {
  auto ts = tiny_llama_tensors();
  auto dir = make_folder("truncated_st", ts);
  auto f = dir + "/model.safetensors";
  fs::resize_file(f, fs::file_size(f) / 2);
  expect_load_error(dir, {f, "outside the file"});
  fs::resize_file(f, 5);
  expect_load_error(dir, {f, "truncated"});
}

TEST_F(BadInput, SafetensorsHeaderPointsOutsideFile) {
  auto dir = make_folder("outside_st", tiny_llama_tensors());
  write_safetensors(dir + "/model.safetensors", tiny_llama_tensors(), [](nlohmann::json& h) {
    h["model.norm.weight"]["data_offsets"] = {100000000, 100000256};
  });
  expect_load_error(dir, {dir + "/model.safetensors", "model.norm.weight", "outside"});
  write_safetensors(dir + "/model.safetensors", tiny_llama_tensors(), [](nlohmann::json& h) {
    h["model.norm.weight"]["data_offsets"] = h["model.embed_tokens.weight"]["data_offsets"];
    h["model.norm.weight"]["shape"] = h["model.embed_tokens.weight"]["shape"];
  });
  expect_load_error(dir, {dir + "/model.safetensors", "overlap"});
  write_safetensors(dir + "/model.safetensors", tiny_llama_tensors(),
                    [](nlohmann::json& h) { h["model.norm.weight"]["shape"] = {65}; });
  expect_load_error(dir, {"model.norm.weight", "[65]", "needs 260"});
  // A header length beyond the file.
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      .write("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10);
  expect_load_error(dir, {"truncated"});
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      .write("\x04\x00\x00\x00\x00\x00\x00\x00{{{{", 12);
  expect_load_error(dir, {"not valid JSON"});
}

TEST_F(BadInput, TensorWithWrongShape) {
  auto ts = tiny_llama_tensors();
  for (auto& t : ts)
    if (t.name == "model.layers.1.self_attn.k_proj.weight") t.shape = {64, 32};  // transposed
  auto dir = make_folder("wrong_shape", ts);
  expect_load_error(dir, {dir + "/model.safetensors", "model.layers.1.self_attn.k_proj.weight",
                          "[64, 32]", "expected [32, 64]"});
}

TEST_F(BadInput, MissingTensor) {
  auto ts = tiny_llama_tensors();
  std::erase_if(ts, [](auto& t) { return t.name == "model.layers.0.mlp.up_proj.weight"; });
  auto dir = make_folder("missing", ts);
  expect_load_error(dir, {dir, "model.layers.0.mlp.up_proj.weight", "missing", "[128, 64]"});
}

TEST_F(BadInput, UnknownArchitecture) {
  auto dir = make_folder("unknown_arch", tiny_llama_tensors(),
                         [](auto& c) { c["model_type"] = "gpt_neox"; });
  expect_load_error(dir, {dir + "/config.json", "gpt_neox", "supported"});
  const std::string g = data_dir() + "/bad/unknown_arch.gguf";
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("falcon"));
  w.write(g);
  expect_load_error(g, {g, "falcon"});
}

// What the forward does not compute is refused, not ignored: biases on the
// MLP, and Granite multipliers that are not positive numbers.
TEST_F(BadInput, ConfigValuesTheForwardCannotHonour) {
  auto dir = make_folder("mlp_bias", tiny_llama_tensors(), [](auto& c) { c["mlp_bias"] = true; });
  expect_load_error(dir, {dir + "/config.json", "mlp_bias=true is not supported"});
  dir = make_folder("granite_zero", tiny_llama_tensors(), [](auto& c) {
    c["model_type"] = "granite";
    c["logits_scaling"] = 0.0;
  });
  expect_load_error(dir,
                    {dir + "/config.json", "the logit scale must be a positive number (got 0)"});
  // GraniteMoeShared's shared experts (llama.cpp's granitemoe with
  // expert_shared_feed_forward_length) would be dropped: refused by name
  const std::string g = data_dir() + "/bad/granitemoe_shared.gguf";
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("granitemoe"));
  for (const char* k :
       {"embedding_length", "block_count", "attention.head_count", "feed_forward_length",
        "expert_count", "expert_used_count", "expert_shared_feed_forward_length"})
    w.set(std::string("granitemoe.") + k, GgufValue::u32(64));
  w.write(g);
  expect_load_error(g, {g, "shared experts (GraniteMoeShared) are not supported"});
}

// Rewrites the tiny llama GGUF with `edit` applied to each tensor in turn.
std::string rewrite_gguf(
    const std::string& name,
    std::function<bool(std::string&, DType&, std::vector<int64_t>&, std::vector<uint8_t>&)> edit) {
  const std::string src = data_dir() + "/bad/llama-f32.gguf";
  if (!fs::exists(src)) convert_hf_to_gguf(tiny_dir("llama"), src, DType::F32);
  GgufFile f(src);
  GgufWriter w;
  for (auto& [k, v] : f.metadata()) w.set(k, v);
  for (auto& n : f.tensor_order()) {
    const TensorView& t = *f.tensors().find(n);
    std::string nm = n;
    DType dt = t.dtype;
    auto shape = t.shape;
    auto* p = static_cast<const uint8_t*>(t.data);
    std::vector<uint8_t> bytes(p, p + t.n_bytes);
    if (edit(nm, dt, shape, bytes)) w.add_tensor(nm, dt, shape, bytes.data(), bytes.size());
  }
  const std::string out = data_dir() + "/bad/" + name + ".gguf";
  w.write(out);
  return out;
}

TEST_F(BadInput, UnsupportedQuantType) {
  auto g = rewrite_gguf("iq2xxs", [](std::string& n, DType& dt, auto& shape, auto& bytes) {
    if (n == "blk.0.attn_v.weight") {  // [32, 64] f32 -> [32, 256] iq2_xxs: 32 blocks of 66 bytes
      dt = static_cast<DType>(16);     // GGML's IQ2_XXS, which wick does not read
      shape = {32, 256};
      bytes.assign(32 * 66, 0);
    }
    return true;
  });
  expect_load_error(g, {g, "blk.0.attn_v.weight", "iq2_xxs", "not support"});
}

TEST_F(BadInput, GgufWrongShapeMissingTruncatedAndOutside) {
  auto g = rewrite_gguf("shape", [](std::string& n, DType&, auto& shape, auto&) {
    if (n == "blk.1.ffn_down.weight") shape = {128, 64};
    return true;
  });
  expect_load_error(g, {g, "blk.1.ffn_down.weight", "[128, 64]", "expected [64, 128]"});
  g = rewrite_gguf("missing",
                   [](std::string& n, auto&, auto&, auto&) { return n != "output_norm.weight"; });
  expect_load_error(g, {g, "output_norm.weight", "missing"});
  g = rewrite_gguf("truncated", [](auto&, auto&, auto&, auto&) { return true; });
  fs::resize_file(g, fs::file_size(g) - 1000);
  expect_load_error(g, {g, "outside the file"});
  fs::resize_file(g, 200);
  expect_load_error(g, {g, "truncated"});
  // A tensor offset pointing past the end: patch the last tensor info's offset.
  g = rewrite_gguf("outside", [](auto&, auto&, auto&, auto&) { return true; });
  {
    GgufFile ok(g);
    const TensorView* last = ok.tensors().find(ok.tensor_order().back());
    ASSERT_NE(last, nullptr);
  }
  std::fstream f(g, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  const std::string last_name = "output.weight";
  auto pos = std::string(bytes.begin(), bytes.end()).rfind(last_name);
  ASSERT_NE(pos, std::string::npos);
  // name, n_dims (4), 2 dims (16), type (4), then the u64 offset
  const size_t off_at = pos + last_name.size() + 4 + 16 + 4;
  uint64_t far = 1ull << 36;
  f.seekp(std::streamoff(off_at));
  f.write(reinterpret_cast<const char*>(&far), 8);
  f.close();
  expect_load_error(g, {g, "output.weight", "outside the file"});
}

TEST_F(BadInput, NotAModelAtAll) {
  const std::string p = data_dir() + "/bad/garbage.gguf";
  fs::create_directories(data_dir() + "/bad");
  std::ofstream(p) << "this is not a model";
  expect_load_error(p, {p, "not a GGUF file"});
  expect_load_error(data_dir() + "/bad/nope.gguf", {"nope.gguf", "no such file"});
  expect_load_error(data_dir() + "/bad", {"no config.json"});
}

}  // namespace
}  // namespace wick::test
