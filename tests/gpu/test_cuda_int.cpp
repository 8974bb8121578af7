// Integer products of 8- and 4-bit weights (WICK_CUDA_INT_MMA, matmul_int.cuh)
// against the CPU, and their bits across batch sizes and launch shapes.
//
// Tolerance: |gpu - ref| <= 1e-4 * sum |w x| per element, ref the float64
// product of the CPU's dequantized weights. The activations' two int8
// levels are within d / 512 of x (d = a block's largest / 127): for randn x
// about 5e-5 of sum |w x| if every error had one sign; bf16 activations
// would need 8e-3.
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "gpu/gpu_helpers.h"
#include "io/quant_blocks.h"
#include "random_weight.h"

namespace wick::test {
namespace {

// The activation quantizations run() launches.
template <typename Run>
uint64_t quantize_launches(Run&& run) {
  const uint64_t before = cuda::quantize_act_launches();
  run();
  return cuda::quantize_act_launches() - before;
}

// The fused q/k/v launch's RoPE and cache write: the batch a's positions
// and slots into layer 0 of kv.
cuda::RopeKv rope_kv_of(const BatchArgs& a, const Buffer& inv_freq, KvStore& kv, int64_t hd) {
  cuda::RopeKv r;
  r.pos = a.rope_pos;
  r.slots = a.slots;
  r.inv_freq = inv_freq.as<float>();
  r.k_cache = kv.k_layer<void>(0);
  r.v_cache = kv.v_layer<void>(0);
  r.cache_f16 = kv.dtype == DType::F16;
  r.head_dim = int(hd);
  return r;
}

// ni's forms (ni.M rows of ni.n, both orders), byte for byte what
// quantize_act makes of y.
void expect_forms_quantize(Backend& be, const float* y, const cuda::NormInt& ni, cudaStream_t st,
                           const std::string& what) {
  auto bytes = [&](const void* p, size_t n) {
    std::vector<uint8_t> h(n);
    be.copy_to_host(h.data(), p, n);
    return h;
  };
  for (cuda::Fmt f : {cuda::Fmt::I8, cuda::Fmt::U4}) {
    const int k_pad = cuda::k_pad_of(f, ni.n);
    Buffer q = be.alloc(cuda::int_act_bytes(ni.M, k_pad));
    const cuda::IntAct want =
        cuda::quantize_act(y, ni.M, ni.n, k_pad, f == cuda::Fmt::U4, q.data(), st);
    const cuda::IntAct got = cuda::norm_int_act(ni, f);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const size_t n_q = size_t(ni.M) * 2 * size_t(k_pad), n_d = size_t(ni.M) * size_t(k_pad / 32),
                 n_s = size_t(ni.M) * size_t(k_pad / 16);
    const std::string order = what + (f == cuda::Fmt::U4 ? ", 4-bit order" : ", 8-bit order");
    EXPECT_EQ(bytes(got.q, n_q), bytes(want.q, n_q)) << order;
    EXPECT_EQ(bytes(got.d, n_d * 4), bytes(want.d, n_d * 4)) << order;
    EXPECT_EQ(bytes(got.s, n_s * 4), bytes(want.s, n_s * 4)) << order;
  }
}

class CudaMatmulInt : public ::testing::TestWithParam<DType> {};

// Every type's products within the tolerance, at odd row counts (a tile
// partly past n_out) and k of one to ten blocks (of 32: 5 and 9 too, a
// chunk partly zeros); a row's bits the same
// alone, among 5, 16 or 33 rows and among 100 (decode and prefill tiles).
TEST_P(CudaMatmulInt, MatchesCpuAndIsBatchInvariant) {
  WICK_REQUIRE_GPU();
  const DType t = GetParam();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(23 + unsigned(t));
  for (int64_t n_in : {160, 256, 288, 512, 2560})  // (160, 288: a chunk part padding)
    for (int64_t n_out : {1, 37, 300}) {
      if (n_in % traits(t).block_size) continue;
      auto wb = random_weight(t, n_out, n_in, rng);
      const Weight host{t, n_out, n_in, wb.data()};
      const Weight w = be->prepare_matrix(host);
      ASSERT_TRUE(cuda::int_path(*static_cast<const cuda::GpuWeight*>(w.aux)));
      const int64_t n_rows = 100;
      auto x = randn(size_t(n_rows * n_in), rng);
      for (int64_t i = 0; i < n_in; i += 37) x[size_t(i)] = 0.f;   // zeros, and a zero block:
      for (int64_t i = 0; i < 32; ++i) x[size_t(n_in + i)] = 0.f;  // d = 0
      Buffer dx = to_device(*be, x.data(), x.size() * 4);
      Buffer dy = be->alloc(size_t(n_rows * n_out) * 4);
      be->matmul(w, dx.as<float>(), n_rows, dy.as<float>());
      const auto y = to_host<float>(*be, dy, size_t(n_rows * n_out));
      const ProductError e = product_error(host, x, n_rows, y);
      ASSERT_LE(e.worst, 1e-4) << dtype_name(t) << " n_in " << n_in << " n_out " << n_out << " row "
                               << e.row << " col " << e.col << " gpu " << e.got << " ref " << e.ref;
      expect_rows_alone_equal(*be, w, dx, n_in, y, {1, 5, 16, 33},
                              std::string(dtype_name(t)) + " n_in " + std::to_string(n_in));
      RecordProperty(std::string(dtype_name(t)) + "_" + std::to_string(n_in) + "_" +
                         std::to_string(n_out) + "_worst",
                     std::to_string(e.worst));
      be->release_matrix(w);
    }
}

// Groups of 32 8-bit (Q8_0, Q5_*, IQ4_*), of 16 (Q6_K, Q2_K, Q3_K), 4-bit
// (Q4_0, Q4_1, Q4_K); with and without a min term.
INSTANTIATE_TEST_SUITE_P(QuantizedTypes, CudaMatmulInt,
                         ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                                           DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                           DType::Q2_K, DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The launches that share x: q/k/v and gate/up equal their separate
// products bit for bit, and so do q/k/v with RoPE and the K/V write in the
// epilogue (decode batches) against the products then rope_kv_write. (At
// these sizes every launch takes 4 slices, alone or together; past them a
// launch's count follows all its rows, kw_for.)
TEST(CudaMatmulIntFused, LaunchesEqualSeparateProducts) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(31);
  const int64_t D = 512, F = 768, hd = 64, n_head = D / hd, n_head_kv = 2, kv_dim = n_head_kv * hd;
  for (DType t :
       {DType::Q8_0, DType::Q6_K, DType::Q4_0, DType::Q4_K, DType::Q2_K})  // (stored mins)
    for (int64_t n_rows : {1, 7, 16, 20}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " rows " + std::to_string(n_rows));
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<Weight> w;
      for (int64_t n_out : {D, kv_dim, kv_dim, F, F}) {
        bytes.push_back(random_weight(t, n_out, D, rng));
        w.push_back(be->prepare_matrix(Weight{t, n_out, D, bytes.back().data()}));
      }
      auto x = randn(size_t(n_rows * D), rng);
      Buffer dx = to_device(*be, x.data(), x.size() * 4);
      auto out = [&](int64_t n) { return be->alloc(size_t(n_rows * n) * 4); };
      // q/k/v in one launch against each alone
      Buffer q = out(D), k = out(kv_dim), v = out(kv_dim), q1 = out(D), k1 = out(kv_dim);
      const Weight* ws[3] = {&w[0], &w[1], &w[2]};
      const float* no_bias[3] = {nullptr, nullptr, nullptr};
      float* qkv[3] = {q.as<float>(), k.as<float>(), v.as<float>()};
      be->matmul_qkv(ws, no_bias, dx.as<float>(), n_rows, qkv);
      be->matmul(w[0], dx.as<float>(), n_rows, q1.as<float>());
      be->matmul(w[1], dx.as<float>(), n_rows, k1.as<float>());
      EXPECT_EQ(to_host<float>(*be, q, size_t(n_rows * D)),
                to_host<float>(*be, q1, size_t(n_rows * D)));
      EXPECT_EQ(to_host<float>(*be, k, size_t(n_rows * kv_dim)),
                to_host<float>(*be, k1, size_t(n_rows * kv_dim)));
      // gate/up against silu(gate) * up
      Buffer g = out(F), u = out(F), g1 = out(F), u1 = out(F);
      be->matmul_gate_up(w[3], w[4], dx.as<float>(), n_rows, g.as<float>(), u.as<float>());
      be->matmul(w[3], dx.as<float>(), n_rows, g1.as<float>());
      be->matmul(w[4], dx.as<float>(), n_rows, u1.as<float>());
      be->silu_mul(g1.as<float>(), u1.as<float>(), n_rows * F);
      EXPECT_EQ(to_host<float>(*be, g, size_t(n_rows * F)),
                to_host<float>(*be, g1, size_t(n_rows * F)));
      // q/k/v with RoPE and the cache write fused, against the two steps
      Batch b;
      b.block_tables = {{3, 1, 0, 2}};
      for (int64_t i = 0; i < n_rows; ++i) b.add(1, int32_t(2 * i + 1), 0, false);
      b.finish(16);
      const BatchArgs a = be->upload(b);
      const std::vector<float> inv = rope_inv_freq(hd);
      Buffer dinv = to_device(*be, inv.data(), inv.size() * 4);
      const AttnShape shape{n_head, n_head_kv, hd, 0, dinv.as<float>()};
      auto sep_kv = be->make_kv(1, 4, 16, kv_dim), fused_kv = be->make_kv(1, 4, 16, kv_dim);
      for (auto* kv : {sep_kv.get(), fused_kv.get()}) {
        const std::vector<uint8_t> zero(kv->layer_bytes(), 0);
        be->copy_to_device(kv->k.data(), zero.data(), zero.size());
        be->copy_to_device(kv->v.data(), zero.data(), zero.size());
      }
      be->rope_kv_write(q1.as<float>(), k1.as<float>(), v.as<float>(), *sep_kv, 0, a, shape,
                        dinv.as<float>());
      Buffer q2 = out(D), k2 = out(kv_dim), v2 = out(kv_dim);
      cuda::MatmulJob jobs[3];
      float* outs[3] = {q2.as<float>(), k2.as<float>(), v2.as<float>()};
      for (int j = 0; j < 3; ++j)
        jobs[j] = {static_cast<const cuda::GpuWeight*>(w[size_t(j)].aux), outs[j], nullptr};
      const cuda::RopeKv r = rope_kv_of(a, dinv, *fused_kv, hd);
      Buffer xb = be->alloc(cuda::matmul_scratch_bytes(int(n_rows), jobs[0].w->k_pad));
      be->sync();
      cudaStream_t st = nullptr;
      ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
      // without the scratch for x's integer form it declines
      EXPECT_FALSE(cuda::matmul_qkv_rope_kv(jobs, dx.as<float>(), int(n_rows), r, nullptr, st));
      const bool took =
          cuda::matmul_qkv_rope_kv(jobs, dx.as<float>(), int(n_rows), r, xb.data(), st);
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      cudaStreamDestroy(st);
      EXPECT_EQ(took, n_rows <= 16);
      if (took) {
        EXPECT_EQ(to_host<float>(*be, q2, size_t(n_rows * D)),
                  to_host<float>(*be, q1, size_t(n_rows * D)));
        EXPECT_EQ(to_host<float>(*be, k2, size_t(n_rows * kv_dim)),
                  to_host<float>(*be, k1, size_t(n_rows * kv_dim)));
        EXPECT_EQ(to_host<float>(*be, v2, size_t(n_rows * kv_dim)),
                  to_host<float>(*be, v, size_t(n_rows * kv_dim)));
        const size_t n = sep_kv->layer_bytes();
        EXPECT_EQ(to_host<uint8_t>(*be, fused_kv->k, n), to_host<uint8_t>(*be, sep_kv->k, n));
        EXPECT_EQ(to_host<uint8_t>(*be, fused_kv->v, n), to_host<uint8_t>(*be, sep_kv->v, n));
      }
      for (auto& wi : w) be->release_matrix(wi);
    }
}

// A NaN in x reaches its row's products (the quantization's block maximum
// would drop it; its block's scale carries it), and no other row's.
TEST(CudaMatmulInt, NanInXShowsInItsRowAlone) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(5);
  const int64_t n_in = 512, n_out = 40, n_rows = 3;
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    auto wb = random_weight(t, n_out, n_in, rng);
    const Weight w = be->prepare_matrix(Weight{t, n_out, n_in, wb.data()});
    auto x = randn(size_t(n_rows * n_in), rng);
    x[size_t(n_in + 77)] = std::nanf("");  // row 1
    Buffer dx = to_device(*be, x.data(), x.size() * 4);
    Buffer dy = be->alloc(size_t(n_rows * n_out) * 4);
    be->matmul(w, dx.as<float>(), n_rows, dy.as<float>());
    const auto y = to_host<float>(*be, dy, size_t(n_rows * n_out));
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t c = 0; c < n_out; ++c)
        EXPECT_EQ(std::isnan(y[size_t(r * n_out + c)]), r == 1)
            << dtype_name(t) << " row " << r << " col " << c;
    be->release_matrix(w);
  }
}

