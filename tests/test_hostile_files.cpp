// Hostile model and tokenizer files, one test per vulnerability class of
// docs/security.md (each input also seeds fuzz/), and the file faults: a
// model file truncated under a loaded model, a write that runs out of room.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/model_pool.h"
#include "helpers.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "io/gguf.h"
#include "model/convert.h"
#include "text/detokenizer.h"
#include "text/jinja.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace wick::test {
namespace {

namespace fs = std::filesystem;

// GGUF bytes, field by field, so that each test can break one rule.
struct Bytes {
  std::string b;
  template <typename T>
  Bytes& put(T x) {
    b.append(reinterpret_cast<const char*>(&x), sizeof x);
    return *this;
  }
  Bytes& str(const std::string& s) { return put<uint64_t>(s.size()).raw(s); }
  Bytes& raw(const std::string& s) {
    b += s;
    return *this;
  }
};

constexpr uint32_t kU8 = 0, kU32 = 4, kString = 8, kArray = 9;

// Header of a GGUF v3 file with these counts.
Bytes header(uint64_t n_tensors, uint64_t n_kv) {
  return Bytes{}.put<uint32_t>(0x46554747).put<uint32_t>(3).put(n_tensors).put(n_kv);
}
// One tensor info (dims innermost first, as GGUF stores them), then padding
// to 32 and n_data bytes of data.
Bytes& tensor(Bytes& g, const std::string& name, std::vector<uint64_t> dims, uint32_t type,
              uint64_t offset) {
  g.str(name).put<uint32_t>(uint32_t(dims.size()));
  for (auto d : dims) g.put(d);
  return g.put(type).put(offset);
}
std::string with_data(Bytes g, size_t n_data) {
  g.b.resize((g.b.size() + 31) / 32 * 32, '\0');
  g.b.append(n_data, '\0');
  return g.b;
}

class HostileFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("wick-hostile-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // Reading must fail with an IoError whose message holds `piece`.
  void expect_refused(const std::string& name, const std::string& bytes, const std::string& piece) {
    const std::string p = file(name, bytes);
    try {
      GgufFile f(p);
      ADD_FAILURE() << name << " was accepted";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

// Class: integer overflow in tensor sizes (llama.cpp CVE-2026-27940,
// CVE-2025-49847). Each dimension is allowed alone; their product wraps.
TEST_F(HostileFiles, GgufTensorDimensionsWhoseProductOverflows) {
  Bytes g = header(1, 0);
  tensor(g, "t", {1ull << 32, 1ull << 32, 4}, 0, 0);  // 2^66 floats: wraps to 0 bytes
  expect_refused("wrap.gguf", with_data(g, 32), "more elements than 2^64");
  Bytes h = header(1, 0);
  tensor(h, "t", {1ull << 40, 1ull << 40, 1ull << 40, 1ull << 40}, 0, 0);
  expect_refused("wrap4.gguf", with_data(h, 32), "more elements than 2^64");
  Bytes q =
      header(1, 0);  // q8_0: 31 * 2^59 elements fit, their 31 * 2^54 blocks of 34 bytes do not
  tensor(q, "t", {1ull << 40, 31ull << 19}, 8, 0);
  expect_refused("bytes.gguf", with_data(q, 64), "more than 2^64 bytes");
}

TEST_F(HostileFiles, SafetensorsShapeWhoseProductOverflows) {
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]}})";
  Bytes st;
  st.put<uint64_t>(h.size()).raw(h);
  TensorSet set;
  try {
    read_safetensors(file("wrap.safetensors", st.b), set);
    ADD_FAILURE() << "accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("more elements than 2^64"), std::string::npos) << e.what();
  }
}

// A dimension past 64 bits is a double to the JSON parser: converting it was
// undefined behaviour (found by fuzz_safetensors).
TEST_F(HostileFiles, SafetensorsDimensionPastInt64) {
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[4,42966666666666666666660],"data_offsets":[0,0]}})";
  Bytes st;
  st.put<uint64_t>(h.size()).raw(h);
  TensorSet set;
  try {
    read_safetensors(file("big.safetensors", st.b), set);
    ADD_FAILURE() << "accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not a 64-bit integer"), std::string::npos) << e.what();
  }
}

