#include "model/fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "io/error.h"

namespace wick {

namespace {

// The OCP 8-bit float formats: e4m3 (bias 7; no infinities, S.1111.111 is
// NaN; largest 448) and e5m2 (bias 15; IEEE-like, exponent 31 is inf/NaN).
std::array<float, 256> make_table(int n_exp, int bias) {
  std::array<float, 256> t{};
  const int n_man = 7 - n_exp;
  const int max_exp = (1 << n_exp) - 1, max_man = (1 << n_man) - 1;
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> n_man) & max_exp, m = b & max_man;
    float v;
    if (n_exp == 4 && e == max_exp && m == max_man)
      v = std::numeric_limits<float>::quiet_NaN();
    else if (n_exp == 5 && e == max_exp)
      v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    else if (e == 0)
      v = std::ldexp(float(m), 1 - bias - n_man);  // subnormal
    else
      v = std::ldexp(float((1 << n_man) + m), e - bias - n_man);
    t[size_t(b)] = b & 0x80 ? -v : v;
  }
  return t;
}

const std::array<float, 256>& table(DType t) {
  static const auto e4m3 = make_table(4, 7), e5m2 = make_table(5, 15);
  return t == DType::F8_E5M2 ? e5m2 : e4m3;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// A scale per block of rows_per x cols_per weights, the blocks row-major.
struct ScaleGrid {
  int64_t rows_per = 0, cols_per = 0;
};

ScaleGrid scale_grid(const TensorView& w, const TensorView& s, const Fp8Scheme& scheme) {
  const int64_t n_out = w.shape[0], n_in = w.shape[1];
  const auto& sh = s.shape;
  if (s.numel() == 1) return {n_out, n_in};
  if (sh == std::vector<int64_t>{n_out} || sh == std::vector<int64_t>{n_out, 1}) return {1, n_in};
  const int64_t br = scheme.block_rows, bc = scheme.block_cols;
  if (br > 0 && bc > 0 && sh == std::vector<int64_t>{ceil_div(n_out, br), ceil_div(n_in, bc)})
    return {br, bc};
  std::string blocks =
      br > 0 && bc > 0 ? fmt::format(", or {} for weight_block_size [{}, {}]",
                                     shape_str({ceil_div(n_out, br), ceil_div(n_in, bc)}), br, bc)
                       : " (config.json's quantization_config gives no weight_block_size)";
  throw_model("{}: scale '{}' has shape {}; for weight {} expected [1], [{}] or [{}, 1]{}", s.file,
              s.name, shape_str(sh), shape_str(w.shape), n_out, n_out, blocks);
}

}  // namespace

Fp8Scheme fp8_scheme_from_hf(const nlohmann::json& config, const std::string& where) {
  Fp8Scheme scheme;
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return scheme;
  const auto& q = *it;
  if (!q.is_object()) throw_model("{}: quantization_config is not an object", where);
  // a string field of quantization_config ("" when absent)
  auto field = [&](const char* key) {
    auto f = q.find(key);
    if (f == q.end() || f->is_null()) return std::string();
    if (!f->is_string())
      throw_model("{}: quantization_config's {} is {}, not a string", where, key, f->dump());
    return f->get<std::string>();
  };
  const std::string method = field("quant_method");
  static const char* kFp8[] = {"", "fp8", "compressed-tensors", "fbgemm_fp8"};
  bool known = false;
  for (const char* m : kFp8) known |= method == m;
  if (!known)
    throw_model(
        "{}: quantization_config's quant_method '{}' is not supported: wick loads FP8 "
        "checkpoints (fp8, compressed-tensors' float-quantized, fbgemm_fp8) and f32/f16/bf16 "
        "ones; for other quantizations use the unquantized model, or a GGUF file",
        where, method);
  const std::string format = field("format");
  if (method == "compressed-tensors" && format != "" && format != "float-quantized" &&
      format != "naive-quantized" && format != "dense")
    throw_model(
        "{}: compressed-tensors format '{}' is not supported (wick loads float-quantized FP8 "
        "weights)",
        where, format);
  if (auto b = q.find("weight_block_size"); b != q.end() && !b->is_null()) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
        !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() <= 0 || (*b)[1].get<int64_t>() <= 0)
      throw_model("{}: weight_block_size must be two positive integers, not {}", where, b->dump());
    scheme.block_rows = (*b)[0].get<int64_t>();
    scheme.block_cols = (*b)[1].get<int64_t>();
  }
  return scheme;
}