// The experts' grouped products with integer products: every 8/4-bit type,
// and a Q4_K_M-like mix (4-bit gate/up, 8-bit groups of 16 down; their tiles
// 16 rows) and its reverse, against the CPU (which quantizes x to int8
// blocks itself: ~0.3 % apart); a token's output alone equals its output
// among 5 and 40 (tiles of other rows around it), bit for bit.
TEST(CudaMoeInt, ExpertsMatchCpuAndRowsAlone) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  std::mt19937 rng(47);
  const int64_t E = 8, K = 2, D = 256, F = 512, n_max = 40;
  for (auto [tg, td] : {std::pair{DType::Q8_0, DType::Q8_0},
                        {DType::Q4_0, DType::Q4_0},
                        {DType::Q4_K, DType::Q4_K},
                        {DType::Q6_K, DType::Q6_K},
                        {DType::Q4_K, DType::Q6_K},
                        {DType::Q8_0, DType::Q4_0}}) {
    SCOPED_TRACE(std::string(dtype_name(tg)) + " / " + dtype_name(td));
    auto be = cuda_backend();  // (a backend each: its expert table)
    const HostExperts experts = random_experts(E, D, F, tg, td, rng);
    const std::vector<ExpertWeights>& host = experts.w;
    std::vector<ExpertWeights> dev(static_cast<size_t>(E));
    be->prepare_experts(host, dev);
    ASSERT_TRUE(cuda::int_path(*static_cast<const cuda::GpuWeight*>(dev[0].gate.aux)));
    const auto logits = randn(size_t(n_max * E), rng), x = randn(size_t(n_max * D), rng, 0.2f);
    std::vector<float> first;  // token 0's output alone
    for (int64_t n_tok : {1, 5, 40}) {
      const size_t n_x = size_t(n_tok * D), n_pairs = size_t(n_tok * K);
      Buffer dl = to_device(*be, logits.data(), size_t(n_tok * E) * 4),
             dx = to_device(*be, x.data(), n_x * 4), ids = be->alloc(n_pairs * 4),
             w = be->alloc(n_pairs * 4), out = be->alloc(n_x * 4);
      be->moe_route(dl.as<float>(), n_tok, E, K, true, ids.as<int32_t>(), w.as<float>());
      be->moe_mlp(dev, dx.as<float>(), n_tok, K, ids.as<int32_t>(), w.as<float>(), out.as<float>());
      const auto got = to_host<float>(*be, out, n_x);
      std::vector<int32_t> cids(n_pairs);
      std::vector<float> cw(n_pairs), want(n_x);
      cpu::moe_route(logits.data(), n_tok, E, K, true, cids.data(), cw.data());
      ASSERT_EQ(to_host<int32_t>(*be, ids, n_pairs), cids) << n_tok << " tokens";
      cpu::MoeScratch scratch;
      cpu::moe_mlp(host, x.data(), n_tok, K, cids.data(), cw.data(), want.data(), scratch);
      double err = 0, norm = 0;
      for (size_t i = 0; i < n_x; ++i) {
        err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        norm += double(want[i]) * want[i];
      }
      EXPECT_LT(std::sqrt(err / norm), 1e-2) << n_tok << " tokens";
      const std::vector<float> row0(got.begin(), got.begin() + D);
      if (n_tok == 1)
        first = row0;
      else
        EXPECT_EQ(row0, first) << n_tok << " tokens";
    }
  }
}