// Byte tokens whose run turns invalid after a character was streamed: each
// streamed piece is still valid UTF-8 (found by fuzz_detokenizer).
TEST_F(HostileFiles, StreamedPiecesStayValidUtf8) {
  const std::string dir = shared_dir() + "/tokenizers/llama2";
  if (!fs::exists(dir)) WICK_SKIP_OR_FAIL("no Llama 2 tokenizer at " << dir);
  auto tk = Tokenizer::load(dir);
  StreamDecoder sd(*tk, false);
  for (int32_t id : {27881, 16896, 27648, 16896, 768, 9, 191, 233, 191, 2307}) {
    const std::string piece = sd.push(id);
    EXPECT_EQ(utf8::find_invalid(piece), std::string::npos) << "after id " << id;
  }
  EXPECT_EQ(utf8::find_invalid(sd.finish()), std::string::npos);
}

TEST_F(HostileFiles, GgufMoreThanFourDimensions) {
  Bytes g = header(1, 0);
  tensor(g, "t", {1, 1, 1, 1, 1}, 0, 0);
  expect_refused("5d.gguf", with_data(g, 32), "5 dimensions");
}

// Class: out-of-bounds reads through offsets (llama.cpp, Ollama CVE-2026-7482).
TEST_F(HostileFiles, GgufOffsetsPastTheEnd) {
  Bytes g = header(1, 0);
  tensor(g, "t", {8}, 0, 1ull << 62);
  expect_refused("past.gguf", with_data(g, 32), "lies outside the file");
  Bytes w = header(1, 0);  // offset + size wraps around 2^64
  tensor(w, "t", {8}, 0, ~0ull - 31);
  expect_refused("wrapoff.gguf", with_data(w, 32), "lies outside the file");
}

TEST_F(HostileFiles, GgufStringAndArrayLengthsNear2To64) {
  Bytes s = header(0, 1);
  s.str("k").put<uint32_t>(kString).put<uint64_t>(~0ull).raw("x");
  expect_refused("str.gguf", s.b, "claims a string of 18446744073709551615 bytes");
  Bytes a = header(0, 1);
  a.str("k").put<uint32_t>(kArray).put<uint32_t>(kU32).put<uint64_t>(~0ull);
  expect_refused("arr.gguf", a.b, "does not fit in the file");
  Bytes n = header(~0ull, ~0ull);  // counts near 2^64
  expect_refused("counts.gguf", n.b, "the file is too small");
}

TEST_F(HostileFiles, GgufNestedArraysAndWrongTypes) {
  Bytes deep = header(0, 1);
  deep.str("k").put<uint32_t>(kArray);  // an array of arrays of arrays ...
  for (int i = 0; i < 40; ++i) deep.put<uint32_t>(kArray).put<uint64_t>(1);
  expect_refused("deep.gguf", deep.b, "nested too deep");
  Bytes bad = header(0, 1);
  bad.str("k").put<uint32_t>(77).put<uint64_t>(0);
  expect_refused("type.gguf", bad.b, "unknown value type 77");
  Bytes elem = header(0, 1);
  elem.str("k").put<uint32_t>(kArray).put<uint32_t>(13).put<uint64_t>(1);
  expect_refused("elem.gguf", elem.b, "unknown array type 13");
}

TEST_F(HostileFiles, GgufDuplicateKeysAndBadAlignment) {
  Bytes d = header(0, 2);
  d.str("a").put<uint32_t>(kU8).put<uint8_t>(1).str("a").put<uint32_t>(kU8).put<uint8_t>(2);
  expect_refused("dup.gguf", d.b, "metadata key 'a' repeats");
  for (uint32_t align : {0u, 24u}) {
    Bytes g = header(1, 1);
    g.str("general.alignment").put<uint32_t>(kU32).put(align);
    tensor(g, "t", {8}, 0, 0);
    expect_refused("align.gguf", with_data(g, 64), "is not a power of two");
  }
}

