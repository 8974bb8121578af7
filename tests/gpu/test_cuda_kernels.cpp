// Every CUDA kernel against its CPU kernel on random inputs, odd sizes
// included, and the batch invariance of the ones whose reduction could
// depend on the batch (matmul, attention): a row computed alone gives the
// same bits as the same row inside a larger batch.
//
// Tolerances: bf16 products (activations and weights rounded to bf16 inside
// the kernel): |gpu - ref| <= 8e-3 * sum |w x| per element, where ref is the
// float64 product of the CPU's dequantized weights; f32 weights (--gpu-f32):
// 1e-5 * sum |w x|; f16 attention (f16 K/V, Q and P): 4e-3 of the output
// scale; element-wise kernels: 1e-5 relative.
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "gpu/gpu_helpers.h"
#include "io/quant_blocks.h"
#include "random_weight.h"

namespace wick::test {
namespace {

struct MatmulCase {
  DType type;
  bool gpu_f32;
};

class CudaMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(CudaMatmul, MatchesCpuAndIsBatchInvariant) {
  WICK_REQUIRE_GPU();
  const auto [t, f32] = GetParam();
  auto be = cuda_backend(f32);
  std::mt19937 rng(11 + unsigned(t));
  const int64_t bs = traits(t).block_size;
  const std::vector<int64_t> n_ins =
      bs == 1 ? std::vector<int64_t>{13, 72, 896, 2080} : std::vector<int64_t>{256, 512, 2560};
  for (int64_t n_in : n_ins)
    for (int64_t n_out : {1, 37, 300}) {
      auto wb = random_weight(t, n_out, n_in, rng);
      const Weight host{t, n_out, n_in, wb.data()};
      const Weight w = be->prepare_matrix(host);
      const int64_t n_rows = 100;
      auto x = randn(size_t(n_rows * n_in), rng);
      Buffer dx = to_device(*be, x.data(), x.size() * 4);
      Buffer dy = be->alloc(size_t(n_rows * n_out) * 4);
      be->matmul(w, dx.as<float>(), n_rows, dy.as<float>());
      auto y = to_host<float>(*be, dy, size_t(n_rows * n_out));
      const ProductError e = product_error(host, x, n_rows, y);
      ASSERT_LE(e.worst, f32 ? 1e-5 : 8e-3)
          << dtype_name(t) << " n_in " << n_in << " row " << e.row << " col " << e.col << " gpu "
          << e.got << " ref " << e.ref;
      // batch invariance: rows alone, and 16 or 33 rows, give the same bits
      expect_rows_alone_equal(*be, w, dx, n_in, y, {1, 16, 33},
                              std::string(dtype_name(t)) + " n_in " + std::to_string(n_in));
      RecordProperty(std::string(dtype_name(t)) + "_" + std::to_string(n_in) + "_" +
                         std::to_string(n_out) + "_worst",
                     std::to_string(e.worst));
    }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, CudaMatmul,
    ::testing::Values(MatmulCase{DType::F32, true}, MatmulCase{DType::F32, false},
                      MatmulCase{DType::BF16, false}, MatmulCase{DType::F16, false},
                      MatmulCase{DType::Q8_0, false}, MatmulCase{DType::Q4_0, false},
                      MatmulCase{DType::Q4_1, false}, MatmulCase{DType::Q5_0, false},
                      MatmulCase{DType::Q5_1, false}, MatmulCase{DType::Q4_K, false},
                      MatmulCase{DType::Q5_K, false}, MatmulCase{DType::Q6_K, false},
                      MatmulCase{DType::Q2_K, false}, MatmulCase{DType::Q3_K, false},
                      MatmulCase{DType::IQ4_NL, false}, MatmulCase{DType::IQ4_XS, false}),
    [](const auto& info) {
      return std::string(dtype_name(info.param.type)) + (info.param.gpu_f32 ? "_gpu_f32" : "");
    });

// Sets the decode kernel's 8-row tiles a warp (16-bit weights) for a scope.
struct DecodeTiles {
  explicit DecodeTiles(int nt) { cuda::set_decode_tiles(nt); }
  ~DecodeTiles() { cuda::set_decode_tiles(0); }
};

// The decode kernel's bits: w and gate/up (w, u) on 1, 5 and 16 rows of x from
// row 50 equal rows 50... of the 100-row products y and gated (the tiled kernel).
void expect_decode_rows_equal_100(Backend& be, const Weight& w, const Weight& u, const Buffer& dx,
                                  int64_t n_in, int64_t n_out, const std::vector<float>& y,
                                  const std::vector<float>& gated) {
  for (int64_t m : {1, 5, 16}) {
    Buffer d1 = be.alloc(size_t(m * n_out) * 4), g1 = be.alloc(size_t(m * n_out) * 4),
           u1 = be.alloc(size_t(m * n_out) * 4);
    be.matmul(w, dx.as<float>() + 50 * n_in, m, d1.as<float>());
    be.matmul_gate_up(w, u, dx.as<float>() + 50 * n_in, m, g1.as<float>(), u1.as<float>());
    const auto y1 = to_host<float>(be, d1, size_t(m * n_out)),
               gated1 = to_host<float>(be, g1, size_t(m * n_out));
    for (int64_t i = 0; i < m * n_out; ++i) {
      ASSERT_EQ(y1[size_t(i)], y[size_t(50 * n_out + i)]) << m << " rows differ from 100 at " << i;
      ASSERT_EQ(gated1[size_t(i)], gated[size_t(50 * n_out + i)])
          << "gate/up, " << m << " rows, at " << i;
    }
  }
}

// Tall matrices (an output head) take wider decode tiles (8,200 rows: 4 a warp
// for bf16 by the rule; 1, 2 and 4 forced too) and, 16-bit ones, 4 slices of
// k however deep (k = 4,096: 8 slices below 8,192 rows): the CPU's values at
// the edges of the last tile, and plain and gate/up the bits of the 100-row
// product.
TEST(CudaMatmul, TallMatrixDecodeTilesKeepTheBits) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend(false);
  std::mt19937 rng(5);
  const int64_t n_out = 8200, n_rows = 100;
  for (int64_t n_in : {int64_t(512), int64_t(4096)})
    for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_0}) {
      auto wb = random_weight(t, n_out, n_in, rng);
      const Weight host{t, n_out, n_in, wb.data()};
      const Weight w = be->prepare_matrix(host);
      auto x = randn(size_t(n_rows * n_in), rng);
      Buffer dx = to_device(*be, x.data(), x.size() * 4);
      Buffer dy = be->alloc(size_t(n_rows * n_out) * 4);
      be->matmul(w, dx.as<float>(), n_rows, dy.as<float>());
      auto y = to_host<float>(*be, dy, size_t(n_rows * n_out));
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t o : {int64_t(0), int64_t(7), n_out - 9, n_out - 1}) {
        dequantize_row_ref(t, host.row(o), row.data(), n_in);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n_in; ++i) {
          ref += double(row[size_t(i)]) * x[size_t(60 * n_in + i)];
          mag += std::fabs(double(row[size_t(i)]) * x[size_t(60 * n_in + i)]);
        }
        EXPECT_LE(std::fabs(y[size_t(60 * n_out + o)] - ref) / (mag + 1e-30), 8e-3)
            << dtype_name(t) << " k " << n_in << " col " << o;
      }
      Buffer dg = be->alloc(size_t(n_rows * n_out) * 4), du = be->alloc(size_t(n_rows * n_out) * 4);
      be->matmul_gate_up(w, w, dx.as<float>(), n_rows, dg.as<float>(), du.as<float>());
      const auto gated = to_host<float>(*be, dg, size_t(n_rows * n_out));
      for (int nt : {0, 1, 2, 4}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + ", k " + std::to_string(n_in) + ", " +
                     std::to_string(nt) + " tiles");
        DecodeTiles scope(nt);
        expect_decode_rows_equal_100(*be, w, w, dx, n_in, n_out, y, gated);
      }
    }
}

// Every int8 code, -128 included (no Q8_0 quantizer writes it; a file may),
// through the decode kernel (1 and 16 rows) and the tiled one (256): rows of
// one-hot activations read each weight back, exactly.
TEST(CudaMatmul, EveryInt8CodeDecodesExactly) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend(false);
  const int64_t n_in = 256;  // 8 blocks: the codes 0x00..0xff in order
  std::vector<BlockQ8_0> blocks(8);
  for (int b = 0; b < 8; ++b) {
    blocks[size_t(b)].d = f32_to_f16(1.f);
    for (int i = 0; i < 32; ++i) blocks[size_t(b)].qs[i] = int8_t(uint8_t(32 * b + i));
  }
  const Weight w = be->prepare_matrix(Weight{DType::Q8_0, 1, n_in, blocks.data()});
  std::vector<float> x(size_t(n_in * n_in), 0.f);
  for (int64_t i = 0; i < n_in; ++i) x[size_t(i * n_in + i)] = 1.f;  // row i picks code i
  Buffer dx = to_device(*be, x.data(), x.size() * 4);
  for (int64_t m : {int64_t(1), int64_t(16), n_in})
    for (int64_t r0 = 0; r0 < n_in; r0 += m) {
      Buffer dy = be->alloc(size_t(m) * 4);
      be->matmul(w, dx.as<float>() + r0 * n_in, m, dy.as<float>());
      const auto y = to_host<float>(*be, dy, size_t(m));
      for (int64_t r = 0; r < m; ++r)
        ASSERT_EQ(y[size_t(r)], float(int8_t(uint8_t(r0 + r))))
            << "code " << r0 + r << ", " << m << " rows a product";
    }
}