// Off, the same weights take bf16 products again (the switch holds for
// every later product): each within its own tolerance of the CPU (the two
// differ by bf16's rounding, up to 8e-3 of sum |w x|: on an H200, session
// 57, an output of -0.34 with sum |w x| 4,686 differed by 0.46, both right).
TEST(CudaMatmulIntSwitch, OffGivesBf16Products) {
  WICK_REQUIRE_GPU();
  auto be = cuda_backend();
  std::mt19937 rng(3);
  const int64_t n_in = 1024, n_out = 64, n_rows = 3;
  auto wb = random_weight(DType::Q8_0, n_out, n_in, rng);
  const Weight w = be->prepare_matrix(Weight{DType::Q8_0, n_out, n_in, wb.data()});
  auto x = randn(size_t(n_rows * n_in), rng);
  Buffer dx = to_device(*be, x.data(), x.size() * 4);
  auto product = [&](bool on) {
    IntProducts scope(on);
    Buffer dy = be->alloc(size_t(n_rows * n_out) * 4);
    be->matmul(w, dx.as<float>(), n_rows, dy.as<float>());
    return to_host<float>(*be, dy, size_t(n_rows * n_out));
  };
  const auto integer = product(true), bf16 = product(false), again = product(true);
  EXPECT_EQ(integer, again);
  EXPECT_NE(integer, bf16);
  const Weight host{DType::Q8_0, n_out, n_in, wb.data()};
  const ProductError ei = product_error(host, x, n_rows, integer),
                     eb = product_error(host, x, n_rows, bf16);
  EXPECT_LE(ei.worst, 1e-4) << "integer: row " << ei.row << " col " << ei.col << " gpu " << ei.got
                            << " ref " << ei.ref;
  EXPECT_LE(eb.worst, 8e-3) << "bf16: row " << eb.row << " col " << eb.col << " gpu " << eb.got
                            << " ref " << eb.ref;
  // bf16's error is well above the integer products' (else the switch did nothing)
  EXPECT_GT(eb.worst, 4 * ei.worst);
}