// A GGUF tokenizer whose token_type array holds strings: a TextError, not
// std::bad_variant_access (a 500 in the server).
TEST_F(HostileFiles, GgufTokenizerArraysOfTheWrongType) {
  Bytes g = header(0, 3);
  g.str("tokenizer.ggml.model").put<uint32_t>(kString).str("llama");
  g.str("tokenizer.ggml.tokens").put<uint32_t>(kArray).put<uint32_t>(kString).put<uint64_t>(2);
  g.str("a").str("b");
  g.str("tokenizer.ggml.token_type").put<uint32_t>(kArray).put<uint32_t>(kString);
  g.put<uint64_t>(2).str("x").str("y");
  GgufFile f(file("types.gguf", g.b));
  try {
    Tokenizer::from_gguf(f);
    ADD_FAILURE() << "accepted";
  } catch (const TextError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.token_type has the wrong type"),
              std::string::npos)
        << e.what();
  }
}

// Class: a negative count or index turned into an out-of-bounds write
// (llama.cpp CVE-2026-21869): a negative token id indexed the vocabulary.
TEST_F(HostileFiles, TokenizerJsonNegativeAndHugeIds) {
  // the file is refused with a TextError that says `needle`
  auto expect_refused = [](const std::string& j, const std::string& needle) {
    try {
      Tokenizer::from_json(j, "hostile.json");
      ADD_FAILURE() << "accepted: " << j;
    } catch (const TextError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto with_id = [](const std::string& id) {
    return R"({"model":{"type":"BPE","vocab":{"a":0,"b":)" + id +
           R"(},"merges":[]},"added_tokens":[]})";
  };
  for (const std::string id : {"-7", "2147483647", "1099511627776"})
    expect_refused(with_id(id), "is outside [0, 16777216)");
  // fuzz_tokenizer: numbers given as floats past int64/int32 converted with UB
  for (const std::string id : {"1.59e21", "3.5"}) expect_refused(with_id(id), "is not an integer");
  expect_refused(
      R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[],)"
      R"("post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"B"}}],)"
      R"("special_tokens":{"B":{"ids":[1.18e20]}}}})",
      "is not an integer in [0, 16777216)");
  expect_refused(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[],)"
                 R"("decoder":{"type":"Strip","content":" ","start":1.84e20,"stop":0}})",
                 "Strip decoder's start");
  const std::string added =
      R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":-1,"content":"x"}]})";
  EXPECT_THROW(Tokenizer::from_json(added, "added.json"), TextError);
}

