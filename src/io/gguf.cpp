#include "io/gguf.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/atomic_file.h"
#include "io/error.h"

namespace wick {

bool GgufValue::is_int() const {
  switch (type) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::U16:
    case GgufType::I16:
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::U64:
    case GgufType::I64:
      return true;
    default:
      return false;
  }
}

int64_t GgufValue::as_int() const {
  if (auto* u = std::get_if<uint64_t>(&v)) return int64_t(*u);
  if (auto* b = std::get_if<bool>(&v)) return *b;
  return std::get<int64_t>(v);
}

double GgufValue::as_float() const {
  if (auto* d = std::get_if<double>(&v)) return *d;
  return double(as_int());
}

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr int kMaxArrayDepth = 8;

// Bounds-checked little-endian cursor over the mapped file.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* p, size_t n) : path_(path), p_(p), n_(n) {}

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T x;
    std::memcpy(&x, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return x;
  }
  std::string read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    if (len > kMaxStringBytes) throw_io("{}: {} claims a string of {} bytes", path_, what, len);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  void need(uint64_t k, const char* what) const {
    if (k > n_ - pos_)
      throw_io("{}: truncated while reading {} at byte {} (file has {} bytes)", path_, what, pos_,
               n_);
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

 private:
  const std::string& path_;
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;
  }
}