// Integer products' 8-bit decode kernels held to 128 registers
// (set_int_r128: 1, the default, those not gated; 2 gated too) give the
// bits of the kernels without the bound: 1 to 16 rows, groups of 32 and
// 16, the rule's slices (16 here: a CTA of 16 warps, which 132 registers
// cut to 15) and 32 forced (a warp takes two).
TEST(CudaMatmulIntR128, SameBitsAsUnbounded) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  const int r128_was = cuda::int_r128();
  struct Dp4aOff {  // (else one row takes dp_kernel at every level)
    bool was = cuda::int_dp4a();
    Dp4aOff() { cuda::set_int_dp4a(false); }
    ~Dp4aOff() { cuda::set_int_dp4a(was); }
  } dp4a_off;
  auto be = cuda_backend();
  std::mt19937 rng(57);
  const int64_t D = 2048, F = 1536;
  for (DType t : {DType::Q8_0, DType::Q6_K}) {
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<Weight> w;
    for (int64_t n_out : {D, F, F}) {  // o, gate, up
      bytes.push_back(random_weight(t, n_out, D, rng));
      w.push_back(be->prepare_matrix(Weight{t, n_out, D, bytes.back().data()}));
    }
    for (int64_t n_rows : {1, 5, 16})
      for (int kw : {0, 32}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " rows " + std::to_string(n_rows) + " kw " +
                     std::to_string(kw));
        auto x = randn(size_t(n_rows * D), rng);
        Buffer dx = to_device(*be, x.data(), x.size() * 4);
        std::vector<float> o_want, g_want;
        for (int level : {0, 1, 2}) {
          cuda::set_int_r128(level);
          cuda::set_kw_force(kw);
          Buffer o = be->alloc(size_t(n_rows * D) * 4), g = be->alloc(size_t(n_rows * F) * 4),
                 u = be->alloc(size_t(n_rows * F) * 4);
          be->matmul(w[0], dx.as<float>(), n_rows, o.as<float>());
          be->matmul_gate_up(w[1], w[2], dx.as<float>(), n_rows, g.as<float>(), u.as<float>());
          const auto o_got = to_host<float>(*be, o, size_t(n_rows * D));
          const auto g_got = to_host<float>(*be, g, size_t(n_rows * F));
          cuda::set_kw_force(0);
          if (level == 0) {
            const ProductError e =
                product_error(Weight{t, D, D, bytes[0].data()}, x, n_rows, o_got);
            EXPECT_LE(e.worst, 1e-4) << "row " << e.row << " col " << e.col;
            o_want = o_got;
            g_want = g_got;
          } else {
            EXPECT_EQ(o_got, o_want) << "level " << level;
            EXPECT_EQ(g_got, g_want) << "level " << level;
          }
        }
      }
    for (auto& wi : w) be->release_matrix(wi);
  }
  cuda::set_int_r128(r128_was);
}

// Integer products of decode steps by dp4a (set_int_dp4a, matmul_dp4a.cuh)
// give the tensor cores' bits: 1 to 4 rows (and 5, past them: the mma
// kernel either way), every kind of group and min (Q8_0; Q5_1's stored min;
// Q6_K's and Q2_K's groups of 16; Q4_0's min 8 s; Q4_1's and Q4_K's stored
// mins), plain, gate/up, and q/k/v with RoPE and the cache write in the
// epilogue, and a tall product (8,200 rows: CTAs of 4 tiles, the last one
// part past the rows, as the output head); the rule's slices and forced 4, 7 (slices of unequal
// chunk counts) and 32 (256 threads a CTA); k of 2,048 and 1,600 (a part chunk).
TEST(CudaMatmulIntDp4a, SameBitsAsMma) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  const bool dp4a_was = cuda::int_dp4a();
  auto be = cuda_backend();
  std::mt19937 rng(60);
  const int64_t F = 1536, hd = 64, kv_dim = 2 * hd;
  for (int64_t D : {2048, 1600})
    for (DType t : {DType::Q8_0, DType::Q5_1, DType::Q6_K, DType::Q2_K, DType::Q4_0, DType::Q4_1,
                    DType::Q4_K}) {
      if (D % traits(t).block_size) continue;
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<Weight> w;
      for (int64_t n_out :
           {D, F, F, kv_dim, kv_dim, int64_t(8200)}) {  // o (q), gate, up, k, v, head
        bytes.push_back(random_weight(t, n_out, D, rng));
        w.push_back(be->prepare_matrix(Weight{t, n_out, D, bytes.back().data()}));
      }
      const std::vector<float> inv = rope_inv_freq(hd);
      Buffer dinv = to_device(*be, inv.data(), inv.size() * 4);
      for (int64_t n_rows : {1, 2, 3, 4, 5})
        for (int kw : {0, 4, 7, 32}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " D " + std::to_string(D) + " rows " +
                       std::to_string(n_rows) + " kw " + std::to_string(kw));
          auto x = randn(size_t(n_rows * D), rng);
          Buffer dx = to_device(*be, x.data(), x.size() * 4);
          Batch b;
          b.block_tables = {{3, 1, 0, 2}};
          for (int64_t i = 0; i < n_rows; ++i) b.add(1, int32_t(3 * i + 2), 0, false);
          b.finish(16);
          const BatchArgs a = be->upload(b);
          // o, gate/up, and the fused q/k/v + RoPE + cache write, as bytes
          auto products = [&](bool dp4a) {
            cuda::set_int_dp4a(dp4a);
            cuda::set_kw_force(kw);
            Buffer o = be->alloc(size_t(n_rows * D) * 4), g = be->alloc(size_t(n_rows * F) * 4),
                   u = be->alloc(size_t(n_rows * F) * 4), h = be->alloc(size_t(n_rows * 8200) * 4);
            be->matmul(w[0], dx.as<float>(), n_rows, o.as<float>());
            be->matmul(w[5], dx.as<float>(), n_rows, h.as<float>());
            be->matmul_gate_up(w[1], w[2], dx.as<float>(), n_rows, g.as<float>(), u.as<float>());
            auto kv = be->make_kv(1, 4, 16, kv_dim);
            const std::vector<uint8_t> zero(kv->layer_bytes(), 0);
            be->copy_to_device(kv->k.data(), zero.data(), zero.size());
            be->copy_to_device(kv->v.data(), zero.data(), zero.size());
            Buffer q = be->alloc(size_t(n_rows * D) * 4),
                   k = be->alloc(size_t(n_rows * kv_dim) * 4),
                   v = be->alloc(size_t(n_rows * kv_dim) * 4);
            cuda::MatmulJob jobs[3];
            float* outs[3] = {q.as<float>(), k.as<float>(), v.as<float>()};
            const int wi[3] = {0, 3, 4};
            for (int j = 0; j < 3; ++j)
              jobs[j] = {static_cast<const cuda::GpuWeight*>(w[size_t(wi[j])].aux), outs[j],
                         nullptr};
            const cuda::RopeKv r = rope_kv_of(a, dinv, *kv, hd);
            Buffer xb = be->alloc(cuda::matmul_scratch_bytes(int(n_rows), jobs[0].w->k_pad));
            be->sync();
            cudaStream_t st = nullptr;
            EXPECT_EQ(cudaStreamCreate(&st), cudaSuccess);
            const bool fused =
                cuda::matmul_qkv_rope_kv(jobs, dx.as<float>(), int(n_rows), r, xb.data(), st);
            EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
            cudaStreamDestroy(st);
            cuda::set_kw_force(0);
            EXPECT_TRUE(fused);
            std::vector<std::vector<uint8_t>> all;
            for (const Buffer* buf : {&o, &g, &q, &k, &v, &h})
              all.push_back(to_host<uint8_t>(*be, *buf, buf->bytes()));
            all.push_back(to_host<uint8_t>(*be, kv->k, kv->layer_bytes()));
            all.push_back(to_host<uint8_t>(*be, kv->v, kv->layer_bytes()));
            return all;
          };
          const auto by_dp4a = products(true), by_mma = products(false);
          const char* names[] = {"o", "gate/up", "q", "k", "v", "head", "k cache", "v cache"};
          for (size_t i = 0; i < by_mma.size(); ++i) EXPECT_EQ(by_dp4a[i], by_mma[i]) << names[i];
          // and right: o against the CPU
          if (kw == 0) {
            cuda::set_int_dp4a(true);
            Buffer o = be->alloc(size_t(n_rows * D) * 4);
            be->matmul(w[0], dx.as<float>(), n_rows, o.as<float>());
            const ProductError e = product_error(Weight{t, D, D, bytes[0].data()}, x, n_rows,
                                                 to_host<float>(*be, o, size_t(n_rows * D)));
            EXPECT_LE(e.worst, 1e-4) << "row " << e.row << " col " << e.col;
          }
        }
      for (auto& wi : w) be->release_matrix(wi);
    }
  cuda::set_int_dp4a(dp4a_was);
}

