// GGUF v2/v3 reader and writer (the llama.cpp model file format).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "io/safetensors.h"
#include "io/tensor.h"

namespace wick {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

// One metadata value. Arrays keep their element type (also when empty) and
// may nest.
struct GgufValue {
  GgufType type = GgufType::U32;
  GgufType elem_type = GgufType::U32;  // for ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> v;

  static GgufValue u32(uint32_t x) { return {GgufType::U32, GgufType::U32, uint64_t(x)}; }
  static GgufValue i32(int32_t x) { return {GgufType::I32, GgufType::U32, int64_t(x)}; }
  static GgufValue u64(uint64_t x) { return {GgufType::U64, GgufType::U32, x}; }
  static GgufValue f32(float x) { return {GgufType::F32, GgufType::U32, double(x)}; }
  static GgufValue boolean(bool x) { return {GgufType::BOOL, GgufType::U32, x}; }
  static GgufValue str(std::string s) { return {GgufType::STRING, GgufType::U32, std::move(s)}; }
  static GgufValue array(GgufType elem, std::vector<GgufValue> xs) {
    return {GgufType::ARRAY, elem, std::move(xs)};
  }

  bool is_int() const;
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
  int64_t as_int() const;   // throws std::bad_variant_access on a wrong type
  double as_float() const;  // accepts integers too
  const std::string& as_str() const { return std::get<std::string>(v); }
  const std::vector<GgufValue>& as_array() const { return std::get<std::vector<GgufValue>>(v); }
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // throws IoError

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* get(const std::string& key) const;
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;
  std::optional<std::string> get_str(const std::string& key) const;
  const TensorSet& tensors() const { return tensors_; }
  // Tensor names in file order.
  const std::vector<std::string>& tensor_order() const { return order_; }

 private:
  std::string path_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> kv_;
  TensorSet tensors_;
  std::vector<std::string> order_;
};

// Builds a GGUF v3 file in memory order: metadata, tensor infos, aligned data.
class GgufWriter {
 public:
  void set(const std::string& key, GgufValue v) { kv_.emplace_back(key, std::move(v)); }
  // shape outermost first (as TensorView); data is copied.
  void add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                  const void* data, size_t n_bytes);
  void write(const std::string& path, uint32_t alignment = 32) const;  // throws IoError

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Pending> tensors_;
};

}  // namespace wick
