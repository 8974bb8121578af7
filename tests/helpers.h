// Shared test helpers: fixture paths, reference files, running a model.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/forward.h"
#include "model/model.h"

namespace wick::test {

// ../shared, or WICK_SHARED_DIR at run time (a GPU machine with a copy elsewhere)
inline std::string shared_dir() {
  const char* d = std::getenv("WICK_SHARED_DIR");
  return d && *d ? d : WICK_SHARED_DIR;
}
// the repository, or WICK_SOURCE_DIR at run time (a GPU machine's copy)
inline std::string source_dir() {
  const char* d = std::getenv("WICK_SOURCE_DIR");
  return d && *d ? d : WICK_SOURCE_DIR;
}
// Granite's fixtures are the repository's (scripts/make_granite_fixture.py), in
// ../shared's layout; the others are ../shared's.
inline std::string tiny_dir(const std::string& arch) {
  if (arch == "granite" || arch == "granitemoe")
    return source_dir() + "/tests/fixtures/tiny-models/" + arch;
  return shared_dir() + "/fixtures/tiny-models/" + arch;
}
// made by the setup tests, or WICK_TEST_DATA_DIR at run time (a GPU machine's copy)
inline std::string data_dir() {
  const char* d = std::getenv("WICK_TEST_DATA_DIR");
  return d && *d ? d : WICK_TEST_DATA_DIR;
}
inline std::string wick_bin() {
  return WICK_BIN;
}

// CI mode: the environment variable CI is "true" (any case) or "1", as CI
// services set it. There a test that cannot run (a missing fixture, model or
// reference) fails instead of skipping, so that a CI run is green only when
// every check ran.
inline bool ci_mode() {
  const char* v = std::getenv("CI");
  if (!v) return false;
  std::string s(v);
  for (auto& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s == "true" || s == "1";
}

// Skips the current test with the streamed message, or fails it with the same
// message under CI (ci_mode()). Returns from the function like GTEST_SKIP, so
// use it in a test body, SetUp or a void helper. Usage:
//   WICK_SKIP_OR_FAIL("fixtures missing: " << path);
// Not for what CI machines lack by design (a GPU, an ISA): use GTEST_SKIP.
#define WICK_SKIP_OR_FAIL(...)                                       \
  do {                                                               \
    ::testing::Message wick_skip_msg_;                               \
    wick_skip_msg_ << __VA_ARGS__;                                   \
    if (::wick::test::ci_mode()) {                                   \
      GTEST_FAIL() << wick_skip_msg_ << " (CI=" << std::getenv("CI") \
                   << ": under CI a test that would skip fails)";    \
    } else {                                                         \
      GTEST_SKIP() << wick_skip_msg_;                                \
    }                                                                \
  } while (0)

#define WICK_REQUIRE_SHARED()                                                              \
  do {                                                                                     \
    if (!std::filesystem::exists(::wick::test::shared_dir() + "/fixtures/tiny-models"))    \
      WICK_SKIP_OR_FAIL("../shared/fixtures not found at " << ::wick::test::shared_dir()); \
  } while (0)

inline const std::vector<std::string>& archs() {
  static const std::vector<std::string> a{"llama",     "mistral", "qwen2",   "qwen3",
                                          "qwen3_moe", "mixtral", "granite", "granitemoe"};
  return a;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  in.seekg(0, std::ios::end);
  std::vector<float> v(size_t(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
  return v;
}

// max |a - b| / max |b|: the error relative to the reference's scale.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return a.size() == b.size() ? num / den : INFINITY;
}

// Runs `ids` as one sequence in chunks of `chunk` tokens (0 = one pass) and
// returns the logits of every position, [n, n_vocab].
// On `be` with weights `w` prepared for it (by default the model's weights
// prepared for a CPU backend).
inline std::vector<float> run_all_logits(Backend& be, const ModelConfig& c, const ModelWeights& w,
                                         const std::vector<int32_t>& ids, int64_t chunk = 0,
                                         bool pre_rope = false) {
  const int64_t n = int64_t(ids.size());
  auto kv = be.make_kv(c.n_layer, 1, n, c.kv_dim(), pre_rope);
  ForwardScratch s;
  std::vector<float> out(size_t(n * c.n_vocab));
  Buffer dev = be.alloc(out.size() * 4);
  if (chunk <= 0) chunk = n;
  for (int64_t start = 0; start < n; start += chunk) {
    Batch b;
    b.block_tables = {{0}};
    const int64_t end = std::min(n, start + chunk);
    for (int64_t i = start; i < end; ++i) b.add(ids[size_t(i)], int32_t(i), 0, true);
    forward(be, c, w, b, *kv, s, dev.as<float>() + start * c.n_vocab);
  }
  be.copy_to_host(out.data(), dev.data(), out.size() * 4);
  s = ForwardScratch{};
  return out;
}
// The model's weights prepared for a CPU backend of their own (repacked for
// the blocked multiply, as the engine runs them).
inline std::unique_ptr<DeviceModel> cpu_model(const Model& m) {
  return prepare_model(m, make_cpu_backend());
}
inline std::vector<float> run_all_logits(const Model& m, const std::vector<int32_t>& ids,
                                         int64_t chunk = 0) {
  auto dm = cpu_model(m);
  return run_all_logits(*dm->backend, m.config, dm->weights, ids, chunk);
}

struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file; `edit` may rewrite the header before it is written.
inline void write_safetensors(const std::string& path, const std::vector<StTensor>& ts,
                              std::function<void(nlohmann::json&)> edit = nullptr) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  std::vector<uint8_t> data;
  for (auto& t : ts) {
    h[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    off += t.bytes.size();
  }
  if (edit) edit(h);
  std::string hs = h.dump();
  uint64_t n = hs.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(hs.data(), std::streamsize(hs.size()));
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

}  // namespace wick::test