// A norm that also writes its output's integer form (NormInt): the same
// norm, and products taking that form equal products that quantize x
// again, bit for bit, for 8-bit weights (groups of 32 and 16) and 4-bit ones
// (with and without a min), at rows whose weights' k_pad differ (576: 576
// and 640), past the norm's registers (n > 2,048), one to 70 rows (the
// decode kernel; at 70 the tiled one too, forced). Below 64 rows the products get no scratch: they
// can only have read the norm's form.
TEST(CudaNormInt, ProductsEqualQuantizingAgain) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(41);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
  for (int n : {96, 576, 2112, 4352})
    for (int n_rows : {1, 7, 20, 70}) {
      SCOPED_TRACE("n " + std::to_string(n) + " rows " + std::to_string(n_rows));
      const size_t n_x = size_t(n_rows) * size_t(n);
      const auto x = randn(n_x, rng), r = randn(n_x, rng), nw = randn(size_t(n), rng);
      Buffer dr = to_device(*be, r.data(), n_x * 4), dnw = to_device(*be, nw.data(), size_t(n) * 4);
      Buffer x1 = to_device(*be, x.data(), n_x * 4), x2 = to_device(*be, x.data(), n_x * 4);
      Buffer y1 = be->alloc(n_x * 4), y2 = be->alloc(n_x * 4);
      Buffer buf = be->alloc(cuda::norm_int_bytes(n_rows, n));
      const cuda::NormInt ni{buf.data(), n_rows, n};
      be->sync();
      for (bool add : {false, true}) {
        if (add) {
          cuda::add_rmsnorm(x1.as<float>(), dr.as<float>(), dnw.as<float>(), n_rows, n, 1e-5f,
                            y1.as<float>(), st, &ni);
          cuda::add_rmsnorm(x2.as<float>(), dr.as<float>(), dnw.as<float>(), n_rows, n, 1e-5f,
                            y2.as<float>(), st);
        } else {
          cuda::rmsnorm(x1.as<float>(), dnw.as<float>(), n_rows, n, 1e-5f, y1.as<float>(), st, &ni);
          cuda::rmsnorm(x2.as<float>(), dnw.as<float>(), n_rows, n, 1e-5f, y2.as<float>(), st);
        }
        ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
        ASSERT_EQ(to_host<float>(*be, y1, n_x), to_host<float>(*be, y2, n_x)) << "add " << add;
        ASSERT_EQ(to_host<float>(*be, x1, n_x), to_host<float>(*be, x2, n_x)) << "add " << add;
        for (DType t : {DType::Q8_0, DType::Q6_K, DType::Q4_0, DType::Q4_1}) {
          if (n % traits(t).block_size) continue;
          const int64_t n_out = 37;
          auto wb = random_weight(t, n_out, n, rng);
          const Weight w = be->prepare_matrix(Weight{t, n_out, n, wb.data()});
          const auto& g = *static_cast<const cuda::GpuWeight*>(w.aux);
          Buffer o1 = be->alloc(size_t(n_rows * n_out) * 4),
                 o2 = be->alloc(size_t(n_rows * n_out) * 4);
          Buffer xb = be->alloc(cuda::matmul_scratch_bytes(n_rows, g.k_pad));
          be->sync();
          const cuda::MatmulJob j1{&g, o1.as<float>(), nullptr}, j2{&g, o2.as<float>(), nullptr};
          EXPECT_EQ(quantize_launches([&] {
                      cuda::matmul(&j1, 1, y1.as<float>(), n_rows,
                                   n_rows < 64 ? nullptr : xb.data(), st, &ni);
                    }),
                    0u)
              << dtype_name(t);
          cuda::matmul(&j2, 1, y2.as<float>(), n_rows, xb.data(), st);
          ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
          EXPECT_EQ(to_host<float>(*be, o1, size_t(n_rows * n_out)),
                    to_host<float>(*be, o2, size_t(n_rows * n_out)))
              << dtype_name(t) << " add " << add;
          if (n_rows >= 64) {  // the tiled kernel reading the norm's form
            cuda::set_matmul_path(cuda::MatmulPath::Tiled);
            cuda::matmul(&j1, 1, y1.as<float>(), n_rows, xb.data(), st, &ni);
            cuda::set_matmul_path(cuda::MatmulPath::Auto);
            ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
            EXPECT_EQ(to_host<float>(*be, o1, size_t(n_rows * n_out)),
                      to_host<float>(*be, o2, size_t(n_rows * n_out)))
                << dtype_name(t) << " add " << add << ", tiled";
          }
          be->release_matrix(w);
        }
      }
    }
  cudaStreamDestroy(st);
}