GgufValue read_value(Cursor& c, GgufType t, const std::string& key, const std::string& path,
                     int depth) {
  GgufValue out;
  out.type = t;
  switch (t) {
    case GgufType::U8:
      out.v = uint64_t(c.read<uint8_t>("metadata"));
      break;
    case GgufType::I8:
      out.v = int64_t(c.read<int8_t>("metadata"));
      break;
    case GgufType::U16:
      out.v = uint64_t(c.read<uint16_t>("metadata"));
      break;
    case GgufType::I16:
      out.v = int64_t(c.read<int16_t>("metadata"));
      break;
    case GgufType::U32:
      out.v = uint64_t(c.read<uint32_t>("metadata"));
      break;
    case GgufType::I32:
      out.v = int64_t(c.read<int32_t>("metadata"));
      break;
    case GgufType::U64:
      out.v = c.read<uint64_t>("metadata");
      break;
    case GgufType::I64:
      out.v = c.read<int64_t>("metadata");
      break;
    case GgufType::F32:
      out.v = double(c.read<float>("metadata"));
      break;
    case GgufType::F64:
      out.v = c.read<double>("metadata");
      break;
    case GgufType::BOOL: {
      uint8_t b = c.read<uint8_t>("metadata");
      if (b > 1) throw_io("{}: metadata '{}': bool value {}", path, key, b);
      out.v = bool(b);
      break;
    }
    case GgufType::STRING:
      out.v = c.read_string("metadata string");
      break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth) throw_io("{}: metadata '{}': arrays nested too deep", path, key);
      auto et = static_cast<GgufType>(c.read<uint32_t>("array type"));
      if (uint32_t(et) > 12)
        throw_io("{}: metadata '{}': unknown array type {}", path, key, uint32_t(et));
      uint64_t n = c.read<uint64_t>("array length");
      // Every element takes at least one byte (strings 8): bound n by what is left.
      size_t min_elem = et == GgufType::STRING || et == GgufType::ARRAY ? 8 : scalar_size(et);
      if (n > c.remaining() / min_elem)
        throw_io("{}: metadata '{}': array of {} elements does not fit in the file", path, key, n);
      std::vector<GgufValue> xs;
      xs.reserve(n);
      for (uint64_t i = 0; i < n; ++i) xs.push_back(read_value(c, et, key, path, depth + 1));
      out.elem_type = et;
      out.v = std::move(xs);
      break;
    }
    default:
      throw_io("{}: metadata '{}': unknown value type {}", path, key, uint32_t(t));
  }
  return out;
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path) {
  auto file = std::make_shared<MappedFile>(path);
  Cursor c(path, file->data(), file->size());
  if (file->size() < 4 || c.read<uint32_t>("magic") != kMagic)
    throw_io("{}: not a GGUF file (bad magic)", path);
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    throw_io("{}: GGUF version {} is not supported (expected 2 or 3)", path, version_);
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_tensors > c.remaining() / 24 || n_kv > c.remaining() / 12)
    throw_io("{}: header claims {} tensors and {} metadata entries; the file is too small", path,
             n_tensors, n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    auto t = static_cast<GgufType>(c.read<uint32_t>("metadata type"));
    GgufValue v = read_value(c, t, key, path, 0);
    if (!kv_.emplace(key, std::move(v)).second)
      throw_io("{}: metadata key '{}' repeats", path, key);
  }
  uint64_t alignment = 32;
  if (auto a = get_int("general.alignment")) {
    if (*a <= 0 || (*a & (*a - 1)))
      throw_io("{}: general.alignment {} is not a power of two", path, *a);
    alignment = uint64_t(*a);
  }

  struct Info {
    std::string name;
    uint32_t type;
    std::vector<int64_t> shape;
    uint64_t offset;
  };
  std::vector<Info> infos;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Info info;
    info.name = c.read_string("tensor name");
    uint32_t n_dims = c.read<uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > 4)
      throw_io("{}: tensor '{}': {} dimensions", path, info.name, n_dims);
    std::vector<int64_t> ne(n_dims);
    for (auto& d : ne) {
      uint64_t x = c.read<uint64_t>("tensor dim");
      if (x == 0 || x > (1ull << 40)) throw_io("{}: tensor '{}': dimension {}", path, info.name, x);
      d = int64_t(x);
    }
    info.shape.assign(ne.rbegin(), ne.rend());  // outermost first
    info.type = c.read<uint32_t>("tensor type");
    info.offset = c.read<uint64_t>("tensor offset");
    infos.push_back(std::move(info));
  }
  uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  if (data_start > file->size() && n_tensors > 0)
    throw_io("{}: truncated: tensor data would start at byte {} but the file has {}", path,
             data_start, file->size());
  for (auto& info : infos) {
    auto tr = dtype_traits(info.type);
    if (!tr) throw_io("{}: tensor '{}': unknown tensor type {}", path, info.name, info.type);
    int64_t inner = info.shape.back();
    if (inner % tr->block_size)
      throw_io("{}: tensor '{}': row of {} elements is not a whole number of {} blocks", path,
               info.name, inner, tr->name);
    // Each dimension is bounded, their product is not: check it before use
    // (a wrapped product would describe a huge tensor over a few bytes).
    uint64_t numel = 1;
    for (auto d : info.shape)
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
        throw_io("{}: tensor '{}': shape {} has more elements than 2^64", path, info.name,
                 shape_str(info.shape));
    uint64_t n_bytes = 0;
    if (__builtin_mul_overflow(numel / uint64_t(tr->block_size), uint64_t(tr->block_bytes),
                               &n_bytes))
      throw_io("{}: tensor '{}': shape {} takes more than 2^64 bytes", path, info.name,
               shape_str(info.shape));
    if (info.offset % alignment)
      throw_io("{}: tensor '{}': offset {} is not aligned to {}", path, info.name, info.offset,
               alignment);
    if (info.offset > file->size() - data_start ||
        n_bytes > file->size() - data_start - info.offset)
      throw_io("{}: tensor '{}': data [{}, {}) lies outside the file ({} data bytes); truncated?",
               path, info.name, info.offset, info.offset + n_bytes, file->size() - data_start);
    TensorView tv{info.name,       static_cast<DType>(info.type),
                  info.shape,      file->data() + data_start + info.offset,
                  size_t(n_bytes), path};
    order_.push_back(info.name);
    tensors_.add(std::move(tv));
  }
  tensors_.keep(std::move(file));
}

