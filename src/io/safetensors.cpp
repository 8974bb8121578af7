#include "io/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/error.h"

namespace wick {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const TensorView* TensorSet::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void TensorSet::add(TensorView t) {
  if (tensors_.count(t.name))
    throw_io("{}: tensor '{}' appears twice (also in {})", t.file, t.name, tensors_[t.name].file);
  std::string name = t.name;
  tensors_.emplace(std::move(name), std::move(t));
}

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit

std::optional<DType> st_dtype(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "F8_E5M2") return DType::F8_E5M2;
  return std::nullopt;
}

}  // namespace

void read_safetensors(const std::string& path, TensorSet& out) {
  auto file = std::make_shared<MappedFile>(path);
  const uint8_t* base = file->data();
  const size_t size = file->size();
  if (size < 8) throw_io("{}: truncated safetensors file ({} bytes, need at least 8)", path, size);
  uint64_t n_header = 0;
  for (int i = 0; i < 8; ++i) n_header |= uint64_t(base[i]) << (8 * i);
  if (n_header > kMaxHeaderBytes)
    throw_io("{}: safetensors header claims {} bytes (limit {})", path, n_header, kMaxHeaderBytes);
  if (n_header > size - 8)
    throw_io("{}: truncated: header claims {} bytes but the file has {} after the length", path,
             n_header, size - 8);
  json header;
  try {
    header = json::parse(base + 8, base + 8 + n_header);
  } catch (const json::exception& e) {
    throw_io("{}: safetensors header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) throw_io("{}: safetensors header is not a JSON object", path);

  const uint8_t* data = base + 8 + n_header;
  const uint64_t n_data = size - 8 - n_header;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<TensorView> views;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      std::string dt_name = info.at("dtype").get<std::string>();
      auto dt = st_dtype(dt_name);
      if (!dt)
        throw_io(
            "{}: tensor '{}': dtype {} is not supported (expected F32, F16, BF16, F8_E4M3 or "
            "F8_E5M2)",
            path, name, dt_name);
      // Integers only: a number past 64 bits is parsed as a double, and
      // converting it would be undefined behaviour.
      for (const char* key : {"shape", "data_offsets"})
        for (auto& x : info.at(key))
          if (!x.is_number_integer())
            throw_io("{}: tensor '{}': {} holds {}, not a 64-bit integer", path, name, key,
                     x.dump());
      auto shape = info.at("shape").get<std::vector<int64_t>>();
      auto offs = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[0] > offs[1])
        throw_io("{}: tensor '{}': data_offsets must be [begin, end]", path, name);
      if (offs[1] > n_data)
        throw_io("{}: tensor '{}': data [{}, {}) lies outside the file's {} data bytes", path, name,
                 offs[0], offs[1], n_data);
      // A wrapped product would describe a huge tensor over a few bytes.
      uint64_t numel = 1, want = 0;
      for (auto d : shape) {
        if (d < 0) throw_io("{}: tensor '{}': negative dimension", path, name);
        if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
          throw_io("{}: tensor '{}': shape {} has more elements than 2^64", path, name,
                   shape_str(shape));
      }
      if (__builtin_mul_overflow(numel, uint64_t(traits(*dt).block_bytes), &want))
        throw_io("{}: tensor '{}': shape {} takes more than 2^64 bytes", path, name,
                 shape_str(shape));
      if (offs[1] - offs[0] != want)
        throw_io("{}: tensor '{}': {} bytes stored, but {} {} needs {}", path, name,
                 offs[1] - offs[0], dt_name, shape_str(shape), want);
      ranges.emplace_back(offs[0], offs[1]);
      views.push_back(TensorView{name, *dt, shape, data + offs[0], size_t(want), path});
    } catch (const json::exception& e) {
      throw_io("{}: tensor '{}': malformed header entry: {}", path, name, e.what());
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      throw_io("{}: tensor data ranges overlap at byte {}", path, ranges[i].first);
  for (auto& v : views) out.add(std::move(v));
  out.keep(std::move(file));
}

TensorSet read_safetensors_dir(const std::string& dir) {
  TensorSet set;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw_io("{}: not valid JSON: {}", index.string(), e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw_io("{}: no 'weight_map' object", index.string());
    std::set<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw_io("{}: weight_map['{}'] is not a string", index.string(), name);
      shards.insert(file.get<std::string>());
    }
    for (auto& s : shards) {
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        throw_io("{}: shard name '{}' must be a plain file name", index.string(), s);
      read_safetensors((fs::path(dir) / s).string(), set);
    }
    for (auto& [name, file] : j["weight_map"].items())
      if (!set.find(name))
        throw_io("{}: tensor '{}' listed in the index is missing from {}", index.string(), name,
                 file.get<std::string>());
  } else if (fs::exists(single)) {
    read_safetensors(single.string(), set);
  } else {
    throw_io("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  return set;
}

}  // namespace wick