// Class: vocabularies whose sizes disagree with the embedding: ids the
// tokenizer makes past the embedding's rows would be read outside it.
TEST_F(HostileFiles, TokenizerLargerThanTheEmbeddingIsRefused) {
  if (!fs::exists(tiny_dir("llama"))) WICK_SKIP_OR_FAIL("no tiny llama at " << tiny_dir("llama"));
  const std::string f32 = (dir_ / "llama-f32.gguf").string();
  convert_hf_to_gguf(tiny_dir("llama"), f32, DType::F32);
  GgufFile src(f32);
  GgufWriter w;
  for (auto& [k, v] : src.metadata()) w.set(k, v);
  const int64_t n_vocab = *src.get_int("llama.vocab_size");
  std::vector<GgufValue> toks, scores, types;
  for (int64_t i = 0; i < n_vocab + 88; ++i) {  // 88 ids past the embedding
    toks.push_back(GgufValue::str("t" + std::to_string(i)));
    scores.push_back(GgufValue::f32(0));
    types.push_back(GgufValue::i32(1));
  }
  w.set("tokenizer.ggml.model", GgufValue::str("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, toks));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::F32, scores));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::I32, types));
  for (auto& n : src.tensor_order()) {
    const TensorView& t = *src.tensors().find(n);
    w.add_tensor(n, t.dtype, t.shape, t.data, t.n_bytes);
  }
  const std::string out = (dir_ / "vocab.gguf").string();
  w.write(out);
  try {
    load_model_at("vocab", out, {}, cpu_options());
    ADD_FAILURE() << "accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("the tokenizer has {} tokens", n_vocab + 88)),
              std::string::npos)
        << e.what();
  }
}

// Untrusted templates: bounded, and a namespace that holds itself is freed
// (LeakSanitizer in make test-asan checks the second part).
TEST_F(HostileFiles, TemplatesAreBoundedAndFreeTheirCycles) {
  jinja::Template::Options opt;
  opt.max_steps = 1000;
  EXPECT_THROW(jinja::Template("{% for i in range(10**12) %}x{% endfor %}", "t", opt).render({}),
               jinja::TemplateError);
  EXPECT_THROW(jinja::Template("{{ 99999999999999999999 }}", "t").render({}), jinja::TemplateError);
  EXPECT_THROW(jinja::Template("{{ (-9223372036854775807 - 1) | abs }}", "t").render({}),
               jinja::TemplateError);
  EXPECT_EQ(jinja::Template("{{ (1e300 | int) }}", "t").render({}), "0");
  for (const char* overflow :
       {"{{ 9223372036854775807 * 2 }}", "{{ 9223372036854775807 + 1 }}",
        "{{ -9223372036854775807 - 2 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
        "{{ -(-9223372036854775807 - 1) }}"})
    EXPECT_THROW(jinja::Template(overflow, "t").render({}), jinja::TemplateError) << overflow;
  // a filter's own argument error (found by fuzz_jinja: it escaped as std::runtime_error)
  EXPECT_THROW(jinja::Template("{{ 'a' | replace('A', dens=2) }}", "t").render({}),
               jinja::TemplateError);
  EXPECT_EQ(jinja::Template("{% set ns = namespace(a=1) %}{% set ns.a = ns %}ok", "t").render({}),
            "ok");
}

// ---- faults ----

// A write past the file size limit (as a full disk) leaves the old file as it
// was and no temporary behind, and says what happened.
TEST_F(HostileFiles, AWriteThatRunsOutOfRoomLeavesNoPartialFile) {
  const std::string p = file("out.gguf", "old contents");
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 16 << 10;
  auto prev = std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    GgufWriter w;
    std::vector<float> big(64 << 10, 1.f);
    w.add_tensor("t", DType::F32, {int64_t(big.size())}, big.data(), big.size() * 4);
    w.write(p);
  } catch (const IoError& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev);
  EXPECT_NE(msg.find(p + ": write failed after 16384 bytes: File too large"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("nothing was written there"), std::string::npos) << msg;
  std::ifstream in(p);
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "old contents");
  for (auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(HostileFiles, AtomicWriteReplacesTheFileWhole) {
  const std::string p = file("x.bin", "old");
  const std::string bytes(100000, 'z');
  write_file_atomic(p, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  EXPECT_EQ(fs::file_size(p), bytes.size());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 1);
}

// A model file truncated after loading: the pool sees it and loads again
// (here: a clear error for the broken file) instead of reading past its end.
TEST_F(HostileFiles, APoolModelWhoseFileIsTruncatedIsLoadedAgain) {
  if (!fs::exists(tiny_dir("llama"))) WICK_SKIP_OR_FAIL("no tiny llama at " << tiny_dir("llama"));
  const std::string p = (dir_ / "m.gguf").string();
  convert_hf_to_gguf(tiny_dir("llama"), p, DType::F32);
  ModelPool pool(2, 0);
  auto first = pool.get(p);
  EXPECT_FALSE(first->model->file_shrunk());
  EXPECT_EQ(pool.get(p), first);  // unchanged: the same model
  const auto size = fs::file_size(p);
  fs::resize_file(p, size / 2);
  EXPECT_TRUE(first->model->file_shrunk());
  try {
    pool.get(p);
    ADD_FAILURE() << "the truncated file loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.n_loads(), 2u);
  // Replaced by rename (as wick's own writers do): the mapping keeps the old
  // inode's data; nothing to reload.
  convert_hf_to_gguf(tiny_dir("llama"), p, DType::F32);
  auto second = pool.get(p);
  convert_hf_to_gguf(tiny_dir("llama"), p, DType::F32);
  EXPECT_FALSE(second->model->file_shrunk());
  EXPECT_EQ(pool.get(p), second);
}

}  // namespace
}  // namespace wick::test