// Sets the most slices of k (WICK_CUDA_KW_MAX) for a scope.
struct KwMax {
  int was = cuda::kw_max();
  explicit KwMax(int kw) { cuda::set_kw_max(kw); }
  ~KwMax() { cuda::set_kw_max(was); }
};

// More or fewer slices of k on the few-row matrices (WICK_CUDA_KW_MAX 8, 24
// or 32; a CTA has a warp a slice, fewer where a kernel's registers do not
// allow them): the CPU's values, and the same bits from 1, 5 and 16 rows
// (the decode kernel) as from 100 (the tiled one), plain and gate/up.
TEST(CudaMatmul, SliceCountsKeepValuesAndBits) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend(false);
  std::mt19937 rng(23);
  const int64_t n_rows = 100;
  for (int kw : {8, 24, 32}) {
    KwMax scope(kw);
    for (DType t : {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_K, DType::Q6_K})
      for (int64_t n_in : {int64_t(2304), int64_t(4864), int64_t(16384)})
        for (int64_t n_out : {int64_t(37), int64_t(896)}) {
          // past 16 slices only where every warp has 4 chunks (kw_for):
          // k = 16,384 takes them in every format (one narrow weight)
          if (n_in == 16384 && (kw < 24 || n_out > 37)) continue;
          SCOPED_TRACE(std::string(dtype_name(t)) + " kw max " + std::to_string(kw) + " n_in " +
                       std::to_string(n_in) + " n_out " + std::to_string(n_out));
          auto wb = random_weight(t, n_out, n_in, rng), ub = random_weight(t, n_out, n_in, rng);
          const Weight host{t, n_out, n_in, wb.data()};
          const Weight w = be->prepare_matrix(host),
                       u = be->prepare_matrix(Weight{t, n_out, n_in, ub.data()});
          auto x = randn(size_t(n_rows * n_in), rng);
          Buffer dx = to_device(*be, x.data(), x.size() * 4);
          Buffer dy = be->alloc(size_t(n_rows * n_out) * 4),
                 dg = be->alloc(size_t(n_rows * n_out) * 4),
                 du = be->alloc(size_t(n_rows * n_out) * 4);
          be->matmul(w, dx.as<float>(), n_rows, dy.as<float>());
          be->matmul_gate_up(w, u, dx.as<float>(), n_rows, dg.as<float>(), du.as<float>());
          auto y = to_host<float>(*be, dy, size_t(n_rows * n_out));
          auto gated = to_host<float>(*be, dg, size_t(n_rows * n_out));
          std::vector<float> row(static_cast<size_t>(n_in));
          for (int64_t o : {int64_t(0), n_out / 2, n_out - 1}) {
            dequantize_row_ref(t, host.row(o), row.data(), n_in);
            for (int64_t r : {0, 57, 99}) {
              double ref = 0, mag = 0;
              for (int64_t i = 0; i < n_in; ++i) {
                const double p = double(row[size_t(i)]) * x[size_t(r * n_in + i)];
                ref += p;
                mag += std::fabs(p);
              }
              EXPECT_LE(std::fabs(y[size_t(r * n_out + o)] - ref) / (mag + 1e-30), 8e-3)
                  << "row " << r << " col " << o;
            }
          }
          expect_decode_rows_equal_100(*be, w, u, dx, n_in, n_out, y, gated);
        }
  }
}

// Sets whether decode products stage x in shared memory (matmul.cu, XS) for a scope.
struct XStage {
  bool was = cuda::x_stage();
  explicit XStage(bool on) { cuda::set_x_stage(on); }
  ~XStage() { cuda::set_x_stage(was); }
};

// Decode products with x staged in shared memory as bf16 (the default) equal
// those that load and convert it in every lane, bit for bit: every weight
// format the stage lays out differently (16-bit, 8-bit groups of 32 and 16,
// 4-bit with and without a stored min), k not a multiple of 4 and past a
// 4-bit row's 32-pair pads, 1 to 16 rows (rows 8-15 read or not), plain and
// gate/up; where the stage is too large (past 48 KiB: 8 or more rows of the
// deepest k; 16 rows of 2,560, and 9 of 4-bit weights' there) both are the
// unstaged kernel (at the deepest k, rows past the first such, 8, would add
// nothing but the same kernel again: 9 and 16 rows run at the other depths).
TEST(CudaMatmul, StagedActivationsKeepTheBits) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend(false);
  IntProducts bf16(false);  // (integer products never stage x: gpu_check's int stage)
  std::mt19937 rng(58);
  for (DType t : {DType::BF16, DType::F16, DType::Q8_0, DType::Q6_K, DType::Q4_0, DType::Q4_1})
    for (int64_t n_in : {int64_t(768), int64_t(2560), int64_t(4864)}) {
      const int64_t n_in_t = traits(t).block_size == 1 ? n_in + 3 : n_in;  // 16-bit: k % 4 != 0
      const int64_t n_out = 200, n_rows = 16;
      auto wb = random_weight(t, n_out, n_in_t, rng), ub = random_weight(t, n_out, n_in_t, rng);
      const Weight w = be->prepare_matrix(Weight{t, n_out, n_in_t, wb.data()}),
                   u = be->prepare_matrix(Weight{t, n_out, n_in_t, ub.data()});
      auto x = randn(size_t(n_rows * n_in_t), rng);
      Buffer dx = to_device(*be, x.data(), x.size() * 4);
      for (int64_t m : {1, 3, 8, 9, 16}) {
        if (n_in == 4864 && m > 8) continue;
        SCOPED_TRACE(std::string(dtype_name(t)) + " n_in " + std::to_string(n_in_t) + " rows " +
                     std::to_string(m));
        std::vector<float> y[2], gated[2];
        for (int on : {0, 1}) {
          XStage scope(on == 1);
          Buffer dy = be->alloc(size_t(m * n_out) * 4), dg = be->alloc(size_t(m * n_out) * 4),
                 du = be->alloc(size_t(m * n_out) * 4);
          be->matmul(w, dx.as<float>(), m, dy.as<float>());
          be->matmul_gate_up(w, u, dx.as<float>(), m, dg.as<float>(), du.as<float>());
          y[on] = to_host<float>(*be, dy, size_t(m * n_out));
          gated[on] = to_host<float>(*be, dg, size_t(m * n_out));
        }
        EXPECT_EQ(y[1], y[0]);
        EXPECT_EQ(gated[1], gated[0]);
      }
      be->release_matrix(w);
      be->release_matrix(u);
    }
}

// q, k, v in one launch and gate/up with SiLU fused equal the separate
// products, bit for bit, at each slice count. (A launch's count follows all
// its rows and the GPU's size, kw_for: on an H100 every launch here takes
// the same count alone or together, on a GPU of 28 SMs q/k/v together take
// 4 and k alone 16. The engine never mixes the two: its q/k/v are one launch,
// gate/up with LoRA terms two at the fused count.)
TEST(CudaMatmulFused, QkvAndGateUpEqualSeparateProducts) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  std::mt19937 rng(5);
  struct Restore {
    ~Restore() { cuda::set_kw_force(0); }
  } restore;
  for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_K})
    for (int64_t n_rows : {1, 20, 70}) {
      const int kw = (n_rows == 1 ? 16 : n_rows == 20 ? 4 : 8);
      cuda::set_kw_force(kw);
      SCOPED_TRACE(std::string(dtype_name(t)) + " rows " + std::to_string(n_rows) + " slices " +
                   std::to_string(kw));
      const int64_t D = 512, F = 768;
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<Weight> w;
      for (int64_t n_out : {D, int64_t(128), int64_t(128), F, F}) {
        bytes.push_back(random_weight(t, n_out, D, rng));
        w.push_back(be->prepare_matrix(Weight{t, n_out, D, bytes.back().data()}));
      }
      auto x = randn(size_t(n_rows * D), rng);
      auto bias = randn(size_t(D), rng);
      Buffer dx = to_device(*be, x.data(), x.size() * 4), db = to_device(*be, bias.data(), D * 4);
      Buffer q = be->alloc(size_t(n_rows * D) * 4), k = be->alloc(size_t(n_rows) * 128 * 4),
             v = be->alloc(size_t(n_rows) * 128 * 4), q1 = be->alloc(size_t(n_rows * D) * 4),
             k1 = be->alloc(size_t(n_rows) * 128 * 4);
      const Weight* ws[3] = {&w[0], &w[1], &w[2]};
      const float* bs[3] = {db.as<float>(), nullptr, nullptr};
      float* outs[3] = {q.as<float>(), k.as<float>(), v.as<float>()};
      be->matmul_qkv(ws, bs, dx.as<float>(), n_rows, outs);
      be->matmul(w[0], dx.as<float>(), n_rows, q1.as<float>());
      be->add_bias(q1.as<float>(), db.as<float>(), n_rows, D);
      be->matmul(w[1], dx.as<float>(), n_rows, k1.as<float>());
      EXPECT_EQ(to_host<float>(*be, q, size_t(n_rows * D)),
                to_host<float>(*be, q1, size_t(n_rows * D)));
      EXPECT_EQ(to_host<float>(*be, k, size_t(n_rows * 128)),
                to_host<float>(*be, k1, size_t(n_rows * 128)));
      Buffer g = be->alloc(size_t(n_rows * F) * 4), u = be->alloc(size_t(n_rows * F) * 4),
             g1 = be->alloc(size_t(n_rows * F) * 4), u1 = be->alloc(size_t(n_rows * F) * 4);
      be->matmul_gate_up(w[3], w[4], dx.as<float>(), n_rows, g.as<float>(), u.as<float>());
      be->matmul(w[3], dx.as<float>(), n_rows, g1.as<float>());
      be->matmul(w[4], dx.as<float>(), n_rows, u1.as<float>());
      be->silu_mul(g1.as<float>(), u1.as<float>(), n_rows * F);
      EXPECT_EQ(to_host<float>(*be, g, size_t(n_rows * F)),
                to_host<float>(*be, g1, size_t(n_rows * F)))
          << dtype_name(t) << " rows " << n_rows;
    }
}