// Through the backend: products right after a norm of their x take its
// integer form (no quantization launched), as do the next products of the
// same x; after anything else ran on the stream, or of another x, they
// quantize again (a stale form would change the last product's bits). Every
// result equals the norm form switched off.
TEST(CudaNormInt, BackendTakesTheFormOnlyRightAfterTheNorm) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(43);
  const int64_t n = 576, n_out = 96;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<Weight> w;
  for (DType t : {DType::Q8_0, DType::Q4_1}) {
    bytes.push_back(random_weight(t, n_out, n, rng));
    w.push_back(be->prepare_matrix(Weight{t, n_out, n, bytes.back().data()}));
  }
  for (int64_t n_rows : {1, 3, 70}) {
    SCOPED_TRACE("rows " + std::to_string(n_rows));
    const size_t n_x = size_t(n_rows * n);
    const auto x = randn(n_x, rng), nw = randn(size_t(n), rng);
    Buffer dx = to_device(*be, x.data(), n_x * 4), dnw = to_device(*be, nw.data(), size_t(n) * 4);
    Buffer y = be->alloc(n_x * 4), other = be->alloc(n_x * 4);
    auto products = [&](bool norm_int) {
      NormInts scope(norm_int);
      std::vector<std::vector<float>> out;
      std::vector<uint64_t> launched;
      auto product = [&](const Weight& wi, const float* in) {
        Buffer o = be->alloc(size_t(n_rows * n_out) * 4);
        launched.push_back(quantize_launches([&] { be->matmul(wi, in, n_rows, o.as<float>()); }));
        out.push_back(to_host<float>(*be, o, size_t(n_rows * n_out)));
      };
      be->copy_to_device(dx.data(), x.data(), n_x * 4);  // (add_rmsnorm below changes it)
      be->rmsnorm(dx.as<float>(), dnw.as<float>(), n_rows, n, 1e-5f, y.as<float>());
      product(w[0], y.as<float>());  // right after the norm
      product(w[1], y.as<float>());  // after a product of the same x
      be->copy_to_device(other.data(), x.data(), n_x * 4);
      product(w[0], other.as<float>());  // another x
      product(w[0], y.as<float>());      // y, but not right after its norm
      be->add_rmsnorm(dx.as<float>(), other.as<float>(), dnw.as<float>(), n_rows, n, 1e-5f,
                      y.as<float>());
      be->scale(y.as<float>(), 2.f, int64_t(n_x));
      product(w[1], y.as<float>());  // y rewritten since its norm: the form is stale
      return std::make_pair(out, launched);
    };
    const auto [fused, launched] = products(true);
    const auto [plain, plain_launched] = products(false);
    EXPECT_EQ(launched, (std::vector<uint64_t>{0, 0, 1, 1, 1}));
    EXPECT_EQ(plain_launched, (std::vector<uint64_t>{1, 1, 1, 1, 1}));
    ASSERT_EQ(fused.size(), plain.size());
    for (size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(fused[i], plain[i]) << "product " << i;
  }
  for (auto& wi : w) be->release_matrix(wi);
}

// gate/up in a decode step (integer products, up to 16 rows) writes its
// output's integer form too, each 32 columns by the last of their CTAs:
// byte for byte what quantize_act makes of that output, in both stored
// orders, at widths with a partial last block and zero blocks past it (200,
// 1,000: k_pad 256 and 1,024 in both orders; 320: 320 for 8-bit weights,
// 384 for 4-bit ones), launched twice (the counters are left at zero for the
// next); the output itself unchanged.
TEST(CudaGatedInt, OutputFormEqualsQuantizingAgain) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(47);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
  const int64_t n_in = 256;
  for (DType t : {DType::Q8_0, DType::Q6_K, DType::Q4_K})
    for (int n_ff : {200, 320, 1000, 4864})
      for (int M : {1, 5, 16}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " n_ff " + std::to_string(n_ff) + " rows " +
                     std::to_string(M));
        auto gb = random_weight(t, n_ff, n_in, rng), ub = random_weight(t, n_ff, n_in, rng);
        const Weight wg = be->prepare_matrix(Weight{t, n_ff, n_in, gb.data()});
        const Weight wu = be->prepare_matrix(Weight{t, n_ff, n_in, ub.data()});
        const auto &g = *static_cast<const cuda::GpuWeight*>(wg.aux),
                   &u = *static_cast<const cuda::GpuWeight*>(wu.aux);
        const auto x = randn(size_t(M * n_in), rng);
        Buffer dx = to_device(*be, x.data(), x.size() * 4);
        const size_t n_y = size_t(M) * size_t(n_ff);
        Buffer y1 = be->alloc(n_y * 4), y2 = be->alloc(n_y * 4);
        Buffer xb = be->alloc(cuda::matmul_scratch_bytes(M, g.k_pad));
        Buffer form = be->alloc(cuda::norm_int_bytes(M, n_ff));
        const size_t n_counters = size_t(cuda::gated_int_counters(n_ff));
        Buffer counters = be->alloc(n_counters * sizeof(int));
        ASSERT_EQ(cudaMemset(counters.data(), 0, n_counters * sizeof(int)), cudaSuccess);
        const cuda::NormInt out{form.data(), M, n_ff, true, true};
        for (int launch = 0; launch < 2; ++launch) {
          ASSERT_EQ(cudaMemsetAsync(form.data(), 0xab, form.bytes(), st), cudaSuccess);
          EXPECT_TRUE(cuda::matmul_gate_up(g, u, dx.as<float>(), M, y1.as<float>(), xb.data(), st,
                                           nullptr, &out, counters.as<int>()));
          EXPECT_FALSE(
              cuda::matmul_gate_up(g, u, dx.as<float>(), M, y2.as<float>(), xb.data(), st));
          ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
          ASSERT_EQ(to_host<float>(*be, y1, n_y), to_host<float>(*be, y2, n_y));
          expect_forms_quantize(*be, y2.as<float>(), out, st, "launch " + std::to_string(launch));
        }
        EXPECT_EQ(to_host<int>(*be, counters, n_counters), std::vector<int>(n_counters, 0));
        be->release_matrix(wg);
        be->release_matrix(wu);
      }
  cudaStreamDestroy(st);
}

