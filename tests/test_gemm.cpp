// The blocked CPU matrix multiply on packed weights (backend/cpu/packed.h), on
// every kernel set this CPU has x every weight type x every path the type takes
// (F32 always; I8 and I8X3 for the block types; BF16 for bf16 weights where the
// set has vdpbf16ps), with odd shapes (partial panels, panel groups and k chunks):
// - packing: every packed weight unpacks to exactly dequantize_row_ref's value;
// - batch invariance: each row of an N-row product is bit-identical to the same
//   row multiplied alone, and to any split of the panels (threads);
// - against a float64 dot product: F32 within 1e-5 of sum |w x|; I8 and BF16
//   within 1e-5 of the product of the activations as the path rounds them, and
//   within the rounding's own bound of the product of the f32 activations (I8X3:
//   activations within 2e-7 of their block's largest).
// Then the same through the CPU backend (prepare_matrix + matmul), decode equal
// to prefill, with the kernel set and paths picked at run time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/simd.h"
#include "kernel_cases.h"
#include "random_weight.h"

namespace wick::test {
namespace {

// The activations of x in the form of path `p`, as k makes them (buffers owned here).
struct Acts {
  std::vector<int8_t> q;
  std::vector<cpu::ActBlock> blk;
  std::vector<uint32_t> h;
  cpu::ActRows a;
};
void make_acts(const cpu::SimdKernels& k, const cpu::PackedMatrix& m, const float* x,
               int64_t n_rows, Acts& out) {
  cpu::ActRows& a = out.a;
  a = cpu::ActRows{};
  a.path = m.path;
  a.n_rows = n_rows;
  a.x = x;
  a.ldx = m.n_in;
  if (m.path == cpu::GemmPath::I8 || m.path == cpu::GemmPath::I8X3) {
    const int n_levels = m.path == cpu::GemmPath::I8X3 ? 3 : 1;
    a.ldq = n_levels * m.k_pad;
    a.ldb = n_levels * m.k_pad / 32;
    out.q.assign(size_t(n_rows * a.ldq), 0);
    out.blk.assign(size_t(n_rows * a.ldb), {});
    k.quantize_rows(x, m.n_in, n_rows, m.n_in, n_levels, out.q.data(), a.ldq, out.blk.data(),
                    a.ldb);
    a.q = out.q.data();
    a.blk = out.blk.data();
  } else if (m.path == cpu::GemmPath::BF16) {
    a.ldh = m.k_pad / 2;
    out.h.assign(size_t(n_rows * a.ldh), 0xdeadbeef);
    k.bf16_rows(x, m.n_in, n_rows, m.n_in, out.h.data(), a.ldh);
    a.h = out.h.data();
  }
}

// y [n_rows, n_out] by k over the panels cut at `cuts` (in panels, ascending, inside the matrix).
std::vector<float> gemm(const cpu::SimdKernels& k, const cpu::PackedMatrix& m, const float* x,
                        int64_t n_rows, std::vector<int64_t> cuts = {}) {
  Acts acts;
  make_acts(k, m, x, n_rows, acts);
  std::vector<float> y(size_t(n_rows * m.n_out), NAN);
  int64_t p0 = 0;
  cuts.push_back(m.n_panels);
  for (int64_t p1 : cuts) {
    k.gemm(m, acts.a, p0, p1, y.data());
    p0 = p1;
  }
  return y;
}

// The value path p multiplies in place of activation i of a row (f32 in, as the kernels round it).
double act_as_used(const Acts& acts, cpu::GemmPath p, int64_t r, int64_t i) {
  const cpu::ActRows& a = acts.a;
  switch (p) {
    case cpu::GemmPath::I8:
      return double(a.q[r * a.ldq + i]) * a.blk[r * a.ldb + i / 32].d;
    case cpu::GemmPath::I8X3: {
      double v = 0;
      for (int64_t l = 0; l < 3; ++l)
        v += double(a.q[r * a.ldq + l * a.ldq / 3 + i]) *
             a.blk[r * a.ldb + l * a.ldb / 3 + i / 32].d;
      return v;
    }
    case cpu::GemmPath::BF16: {
      uint16_t h;
      std::memcpy(&h, reinterpret_cast<const uint8_t*>(a.h + r * a.ldh) + 2 * i, 2);
      return bf16_to_f32(h);
    }
    default:
      return a.x[r * a.ldx + i];
  }
}

std::vector<int64_t> widths(DType t) {
  const int64_t bs = traits(t).block_size;
  if (bs == 1) return {1, 2, 13, 72, 129, 300, 513};  // odd; past the F32 and BF16 k chunks
  if (bs == 32) return {32, 96, 544, 1056};           // 17 and 33 blocks cross the I8 chunk of 512
  return {256, 768, 1280};
}

class Gemm : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(Gemm, PackedProductsAreExactBatchInvariantAndMatchFloat64) {
  const auto [isa, t] = GetParam();
  const cpu::SimdKernels* k = cpu::simd_for(isa);
  if (!k) GTEST_SKIP() << "this CPU has no " << isa << " (cpuid)";
  std::vector<cpu::GemmPath> paths{cpu::GemmPath::F32};
  if (cpu::code_bits(t)) {
    paths.push_back(cpu::GemmPath::I8);
    paths.push_back(cpu::GemmPath::I8X3);
  }
  if (t == DType::BF16 && k->bf16_dp) paths.push_back(cpu::GemmPath::BF16);
  std::mt19937 rng(11 + unsigned(t));
  std::normal_distribution<float> nd;
  const int64_t n_rows = 19;  // past every register tile's row count (AMX: 16), with a remainder
  for (const int64_t n_in : widths(t))
    for (const int64_t n_out : {1, 16, 37, 100}) {  // partial panels and panel groups
      auto wb = random_weight(t, n_out, n_in, rng);
      const Weight w{t, n_out, n_in, wb.data()};
      std::vector<float> x(size_t(n_rows * n_in));
      for (auto& v : x) v = nd(rng);
      x[3] = 0.f;  // a zero, and a block of zeros (scale 0)
      if (n_in >= 64)
        for (int64_t i = 32; i < 64; ++i) x[size_t(n_in + i)] = 0.f;

      cpu::PackedMatrix m;
      const cpu::AlignedBytes bytes = cpu::pack_matrix(w, m);
      std::vector<float> ref(static_cast<size_t>(n_in)), got(static_cast<size_t>(n_in));
      std::vector<std::vector<float>> rows(static_cast<size_t>(n_out));
      for (int64_t o = 0; o < n_out; ++o) {
        dequantize_row_ref(t, w.row(o), ref.data(), n_in);
        cpu::unpack_row(m, o, got.data());
        for (int64_t i = 0; i < n_in; ++i)
          ASSERT_EQ(bits(got[size_t(i)]), bits(ref[size_t(i)]))
              << dtype_name(t) << " n_in " << n_in << " row " << o << " element " << i;
        rows[size_t(o)] = ref;
      }

      for (const cpu::GemmPath p : paths) {
        m.path = p;
        const std::string where = std::string(isa) + " " + dtype_name(t) + " path " +
                                  std::to_string(int(p)) + " n_in " + std::to_string(n_in) +
                                  " n_out " + std::to_string(n_out);
        const auto y = gemm(*k, m, x.data(), n_rows);
        // batch invariance: alone, in pairs from an odd offset, under a split of the panels
        for (int64_t r = 0; r < n_rows; ++r) {
          const auto one = gemm(*k, m, x.data() + r * n_in, 1);
          for (int64_t o = 0; o < n_out; ++o)
            ASSERT_EQ(bits(one[size_t(o)]), bits(y[size_t(r * n_out + o)]))
                << where << " row " << r << " alone, output " << o;
        }
        const auto pair = gemm(*k, m, x.data() + 5 * n_in, 2);
        for (int64_t i = 0; i < 2 * n_out; ++i)
          ASSERT_EQ(bits(pair[size_t(i)]), bits(y[size_t(5 * n_out + i)])) << where << " pair";
        if (m.n_panels > 2) {
          const auto split = gemm(*k, m, x.data(), n_rows, {1, m.n_panels - 1});
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_EQ(bits(split[i]), bits(y[i])) << where << " split at " << i;
        }

        // against float64: the activations as used, then the f32 activations
        Acts acts;
        make_acts(*k, m, x.data(), n_rows, acts);
        for (int64_t r = 0; r < n_rows; ++r)
          for (int64_t o = 0; o < n_out; ++o) {
            const auto& wr = rows[size_t(o)];
            double used = 0, mag = 0, exact = 0, round = 0;
            for (int64_t i = 0; i < n_in; ++i) {
              const double xu = act_as_used(acts, p, r, i), xf = x[size_t(r * n_in + i)];
              used += wr[size_t(i)] * xu;
              exact += wr[size_t(i)] * xf;
              mag += std::fabs(wr[size_t(i)] * xu);
              round += std::fabs(wr[size_t(i)]) * std::fabs(xu - xf);
            }
            const double v = y[size_t(r * n_out + o)];
            ASSERT_LE(std::fabs(v - used), 1e-5 * mag + 1e-30) << where << " row " << r;
            // the rounding of each activation is within half its step: I8 d / 2, bf16 2^-9 |x|
            if (p == cpu::GemmPath::I8) {
              for (int64_t i = 0; i < n_in; ++i)
                ASSERT_LE(std::fabs(act_as_used(acts, p, r, i) - x[size_t(r * n_in + i)]),
                          0.5001 * acts.a.blk[r * acts.a.ldb + i / 32].d)
                    << where;
            }
            // three levels: within 2e-7 of the block's largest activation
            if (p == cpu::GemmPath::I8X3) {
              for (int64_t i = 0; i < n_in; ++i) {
                const double amax = 127.0 * acts.a.blk[r * acts.a.ldb + i / 32].d;
                ASSERT_LE(std::fabs(act_as_used(acts, p, r, i) - x[size_t(r * n_in + i)]),
                          2e-7 * amax)
                    << where;
              }
            }
            ASSERT_LE(std::fabs(v - exact), round + 1e-5 * mag + 1e-30) << where << " row " << r;
          }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(IsaByType, Gemm,
                         ::testing::Combine(::testing::ValuesIn(kGemmIsas),
                                            ::testing::ValuesIn(kAllTypes)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

// Through the backend: weights prepared (packed, path by type) and multiplied on every core;
// decode (one row) bit-identical to prefill (many rows), for every type.
class PreparedMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(PreparedMatmul, DecodeEqualsPrefill) {
  const DType t = GetParam();
  auto be = make_cpu_backend();
  std::mt19937 rng(5 + unsigned(t));
  std::normal_distribution<float> nd;
  const int64_t bs = traits(t).block_size;
  for (const int64_t n_in : {bs == 1 ? 896 : 256 * 4, bs == 1 ? 77 : 512}) {
    const int64_t n_out = 300, n_rows = 33;
    auto wb = random_weight(t, n_out, n_in, rng);
    const Weight w = be->prepare_matrix(Weight{t, n_out, n_in, wb.data()});
    ASSERT_NE(cpu::packed_of(w), nullptr) << dtype_name(t);
    std::vector<float> x(size_t(n_rows * n_in));
    for (auto& v : x) v = nd(rng);
    std::vector<float> y(size_t(n_rows * n_out)), one(static_cast<size_t>(n_out));
    be->matmul(w, x.data(), n_rows, y.data());
    for (int64_t r = 0; r < n_rows; ++r) {
      be->matmul(w, x.data() + r * n_in, 1, one.data());
      for (int64_t o = 0; o < n_out; ++o)
        ASSERT_EQ(bits(one[size_t(o)]), bits(y[size_t(r * n_out + o)]))
            << dtype_name(t) << " n_in " << n_in << " row " << r << " output " << o;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, PreparedMatmul, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Products that share their input (q, k, v; gate, up) in one pass: each output equal bit for bit
// to its own matmul, for one row and many, through the backend's qkv and gate/up entry points;
// weights of one type, of types with one activation form (Q4_K, Q6_K: a Q4_K_M file's attention),
// and of different forms (Q8_0's three levels beside Q4_K's one: each takes its own).
TEST(PreparedMatmul, SharedInputProductsEqualSeparateOnes) {
  auto be = make_cpu_backend();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int64_t n_in = 512;
  const std::vector<std::vector<DType>> sets = {{DType::Q4_K, DType::Q4_K, DType::Q4_K},
                                                {DType::Q4_K, DType::Q6_K, DType::Q6_K},
                                                {DType::Q8_0, DType::Q4_K, DType::Q4_1},
                                                {DType::F16, DType::F16, DType::F16}};
  const int64_t n_outs[3] = {300, 64, 64};  // q, k and v of a GQA layer, partial panels
  for (const auto& types : sets)
    for (const int64_t n_rows : {1, 5, 33}) {
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<Weight> w;
      for (int i = 0; i < 3; ++i) {
        bytes.push_back(random_weight(types[size_t(i)], n_outs[i], n_in, rng));
        w.push_back(
            be->prepare_matrix(Weight{types[size_t(i)], n_outs[i], n_in, bytes.back().data()}));
      }
      std::vector<float> x(size_t(n_rows * n_in));
      for (auto& v : x) v = nd(rng);
      std::vector<std::vector<float>> alone(3), shared(3);
      float* out[3];
      const Weight* ws[3] = {&w[0], &w[1], &w[2]};
      const float* no_bias[3] = {nullptr, nullptr, nullptr};
      for (int i = 0; i < 3; ++i) {
        alone[size_t(i)].resize(size_t(n_rows * n_outs[i]));
        shared[size_t(i)].assign(size_t(n_rows * n_outs[i]), NAN);
        be->matmul(w[size_t(i)], x.data(), n_rows, alone[size_t(i)].data());
        out[i] = shared[size_t(i)].data();
      }
      be->matmul_qkv(ws, no_bias, x.data(), n_rows, out);
      for (int i = 0; i < 3; ++i)
        for (size_t j = 0; j < alone[size_t(i)].size(); ++j)
          ASSERT_EQ(bits(alone[size_t(i)][j]), bits(shared[size_t(i)][j]))
              << dtype_name(types[size_t(i)]) << " product " << i << " rows " << n_rows << " at "
              << j;
      // gate/up: silu(gate) * up from the two shared products
      std::vector<float> g(size_t(n_rows * n_outs[1])), u(g.size());
      be->matmul_gate_up(w[1], w[2], x.data(), n_rows, g.data(), u.data());
      std::vector<float> want = alone[1];
      be->silu_mul(want.data(), alone[2].data(), int64_t(want.size()));
      for (size_t j = 0; j < want.size(); ++j)
        ASSERT_EQ(bits(want[j]), bits(g[j])) << "gate/up rows " << n_rows << " at " << j;
    }
}

// The experts of a layer in two parallel regions per group of routed rows equal each expert
// run alone (gate and up, silu, down) and summed in expert order, bit for bit: one token (a
// decode step), a few, and enough routed rows for several groups; gate, up and down of
// different forms (Q6_K downs; a Q8_0 up, which takes no shared region).
TEST(PreparedMatmul, GroupedExpertsEqualExpertsAlone) {
  auto be = make_cpu_backend();
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  const int64_t D = 256, F = 512, n_expert = 16, k = 8;
  for (const DType up_type : {DType::Q4_K, DType::Q8_0})
    for (const int64_t n_tokens : {1, 3, 70}) {
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<ExpertWeights> host(static_cast<size_t>(n_expert)), experts(host.size());
      auto weight = [&](DType t, int64_t n_out, int64_t n_in) {
        bytes.push_back(random_weight(t, n_out, n_in, rng));
        return Weight{t, n_out, n_in, bytes.back().data()};
      };
      bytes.reserve(size_t(3 * n_expert));
      for (auto& e : host)
        e = {weight(DType::Q4_K, F, D), weight(up_type, F, D), weight(DType::Q6_K, D, F)};
      be->prepare_experts(host, experts);
      std::vector<float> x(size_t(n_tokens * D)), logits(size_t(n_tokens * n_expert));
      for (auto& v : x) v = nd(rng);
      for (auto& v : logits) v = nd(rng);
      std::vector<int32_t> ids(size_t(n_tokens * k));
      std::vector<float> w(ids.size());
      be->moe_route(logits.data(), n_tokens, n_expert, k, true, ids.data(), w.data());
      std::vector<float> got(size_t(n_tokens * D), NAN), want(size_t(n_tokens * D), 0.f);
      be->moe_mlp(experts, x.data(), n_tokens, k, ids.data(), w.data(), got.data());
      std::vector<float> g(static_cast<size_t>(F)), u(g.size()), y(static_cast<size_t>(D));
      for (int64_t e = 0; e < n_expert; ++e)
        for (int64_t i = 0; i < n_tokens * k; ++i) {
          if (ids[size_t(i)] != e) continue;
          const float* xt = x.data() + (i / k) * D;
          be->matmul(experts[size_t(e)].gate, xt, 1, g.data());
          be->matmul(experts[size_t(e)].up, xt, 1, u.data());
          be->silu_mul(g.data(), u.data(), F);
          be->matmul(experts[size_t(e)].down, g.data(), 1, y.data());
          for (int64_t j = 0; j < D; ++j)
            want[size_t((i / k) * D + j)] += y[size_t(j)] * w[size_t(i)];
        }
      for (size_t j = 0; j < want.size(); ++j)
        ASSERT_EQ(bits(want[j]), bits(got[j]))
            << "up " << dtype_name(up_type) << ", " << n_tokens << " tokens, at " << j;
    }
}

// Routing picks the k largest probabilities, ties to the lower id, in descending order, with the
// weights renormalised over the k when asked: against a full stable sort, on logits with many
// ties (a few distinct values over 64 experts) and on distinct ones.
TEST(MoeRoute, TopKTiesToTheLowerId) {
  std::mt19937 rng(13);
  const int64_t n_expert = 64, n_tokens = 20;
  for (const bool ties : {true, false})
    for (const int64_t k : {1, 2, 8})
      for (const bool norm : {true, false}) {
        std::vector<float> logits(size_t(n_tokens * n_expert));
        std::uniform_int_distribution<int> few(0, 3);
        std::normal_distribution<float> nd;
        for (auto& v : logits) v = ties ? float(few(rng)) * 0.5f : nd(rng);
        std::vector<int32_t> ids(size_t(n_tokens * k));
        std::vector<float> w(ids.size());
        cpu::moe_route(logits.data(), n_tokens, n_expert, k, norm, ids.data(), w.data());
        for (int64_t t = 0; t < n_tokens; ++t) {
          const float* l = logits.data() + t * n_expert;
          const float mx = *std::max_element(l, l + n_expert);
          std::vector<float> p(static_cast<size_t>(n_expert));
          float sum = 0.f;
          for (int64_t e = 0; e < n_expert; ++e) sum += (p[size_t(e)] = std::exp(l[e] - mx));
          for (auto& v : p) v /= sum;
          std::vector<int32_t> order(p.size());
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
          float top = 0.f;
          for (int64_t j = 0; j < k; ++j) top += p[size_t(order[size_t(j)])];
          for (int64_t j = 0; j < k; ++j) {
            const int32_t e = order[size_t(j)];
            ASSERT_EQ(ids[size_t(t * k + j)], e) << "token " << t << " slot " << j;
            const float want = norm ? p[size_t(e)] / top : p[size_t(e)];
            ASSERT_EQ(bits(w[size_t(t * k + j)]), bits(want)) << "token " << t << " slot " << j;
          }
        }
      }
}

}  // namespace
}  // namespace wick::test