// gate/up whose weights carry a LoRA term run as two products (the terms add
// before silu(g) * u); matmul_gate_up_apart gives them the fused launch's
// slice count, so rows without an adapter keep the fused bits. At SmolLM2-
// 360M's shape (2,560 x 960) gated and plain launches take different counts
// on an H100/H200 (by the waves rule: 4 against 7 or 8), so apart at the
// plain count would differ. Decode rows (1, 5) and a prefill's (70: the
// tiled kernel), integer products too.
TEST(CudaMatmulFused, GateUpApartKeepsTheFusedBits) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  std::mt19937 rng(61);
  const int64_t D = 960, F = 2560;
  for (bool int_mma : {false, true})
    for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_0}) {
      if (int_mma && t == DType::BF16) continue;
      IntProducts scope(int_mma);
      auto gb = random_weight(t, F, D, rng), ub = random_weight(t, F, D, rng);
      const Weight wg = be->prepare_matrix(Weight{t, F, D, gb.data()}),
                   wu = be->prepare_matrix(Weight{t, F, D, ub.data()});
      const auto &g = *static_cast<const cuda::GpuWeight*>(wg.aux),
                 &u = *static_cast<const cuda::GpuWeight*>(wu.aux);
      for (int64_t n_rows : {1, 5, 70}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + (int_mma ? " integer" : "") + " rows " +
                     std::to_string(n_rows));
        auto x = randn(size_t(n_rows * D), rng);
        Buffer dx = to_device(*be, x.data(), x.size() * 4);
        Buffer fg = be->alloc(size_t(n_rows * F) * 4), fu = be->alloc(size_t(n_rows * F) * 4),
               ag = be->alloc(size_t(n_rows * F) * 4), au = be->alloc(size_t(n_rows * F) * 4),
               xb = be->alloc(cuda::matmul_scratch_bytes(int(n_rows), g.k_pad));
        be->matmul_gate_up(wg, wu, dx.as<float>(), n_rows, fg.as<float>(), fu.as<float>());
        be->sync();
        cudaStream_t st = nullptr;
        ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
        cuda::matmul_gate_up_apart(g, u, dx.as<float>(), int(n_rows), ag.as<float>(),
                                   au.as<float>(), xb.data(), st);
        ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
        cudaStreamDestroy(st);
        be->silu_mul(ag.as<float>(), au.as<float>(), n_rows * F);
        EXPECT_EQ(to_host<float>(*be, ag, size_t(n_rows * F)),
                  to_host<float>(*be, fg, size_t(n_rows * F)));
      }
      be->release_matrix(wg);
      be->release_matrix(wu);
    }
}

// A one-row product with the residual add and the next norm taken by its
// last CTA (WICK_CUDA_FUSE_NORM=1) equals the product followed by
// add_rmsnorm, bit for bit: proj, the updated residual and the normed row,
// launch after launch (the kernel leaves its counter at zero: a second
// launch on it finds its last CTA only so), for rows
// shorter than the norm kernel's block and odd ones. Two rows: not fused (a
// test of its own, so that emu.race_ctas runs only the fused one). A test a
// weight format: the CTAs' protocol is the same code in each, and
// emu.race_ctas checks it on q8_0's alone.
class CudaFusedAddNorm : public ::testing::TestWithParam<DType> {};

void check_add_rmsnorm_in_the_last_cta(DType t, int64_t M) {
  struct Restore {
    bool was = cuda::fuse_norm();
    ~Restore() { cuda::set_fuse_norm(was); }
  } restore;
  cuda::set_fuse_norm(true);
  IntProducts bf16(false);  // (integer products decline the fused norm)
  auto be = cuda_backend();
  std::mt19937 rng(12);
  const float eps = 1e-6f;
  for (auto [n, n_in, kw] : {std::tuple<int64_t, int64_t, int>{64, 512, 16},
                             {200, 512, 16},
                             {896, 512, 16},
                             {1000, 1024, 16},
                             {2048, 1024, 16},
                             {896, 4864, 32},  // Qwen2.5-0.5B's down at 32 slices
                             {2048, 2048, 32}}) {
    SCOPED_TRACE(std::string(dtype_name(t)) + " n " + std::to_string(n) + " n_in " +
                 std::to_string(n_in) + " kw max " + std::to_string(kw));
    KwMax scope(kw);
    auto wb = random_weight(t, n, n_in, rng);
    const Weight w = be->prepare_matrix(Weight{t, n, n_in, wb.data()});
    auto in = randn(size_t(M * n_in), rng), x = randn(size_t(M * n), rng),
         nw = randn(size_t(n), rng);
    Buffer din = to_device(*be, in.data(), in.size() * 4),
           dnw = to_device(*be, nw.data(), nw.size() * 4);
    struct Out {
      Buffer proj, x, y;
    };
    auto fresh = [&] {
      return Out{be->alloc(size_t(M * n) * 4), to_device(*be, x.data(), x.size() * 4),
                 be->alloc(size_t(M * n) * 4)};
    };
    auto same = [&](const Out& want, const Out& got, const std::string& how) {
      for (auto [a, b, what] : {std::tuple{&want.proj, &got.proj, "proj"},
                                std::tuple{&want.x, &got.x, "x"}, std::tuple{&want.y, &got.y, "y"}})
        EXPECT_EQ(to_host<float>(*be, *b, size_t(M * n)), to_host<float>(*be, *a, size_t(M * n)))
            << how << ": " << what;
    };
    Out sep = fresh();
    be->matmul(w, din.as<float>(), M, sep.proj.as<float>());
    be->add_rmsnorm(sep.x.as<float>(), sep.proj.as<float>(), dnw.as<float>(), M, n, eps,
                    sep.y.as<float>());
    // the fused kernel itself, two launches on one counter
    Buffer counter = be->alloc(sizeof(int));
    const int zero = 0;
    be->copy_to_device(counter.data(), &zero, sizeof zero);
    be->sync();
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    for (int launch = 0; launch < 2; ++launch) {
      Out f = fresh();
      be->sync();
      const cuda::MatmulJob job{static_cast<const cuda::GpuWeight*>(w.aux), f.proj.as<float>(),
                                nullptr};
      const cuda::AddNorm a{f.x.as<float>(), dnw.as<float>(), eps, f.y.as<float>(),
                            counter.as<int>()};
      const bool took = cuda::matmul_add_rmsnorm(job, din.as<float>(), int(M), a, st);
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      EXPECT_EQ(took, M == 1);
      if (took) same(sep, f, "fused kernel, launch " + std::to_string(launch));
    }
    cudaStreamDestroy(st);
    EXPECT_EQ(to_host<int>(*be, counter, 1)[0], 0);
    // the backend's entry point (fused or not)
    Out via = fresh();
    be->matmul_add_rmsnorm(w, din.as<float>(), M, via.proj.as<float>(), via.x.as<float>(),
                           dnw.as<float>(), eps, via.y.as<float>());
    same(sep, via, "matmul_add_rmsnorm, rows " + std::to_string(M));
  }
}

TEST_P(CudaFusedAddNorm, InTheLastCtaEqualsTwoKernels) {
  WICK_REQUIRE_GPU();
  check_add_rmsnorm_in_the_last_cta(GetParam(), 1);
}

