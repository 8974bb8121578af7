// CPU kernels on random inputs.
// - Every kernel set this CPU has (generic, avx2, avx512, avx512bf16) x every weight type x sizes
// with odd
//   block counts and odd lengths, through the SimdKernels tables: dequant_row bit-identical to
//   dequantize_row_ref, dot_row (the fused decode path) bit-identical to dequant_row + dot (the
//   prefill path), so outputs never depend on how many rows a batch has, and the product close
//   to a float64 reference.
// - The matmul against a float64 reference, decode equal to prefill, with the kernel set picked
//   at run time.
// - Plain float64 references, written here without the kernels' code, for the kernels a backend
//   port must reproduce: paged causal attention (GQA, sliding window, block tables over a
//   random permutation of blocks, several sequences interleaved in one batch), NeoX RoPE and
//   RMSNorm; the CPU kernels checked against them, and the SIMD primitives attention is built
//   on (dot, axpy) checked against them on every kernel set this CPU has.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend/batch.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "io/quantize.h"
#include "kernel_cases.h"
#include "random_weight.h"

namespace wick::test {
namespace {

// The kernel set, or nullptr after GTEST_SKIP when this CPU lacks the ISA.
#define KERNELS_OR_SKIP(k, isa)                                    \
  const cpu::SimdKernels* k = cpu::simd_for(isa);                  \
  if (!k) GTEST_SKIP() << "this CPU has no " << isa << " (cpuid)"; \
  ASSERT_STREQ(k->isa, isa)

class KernelSet : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(KernelSet, DequantAndFusedDotAreExact) {
  const auto [isa, t] = GetParam();
  KERNELS_OR_SKIP(k, isa);
  const int64_t bs = traits(t).block_size;
  // element counts: for float types odd ones around the vector widths (8, 16) and the unrolled
  // steps (32, 64); for block types 1, 2, 3, 5, 7, 28 (Qwen2.5-0.5B's 896) and 152 blocks
  std::vector<int64_t> sizes;
  if (bs == 1)
    sizes = {1, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 129, 896, 1000, 4864};
  else
    for (int64_t nb : {1, 2, 3, 5, 7, 28, 152}) sizes.push_back(nb * bs);
  std::mt19937 rng(1234 + unsigned(t));
  std::normal_distribution<float> nd;
  for (const int64_t n : sizes) {
    const int64_t n_rows = 5;  // rows after the first start at unaligned byte offsets
    auto wb = random_weight(t, n_rows, n, rng);
    const size_t rb = row_bytes(t, n);
    std::vector<float> x(static_cast<size_t>(n) + 1);
    for (auto& v : x) v = nd(rng);
    const float* xr = x.data() + 1;  // not 64-byte aligned
    const size_t un = static_cast<size_t>(n);
    std::vector<float> ref(un), deq(un), buf(un);
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* w = wb.data() + size_t(r) * rb;
      const std::string where = std::string(isa) + " " + dtype_name(t) + " n=" + std::to_string(n) +
                                " row " + std::to_string(r);
      dequantize_row_ref(t, w, ref.data(), n);
      std::fill(deq.begin(), deq.end(), NAN);
      k->dequant_row(t, w, deq.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits(deq[size_t(i)]), bits(ref[size_t(i)])) << where << " element " << i;

      const float unfused = k->dot(xr, deq.data(), n);
      std::fill(buf.begin(), buf.end(), NAN);  // a fused kernel must not read it
      const float fused = k->dot_row(t, w, xr, n, buf.data());
      ASSERT_EQ(bits(fused), bits(unfused)) << where << ": " << fused << " vs " << unfused;

      double exact = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += double(ref[size_t(i)]) * xr[i];
        mag += std::fabs(double(ref[size_t(i)]) * xr[i]);
      }
      ASSERT_LE(std::fabs(double(fused) - exact), 1e-5 * mag + 1e-30) << where;
    }
  }
}

// Every finite f16 and bf16 value, subnormals included, and the infinities, through each
// kernel set's dequant_row (vector body and scalar tail) and fused dot.
class HalfKernels : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(HalfKernels, EveryBitPattern) {
  const auto [isa, t] = GetParam();
  KERNELS_OR_SKIP(k, isa);
  std::vector<uint16_t> all;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t exp_mask = t == DType::F16 ? 0x7c00 : 0x7f80;
    const uint32_t man_mask = t == DType::F16 ? 0x03ff : 0x007f;
    if ((h & exp_mask) == exp_mask && (h & man_mask)) continue;  // NaN
    all.push_back(uint16_t(h));
  }
  const int64_t n = int64_t(all.size()) - 5;  // an odd tail
  std::vector<float> ref(all.size()), got(all.size());
  dequantize_row_ref(t, all.data(), ref.data(), n);
  k->dequant_row(t, all.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(bits(got[size_t(i)]), bits(ref[size_t(i)]))
        << isa << " 0x" << std::hex << all[size_t(i)];
  // each value alone in a row of 88 at positions in the unrolled loop, the 16- (avx512) or 8-wide
  // (avx2) remainder loop and the scalar tail: dot_row must agree with dot over the reference
  // weights
  constexpr int64_t kRow = 88;
  std::vector<uint16_t> w(kRow);
  std::vector<float> x(kRow), wf(kRow), buf(kRow);
  for (const uint16_t h : all)
    for (const int64_t pos : {5, 50, 70, 85}) {
      w.assign(kRow, 0);
      w[size_t(pos)] = h;
      x.assign(kRow, 0.f);
      x[size_t(pos)] = 1.5f;
      dequantize_row_ref(t, w.data(), wf.data(), kRow);
      ASSERT_EQ(bits(k->dot_row(t, w.data(), x.data(), kRow, buf.data())),
                bits(k->dot(x.data(), wf.data(), kRow)))
          << isa << " 0x" << std::hex << h << " at " << std::dec << pos;
    }
}