// Through the backend: the down products right after gate/up in a decode
// step (up to 16 rows) take its output's form (no quantization launched),
// as does the next product of the same x, and so does down with the
// residual add and the next norm (a model's layer: matmul_add_rmsnorm);
// past 16 rows, or once the output changed, they quantize. Every result
// equals the forms switched off.
TEST(CudaGatedInt, BackendDownTakesGateUpsForm) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(53);
  const int64_t n = 576, n_ff = 320;  // (320: k_pad 320 and 384 in the two orders)
  std::vector<std::vector<uint8_t>> bytes;
  auto weight = [&](DType t, int64_t n_out, int64_t n_in) {
    bytes.push_back(random_weight(t, n_out, n_in, rng));
    return be->prepare_matrix(Weight{t, n_out, n_in, bytes.back().data()});
  };
  const Weight gate = weight(DType::Q8_0, n_ff, n), up = weight(DType::Q8_0, n_ff, n);
  const Weight down8 = weight(DType::Q8_0, n, n_ff), down4 = weight(DType::Q4_0, n, n_ff);
  for (int64_t n_rows : {1, 3, 16, 20}) {
    SCOPED_TRACE("rows " + std::to_string(n_rows));
    const size_t n_x = size_t(n_rows * n), n_g = size_t(n_rows * n_ff);
    const auto x = randn(n_x, rng), nw = randn(size_t(n), rng);
    Buffer dx = to_device(*be, x.data(), n_x * 4), dnw = to_device(*be, nw.data(), size_t(n) * 4);
    Buffer y = be->alloc(n_x * 4), g = be->alloc(n_g * 4), u = be->alloc(n_g * 4);
    Buffer resid = be->alloc(n_x * 4), proj = be->alloc(n_x * 4), y2 = be->alloc(n_x * 4);
    auto products = [&](bool forms) {
      NormInts scope(forms);
      std::vector<std::vector<float>> out;
      std::vector<uint64_t> launched;
      auto product = [&](const Weight& wi, const float* in) {
        Buffer o = be->alloc(size_t(n_rows * n) * 4);
        launched.push_back(quantize_launches([&] { be->matmul(wi, in, n_rows, o.as<float>()); }));
        out.push_back(to_host<float>(*be, o, size_t(n_rows * n)));
      };
      auto gate_up = [&](const float* in) {
        launched.push_back(quantize_launches(
            [&] { be->matmul_gate_up(gate, up, in, n_rows, g.as<float>(), u.as<float>()); }));
        out.push_back(to_host<float>(*be, g, n_g));
      };
      be->copy_to_device(resid.data(), x.data(), n_x * 4);
      be->rmsnorm(dx.as<float>(), dnw.as<float>(), n_rows, n, 1e-5f, y.as<float>());
      gate_up(y.as<float>());
      {  // down, the residual add and the next norm (into y2)
        launched.push_back(quantize_launches([&] {
          be->matmul_add_rmsnorm(down8, g.as<float>(), n_rows, proj.as<float>(), resid.as<float>(),
                                 dnw.as<float>(), 1e-5f, y2.as<float>());
        }));
        for (const Buffer* b : {&proj, &resid, &y2}) out.push_back(to_host<float>(*be, *b, n_x));
      }
      gate_up(y2.as<float>());        // right after that norm
      product(down8, g.as<float>());  // right after gate/up
      product(down4, g.as<float>());  // after a product of the same x (the other order)
      be->scale(g.as<float>(), 2.f, int64_t(n_g));
      product(down8, g.as<float>());  // g rewritten: the form is stale
      return std::make_pair(out, launched);
    };
    const auto [fused, launched] = products(true);
    const auto [plain, plain_launched] = products(false);
    // gate/up, down + norm, gate/up, down, down (4-bit), down after a change
    if (n_rows <= 16)
      EXPECT_EQ(launched, (std::vector<uint64_t>{0, 0, 0, 0, 0, 1}));
    else
      EXPECT_EQ(launched, (std::vector<uint64_t>{0, 1, 0, 1, 1, 1}));
    EXPECT_EQ(plain_launched, (std::vector<uint64_t>(6, 1)));
    ASSERT_EQ(fused.size(), plain.size());
    for (size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(fused[i], plain[i]) << "output " << i;
  }
  for (const Weight* wi : {&gate, &up, &down8, &down4}) be->release_matrix(*wi);
}