TEST_P(CudaFusedAddNorm, TwoRowsAsTwoKernels) {
  WICK_REQUIRE_GPU();
  check_add_rmsnorm_in_the_last_cta(GetParam(), 2);
}

INSTANTIATE_TEST_SUITE_P(NormTypes, CudaFusedAddNorm,
                         ::testing::Values(DType::BF16, DType::Q8_0, DType::Q4_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The tiled (prefill) kernel computes the decode kernel's bits: plain
// products, q/k/v with biases in one launch, and gate/up with SiLU, for the
// formats it takes (bf16, f16, 8-bit groups of 32 and 16, 4-bit with the
// min 8 scale, a stored min, and super-blocks) and odd shapes; with bf16
// products and with integer products (WICK_CUDA_INT_MMA).
TEST(CudaMatmulTiled, EqualsDecodeKernelBitForBit) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  std::mt19937 rng(5);
  struct Restore {
    ~Restore() { cuda::set_matmul_path(cuda::MatmulPath::Auto); }
  } restore;
  for (bool int_mma : {false, true})
    for (DType t : {DType::BF16, DType::F16, DType::Q8_0, DType::Q6_K, DType::Q5_K, DType::Q4_0,
                    DType::Q4_1, DType::Q4_K}) {
      const bool blocks = traits(t).block_size > 1;
      if (int_mma && !blocks) continue;  // (integer products: 8- and 4-bit weights)
      IntProducts scope(int_mma);
      for (int64_t n_in :
           blocks ? std::vector<int64_t>{256, 2560} : std::vector<int64_t>{72, 896, 2080})
        for (int64_t n_rows : {64, 200}) {
          const int64_t n_out[3] = {300, 37, 64};
          std::vector<std::vector<uint8_t>> hw;
          std::vector<Weight> w;
          for (int i = 0; i < 3; ++i) {
            hw.push_back(random_weight(t, n_out[i], n_in, rng));
            w.push_back(be->prepare_matrix(Weight{t, n_out[i], n_in, hw.back().data()}));
          }
          Weight up = be->prepare_matrix(Weight{t, 300, n_in, hw[0].data()});  // same shape as gate
          auto x = randn(size_t(n_rows * n_in), rng);
          auto bias = randn(300, rng);
          Buffer dx = to_device(*be, x.data(), x.size() * 4),
                 db = to_device(*be, bias.data(), bias.size() * 4);
          auto products = [&](cuda::MatmulPath path) {
            cuda::set_matmul_path(path);
            std::vector<Buffer> outs;
            for (int i = 0; i < 3; ++i) outs.push_back(be->alloc(size_t(n_rows * n_out[i]) * 4));
            const Weight* ws[3] = {&w[0], &w[1], &w[2]};
            const float* bs[3] = {db.as<float>(), nullptr, db.as<float>()};
            float* ys[3] = {outs[0].as<float>(), outs[1].as<float>(), outs[2].as<float>()};
            be->matmul_qkv(ws, bs, dx.as<float>(), n_rows, ys);
            outs.push_back(be->alloc(size_t(n_rows * 37) * 4));
            be->matmul(w[1], dx.as<float>(), n_rows, outs.back().as<float>());
            outs.push_back(be->alloc(size_t(n_rows * 300) * 4));
            Buffer u = be->alloc(size_t(n_rows * 300) * 4);
            be->matmul_gate_up(w[0], up, dx.as<float>(), n_rows, outs.back().as<float>(),
                               u.as<float>());
            std::vector<std::vector<float>> host;
            for (auto& o : outs) host.push_back(to_host<float>(*be, o, o.bytes() / 4));
            return host;
          };
          const auto tiled = products(cuda::MatmulPath::Tiled);
          const auto plain = products(cuda::MatmulPath::DecodeKernel);
          for (size_t i = 0; i < tiled.size(); ++i)
            ASSERT_EQ(tiled[i], plain[i])
                << dtype_name(t) << (int_mma ? " integer" : "") << " n_in " << n_in << " rows "
                << n_rows << " product " << i;
        }
      // a prefill's size (4,096 x 1,024 weights, 512 rows): the widest CTA
      // tiles (2 x 4 warps, several copy passes a stage; 8/4-bit weights
      // decoded once a CTA but 4-bit gate/up), which the small problems
      // above never reach; and 2,048 of its rows alone, which 8- and 16-bit
      // weights' bf16 products take in 2-column-tile warps (dispatch_tile,
      // on a GPU of 86 to 170 SMs); and a short k (256: 4 chunks of 8-bit
      // weights, 2 of 4-bit, fewer than the ring's stages) in the same wide
      // CTAs, 500 rows (the last 16-row tile cut by M)
      const int64_t n_in = 1024, n_out = 4096, n_half = 2048, n_rows = 512;
      const int64_t n_in_s = 256, n_rows_s = 500;
      auto hg = random_weight(t, n_out, n_in, rng), hu = random_weight(t, n_out, n_in, rng);
      auto hs = random_weight(t, n_out, n_in_s, rng);
      const Weight g = be->prepare_matrix(Weight{t, n_out, n_in, hg.data()});
      const Weight u = be->prepare_matrix(Weight{t, n_out, n_in, hu.data()});
      const Weight h = be->prepare_matrix(Weight{t, n_half, n_in, hg.data()});
      const Weight s = be->prepare_matrix(Weight{t, n_out, n_in_s, hs.data()});
      auto x = randn(size_t(n_rows * n_in), rng), xs = randn(size_t(n_rows_s * n_in_s), rng);
      Buffer dx = to_device(*be, x.data(), x.size() * 4),
             dxs = to_device(*be, xs.data(), xs.size() * 4);
      auto products = [&](cuda::MatmulPath path) {
        cuda::set_matmul_path(path);
        Buffer y = be->alloc(size_t(n_rows * n_out) * 4),
               gy = be->alloc(size_t(n_rows * n_out) * 4),
               uy = be->alloc(size_t(n_rows * n_out) * 4),
               hy = be->alloc(size_t(n_rows * n_half) * 4),
               sy = be->alloc(size_t(n_rows_s * n_out) * 4);
        be->matmul(g, dx.as<float>(), n_rows, y.as<float>());
        be->matmul_gate_up(g, u, dx.as<float>(), n_rows, gy.as<float>(), uy.as<float>());
        be->matmul(h, dx.as<float>(), n_rows, hy.as<float>());
        be->matmul(s, dxs.as<float>(), n_rows_s, sy.as<float>());
        return std::vector<std::vector<float>>{to_host<float>(*be, y, size_t(n_rows * n_out)),
                                               to_host<float>(*be, gy, size_t(n_rows * n_out)),
                                               to_host<float>(*be, hy, size_t(n_rows * n_half)),
                                               to_host<float>(*be, sy, size_t(n_rows_s * n_out))};
      };
      const auto tiled = products(cuda::MatmulPath::Tiled);
      const auto plain = products(cuda::MatmulPath::DecodeKernel);
      // (EXPECT_TRUE: two million values would flood the log)
      const char* what[4] = {", large", ", large gate/up", ", 2,048 rows", ", short k, 500 rows"};
      for (size_t i = 0; i < 4; ++i)
        EXPECT_TRUE(tiled[i] == plain[i])
            << dtype_name(t) << (int_mma ? " integer" : "") << what[i];
      if (blocks && !int_mma) {  // 8/4-bit weights decoded by each warp (WICK_CUDA_PREDECODE=0)
        struct PredecodeOn {
          ~PredecodeOn() { cuda::set_predecode(true); }
        } on;
        cuda::set_predecode(false);
        const auto warps = products(cuda::MatmulPath::Tiled);
        for (size_t i = 0; i < 4; ++i)
          EXPECT_TRUE(warps[i] == plain[i]) << dtype_name(t) << what[i] << ", not predecoded";
      }
      be->release_matrix(g);
      be->release_matrix(u);
      be->release_matrix(h);
      be->release_matrix(s);
    }
}

// On a GPU of less shared memory (an A100's 163 KB, an RTX 4090's 99 KB;
// played here by set_smem_limit) the products take smaller shapes: the
// prefill kernel narrower CTAs (and at 99 KB no PRE), the decode kernel
// 16-row tiles where 32 gated slices of 32 rows would not fit. The same
// bits as this GPU's own shapes, prefill (512 rows) and decode steps of 24
// and 40 rows at 32 slices, plain and gate/up.
TEST(CudaSmemLimit, SmallerGpusKeepTheBits) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  std::mt19937 rng(17);
  struct Restore {  // (the limit gpu_check's WICK_CUDA_SMEM_LIMIT runs set, for later tests)
    int was = cuda::smem_limit();
    ~Restore() {
      cuda::set_smem_limit(was);
      cuda::set_kw_force(0);
    }
  } restore;
  for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_0}) {
    const int64_t n_in = 4096, n_out = 2048;
    auto hg = random_weight(t, n_out, n_in, rng), hu = random_weight(t, n_out, n_in, rng);
    const Weight g = be->prepare_matrix(Weight{t, n_out, n_in, hg.data()});
    const Weight u = be->prepare_matrix(Weight{t, n_out, n_in, hu.data()});
    for (int64_t n_rows : {512, 24, 40}) {
      auto x = randn(size_t(n_rows * n_in), rng);
      Buffer dx = to_device(*be, x.data(), x.size() * 4);
      cuda::set_kw_force(n_rows == 512 ? 0 : 32);
      auto products = [&](int limit) {
        cuda::set_smem_limit(limit);
        Buffer y = be->alloc(size_t(n_rows * n_out) * 4),
               gy = be->alloc(size_t(n_rows * n_out) * 4),
               uy = be->alloc(size_t(n_rows * n_out) * 4);
        be->matmul(g, dx.as<float>(), n_rows, y.as<float>());
        be->matmul_gate_up(g, u, dx.as<float>(), n_rows, gy.as<float>(), uy.as<float>());
        return std::vector<std::vector<float>>{to_host<float>(*be, y, size_t(n_rows * n_out)),
                                               to_host<float>(*be, gy, size_t(n_rows * n_out))};
      };
      const auto own = products(0);
      for (int limit : {163 * 1024, 99 * 1024}) {
        const auto small = products(limit);
        for (size_t i = 0; i < own.size(); ++i)
          EXPECT_TRUE(small[i] == own[i]) << dtype_name(t) << " rows " << n_rows << " limit "
                                          << limit << (i ? " gate/up" : " plain");
      }
    }
    be->release_matrix(g);
    be->release_matrix(u);
  }
}