const GgufValue* GgufFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  auto* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_int() && v->type != GgufType::BOOL)
    throw_io("{}: metadata '{}' should be an integer", path_, key);
  return v->as_int();
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  auto* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_int() && !v->is_float()) throw_io("{}: metadata '{}' should be a number", path_, key);
  return v->as_float();
}

std::optional<std::string> GgufFile::get_str(const std::string& key) const {
  auto* v = get(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::STRING) throw_io("{}: metadata '{}' should be a string", path_, key);
  return v->as_str();
}

// ---- writer ----

void GgufWriter::add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            const void* data, size_t n_bytes) {
  auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back(Pending{name, dtype, std::move(shape), std::vector<uint8_t>(p, p + n_bytes)});
}

namespace {

struct Out {
  std::vector<uint8_t> buf;
  template <typename T>
  void put(T x) {
    auto* p = reinterpret_cast<const uint8_t*>(&x);
    buf.insert(buf.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    buf.insert(buf.end(), s.begin(), s.end());
  }
  void put_value(const GgufValue& v) {
    switch (v.type) {
      case GgufType::U8:
        put<uint8_t>(uint8_t(v.as_int()));
        break;
      case GgufType::I8:
        put<int8_t>(int8_t(v.as_int()));
        break;
      case GgufType::U16:
        put<uint16_t>(uint16_t(v.as_int()));
        break;
      case GgufType::I16:
        put<int16_t>(int16_t(v.as_int()));
        break;
      case GgufType::U32:
        put<uint32_t>(uint32_t(v.as_int()));
        break;
      case GgufType::I32:
        put<int32_t>(int32_t(v.as_int()));
        break;
      case GgufType::U64:
        put<uint64_t>(uint64_t(v.as_int()));
        break;
      case GgufType::I64:
        put<int64_t>(v.as_int());
        break;
      case GgufType::F32:
        put<float>(float(v.as_float()));
        break;
      case GgufType::F64:
        put<double>(v.as_float());
        break;
      case GgufType::BOOL:
        put<uint8_t>(std::get<bool>(v.v) ? 1 : 0);
        break;
      case GgufType::STRING:
        put_str(v.as_str());
        break;
      case GgufType::ARRAY:
        put<uint32_t>(uint32_t(v.elem_type));
        put<uint64_t>(v.as_array().size());
        for (auto& x : v.as_array()) put_value(x);
        break;
    }
  }
  void pad_to(uint64_t a) {
    while (buf.size() % a) buf.push_back(0);
  }
};

}  // namespace

void GgufWriter::write(const std::string& path, uint32_t alignment) const {
  Out o;
  o.put<uint32_t>(kMagic);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  bool has_align = false;
  for (auto& [k, v] : kv_) has_align |= k == "general.alignment";
  o.put<uint64_t>(kv_.size() + (has_align || alignment == 32 ? 0 : 1));
  for (auto& [k, v] : kv_) {
    o.put_str(k);
    o.put<uint32_t>(uint32_t(v.type));
    o.put_value(v);
  }
  if (!has_align && alignment != 32) {
    o.put_str("general.alignment");
    o.put<uint32_t>(uint32_t(GgufType::U32));
    o.put<uint32_t>(alignment);
  }
  uint64_t offset = 0;
  for (auto& t : tensors_) {
    o.put_str(t.name);
    o.put<uint32_t>(uint32_t(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) o.put<uint64_t>(uint64_t(*it));
    o.put<uint32_t>(uint32_t(t.dtype));
    o.put<uint64_t>(offset);
    offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  o.pad_to(alignment);
  // Whole or not at all (AtomicFile): a full disk or an interrupted run
  // never leaves a partial file under `path`.
  AtomicFile f(path);
  f.write(o.buf.data(), o.buf.size());
  const std::vector<uint8_t> zeros(alignment, 0);
  for (auto& t : tensors_) {
    f.write(t.bytes.data(), t.bytes.size());
    f.write(zeros.data(), (alignment - t.bytes.size() % alignment) % alignment);
  }
  f.commit();
}

}  // namespace wick