INSTANTIATE_TEST_SUITE_P(IsaByType, KernelSet,
                         ::testing::Combine(::testing::ValuesIn(kIsas),
                                            ::testing::ValuesIn(kAllTypes)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(IsaByType, HalfKernels,
                         ::testing::Combine(::testing::ValuesIn(kIsas),
                                            ::testing::Values(DType::F16, DType::BF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

class MatmulTypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTypes, DecodeEqualsPrefillAndMatchesReference) {
  const DType t = GetParam();
  std::mt19937 rng(7 + unsigned(t));
  const int64_t bs = traits(t).block_size;
  for (int64_t n_in : {bs == 1 ? 72 : 256, bs == 1 ? 13 : 512, 768}) {  // odd sizes for float types
    const int64_t n_out = 37, n_rows = 6;
    auto wb = random_weight(t, n_out, n_in, rng);
    Weight w{t, n_out, n_in, wb.data()};
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t(n_rows * n_in));
    for (auto& v : x) v = nd(rng);
    std::vector<float> y_batch(static_cast<size_t>(n_rows * n_out)),
        y_one(static_cast<size_t>(n_out));
    cpu::matmul(w, x.data(), n_rows, y_batch.data());  // dequantize-then-dot path
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < n_rows; ++r) {
      cpu::matmul(w, x.data() + r * n_in, 1, y_one.data());  // fused path
      for (int64_t o = 0; o < n_out; ++o) {
        ASSERT_EQ(y_one[size_t(o)], y_batch[size_t(r * n_out + o)])
            << dtype_name(t) << " n_in " << n_in;
        dequantize_row_ref(t, w.row(o), row.data(), n_in);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n_in; ++i) {
          ref += double(row[size_t(i)]) * x[size_t(r * n_in + i)];
          mag += std::fabs(double(row[size_t(i)]) * x[size_t(r * n_in + i)]);
        }
        ASSERT_LE(std::fabs(y_one[size_t(o)] - ref), 1e-5 * mag + 1e-30) << dtype_name(t);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTypes,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                           DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---------------------------------------------------------------------------------------------
// Plain float64 references (the oracle for every backend's kernels).

// Causal attention through block tables. q [T, n_head, hd]; the K and V caches are
// [n_slots, n_head_kv * hd]; position j of sequence s lives in slot
// tables[s][j / bs] * bs + j % bs. Head h reads KV head h / (n_head / n_head_kv). Token t at
// position p of sequence s attends to positions [lo, p] of s, lo = max(0, p - window + 1) with a
// window, else 0: softmax(q . k / sqrt(hd)) over them, the weights times v.
// Returns out [T, n_head * hd].
std::vector<double> ref_attention(const std::vector<float>& q, const std::vector<float>& kc,
                                  const std::vector<float>& vc, const std::vector<int32_t>& pos,
                                  const std::vector<int32_t>& seq,
                                  const std::vector<std::vector<int32_t>>& tables, int64_t bs,
                                  int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t window) {
  const int64_t T = int64_t(pos.size()), kv_dim = n_head_kv * hd;
  std::vector<double> out(size_t(T * n_head * hd), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = pos[size_t(t)];
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    const auto& table = tables[size_t(seq[size_t(t)])];
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t kvh = h / (n_head / n_head_kv);
      const float* qh = q.data() + (t * n_head + h) * hd;
      // position j's key and value rows of head kvh (plain pointers: the test runs under ASan)
      const auto row = [&](const std::vector<float>& c, int64_t j) {
        const int64_t slot = int64_t(table[size_t(j / bs)]) * bs + j % bs;
        return c.data() + slot * kv_dim + kvh * hd;
      };
      std::vector<double> w;
      for (int64_t j = lo; j <= p; ++j) {
        const float* k = row(kc, j);
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += double(qh[i]) * k[i];
        w.push_back(dot / std::sqrt(double(hd)));
      }
      const double mx = *std::max_element(w.begin(), w.end());
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(x - mx));
      double* o = out.data() + (t * n_head + h) * hd;
      for (int64_t j = lo; j <= p; ++j) {
        const float* v = row(vc, j);
        const double wj = w[size_t(j - lo)] / sum;
        for (int64_t i = 0; i < hd; ++i) o[i] += wj * v[i];
      }
    }
  }
  return out;
}

// NeoX RoPE on x [n_rows, n_heads, hd]: for i < hd/2 the pair (x[i], x[i + hd/2]) is rotated by
// angle pos[r] * inv_freq[i].
std::vector<double> ref_rope(const std::vector<float>& x, const std::vector<int32_t>& pos,
                             int64_t n_heads, int64_t hd, const std::vector<float>& inv_freq) {
  std::vector<double> y(x.begin(), x.end());
  const int64_t half = hd / 2;
  for (size_t r = 0; r < pos.size(); ++r)
    for (int64_t h = 0; h < n_heads; ++h) {
      double* v = y.data() + (int64_t(r) * n_heads + h) * hd;
      for (int64_t i = 0; i < half; ++i) {
        const double a = double(pos[r]) * double(inv_freq[size_t(i)]);
        const double x0 = v[i], x1 = v[i + half];
        v[i] = x0 * std::cos(a) - x1 * std::sin(a);
        v[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
  return y;
}

// RMSNorm of rows of n: y = w * x / sqrt(mean(x^2) + eps).
std::vector<double> ref_rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int64_t n,
                                double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / size_t(n); ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i)
      ss += double(x[r * size_t(n) + size_t(i)]) * x[r * size_t(n) + size_t(i)];
    const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      y[r * size_t(n) + size_t(i)] = double(w[size_t(i)]) * x[r * size_t(n) + size_t(i)] * inv;
  }
  return y;
}

// ---------------------------------------------------------------------------------------------
// The SIMD primitives of attention, on every kernel set this CPU has.

class SimdPrimitives : public ::testing::TestWithParam<const char*> {};

// dot: |got - exact| <= 1e-5 * sum |a_i b_i| (float accumulation over n <= 4864 terms; the same
// bound as the dot products of the matmul tests). axpy: each y[i] + a * x[i] within
// FLT_EPSILON * (|y[i]| + |a * x[i]|) of the exact value (one or two roundings, with or without
// FMA), and nothing written past n.
TEST_P(SimdPrimitives, DotAndAxpyMatchFloat64) {
  const char* isa = GetParam();
  KERNELS_OR_SKIP(k, isa);
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  for (const int64_t n : {1,  3,  7,   8,   15,  16,  17,  31,  32,  33,  63,   64,
                          65, 96, 100, 127, 128, 129, 255, 256, 257, 896, 1000, 4864}) {
    const size_t un = size_t(n);
    // one float past a 64-byte boundary: unaligned rows, as slots of a KV cache can be
    std::vector<float> a(un + 1), b(un + 1), y(un + 2);
    for (auto& v : a) v = nd(rng);
    for (auto& v : b) v = nd(rng) * 3.f;
    const float* ap = a.data() + 1;
    const float* bp = b.data() + 1;
    double exact = 0, mag = 0;
    for (size_t i = 0; i < un; ++i) {
      exact += double(ap[i]) * bp[i];
      mag += std::fabs(double(ap[i]) * bp[i]);
    }
    const float d = k->dot(ap, bp, n);
    ASSERT_LE(std::fabs(double(d) - exact), 1e-5 * mag) << isa << " dot n=" << n;
    ASSERT_NE(d, 0.f) << isa << " dot n=" << n;  // not an empty loop

    for (const float alpha : {0.37f, -1.75f}) {
      for (auto& v : y) v = nd(rng);
      y[un + 1] = 12345.f;  // sentinel after the row
      std::vector<float> y0(y);
      k->axpy(alpha, bp, y.data() + 1, n);
      for (size_t i = 0; i < un; ++i) {
        const double want = double(y0[i + 1]) + double(alpha) * bp[i];
        const double tol =
            FLT_EPSILON * (std::fabs(double(y0[i + 1])) + std::fabs(double(alpha) * bp[i]));
        ASSERT_LE(std::fabs(double(y[i + 1]) - want), tol)
            << isa << " axpy n=" << n << " element " << i << ": " << y[i + 1] << " vs " << want;
      }
      ASSERT_EQ(y[0], y0[0]) << isa << " axpy wrote before the row";
      ASSERT_EQ(y[un + 1], 12345.f) << isa << " axpy wrote past the row";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, SimdPrimitives, ::testing::ValuesIn(kIsas),
                         [](const auto& info) { return std::string(info.param); });

// ---------------------------------------------------------------------------------------------
// cpu::attention against ref_attention, with the kernel set picked at run time (cpu::simd()).

struct AttnCase {
  int64_t head_dim, gqa;  // gqa = n_head / n_head_kv
};

class PagedAttention : public ::testing::TestWithParam<AttnCase> {};

// A batch of six sequences whose tokens are interleaved: a prefill chunk continuing past
// position 512, a decode step at position 529, a fresh 37-token prefill, a short chunk right
// after position 512, and two whose keys span partitions of 1,024 (a chunk across 2,048, a
// decode step at 1,029). All K/V of each sequence's context are in the cache (as if written by
// earlier steps and kv_write); slots no sequence owns, and slots of a sequence's last block past
// its length, hold NaN, so a read outside [lo, pos] of the token's own sequence shows.
// Block tables cover a random permutation of the blocks, with unused blocks in between; block
// sizes 16, 1 and one block holding a whole sequence; no window, and windows of 37, 300 and
// 1,100 (across a partition).
// Tolerance: |got - ref| <= 5e-6 * max |v| per element. The float kernel's error is that of
// float dot products of hd terms, float exp and a float sum and axpy over <= 600 positions:
// at most 6e-7 * max |v| measured with each kernel set (generic, avx2, avx512 through
// WICK_ISA); a wrong slot, mask or head shows as errors of order 0.1.
// A bf16 cache on AMX tiles also rounds q and the softmax weights to bf16 (2^-8 each):
constexpr double kBf16ProductsTol = 1e-2;  // measured: 1.9e-3 to 3.5e-3
TEST_P(PagedAttention, MatchesFloat64Reference) {
  const auto [hd, gqa] = GetParam();
  const int64_t n_head_kv = 2, n_head = n_head_kv * gqa, kv_dim = n_head_kv * hd;
  struct Seq {
    int32_t len, n_new;  // context length; the last n_new positions are in the batch
  };
  const std::vector<Seq> seqs{{600, 6}, {530, 1}, {37, 37}, {516, 3}, {2200, 5}, {1030, 1}};
  std::mt19937 rng(unsigned(hd * 100 + gqa));
  std::normal_distribution<float> nd;
  double worst = 0, worst_bf16 = 0;
  int checked = 0;
  for (const int32_t bs : {16, 1, 2200}) {  // 2200: one block holds a whole sequence
    for (const int64_t window : {0, 37, 300, 1100}) {
      // block tables over a random permutation of the blocks, 3 blocks left unused
      int32_t n_blocks = 3;
      for (auto& s : seqs) n_blocks += (s.len + bs - 1) / bs;
      std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<std::vector<int32_t>> tables(seqs.size());
      size_t next = 0;
      for (size_t s = 0; s < seqs.size(); ++s)
        for (int32_t b = 0; b < (seqs[s].len + bs - 1) / bs; ++b) tables[s].push_back(perm[next++]);

      const size_t n_slots = size_t(n_blocks) * size_t(bs);
      std::vector<float> kc(n_slots * size_t(kv_dim), NAN), vc(n_slots * size_t(kv_dim), NAN);
      float v_max = 0;
      for (size_t s = 0; s < seqs.size(); ++s)
        for (int32_t j = 0; j < seqs[s].len; ++j) {
          const size_t slot = size_t(tables[s][size_t(j / bs)]) * size_t(bs) + size_t(j % bs);
          for (int64_t i = 0; i < kv_dim; ++i) {
            kc[slot * size_t(kv_dim) + size_t(i)] = nd(rng);
            const float v = nd(rng);
            vc[slot * size_t(kv_dim) + size_t(i)] = v;
            v_max = std::max(v_max, std::fabs(v));
          }
        }

      // the batch: each sequence's new tokens in order, the sequences interleaved at random
      Batch batch;
      batch.block_tables = tables;
      std::vector<int32_t> next_pos(seqs.size());
      for (size_t s = 0; s < seqs.size(); ++s) next_pos[s] = seqs[s].len - seqs[s].n_new;
      for (;;) {
        std::vector<int32_t> open;
        for (size_t s = 0; s < seqs.size(); ++s)
          if (next_pos[s] < seqs[s].len) open.push_back(int32_t(s));
        if (open.empty()) break;
        const int32_t s = open[std::uniform_int_distribution<size_t>(0, open.size() - 1)(rng)];
        batch.add(7, next_pos[size_t(s)]++, s, true);
      }
      batch.finish(bs);
      const BatchArgs args = batch.args(batch.packed().data());
      ASSERT_GT(args.n_runs, int32_t(seqs.size()));  // interleaved, not one run per sequence

      const int64_t T = batch.n_tokens();
      std::vector<float> q(size_t(T * n_head * hd));
      for (auto& v : q) v = 2.f * nd(rng);  // scores of spread ~2: uneven softmax weights
      // an f32 cache; f16 and q8_0 ones against the reference on their rounded values (q8_0
      // where a head is whole blocks of 32; slots no sequence owns as 0 there, never read)
      std::vector<uint16_t> kh(kc.size()), vh(vc.size()), kb(kc.size()), vb(vc.size());
      std::vector<float> kr(kc.size()), vr(vc.size()), kq(kc.size()), vq(vc.size()), kbr(kc.size()),
          vbr(vc.size());
      const size_t q8_row = row_bytes(DType::Q8_0, kv_dim);
      std::vector<uint8_t> k8(hd % 32 ? 0 : n_slots * q8_row), v8(k8.size());
      for (size_t i = 0; i < kc.size(); ++i) {
        kh[i] = std::isnan(kc[i]) ? 0x7e00 : f32_to_f16(kc[i]);
        vh[i] = std::isnan(vc[i]) ? 0x7e00 : f32_to_f16(vc[i]);
        kr[i] = f16_to_f32(kh[i]);
        vr[i] = f16_to_f32(vh[i]);
        kb[i] = f32_to_bf16(kc[i]);
        vb[i] = f32_to_bf16(vc[i]);
        kbr[i] = bf16_to_f32(kb[i]);
        vbr[i] = bf16_to_f32(vb[i]);
      }
      if (!k8.empty())
        for (size_t sl = 0; sl < n_slots; ++sl) {
          std::vector<float> rk(kc.begin() + long(sl * kv_dim),
                                kc.begin() + long((sl + 1) * kv_dim)),
              rv(vc.begin() + long(sl * kv_dim), vc.begin() + long((sl + 1) * kv_dim));
          for (auto* r : {&rk, &rv})
            for (float& f : *r) f = std::isnan(f) ? 0.f : f;
          quantize_row(DType::Q8_0, rk.data(), k8.data() + sl * q8_row, kv_dim);
          quantize_row(DType::Q8_0, rv.data(), v8.data() + sl * q8_row, kv_dim);
          dequantize_row_ref(DType::Q8_0, k8.data() + sl * q8_row, kq.data() + sl * kv_dim, kv_dim);
          dequantize_row_ref(DType::Q8_0, v8.data() + sl * q8_row, vq.data() + sl * kv_dim, kv_dim);
        }
      for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
        if (dt == DType::Q8_0 && k8.empty()) continue;
        const bool f16 = dt == DType::F16, q8 = dt == DType::Q8_0, b16 = dt == DType::BF16;
        std::vector<float> out(q.size(), NAN);
        const void* kp = q8    ? (const void*)k8.data()
                         : f16 ? (const void*)kh.data()
                         : b16 ? (const void*)kb.data()
                               : kc.data();
        const void* vp = q8    ? (const void*)v8.data()
                         : f16 ? (const void*)vh.data()
                         : b16 ? (const void*)vb.data()
                               : vc.data();
        cpu::attention(q.data(), kp, vp, dt, kv_dim, args, AttnShape{n_head, n_head_kv, hd, window},
                       nullptr, out.data());
        const auto ref =
            ref_attention(q,
                          q8    ? kq
                          : f16 ? kr
                          : b16 ? kbr
                                : kc,
                          q8    ? vq
                          : f16 ? vr
                          : b16 ? vbr
                                : vc,
                          batch.positions, batch.seq_of, tables, bs, n_head, n_head_kv, hd, window);
        // on AMX tiles (a bf16 cache where the set has them) q and the weights p are rounded
        // to bf16 too
        const bool bf16_products = b16 && cpu::simd().attn_bf16;
        const double tol = (bf16_products ? kBf16ProductsTol : 5e-6) * v_max;
        double ref_mag = 0, worst_here = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          ref_mag = std::max(ref_mag, std::fabs(ref[i]));
          const double err = std::fabs(double(out[i]) - ref[i]);
          worst_here = std::max(worst_here, err / v_max);
          const int64_t t = int64_t(i) / (n_head * hd), h = int64_t(i) / hd % n_head;
          ASSERT_LE(err, tol) << "hd " << hd << " gqa " << gqa << " block " << bs << " window "
                              << window << ": token " << t << " (seq " << batch.seq_of[size_t(t)]
                              << ", pos " << batch.positions[size_t(t)] << ") head " << h << " dim "
                              << i % size_t(hd) << ": " << out[i] << " vs " << ref[i] << " ("
                              << dtype_name(dt) << " cache)";
        }
        ASSERT_GT(ref_mag, 0.1);  // real values, not all zero
        if (bf16_products)
          worst_bf16 = std::max(worst_bf16, worst_here);
        else
          worst = std::max(worst, worst_here);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
  std::printf("[ report ] attention (%s) hd %lld gqa %lld: worst |err| / max|v| %.2e",
              cpu::simd().isa, static_cast<long long>(hd), static_cast<long long>(gqa), worst);
  if (cpu::simd().attn_bf16) std::printf(", on tiles (bf16 cache) %.2e", worst_bf16);
  std::printf("\n");
}

INSTANTIATE_TEST_SUITE_P(HeadDimByGqa, PagedAttention,
                         ::testing::Values(AttnCase{16, 1}, AttnCase{16, 7}, AttnCase{32, 2},
                                           AttnCase{32, 4}, AttnCase{64, 1}, AttnCase{64, 2},
                                           AttnCase{64, 4}, AttnCase{64, 7}, AttnCase{128, 1},
                                           AttnCase{128, 2}, AttnCase{128, 4}, AttnCase{128, 7}),
                         [](const auto& info) {
                           return "hd" + std::to_string(info.param.head_dim) + "_gqa" +
                                  std::to_string(info.param.gqa);
                         });

// Items of every KV head reading whole rows (decode) and items of one head reading its slice of
// each row give the same bits, and so does the choice made by default at 1 and 2 threads: f32,
// f16 and q8_0 caches, keys before and after RoPE, holes in blocks, windows; decode steps,
// short runs and a 17-token prefill whose keys span several partitions.
TEST(AttentionReads, WholeRowsEqualHeadSlices) {
  struct Shape {
    int64_t hd, n_head_kv, gqa;
  };
  struct Seq {
    int32_t len, n_new;
  };
  const std::vector<Seq> seqs{{2500, 1}, {700, 2}, {64, 1}, {1030, 3}, {17, 17}};
  const int32_t bs = 16;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int saved = cpu::n_threads();
  int checked = 0;
  for (const Shape sh : {Shape{64, 3, 3}, Shape{128, 2, 7}, Shape{32, 4, 1}}) {
    const int64_t kv_dim = sh.n_head_kv * sh.hd, n_head = sh.n_head_kv * sh.gqa;
    int32_t n_blocks = 2;
    for (auto& sq : seqs) n_blocks += (sq.len + 2 * bs - 1) / bs;  // room for the holes
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    Batch batch;
    size_t next = 0;
    // sequence 0 has holes: block 2 keeps slots [0, 10), block 5 [3, 16)
    batch.block_fills = {{{0, 16}, {0, 16}, {0, 10}, {0, 16}, {0, 16}, {3, 16}}};
    const size_t n_slots = size_t(n_blocks) * bs;
    std::vector<float> kc(n_slots * size_t(kv_dim), NAN), vc(kc.size(), NAN);
    for (size_t sq = 0; sq < seqs.size(); ++sq) {
      const int32_t n_tbl = (seqs[sq].len + 2 * bs - 1) / bs;
      batch.block_tables.emplace_back();
      for (int32_t b = 0; b < n_tbl; ++b) batch.block_tables.back().push_back(perm[next++]);
      for (int32_t j = 0; j < n_tbl * bs; ++j) {
        if (sq == 0 && ((j / bs == 2 && j % bs >= 10) || (j / bs == 5 && j % bs < 3))) continue;
        const size_t slot = size_t(batch.block_tables.back()[size_t(j / bs)]) * bs + j % bs;
        for (int64_t i = 0; i < kv_dim; ++i) {
          kc[slot * size_t(kv_dim) + size_t(i)] = nd(rng);
          vc[slot * size_t(kv_dim) + size_t(i)] = nd(rng);
        }
      }
    }
    for (size_t sq = 0; sq < seqs.size(); ++sq)
      for (int32_t p = seqs[sq].len - seqs[sq].n_new; p < seqs[sq].len; ++p)
        batch.add(7, p, int32_t(sq), true);
    batch.finish(bs);
    const BatchArgs args = batch.args(batch.packed().data());
    std::vector<float> q(size_t(batch.n_tokens() * n_head * sh.hd));
    for (auto& v : q) v = 2.f * nd(rng);
    // the three caches (q8_0: unowned slots as 0)
    std::vector<uint16_t> kh(kc.size()), vh(vc.size()), kb(kc.size()), vb(vc.size());
    for (size_t i = 0; i < kc.size(); ++i) {
      kh[i] = std::isnan(kc[i]) ? 0x7e00 : f32_to_f16(kc[i]);
      vh[i] = std::isnan(vc[i]) ? 0x7e00 : f32_to_f16(vc[i]);
      kb[i] = f32_to_bf16(kc[i]);
      vb[i] = f32_to_bf16(vc[i]);
    }
    const size_t q8_row = row_bytes(DType::Q8_0, kv_dim);
    std::vector<uint8_t> k8(n_slots * q8_row), v8(k8.size());
    for (size_t sl = 0; sl < n_slots; ++sl) {
      std::vector<float> rk(static_cast<size_t>(kv_dim)), rv(static_cast<size_t>(kv_dim));
      for (int64_t i = 0; i < kv_dim; ++i) {
        const float a = kc[sl * size_t(kv_dim) + size_t(i)],
                    b = vc[sl * size_t(kv_dim) + size_t(i)];
        rk[size_t(i)] = std::isnan(a) ? 0.f : a;
        rv[size_t(i)] = std::isnan(b) ? 0.f : b;
      }
      quantize_row(DType::Q8_0, rk.data(), k8.data() + sl * q8_row, kv_dim);
      quantize_row(DType::Q8_0, rv.data(), v8.data() + sl * q8_row, kv_dim);
    }
    std::vector<float> inv_freq(size_t(sh.hd / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i)
      inv_freq[i] = float(std::pow(10000.0, -2.0 * double(i) / double(sh.hd)));
    cpu::RopeTable rope;
    rope.ensure(inv_freq.data(), sh.hd, 4096);
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
      for (const bool pre_rope : {false, true})
        for (const int64_t window : {0, 300}) {
          const void* kp = dt == DType::Q8_0   ? (const void*)k8.data()
                           : dt == DType::F16  ? (const void*)kh.data()
                           : dt == DType::BF16 ? (const void*)kb.data()
                                               : kc.data();
          const void* vp = dt == DType::Q8_0   ? (const void*)v8.data()
                           : dt == DType::F16  ? (const void*)vh.data()
                           : dt == DType::BF16 ? (const void*)vb.data()
                                               : vc.data();
          auto run = [&](cpu::KvReads r, int n_thr) {
            cpu::set_kv_reads(r);
            cpu::set_n_threads(n_thr);
            std::vector<float> out(q.size(), NAN);
            cpu::attention(q.data(), kp, vp, dt, kv_dim, args,
                           AttnShape{n_head, sh.n_head_kv, sh.hd, window},
                           pre_rope ? &rope : nullptr, out.data());
            return out;
          };
          const auto whole = run(cpu::KvReads::WholeRows, 2);
          for (float v : whole) ASSERT_TRUE(std::isfinite(v));
          const std::string what = std::string(dtype_name(dt)) + (pre_rope ? " pre-RoPE" : "") +
                                   " hd " + std::to_string(sh.hd) + " window " +
                                   std::to_string(window);
          for (const auto& [r, n_thr] :
               {std::pair{cpu::KvReads::HeadSlices, 2}, std::pair{cpu::KvReads::WholeRows, 1},
                std::pair{cpu::KvReads::Auto, 1}, std::pair{cpu::KvReads::Auto, 2},
                std::pair{cpu::KvReads::Auto, 8}}) {
            const auto other = run(r, n_thr);
            ASSERT_EQ(std::memcmp(other.data(), whole.data(), whole.size() * 4), 0)
                << what << ", reads " << int(r) << ", " << n_thr << " threads";
          }
          ++checked;
        }
  }
  cpu::set_kv_reads(cpu::KvReads::Auto);
  cpu::set_n_threads(saved);
  EXPECT_EQ(checked, 48);
}

// A batch whose partition states pass one wave's (two runs of 128 queries, 8 heads of 64, over
// 8,192 keys: 2.2M floats a run) is computed in waves of whole runs: each query's bits are
// those of its run alone (and the last one's, alone), and the same at 1, 2 and 8 threads; with
// an f32 cache and a bf16 one (AMX tiles where the set has them).
TEST(AttentionWaves, LongBatchEqualsItsRunsAlone) {
  const int64_t hd = 64, n_head_kv = 2, n_head = 8, kv_dim = n_head_kv * hd;
  const int32_t bs = 16, len = 8192, n_new = 256, run_len = 128;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> kc(size_t(len) * size_t(kv_dim)), vc(kc.size());
  for (auto& v : kc) v = nd(rng);
  for (auto& v : vc) v = nd(rng);
  std::vector<float> q(size_t(n_new * n_head * hd));
  for (auto& v : q) v = 2.f * nd(rng);
  std::vector<uint16_t> kb(kc.size()), vb(vc.size());
  for (size_t i = 0; i < kc.size(); ++i) {
    kb[i] = f32_to_bf16(kc[i]);
    vb[i] = f32_to_bf16(vc[i]);
  }
  const int saved = cpu::n_threads();
  for (const DType dt : {DType::F32, DType::BF16}) {
    // queries [first, first + n) of the last n_new positions, in one call
    auto run = [&](int32_t first, int32_t n) {
      Batch batch;
      batch.block_tables.emplace_back();
      for (int32_t b = 0; b < len / bs; ++b) batch.block_tables.back().push_back(b);
      for (int32_t i = first; i < first + n; ++i) batch.add(7, len - n_new + i, 0, true);
      batch.finish(bs);
      const BatchArgs args = batch.args(batch.packed().data());
      std::vector<float> out(size_t(n * n_head * hd), NAN);
      const bool b16 = dt == DType::BF16;
      cpu::attention(q.data() + size_t(first * n_head * hd),
                     b16 ? (const void*)kb.data() : kc.data(),
                     b16 ? (const void*)vb.data() : vc.data(), dt, kv_dim, args,
                     AttnShape{n_head, n_head_kv, hd, 0}, nullptr, out.data());
      return out;
    };
    cpu::set_n_threads(1);
    const auto want = run(0, n_new);
    for (float v : want) ASSERT_TRUE(std::isfinite(v));
    for (const int n_thr : {1, 2, 8}) {
      cpu::set_n_threads(n_thr);
      const auto all = run(0, n_new);
      ASSERT_EQ(std::memcmp(all.data(), want.data(), want.size() * 4), 0) << n_thr << " threads";
      for (int32_t first = 0; first < n_new; first += run_len) {
        const auto alone = run(first, run_len);
        ASSERT_EQ(
            std::memcmp(alone.data(), want.data() + size_t(first * n_head * hd), alone.size() * 4),
            0)
            << "queries from " << first << ", " << n_thr << " threads, " << dtype_name(dt);
      }
      // the last query alone (decode): its bits in the long batch
      const auto last = run(n_new - 1, 1);
      ASSERT_EQ(std::memcmp(last.data(), want.data() + size_t((n_new - 1) * n_head * hd),
                            last.size() * 4),
                0)
          << "the last query alone, " << n_thr << " threads, " << dtype_name(dt);
    }
  }
  cpu::set_n_threads(saved);
}

// ---------------------------------------------------------------------------------------------
// cpu::rope against ref_rope. The kernel forms the angle pos * inv_freq[i] in float, so its
// error grows with the angle: per element |got - ref| <= (|x0| + |x1|) * FLT_EPSILON *
// (angle + 4) for the pair (x0, x1) at angle pos * inv_freq[i] (half an ulp of the angle, about
// angle * 2^-24, plus a few roundings in cos, sin and the rotation). Positions from 0 to 32767,
// past 512 and around powers of two; theta 10^4 and 10^6.
TEST(Rope, MatchesFloat64Reference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const std::vector<int32_t> pos{0,   1,   2,    17,   255,  511,  512,
                                 513, 600, 1023, 1024, 4095, 8191, 32767};
  const int64_t n_heads = 3;
  for (const int64_t hd : {16, 32, 64, 128})
    for (const double theta : {1e4, 1e6}) {
      std::vector<float> inv_freq(size_t(hd / 2));
      for (int64_t i = 0; i < hd / 2; ++i)
        inv_freq[size_t(i)] = float(std::pow(theta, -2.0 * double(i) / double(hd)));
      std::vector<float> x(pos.size() * size_t(n_heads * hd));
      for (auto& v : x) v = nd(rng);
      const auto ref = ref_rope(x, pos, n_heads, hd, inv_freq);
      std::vector<float> got(x);
      cpu::rope(got.data(), pos.data(), int64_t(pos.size()), n_heads, hd, inv_freq.data());
      const int64_t half = hd / 2;
      for (size_t r = 0; r < pos.size(); ++r)
        for (int64_t h = 0; h < n_heads; ++h)
          for (int64_t i = 0; i < hd; ++i) {
            const size_t base = (r * size_t(n_heads) + size_t(h)) * size_t(hd);
            const int64_t pair = i % half;
            const double angle = double(pos[r]) * inv_freq[size_t(pair)];
            const double tol = (std::fabs(double(x[base + size_t(pair)])) +
                                std::fabs(double(x[base + size_t(pair + half)]))) *
                               FLT_EPSILON * (angle + 4);
            ASSERT_LE(std::fabs(got[base + size_t(i)] - ref[base + size_t(i)]), tol)
                << "hd " << hd << " theta " << theta << " pos " << pos[r] << " head " << h
                << " dim " << i << ": " << got[base + size_t(i)] << " vs " << ref[base + size_t(i)];
          }
      // position 0 is the identity; elsewhere the rotation changed the values
      for (int64_t i = 0; i < n_heads * hd; ++i) ASSERT_EQ(got[size_t(i)], x[size_t(i)]);
      ASSERT_NE(got[size_t(n_heads * hd)], x[size_t(n_heads * hd)]);
    }
}

// ---------------------------------------------------------------------------------------------
// cpu::rmsnorm against ref_rmsnorm: per element |got - ref| <= 4 * FLT_EPSILON * |ref| (the
// sum of squares is kept in double; a float 1/sqrt and two products are at most a few half
// ulps). Row lengths from 1 to 4096, weights of both signs, rows at scales 1e-3 to 1e3 and an
// all-zero row (eps keeps it finite: zeros out), eps 1e-5 and 1e-6.
TEST(RmsNorm, MatchesFloat64Reference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (const int64_t n : {1, 7, 16, 32, 64, 128, 576, 896, 4096})
    for (const float eps : {1e-5f, 1e-6f}) {
      const float scales[] = {1.f, 1e-3f, 1e3f, 0.f};
      const int64_t n_rows = 4;
      std::vector<float> w(static_cast<size_t>(n)), x(static_cast<size_t>(n_rows * n));
      for (auto& v : w) v = 1.f + 0.5f * nd(rng);
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < n; ++i) x[size_t(r * n + i)] = scales[r] * nd(rng);
      const auto ref = ref_rmsnorm(x, w, n, eps);
      std::vector<float> got(x.size(), NAN);
      cpu::rmsnorm(x.data(), w.data(), n_rows, n, eps, got.data());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - ref[i]), 4 * FLT_EPSILON * std::fabs(ref[i]))
            << "n " << n << " eps " << eps << " row " << i / size_t(n) << " element "
            << i % size_t(n) << ": " << got[i] << " vs " << ref[i];
      // unit scale: the output has rms ~ |w|, not zeros
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += ref[size_t(i)] * ref[size_t(i)];
      ASSERT_GT(ss / double(n), 0.05);
    }
}

// ---------------------------------------------------------------------------------------------
// The row and element ops split long inputs across threads (prefill): a whole batch gives the
// same bits as each row (or element range) alone, with an uneven split (3 threads).
TEST(RowOps, ThreadSplitEqualsRowByRow) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  const int64_t n_rows = 301, n = 896, n_heads = 14, hd = 64;
  std::vector<float> x(static_cast<size_t>(n_rows * n)), w(static_cast<size_t>(n)),
      b(static_cast<size_t>(n)), inv_freq(static_cast<size_t>(hd / 2));
  for (std::vector<float>* v : {&x, &w, &b})
    for (auto& f : *v) f = nd(rng);
  for (int64_t i = 0; i < hd / 2; ++i)
    inv_freq[size_t(i)] = float(std::pow(1e6, -2.0 * double(i) / double(hd)));
  std::vector<int32_t> pos(static_cast<size_t>(n_rows));
  std::iota(pos.begin(), pos.end(), 7);
  const int saved = cpu::n_threads();
  cpu::set_n_threads(3);
  std::vector<float> all(x.size()), one(x.size());
  cpu::rmsnorm(x.data(), w.data(), n_rows, n, 1e-6f, all.data());
  for (int64_t r = 0; r < n_rows; ++r)
    cpu::rmsnorm(x.data() + r * n, w.data(), 1, n, 1e-6f, one.data() + r * n);
  EXPECT_EQ(all, one) << "rmsnorm";
  all = x, one = x;
  cpu::add_bias(all.data(), b.data(), n_rows, n);
  for (int64_t r = 0; r < n_rows; ++r) cpu::add_bias(one.data() + r * n, b.data(), 1, n);
  EXPECT_EQ(all, one) << "add_bias";
  all = x, one = x;
  cpu::rope(all.data(), pos.data(), n_rows, n_heads, hd, inv_freq.data());
  for (int64_t r = 0; r < n_rows; ++r)
    cpu::rope(one.data() + r * n, pos.data() + r, 1, n_heads, hd, inv_freq.data());
  EXPECT_EQ(all, one) << "rope";
  // flat ops over a length that leaves a tail for the scalar path
  const int64_t len = n_rows * n - 5, piece = 1024;  // pieces as aligned as the split's
  all = x, one = x;
  cpu::add(all.data(), x.data(), len);
  for (int64_t i = 0; i < len; i += piece)
    cpu::add(one.data() + i, x.data() + i, std::min(piece, len - i));
  EXPECT_EQ(all, one) << "add";
  all = x, one = x;
  std::vector<float> up(x.rbegin(), x.rend());
  cpu::silu_mul(all.data(), up.data(), len);
  for (int64_t i = 0; i < len; i += piece)
    cpu::silu_mul(one.data() + i, up.data() + i, std::min(piece, len - i));
  EXPECT_EQ(all, one) << "silu_mul";
  cpu::set_n_threads(saved);
}

// A chunk's keys transposed for attn_chunk: every kernel set moves each value to its place (the
// bits of the rows, f32, or f16 and q8_0 widened; zeros for missing rows), at head dims that are
// and are not multiples of the 16- and 8-wide blocks.
TEST(AttentionKeys, TransposedLikeTheScalar) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  for (const int64_t hd : {8, 40, 64, 72, 128, 200}) {
    std::vector<float> rows(size_t(64 * hd));
    for (auto& v : rows) v = nd(rng);
    // every 7th row from the 4th missing (nullptr)
    auto row_ptrs = [&](const void* base, size_t row_b, const void** p) {
      for (int j = 0; j < 64; ++j)
        p[j] = j % 7 == 3 ? nullptr : static_cast<const uint8_t*>(base) + size_t(j) * row_b;
    };
    // the f32, f16 and q8_0 rows, and each widened as the reference widens it
    std::vector<uint16_t> half(rows.size());
    std::vector<float> half_wide(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      half[i] = f32_to_f16(rows[i]);
      half_wide[i] = f16_to_f32(half[i]);
    }
    const size_t q8_b = row_bytes(DType::Q8_0, hd);
    std::vector<uint8_t> q8(64 * q8_b);
    std::vector<float> q8_wide(rows.size());
    if (hd % 32 == 0)
      for (int j = 0; j < 64; ++j) {
        quantize_row(DType::Q8_0, rows.data() + j * hd, q8.data() + j * q8_b, hd);
        dequantize_row_ref(DType::Q8_0, q8.data() + j * q8_b, q8_wide.data() + j * hd, hd);
      }
    for (const char* isa : {"generic", "avx2", "avx512", "avx512bf16"}) {
      const cpu::SimdKernels* k = cpu::simd_for(isa);
      if (!k) continue;
      auto expect = [&](DType t, const void* base, size_t row_b, const std::vector<float>& wide) {
        const void* p[64];
        row_ptrs(base, row_b, p);
        std::vector<float> kt(size_t(hd * 64), NAN);
        k->keys_t(p, t, hd, kt.data());
        for (int j = 0; j < 64; ++j)
          for (int64_t i = 0; i < hd; ++i) {
            const float want = p[j] ? wide[size_t(j * hd + i)] : 0.f;
            ASSERT_EQ(std::memcmp(&kt[size_t(i * 64 + j)], &want, 4), 0)
                << isa << " " << dtype_name(t) << ", hd " << hd << " key " << j << " dim " << i;
          }
      };
      expect(DType::F32, rows.data(), size_t(hd) * 4, rows);
      expect(DType::F16, half.data(), size_t(hd) * 2, half_wide);       // an f16 cache's keys
      if (hd % 32 == 0) expect(DType::Q8_0, q8.data(), q8_b, q8_wide);  // a q8_0 cache's
    }
  }
}

// Two and three query heads through attn_chunk2 and attn_chunk3 give the bits of as many
// attn_chunk calls, on every kernel set: head dims odd, below, at and past the 64-wide blocks,
// live masks full, sparse and of one key, a first chunk (max -inf) and a running state.
TEST(AttentionChunk, SeveralHeadsAsEachAlone) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (const int64_t hd : {7, 16, 64, 72, 128, 200}) {
    const size_t n_st = size_t(hd + 2);
    std::vector<float> kt(size_t(hd * 64)), vrows(size_t(64 * hd)), q(size_t(3 * hd));
    for (auto& x : kt) x = nd(rng);
    for (auto& x : vrows) x = nd(rng);
    for (auto& x : q) x = 2.f * nd(rng);
    const float* vp[64];
    for (int j = 0; j < 64; ++j) vp[j] = vrows.data() + j * hd;
    for (const uint64_t live : {~uint64_t(0), uint64_t(0x8421'0842'1084'2108), uint64_t(1) << 37,
                                (uint64_t(1) << 50) - 1})
      for (const bool first : {true, false}) {
        std::vector<float> st0(3 * n_st);
        for (size_t h = 0; h < 3; ++h) {
          float* s = st0.data() + h * n_st;
          s[0] = first ? -INFINITY : 1.5f + float(h);
          s[1] = first ? 0.f : 3.f;
          for (int64_t d = 0; d < hd; ++d) s[2 + d] = first ? 0.f : nd(rng);
        }
        for (const char* isa : {"generic", "avx2", "avx512", "avx512bf16"}) {
          const cpu::SimdKernels* k = cpu::simd_for(isa);
          if (!k) continue;
          for (const int n_heads : {2, 3}) {
            std::vector<float> alone(st0), together(st0);
            const float* qh[3];
            float* sh[3];
            for (int h = 0; h < n_heads; ++h) {
              k->attn_chunk(q.data() + h * hd, hd, 0.125f, kt.data(), vp, live,
                            alone.data() + size_t(h) * n_st);
              qh[h] = q.data() + h * hd;
              sh[h] = together.data() + size_t(h) * n_st;
            }
            (n_heads == 2 ? k->attn_chunk2 : k->attn_chunk3)(qh, hd, 0.125f, kt.data(), vp, live,
                                                             sh);
            ASSERT_EQ(std::memcmp(alone.data(), together.data(), alone.size() * 4), 0)
                << isa << " " << n_heads << " heads, hd " << hd << " live " << std::hex << live;
            for (size_t i = 0; i < size_t(n_heads) * n_st; ++i)
              ASSERT_TRUE(std::isfinite(together[i]));
          }
        }
      }
  }
}

}  // namespace
}  // namespace wick::test