// Embedding rows are the CPU's dequantized rows exactly, for every type.
TEST(CudaEmbed, RowsEqualCpuDequantization) {
  WICK_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (bool f32 : {false, true}) {
    auto be = cuda_backend(f32);
    for (DType t : {DType::F32, DType::BF16, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                    DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K,
                    DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS}) {
      const int64_t n_vocab = 50, n_embd = 512;
      auto wb = random_weight(t, n_vocab, n_embd, rng);
      const Weight host{t, n_vocab, n_embd, wb.data()};
      const Weight w = be->prepare_matrix(host);
      Batch b;
      b.block_tables = {{0}};
      const std::vector<int32_t> ids{3, 0, 49, 17, 3};
      for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(i), 0, false);
      b.finish(16);
      const BatchArgs a = be->upload(b);
      Buffer out = be->alloc(ids.size() * n_embd * 4);
      be->embed(w, a, out.as<float>());
      auto got = to_host<float>(*be, out, ids.size() * n_embd);
      std::vector<float> want(static_cast<size_t>(n_embd));
      for (size_t i = 0; i < ids.size(); ++i) {
        dequantize_row_ref(t, host.row(ids[i]), want.data(), n_embd);
        if (t == DType::F32 && !f32)  // stored as bf16 on the GPU
          for (auto& x : want) x = bf16_to_f32(f32_to_bf16(x));
        for (int64_t j = 0; j < n_embd; ++j)
          ASSERT_EQ(got[i * n_embd + size_t(j)], want[size_t(j)])
              << dtype_name(t) << " id " << ids[i];
      }
    }
  }
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

TEST(CudaElementwise, NormsRopeAddSiluMatchCpu) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  std::mt19937 rng(9);
  for (int64_t n : {16, 64, 576, 4864}) {
    const int64_t rows = 7;
    auto x = randn(size_t(rows * n), rng), r = randn(size_t(rows * n), rng),
         w = randn(size_t(n), rng);
    Buffer dx = to_device(*be, x.data(), x.size() * 4), dr = to_device(*be, r.data(), r.size() * 4),
           dw = to_device(*be, w.data(), w.size() * 4), dy = be->alloc(x.size() * 4);
    be->rmsnorm(dx.as<float>(), dw.as<float>(), rows, n, 1e-6f, dy.as<float>());
    std::vector<float> want(x.size());
    cpu::rmsnorm(x.data(), w.data(), rows, n, 1e-6f, want.data());
    EXPECT_LT(max_rel(to_host<float>(*be, dy, x.size()), want), 1e-5) << "rmsnorm " << n;
    // x += r, y = norm(x)
    be->add_rmsnorm(dx.as<float>(), dr.as<float>(), dw.as<float>(), rows, n, 1e-6f, dy.as<float>());
    cpu::add(x.data(), r.data(), int64_t(x.size()));
    cpu::rmsnorm(x.data(), w.data(), rows, n, 1e-6f, want.data());
    EXPECT_EQ(to_host<float>(*be, dx, x.size()), x) << "residual add " << n;
    EXPECT_LT(max_rel(to_host<float>(*be, dy, x.size()), want), 1e-5) << "add_rmsnorm " << n;
    // silu(g) * u
    be->silu_mul(dx.as<float>(), dr.as<float>(), int64_t(x.size()));
    cpu::silu_mul(x.data(), r.data(), int64_t(x.size()));
    EXPECT_LT(max_rel(to_host<float>(*be, dx, x.size()), x), 1e-5) << "silu_mul " << n;
    // bias
    be->add_bias(dr.as<float>(), dw.as<float>(), rows, n);
    cpu::add_bias(r.data(), w.data(), rows, n);
    EXPECT_EQ(to_host<float>(*be, dr, r.size()), r) << "add_bias " << n;
  }
  // RoPE at scattered positions, several head sizes
  for (int64_t hd : {16, 64, 128}) {
    const int64_t rows = 5, heads = 3;
    auto x = randn(size_t(rows * heads * hd), rng);
    const std::vector<float> inv = rope_inv_freq(hd);
    Batch b;
    b.block_tables = {{0, 1, 2, 3, 4, 5, 6, 7}};
    const std::vector<int32_t> pos{0, 1, 17, 100, 127};
    for (int32_t p : pos) b.add(1, p, 0, false);
    b.finish(16);
    const BatchArgs a = be->upload(b);
    Buffer dx = to_device(*be, x.data(), x.size() * 4),
           dinv = to_device(*be, inv.data(), inv.size() * 4);
    be->rope(dx.as<float>(), a, heads, hd, dinv.as<float>());
    cpu::rope(x.data(), pos.data(), rows, heads, hd, inv.data());
    EXPECT_LT(max_rel(to_host<float>(*be, dx, x.size()), x), 2e-5) << "rope " << hd;
  }
}

// The same K/V in a CPU store (f32) and a GPU one (f32, f16 or q8_0), rounded
// as the GPU stores them first: both kernels read equal values (the GPU's
// q8_0 then widens q d to f16 as it reads).
void load_kv(Backend& be, std::vector<float> kh, std::vector<float> vh, KvStore& cpu_kv,
             KvStore& gpu_kv) {
  const size_t n_el = kh.size();
  if (gpu_kv.dtype == DType::Q8_0) {
    for (auto* x : {&kh, &vh}) {
      const std::vector<uint8_t> planes = q8_cache_planes(*x, gpu_kv.kv_dim);
      *x = q8_cache_values(planes, gpu_kv.kv_dim);
      be.copy_to_device(x == &kh ? gpu_kv.k.data() : gpu_kv.v.data(), planes.data(), planes.size());
    }
  } else if (gpu_kv.dtype == DType::F32) {
    be.copy_to_device(gpu_kv.k.data(), kh.data(), n_el * 4);
    be.copy_to_device(gpu_kv.v.data(), vh.data(), n_el * 4);
  } else {
    std::vector<uint16_t> k16(n_el), v16(n_el);
    for (size_t i = 0; i < n_el; ++i) {
      k16[i] = f32_to_f16(kh[i]), v16[i] = f32_to_f16(vh[i]);
      kh[i] = f16_to_f32(k16[i]), vh[i] = f16_to_f32(v16[i]);
    }
    be.copy_to_device(gpu_kv.k.data(), k16.data(), n_el * 2);
    be.copy_to_device(gpu_kv.v.data(), v16.data(), n_el * 2);
  }
  std::memcpy(cpu_kv.k.data(), kh.data(), n_el * 4);
  std::memcpy(cpu_kv.v.data(), vh.data(), n_el * 4);
}

