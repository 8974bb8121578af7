// GGUF reading (every metadata type, nested arrays, v2 and v3) and
// dequantization of every supported type against the `gguf` Python package.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "backend/cpu/simd.h"
#include "helpers.h"
#include "io/error.h"
#include "io/gguf.h"
#include "model/convert.h"

namespace wick::test {
namespace {

std::string fixture() {
  return data_dir() + "/gguf/quants.gguf";
}

TEST(Gguf, ReadsEveryMetadataType) {
  GgufFile f(fixture());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(*f.get_int("test.u8"), 255);
  EXPECT_EQ(*f.get_int("test.i8"), -128);
  EXPECT_EQ(*f.get_int("test.u16"), 65535);
  EXPECT_EQ(*f.get_int("test.i16"), -32768);
  EXPECT_EQ(*f.get_int("test.u32"), 4000000000LL);
  EXPECT_EQ(*f.get_int("test.i32"), -2000000000LL);
  EXPECT_EQ(uint64_t(*f.get_int("test.u64")), (1ull << 63) + 5);
  EXPECT_EQ(*f.get_int("test.i64"), -(1LL << 62));
  EXPECT_EQ(*f.get_float("test.f32"), 0.25);
  EXPECT_EQ(*f.get_float("test.f64"), -1.5e300);
  EXPECT_EQ(std::get<bool>(f.get("test.bool")->v), true);
  EXPECT_EQ(*f.get_str("test.str"), "héllo ✓");
  auto& ai = f.get("test.arr_i32")->as_array();
  ASSERT_EQ(ai.size(), 3u);
  EXPECT_EQ(ai[1].as_int(), -2);
  auto& as = f.get("test.arr_str")->as_array();
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(as[1].as_str(), "");
  EXPECT_EQ(as[2].as_str(), "ü");
  auto& nested = f.get("test.nested")->as_array();
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(f.get("test.nested")->elem_type, GgufType::ARRAY);
  ASSERT_EQ(nested[1].as_array().size(), 3u);
  EXPECT_EQ(nested[1].as_array()[2].as_int(), 5);
  EXPECT_THROW(f.get_int("test.str"), IoError);
}

// Every block of every type, through the reference path and each SIMD kernel
// set this CPU has: bit-exact against gguf.quants.dequantize.
TEST(Gguf, DequantizationMatchesGgufPackage) {
  GgufFile f(fixture());
  auto expect = read_json(data_dir() + "/gguf/expect.json");
  int n_types = 0;
  for (auto& t : expect["tensors"]) {
    const TensorView* tv = f.tensors().find(t["name"]);
    ASSERT_NE(tv, nullptr) << t["name"];
    EXPECT_EQ(dtype_name(tv->dtype), t["type"].get<std::string>());
    EXPECT_EQ(tv->shape, t["shape"].get<std::vector<int64_t>>());
    auto want = read_f32(data_dir() + "/gguf/" + t["type"].get<std::string>() + ".f32");
    ASSERT_EQ(int64_t(want.size()), tv->numel());
    const int64_t n_in = tv->shape[1];
    const size_t rb = row_bytes(tv->dtype, n_in);
    for (const char* isa : {"ref", "generic", "avx2", "avx512"}) {
      const cpu::SimdKernels* k = std::strcmp(isa, "ref") ? cpu::simd_for(isa) : nullptr;
      if (std::strcmp(isa, "ref") && !k) continue;  // not on this CPU
      std::vector<float> got(want.size());
      for (int64_t r = 0; r < tv->shape[0]; ++r) {
        const void* src = static_cast<const uint8_t*>(tv->data) + size_t(r) * rb;
        if (k)
          k->dequant_row(tv->dtype, src, got.data() + r * n_in, n_in);
        else
          dequantize_row_ref(tv->dtype, src, got.data() + r * n_in, n_in);
      }
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << t["type"] << " via " << isa << " element " << i << " (block "
                                   << i / size_t(traits(tv->dtype).block_size) << ")";
    }
    ++n_types;
  }
  EXPECT_EQ(n_types, 15);  // f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k
                           // iq4_nl iq4_xs
}

TEST(Gguf, ReadsVersion2) {
  // v2 and v3 share the little-endian layout; only the version word differs.
  std::ifstream in(fixture(), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  uint32_t v2 = 2;
  std::memcpy(bytes.data() + 4, &v2, 4);
  const std::string path = data_dir() + "/quants-v2.gguf";
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  GgufFile f(path);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().all().size(), 15u);
  uint32_t v1 = 1;
  std::memcpy(bytes.data() + 4, &v1, 4);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  EXPECT_THROW(GgufFile{path}, IoError);
}

TEST(Gguf, WriterRoundTripsWithCustomAlignment) {
  GgufWriter w;
  w.set("a.nested",
        GgufValue::array(GgufType::ARRAY, {GgufValue::array(GgufType::U32, {GgufValue::u32(7)}),
                                           GgufValue::array(GgufType::U32, {})}));
  w.set("a.flag", GgufValue::boolean(false));
  float x[5] = {1, 2, 3, 4, 5};
  w.add_tensor("x", DType::F32, {5}, x, sizeof x);
  w.add_tensor("y", DType::F32, {1, 5}, x, sizeof x);
  const std::string path = data_dir() + "/writer.gguf";
  w.write(path, 64);
  GgufFile f(path);
  EXPECT_EQ(*f.get_int("general.alignment"), 64);
  EXPECT_EQ(f.get("a.nested")->as_array()[0].as_array()[0].as_int(), 7);
  EXPECT_TRUE(f.get("a.nested")->as_array()[1].as_array().empty());
  const TensorView* y = f.tensors().find("y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(y->data) % 64, 0u);
  EXPECT_EQ(std::memcmp(y->data, x, sizeof x), 0);
}

TEST(Dtype, HalfConversionsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);       // rounds to infinity
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // ties to even
  EXPECT_EQ(bf16_to_f32(0x3f81), 1.0078125f);
}

// f16_to_f32 and a row of f16 (dequantize_row_ref) against the format's
// definition for all 65536 halves: (-1)^s 2^(e-15) (1 + m/1024), subnormals
// m 2^-24, infinities and NaNs with their mantissa bits as the float's top ones.
TEST(Dtype, HalfToFloatIsExactForEveryHalf) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = uint16_t(h);
  std::vector<float> row(65536);
  dequantize_row_ref(DType::F16, all.data(), row.data(), 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t want;
    if (exp == 31) {
      want = (sign << 31) | 0x7f800000u | (man << 13);
    } else {
      const float mag = exp == 0 ? std::ldexp(float(man), -24)
                                 : std::ldexp(1.f + float(man) / 1024.f, int(exp) - 15);
      const float v = sign ? -mag : mag;
      std::memcpy(&want, &v, 4);
    }
    uint32_t got, got_row;
    const float f = f16_to_f32(uint16_t(h));
    std::memcpy(&got, &f, 4);
    std::memcpy(&got_row, &row[h], 4);
    ASSERT_EQ(got, want) << h;
    ASSERT_EQ(got_row, want) << h;
  }
}

// wick convert on a GGUF file (the draft-model benchmark's f32 target): every
// matrix is the source's exact dequantization, vectors stay f32, metadata
// (tokenizer included) is kept but for the file type.
TEST(Convert, GgufToF32IsTheExactDequantization) {
  const char* src = std::getenv("WICK_TEST_MODEL");
  if (!src || !std::filesystem::exists(src)) WICK_SKIP_OR_FAIL("default model missing");
  const std::string out = data_dir() + "/converted-f32.gguf";
  std::filesystem::create_directories(data_dir());
  convert_gguf(src, out, DType::F32);
  GgufFile a(src), b(out);
  for (const auto& [key, v] : a.metadata()) {
    if (key == "general.file_type" || key == "general.alignment") continue;
    ASSERT_NE(b.get(key), nullptr) << key;
    EXPECT_EQ(b.get(key)->type, v.type) << key;
  }
  EXPECT_EQ(b.get_int("general.file_type"), 0);
  EXPECT_EQ(b.get("tokenizer.ggml.tokens")->as_array().size(),
            a.get("tokenizer.ggml.tokens")->as_array().size());
  ASSERT_EQ(b.tensor_order(), a.tensor_order());
  std::vector<float> row;
  for (const auto& name : a.tensor_order()) {
    const TensorView &x = *a.tensors().find(name), &y = *b.tensors().find(name);
    ASSERT_EQ(y.dtype, DType::F32) << name;
    ASSERT_EQ(y.shape, x.shape) << name;
    const int64_t n_in = x.shape.back(), n_rows = x.numel() / n_in;
    row.resize(size_t(n_in));
    for (int64_t r = 0; r < n_rows; ++r) {
      dequantize_row_ref(x.dtype,
                         static_cast<const uint8_t*>(x.data) + size_t(r) * row_bytes(x.dtype, n_in),
                         row.data(), n_in);
      ASSERT_EQ(
          std::memcmp(row.data(), static_cast<const float*>(y.data) + r * n_in, size_t(n_in) * 4),
          0)
          << name << " row " << r;
    }
  }
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace wick::test