// Through the backend: o right after a decode step's attention takes the
// attention output's integer form (the decode kernel's, and the combine's for
// a token whose keys span partitions), as does the next product of it; a
// prefill batch, or an output changed since, quantizes. Shapes: 9 heads of 64
// (576: k_pad 640 for 4-bit weights, zero blocks past the heads) and 8 of 128.
// Every result equals the forms switched off; and cuda::attention's form,
// into a buffer filled with NaN bytes first, is byte for byte quantize_act's
// of its output. (The decode batch takes the decode kernel on a GPU of 36 SMs
// or more and of an H100's shared memory, unless WICK_CUDA_ATTN_DECODE=0;
// elsewhere, an A100 or one played by WICK_CUDA_SMEM_LIMIT, the tiled
// kernel, which writes no form: o quantizes, with the same bits.)
TEST(CudaAttnInt, OProductTakesTheAttentionsForm) {
  WICK_REQUIRE_GPU();
  IntProducts on(true);
  auto be = cuda_backend();
  std::mt19937 rng(59);
  int dev = 0, n_sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev);
  for (auto [n_head, hd] : std::vector<std::pair<int64_t, int64_t>>{{9, 64}, {8, 128}}) {
    SCOPED_TRACE("heads " + std::to_string(n_head) + " x " + std::to_string(hd));
    const int64_t n_head_kv = n_head / (n_head == 9 ? 3 : 4), kv_dim = n_head_kv * hd;
    const int64_t n = n_head * hd, n_out = 96, bs = 16, n_blocks = 120;
    std::vector<std::vector<uint8_t>> bytes;
    auto weight = [&](DType t) {
      bytes.push_back(random_weight(t, n_out, n, rng));
      return be->prepare_matrix(Weight{t, n_out, n, bytes.back().data()});
    };
    const Weight o8 = weight(DType::Q8_0), o4 = weight(DType::Q4_0);
    auto kv = be->make_kv(1, n_blocks, bs, kv_dim);
    const size_t n_el = size_t(n_blocks * bs * kv_dim);
    std::vector<uint16_t> k16(n_el), v16(n_el);
    for (size_t i = 0; i < n_el; ++i) {
      k16[i] = f32_to_f16(float(rng() % 2001) * 1e-3f - 1.f);
      v16[i] = f32_to_f16(float(rng() % 2001) * 1e-3f - 1.f);
    }
    ASSERT_EQ(kv->dtype, DType::F16);
    be->copy_to_device(kv->k.data(), k16.data(), n_el * 2);
    be->copy_to_device(kv->v.data(), v16.data(), n_el * 2);
    // sequence 0: 1,200 keys (3 partitions: the combine), 1: 70 keys (one)
    std::vector<std::vector<int32_t>> tables(2);
    for (int32_t i = 0; i < 75; ++i) tables[0].push_back(i);
    for (int32_t i = 75; i < 80; ++i) tables[1].push_back(i);
    const AttnShape shape{n_head, n_head_kv, hd, 0};
    for (bool prefill : {false, true}) {
      Batch b;
      b.block_tables = tables;
      if (prefill) {
        for (int32_t p = 0; p < 40; ++p) b.add(1, p, 1, false);
      } else {
        b.add(1, 1199, 0, false);
        b.add(1, 69, 1, false);
      }
      b.finish(int32_t(bs));
      const int64_t T = b.n_tokens();
      const BatchArgs a = be->upload(b);
      const auto q = randn(size_t(T * n), rng);
      Buffer dq = to_device(*be, q.data(), q.size() * 4), att = be->alloc(size_t(T * n) * 4);
      auto products = [&](bool forms) {
        NormInts scope(forms);
        std::vector<std::vector<float>> out;
        std::vector<uint64_t> launched;
        auto product = [&](const Weight& wi) {
          Buffer o = be->alloc(size_t(T * n_out) * 4);
          launched.push_back(
              quantize_launches([&] { be->matmul(wi, att.as<float>(), T, o.as<float>()); }));
          out.push_back(to_host<float>(*be, o, size_t(T * n_out)));
        };
        be->attention(dq.as<float>(), *kv, 0, a, shape, att.as<float>());
        out.push_back(to_host<float>(*be, att, size_t(T * n)));
        product(o8);  // right after attention
        product(o4);  // after a product of the same x (the other order)
        be->scale(att.as<float>(), 2.f, T * n);
        product(o8);  // the output changed: the form is stale
        return std::make_pair(out, launched);
      };
      const auto [fused, launched] = products(true);
      const auto [plain, plain_launched] = products(false);
      const bool formed = !prefill && n_sms >= 36 && cuda::attention_decode_kernel(int(hd));
      const std::vector<uint64_t> want =
          formed ? std::vector<uint64_t>{0, 0, 1} : std::vector<uint64_t>{1, 1, 1};
      EXPECT_EQ(launched, want) << (prefill ? "prefill" : "decode");
      EXPECT_EQ(plain_launched, (std::vector<uint64_t>{1, 1, 1}));
      ASSERT_EQ(fused.size(), plain.size());
      for (size_t i = 0; i < fused.size(); ++i)
        EXPECT_EQ(fused[i], plain[i]) << (prefill ? "prefill" : "decode") << ", output " << i;
      if (!formed) continue;
      // the form's bytes, every block of both orders, through cuda::attention
      Buffer partial =
          be->alloc(cuda::attention_partial_floats(a, int(n_head), int(hd)) * sizeof(float));
      Buffer form = be->alloc(cuda::norm_int_bytes(int(T), int(n)));
      Buffer att2 = be->alloc(size_t(T * n) * 4);
      be->sync();
      cudaStream_t st = nullptr;
      ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(form.data(), 0xff, form.bytes(), st), cudaSuccess);
      const cuda::NormInt ni{form.data(), int(T), int(n), true, true};
      cuda::KvLayer layer;  // (the f16 cache)
      layer.k = kv->k_layer<void>(0);
      layer.v = kv->v_layer<void>(0);
      cuda::AttnArgs args{dq.as<float>(), layer,          att2.as<float>(), partial.as<float>(),
                          int(n_head),    int(n_head_kv), int(hd),          0};
      args.out_form = cuda::int_out(ni);
      EXPECT_TRUE(cuda::attention(args, a, st));
      expect_forms_quantize(*be, att2.as<float>(), ni, st, "attention");
      EXPECT_EQ(to_host<float>(*be, att2, size_t(T * n)), fused[0]);
      cudaStreamDestroy(st);
    }
    be->release_matrix(o8);
    be->release_matrix(o4);
  }
}

}  // namespace
}  // namespace wick::test