// Attention over a paged cache: GQA, scattered blocks, a prefill run, decode
// tokens past one partition, a chunk in the middle of a sequence, a sliding
// window; against the CPU kernel on the same (f16-rounded) K/V.
struct AttnCase {
  int64_t head_dim, window;
  bool f32, q8 = false;  // the cache: f16, f32 (--gpu-f32) or q8_0
};
class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpuAndIsBatchInvariant) {
  WICK_REQUIRE_GPU();
  const auto [hd, window, f32, q8] = GetParam();
  auto be = q8 ? cuda_backend_q8() : cuda_backend(f32);
  std::mt19937 rng(21 + unsigned(hd));
  const int64_t n_head = 8, n_head_kv = 2, kv_dim = n_head_kv * hd, bs = 16, n_blocks = 200;
  auto cpu_kv = cpu_backend().make_kv(1, n_blocks, bs, kv_dim);
  auto gpu_kv = be->make_kv(1, n_blocks, bs, kv_dim);
  // three sequences on a random permutation of the blocks
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  for (int32_t i = 0; i < n_blocks; ++i) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<int32_t> ctx{70, 1100, 60};  // tokens each sequence holds
  std::vector<std::vector<int32_t>> tables(3);
  size_t next = 0;
  for (int s = 0; s < 3; ++s)
    for (int64_t b = 0; b < (ctx[size_t(s)] + bs - 1) / bs; ++b)
      tables[size_t(s)].push_back(perm[next++]);
  // random K/V in every slot
  const size_t n_el = size_t(n_blocks * bs * kv_dim);
  load_kv(*be, randn(n_el, rng), randn(n_el, rng), *cpu_kv, *gpu_kv);
  // batch: seq 0 prefill of all 70, seq 1 one decode token at 1099, seq 2 a chunk at 40..59
  auto make_batch = [&](const std::vector<std::pair<int, std::pair<int, int>>>& parts) {
    Batch b;
    for (int s = 0; s < 3; ++s) b.block_tables.push_back(tables[size_t(s)]);
    for (auto& [s, range] : parts)
      for (int p = range.first; p < range.second; ++p) b.add(1, p, s, false);
    b.finish(int32_t(bs));
    return b;
  };
  const AttnShape shape{n_head, n_head_kv, hd, window};
  auto run = [&](Backend& bk, KvStore& kv, Batch& b, const std::vector<float>& q) {
    const BatchArgs a = bk.upload(b);
    Buffer dq = to_device(bk, q.data(), q.size() * 4);
    Buffer out = bk.alloc(q.size() * 4);
    bk.attention(dq.as<float>(), kv, 0, a, shape, out.as<float>());
    return to_host<float>(bk, out, q.size());
  };
  Batch big = make_batch({{0, {0, 70}}, {1, {1099, 1100}}, {2, {40, 60}}});
  auto q = randn(size_t(big.n_tokens() * n_head * hd), rng);
  auto want = run(cpu_backend(), *cpu_kv, big, q);
  auto got = run(*be, *gpu_kv, big, q);
  EXPECT_LT(max_rel(got, want), f32 ? 1e-5 : 4e-3) << "head_dim " << hd << " window " << window;
  // the same rows alone: the decode token, the last prefill token, one chunk token
  const int64_t row = n_head * hd;
  for (auto [s, p, at] :
       std::vector<std::tuple<int, int, int64_t>>{{1, 1099, 70}, {0, 69, 69}, {2, 45, 76}}) {
    Batch one = make_batch({{s, {p, p + 1}}});
    std::vector<float> q1(q.begin() + at * row, q.begin() + (at + 1) * row);
    auto alone = run(*be, *gpu_kv, one, q1);
    for (int64_t i = 0; i < row; ++i)
      ASSERT_EQ(alone[size_t(i)], got[size_t(at * row + i)])
          << "token at " << p << " of sequence " << s << " alone differs from the batch";
  }
  // three tokens of a chunk together (12 rows: the decode kernel's one tile)
  Batch three = make_batch({{2, {45, 48}}});
  std::vector<float> q3(q.begin() + 76 * row, q.begin() + 79 * row);
  auto chunk = run(*be, *gpu_kv, three, q3);
  for (int64_t i = 0; i < 3 * row; ++i)
    ASSERT_EQ(chunk[size_t(i)], got[size_t(76 * row + i)]) << "a 3-token run differs at " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Values(AttnCase{16, 0, false}, AttnCase{32, 0, false}, AttnCase{64, 0, false},
                      AttnCase{128, 0, false}, AttnCase{64, 32, false}, AttnCase{16, 16, false},
                      AttnCase{64, 0, true}, AttnCase{16, 16, true}, AttnCase{16, 0, false, true},
                      AttnCase{64, 32, false, true}, AttnCase{128, 0, false, true}),
    [](const auto& info) {
      return "hd" + std::to_string(info.param.head_dim) + "_w" + std::to_string(info.param.window) +
             (info.param.f32  ? "_f32"
              : info.param.q8 ? "_q8_0"
                              : "_f16");
    });

// Pre-RoPE keys (the span cache) through a span layout: blocks closed early,
// spans placed at an offset in their block, holes that RoPE does not count,
// a sequence long enough that decode splits its context; beside it a
// sequence without holes. Against the CPU kernel, which rotates the same
// stored keys with its own cos/sin table (hence 1e-4 for f32, not 1e-5).
// Hole slots hold large keys: a kernel that read one would be far off.
TEST(CudaAttention, PreRopeKeysThroughHolesMatchCpu) {
  WICK_REQUIRE_GPU();
  for (const char* cache : {"f16", "f32", "q8_0"})
    for (int64_t hd : {64, 128}) {
      SCOPED_TRACE(std::string(cache) + " head_dim " + std::to_string(hd));
      const bool f32 = std::string(cache) == "f32";
      auto be = std::string(cache) == "q8_0" ? cuda_backend_q8() : cuda_backend(f32);
      std::mt19937 rng(57 + unsigned(hd));
      const int64_t n_head = 8, n_head_kv = 2, kv_dim = n_head_kv * hd, bs = 16, n_blocks = 90;
      auto cpu_kv = cpu_backend().make_kv(1, n_blocks, bs, kv_dim, true);
      auto gpu_kv = be->make_kv(1, n_blocks, bs, kv_dim, true);
      std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
      for (int32_t i = 0; i < n_blocks; ++i) perm[size_t(i)] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      // sequence 0: 75 blocks, every fifth closed after 9 slots, every
      // seventh starting at slot 5 (block 17 both); sequence 1: 6 full blocks
      std::vector<std::vector<int32_t>> tables(2);
      using Fills = std::vector<std::pair<int32_t, int32_t>>;
      std::vector<Fills> fills(2);
      std::vector<int32_t> valid0;  // sequence 0's positions outside the holes
      for (int32_t blk = 0; blk < 75; ++blk) {
        tables[0].push_back(perm[size_t(blk)]);
        const int32_t begin = blk % 7 == 3 ? 5 : 0, end = blk % 5 == 2 ? 9 : 16;
        fills[0].push_back({begin, end});
        for (int32_t o = begin; o < end; ++o) valid0.push_back(blk * int32_t(bs) + o);
      }
      for (int32_t blk = 0; blk < 6; ++blk) tables[1].push_back(perm[size_t(75 + blk)]);
      const size_t n_el = size_t(n_blocks * bs * kv_dim);
      auto kh = randn(n_el, rng), vh = randn(n_el, rng);
      for (size_t blk = 0; blk < fills[0].size(); ++blk)
        for (int32_t o = 0; o < bs; ++o)
          if (o < fills[0][blk].first || o >= fills[0][blk].second) {
            const size_t at = (size_t(tables[0][blk]) * size_t(bs) + size_t(o)) * size_t(kv_dim);
            for (int64_t i = 0; i < kv_dim; ++i) kh[at + size_t(i)] *= 30.f;
          }
      load_kv(*be, std::move(kh), std::move(vh), *cpu_kv, *gpu_kv);
      const std::vector<float> inv = rope_inv_freq(hd);
      Buffer dinv = to_device(*be, inv.data(), inv.size() * 4);
      // (sequence, positions): holes in the batch only where a token of sequence 0 is
      auto make_batch = [&](const std::vector<std::pair<int, std::vector<int32_t>>>& parts) {
        Batch b;
        bool hole_seq = false;
        for (auto& [s, ps] : parts) hole_seq |= s == 0;
        for (int s = 0; s < 2; ++s) {
          b.block_tables.push_back(tables[size_t(s)]);
          b.block_fills.push_back(hole_seq ? fills[size_t(s)] : Fills{});
        }
        for (auto& [s, ps] : parts)
          for (int32_t p : ps) b.add(1, p, s, false);
        b.finish(int32_t(bs));
        return b;
      };
      auto run = [&](Backend& bk, KvStore& kv, Batch& b, const std::vector<float>& q,
                     const float* inv_freq) {
        const BatchArgs a = bk.upload(b);
        Buffer dq = to_device(bk, q.data(), q.size() * 4);
        Buffer out = bk.alloc(q.size() * 4);
        bk.attention(dq.as<float>(), kv, 0, a, AttnShape{n_head, n_head_kv, hd, 0, inv_freq},
                     out.as<float>());
        return to_host<float>(bk, out, q.size());
      };
      // sequence 0: a 6-token chunk into block 74 (after block 73's hole at its start), then its
      // last token (decode); sequence 1: a prefill of all 96
      const std::vector<int32_t> chunk(valid0.end() - 20, valid0.end() - 14), last{valid0.back()};
      std::vector<int32_t> all1(96);
      for (int32_t p = 0; p < 96; ++p) all1[size_t(p)] = p;
      Batch big = make_batch({{0, chunk}, {0, last}, {1, all1}});
      auto q = randn(size_t(big.n_tokens() * n_head * hd), rng);
      auto want = run(cpu_backend(), *cpu_kv, big, q, inv.data());
      auto got = run(*be, *gpu_kv, big, q, dinv.as<float>());
      EXPECT_LT(max_rel(got, want), f32 ? 1e-4 : 4e-3);
      // rows alone: the decode token, a chunk token, sequence 1's last (a batch with no holes)
      const int64_t row = n_head * hd;
      for (auto [s, p, at] : std::vector<std::tuple<int, int32_t, int64_t>>{
               {0, valid0.back(), 6}, {0, chunk[2], 2}, {1, 95, 102}}) {
        Batch one = make_batch({{s, {p}}});
        std::vector<float> q1(q.begin() + at * row, q.begin() + (at + 1) * row);
        auto alone = run(*be, *gpu_kv, one, q1, dinv.as<float>());
        for (int64_t i = 0; i < row; ++i)
          ASSERT_EQ(alone[size_t(i)], got[size_t(at * row + i)])
              << "position " << p << " of sequence " << s << " alone differs from the batch";
      }
    }
}