float fp8_to_f32(DType t, uint8_t code) {
  return table(t)[code];
}

void dequantize_fp8(const TensorView& w, const TensorView& scale, const Fp8Scheme& scheme,
                    uint16_t* out) {
  if (w.shape.size() != 2) throw_model("{}: FP8 tensor '{}' is not a matrix", w.file, w.name);
  if (scale.dtype != DType::F32 && scale.dtype != DType::F16 && scale.dtype != DType::BF16)
    throw_model("{}: scale '{}' has type {}; expected f32, f16 or bf16", scale.file, scale.name,
                dtype_name(scale.dtype));
  const ScaleGrid g = scale_grid(w, scale, scheme);
  std::vector<float> s(size_t(scale.numel()));
  dequantize_row_ref(scale.dtype, scale.data, s.data(), scale.numel());
  for (size_t i = 0; i < s.size(); ++i)
    if (!std::isfinite(s[i]))
      throw_model("{}: scale '{}' holds {} at {}", scale.file, scale.name, s[i], i);

  const int64_t n_out = w.shape[0], n_in = w.shape[1];
  const int64_t n_scale_cols = ceil_div(n_in, g.cols_per);
  const auto& lut = table(w.dtype);
  const auto* q = static_cast<const uint8_t*>(w.data);
  auto value = [&](int64_t r, int64_t c) {
    return lut[q[r * n_in + c]] * s[size_t((r / g.rows_per) * n_scale_cols + c / g.cols_per)];
  };
  // The first row with a code that is not a finite weight (or that
  // overflows with its scale), found in parallel and reported after.
  int64_t bad_row = n_out;
#pragma omp parallel for num_threads(cpu::n_threads()) schedule(static) reduction(min : bad_row)
  for (int64_t r = 0; r < n_out; ++r) {
    const float* srow = s.data() + (r / g.rows_per) * n_scale_cols;
    const uint8_t* qr = q + r * n_in;
    uint16_t* o = out + r * n_in;
    uint32_t not_finite = 0;
    for (int64_t c0 = 0, j = 0; c0 < n_in; c0 += g.cols_per, ++j) {
      const float sc = srow[j];
      const int64_t c1 = std::min(n_in, c0 + g.cols_per);
      for (int64_t c = c0; c < c1; ++c) {
        // f32_to_bf16's rounding without its NaN case, so that the loop
        // vectorises: a product that is not finite, or rounds to an
        // infinity, is refused (and its rounded bits never used).
        uint32_t u;
        const float v = lut[qr[c]] * sc;
        std::memcpy(&u, &v, 4);
        const uint32_t h = (u + 0x7fff + ((u >> 16) & 1)) >> 16;
        o[c] = uint16_t(h);
        not_finite |= uint32_t((u & 0x7f800000) == 0x7f800000) | uint32_t((h & 0x7f80) == 0x7f80);
      }
    }
    if (not_finite) bad_row = std::min(bad_row, r);
  }
  if (bad_row == n_out) return;
  int64_t c = 0;
  while ((f32_to_bf16(value(bad_row, c)) & 0x7f80) != 0x7f80) ++c;
  throw_model("{}: FP8 weight '{}' at [{}, {}] is {} (code 0x{:02x} times its scale)", w.file,
              w.name, bad_row, c, value(bad_row, c), q[bad_row * n_in + c]);
}

}  // namespace wick