// A batch whose integers pass the 16 MiB pinned upload buffer (a block table
// of 5M blocks: 20 MB) grows it instead of failing, and arrives whole; a
// small batch after it uses the grown buffer.
TEST(CudaUpload, BatchesPastThePinnedBufferArriveWhole) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  for (int32_t n_blocks : {5'000'000, 3}) {
    Batch b;
    b.block_tables.emplace_back(static_cast<size_t>(n_blocks));
    for (int32_t i = 0; i < n_blocks; ++i) b.block_tables[0][size_t(i)] = n_blocks - 1 - i;
    b.add(7, 33, 0, true);
    b.finish(16);
    const BatchArgs a = be->upload(b);
    std::vector<int32_t> table(static_cast<size_t>(n_blocks)), id(1);
    be->copy_to_host(table.data(), a.block_table, table.size() * 4);
    be->copy_to_host(id.data(), a.token_ids, 4);
    EXPECT_EQ(table, b.block_tables[0]) << n_blocks << " blocks";
    EXPECT_EQ(id[0], 7);
  }
}

// K/V writes land in the slots of the batch's positions, rounded to the cache's type.
TEST(CudaKv, RopeAndWriteMatchCpu) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  std::mt19937 rng(4);
  const int64_t n_head = 4, n_head_kv = 2, hd = 32, kv_dim = n_head_kv * hd;
  Batch b;
  b.block_tables = {{3, 1}, {0, 2}};
  b.add(1, 5, 0, false);
  b.add(1, 17, 0, false);
  b.add(1, 30, 1, false);
  b.finish(16);
  auto q = randn(size_t(3 * n_head * hd), rng), k = randn(size_t(3 * kv_dim), rng),
       v = randn(size_t(3 * kv_dim), rng);
  const std::vector<float> inv = rope_inv_freq(hd);
  auto kv = be->make_kv(1, 4, 16, kv_dim);
  const BatchArgs a = be->upload(b);
  Buffer dq = to_device(*be, q.data(), q.size() * 4), dk = to_device(*be, k.data(), k.size() * 4),
         dv = to_device(*be, v.data(), v.size() * 4),
         dinv = to_device(*be, inv.data(), inv.size() * 4);
  be->rope_kv_write(dq.as<float>(), dk.as<float>(), dv.as<float>(), *kv, 0, a,
                    AttnShape{n_head, n_head_kv, hd, 0}, dinv.as<float>());
  cpu::rope(q.data(), b.positions.data(), 3, n_head, hd, inv.data());
  cpu::rope(k.data(), b.positions.data(), 3, n_head_kv, hd, inv.data());
  EXPECT_LT(max_rel(to_host<float>(*be, dq, q.size()), q), 2e-5);
  std::vector<uint16_t> kc(size_t(4 * 16 * kv_dim)), vc(kc.size());
  be->copy_to_host(kc.data(), kv->k.data(), kc.size() * 2);
  be->copy_to_host(vc.data(), kv->v.data(), vc.size() * 2);
  const std::vector<int64_t> slots{3 * 16 + 5, 1 * 16 + 1, 2 * 16 + 14};
  for (size_t t = 0; t < 3; ++t)
    for (int64_t i = 0; i < kv_dim; ++i) {
      EXPECT_NEAR(f16_to_f32(kc[size_t(slots[t] * kv_dim + i)]), k[t * kv_dim + size_t(i)],
                  2e-3 * (1 + std::fabs(k[t * kv_dim + size_t(i)])));
      EXPECT_EQ(vc[size_t(slots[t] * kv_dim + i)], f32_to_f16(v[t * kv_dim + size_t(i)]));
    }
}

// q, k, v with RoPE and the cache write in the product's epilogue (decode
// batches) equal the product followed by rope_kv_write, bit for bit: q and
// k rotated (k not where the cache keeps keys before RoPE), the cache's K
// and V rows, in f16 and f32 caches, with and without biases. Past 16 rows
// the fused kernel declines and the backend runs the two.
TEST(CudaKv, QkvRopeWriteFusedEqualsSeparateKernels) {
  WICK_REQUIRE_GPU();
  // bf16 products (no scratch below: integer ones decline without it; their
  // fused launch: CudaMatmulIntFused)
  IntProducts bf16(false);
  std::mt19937 rng(9);
  const int64_t n_head_kv = 2, bs = 16;
  // rows of 256 at 16 slices, and of 4,096 at 32 (WICK_CUDA_KW_MAX; bf16's
  // 128 chunks take them, Q8_0's and Q4_K's 64 and 32 stay at 16); and a q
  // of 3,072 rows (a 3B model's), whose own count (8 or 4) differs from its
  // k's and v's: the three take q's and still fuse
  struct Case {
    int64_t D;
    int kw_max;
    int64_t n_head;
  };
  for (auto [D, kw, n_head] : {Case{256, 16, 4}, Case{4096, 32, 4}, Case{3072, 32, 24}})
    for (bool f32_cache : {false, true}) {
      KwMax scope(kw);
      auto be = cuda_backend(f32_cache);
      const bool tall = n_head * 128 > 2048;
      for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_K})
        for (int64_t hd : {64, 128})
          for (int64_t n_rows : {1, 5, 16, 20})
            for (bool pre_rope : {false, true}) {
              if (tall && (hd != 128 || n_rows == 5 || n_rows == 16)) continue;  // (time)
              const int64_t q_dim = n_head * hd, kv_dim = n_head_kv * hd;
              SCOPED_TRACE(std::string(dtype_name(t)) + " D " + std::to_string(D) + " hd " +
                           std::to_string(hd) + " rows " + std::to_string(n_rows) +
                           (pre_rope ? " pre-rope" : "") + (f32_cache ? " f32 cache" : ""));
              std::vector<std::vector<uint8_t>> bytes;
              std::vector<Weight> w;
              for (int64_t n_out : {q_dim, kv_dim, kv_dim}) {
                bytes.push_back(random_weight(t, n_out, D, rng));
                w.push_back(be->prepare_matrix(Weight{t, n_out, D, bytes.back().data()}));
              }
              // two sequences, tokens interleaved, at scattered positions
              Batch b;
              b.block_tables = {{5, 2, 7, 0}, {1, 6, 3, 4}};
              for (int64_t i = 0; i < n_rows; ++i)
                b.add(1, int32_t(3 * (i / 2) + 7 * (i % 2)), int32_t(i % 2), false);
              b.finish(int32_t(bs));
              const BatchArgs a = be->upload(b);
              const std::vector<float> inv = rope_inv_freq(hd);
              Buffer dinv = to_device(*be, inv.data(), inv.size() * 4);
              const AttnShape shape{n_head, n_head_kv, hd, 0, dinv.as<float>()};
              auto x = randn(size_t(n_rows * D), rng);
              Buffer dx = to_device(*be, x.data(), x.size() * 4);
              std::vector<Buffer> biases;
              const float* bias[3] = {nullptr, nullptr, nullptr};
              if (t == DType::BF16)  // Qwen2's q/k/v biases
                for (int j = 0; j < 3; ++j) {
                  auto bv = randn(size_t(w[size_t(j)].n_out), rng);
                  biases.push_back(to_device(*be, bv.data(), bv.size() * 4));
                  bias[j] = biases.back().as<float>();
                }
              const Weight* ws[3] = {&w[0], &w[1], &w[2]};
              struct Out {
                Buffer q, k, v;
                std::unique_ptr<KvStore> kv;
              };
              auto fresh = [&] {
                Out o{be->alloc(size_t(n_rows * q_dim) * 4), be->alloc(size_t(n_rows * kv_dim) * 4),
                      be->alloc(size_t(n_rows * kv_dim) * 4),
                      be->make_kv(1, 8, bs, kv_dim, pre_rope)};
                const size_t cache_bytes = o.kv->layer_bytes();
                const std::vector<uint8_t> zero(cache_bytes, 0);
                be->copy_to_device(o.kv->k.data(), zero.data(), cache_bytes);
                be->copy_to_device(o.kv->v.data(), zero.data(), cache_bytes);
                return o;
              };
              auto same = [&](const Out& want, const Out& got, const char* how) {
                EXPECT_EQ(to_host<float>(*be, got.q, size_t(n_rows * q_dim)),
                          to_host<float>(*be, want.q, size_t(n_rows * q_dim)))
                    << how << ": q";
                EXPECT_EQ(to_host<float>(*be, got.k, size_t(n_rows * kv_dim)),
                          to_host<float>(*be, want.k, size_t(n_rows * kv_dim)))
                    << how << ": k";
                EXPECT_EQ(to_host<float>(*be, got.v, size_t(n_rows * kv_dim)),
                          to_host<float>(*be, want.v, size_t(n_rows * kv_dim)))
                    << how << ": v";
                const size_t n = want.kv->layer_bytes();
                EXPECT_EQ(to_host<uint8_t>(*be, got.kv->k, n), to_host<uint8_t>(*be, want.kv->k, n))
                    << how << ": K cache";
                EXPECT_EQ(to_host<uint8_t>(*be, got.kv->v, n), to_host<uint8_t>(*be, want.kv->v, n))
                    << how << ": V cache";
              };
              // the reference: two kernels
              Out sep = fresh();
              float* so[3] = {sep.q.as<float>(), sep.k.as<float>(), sep.v.as<float>()};
              be->matmul_qkv(ws, bias, dx.as<float>(), n_rows, so);
              be->rope_kv_write(so[0], so[1], so[2], *sep.kv, 0, a, shape, dinv.as<float>());
              // the fused kernel itself: it must take every batch of up to 16 rows
              Out fused = fresh();
              cuda::MatmulJob jobs[3];
              jobs[0] = {static_cast<const cuda::GpuWeight*>(w[0].aux), fused.q.as<float>(),
                         bias[0]};
              jobs[1] = {static_cast<const cuda::GpuWeight*>(w[1].aux), fused.k.as<float>(),
                         bias[1]};
              jobs[2] = {static_cast<const cuda::GpuWeight*>(w[2].aux), fused.v.as<float>(),
                         bias[2]};
              cuda::RopeKv r;
              r.pos = a.rope_pos;
              r.slots = a.slots;
              r.inv_freq = dinv.as<float>();
              r.k_cache = fused.kv->k_layer<void>(0);
              r.v_cache = fused.kv->v_layer<void>(0);
              r.cache_f16 = fused.kv->dtype == DType::F16;
              r.rotate_k = !pre_rope;
              r.head_dim = int(hd);
              be->sync();
              cudaStream_t st = nullptr;
              ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
              const bool took =
                  cuda::matmul_qkv_rope_kv(jobs, dx.as<float>(), int(n_rows), r, nullptr, st);
              ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
              cudaStreamDestroy(st);
              EXPECT_EQ(took, n_rows <= 16);
              if (took) same(sep, fused, "fused kernel");
              // the backend's entry point (fused or not)
              Out via = fresh();
              float* vo[3] = {via.q.as<float>(), via.k.as<float>(), via.v.as<float>()};
              be->qkv_rope_kv_write(ws, bias, dx.as<float>(), vo, *via.kv, 0, a, shape);
              same(sep, via, "qkv_rope_kv_write");
            }
    }
}

// K/V deviations from the cache's rows: written K/V deviate by 0 (the new
// rows rounded as the cache stores them), other rows as the CPU computes
// from the same values (f16, or q8_0's round trips).
TEST(CudaKv, DeviationMatchesCpu) {
  WICK_REQUIRE_GPU();
  for (bool q8 : {false, true}) {
    SCOPED_TRACE(q8 ? "q8_0" : "f16");
    auto be = q8 ? cuda_backend_q8() : cuda_backend();
    std::mt19937 rng(5);
    const int64_t kv_dim = 64;
    Batch b;
    b.block_tables = {{3, 1}};
    for (int32_t p : {2, 9, 20}) b.add(1, p, 0, false);
    b.finish(16);
    auto k = randn(size_t(3 * kv_dim), rng), v = randn(size_t(3 * kv_dim), rng);
    auto kv = be->make_kv(1, 4, 16, kv_dim, true);
    const BatchArgs a = be->upload(b);
    Buffer dk = to_device(*be, k.data(), k.size() * 4), dv = to_device(*be, v.data(), v.size() * 4);
    be->kv_write(*kv, 0, a, dk.as<float>(), dv.as<float>());
    Buffer out = be->alloc(3 * 4);
    be->kv_deviation(*kv, 0, a, dk.as<float>(), dv.as<float>(), out.as<float>());
    EXPECT_EQ(to_host<float>(*be, out, 3), std::vector<float>(3, 0.f));
    // other K/V against the written rows: the CPU's sum over the rounded values
    auto k2 = randn(k.size(), rng), v2 = randn(v.size(), rng);
    Buffer dk2 = to_device(*be, k2.data(), k2.size() * 4),
           dv2 = to_device(*be, v2.data(), v2.size() * 4);
    be->kv_deviation(*kv, 0, a, dk2.as<float>(), dv2.as<float>(), out.as<float>());
    auto round = [&](std::vector<float> x) {
      if (q8) return q8_cache_values(q8_cache_planes(x, kv_dim), kv_dim);
      for (float& f : x) f = f16_to_f32(f32_to_f16(f));
      return x;
    };
    const auto rk = round(k), rv = round(v), rk2 = round(k2), rv2 = round(v2);
    std::vector<float> want(3);
    const int32_t slots[3] = {0, 1, 2};  // rows t of the rounded arrays, as cache rows
    cpu::kv_deviation(rk.data(), rv.data(), DType::F32, kv_dim, slots, 3, rk2.data(), rv2.data(),
                      want.data());
    EXPECT_LT(max_rel(to_host<float>(*be, out, 3), want), 1e-5);
  }
}

// Routing and the grouped expert products against the CPU's: 2, 10 and 80
// (token, expert) pairs, so 16-, 32- and 64-row tiles; and gate/up over
// k = 4,096 in 32 slices, where the 80 pairs take 32-row tiles (64-row
// tiles of 32 slices would need 256 KiB of shared memory).
TEST(CudaMoe, RouteAndExpertsMatchCpu) {
  WICK_REQUIRE_GPU();
  std::mt19937 rng(8);
  struct Case {
    bool f32;
    int64_t n_tok, D;
    int kw_max;
  };
  std::vector<Case> cases;
  for (bool f32 : {false, true})
    for (int64_t n_tok : {1, 5, 40}) cases.push_back({f32, n_tok, 256, 16});
  for (int64_t n_tok : {5, 40}) cases.push_back({false, n_tok, 4096, 32});
  for (const Case& c : cases) {
    KwMax scope(c.kw_max);
    const bool f32 = c.f32;
    const int64_t n_tok = c.n_tok;
    auto be = cuda_backend(f32);
    const int64_t E = 8, K = 2, D = c.D, F = 96;
    const DType t = f32 ? DType::F32 : DType::BF16;
    const HostExperts experts = random_experts(E, D, F, t, t, rng);
    const std::vector<ExpertWeights>& host = experts.w;
    std::vector<ExpertWeights> dev(static_cast<size_t>(E));
    be->prepare_experts(host, dev);
    auto logits = randn(size_t(n_tok * E), rng);
    auto x = randn(size_t(n_tok * D), rng, 0.2f);
    Buffer dl = to_device(*be, logits.data(), logits.size() * 4),
           dx = to_device(*be, x.data(), x.size() * 4), ids = be->alloc(size_t(n_tok * K) * 4),
           w = be->alloc(size_t(n_tok * K) * 4), out = be->alloc(x.size() * 4);
    be->moe_route(dl.as<float>(), n_tok, E, K, true, ids.as<int32_t>(), w.as<float>());
    std::vector<int32_t> cids(size_t(n_tok * K));
    std::vector<float> cw(size_t(n_tok * K));
    cpu::moe_route(logits.data(), n_tok, E, K, true, cids.data(), cw.data());
    EXPECT_EQ(to_host<int32_t>(*be, ids, cids.size()), cids);
    EXPECT_LT(max_rel(to_host<float>(*be, w, cw.size()), cw), 1e-5);
    be->moe_mlp(dev, dx.as<float>(), n_tok, K, ids.as<int32_t>(), w.as<float>(), out.as<float>());
    std::vector<float> want(x.size());
    cpu::MoeScratch s;
    // the CPU on bf16-rounded weights when the GPU holds bf16
    cpu::moe_mlp(host, x.data(), n_tok, K, cids.data(), cw.data(), want.data(), s);
    EXPECT_LT(max_rel(to_host<float>(*be, out, x.size()), want), f32 ? 1e-5 : 2e-2)
        << "tokens " << n_tok << (f32 ? " f32" : " bf16") << ", D " << D << ", kw max " << c.kw_max;
  }
}

}  // namespace
}  // namespace wick::test
