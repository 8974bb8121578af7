// Sampling on the GPU (Backend::sample) against the CPU sampler
// (sampling/sampler.h): greedy and penalties bit for bit; the fast path
// (0 < top_k <= 1024) id for id, with the draw u = sample_uniform(seed,
// counter) scaled by the kept mass and walked in the CPU's order; the
// general path (top_k 0 or > 1024) by membership in the CPU's kept set and
// by the empirical distribution of many draws. Also reproducibility and
// batch invariance (a row alone gives the id it gives in a batch).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "backend/sample.h"
#include "gpu/gpu_helpers.h"
#include "sampling/sampler.h"

namespace wick::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One backend for the suite, kept to the end of the process.
Backend& backend() {
  static Backend* be = cuda_backend().release();
  return *be;
}

// Samples rows of host logits [rows.size(), n_vocab] on the GPU; `logits`
// gets the device's logits back (penalised).
std::vector<int32_t> gpu_sample(Backend& be, std::vector<float>& logits, int n_vocab,
                                const std::vector<SampleRow>& rows,
                                const std::vector<int32_t>& pairs = {}) {
  EXPECT_EQ(logits.size(), rows.size() * size_t(n_vocab));
  Buffer d = to_device(be, logits.data(), logits.size() * sizeof(float));
  std::vector<int32_t> ids(rows.size(), -7);
  be.sample(d.as<float>(), int64_t(rows.size()), n_vocab, rows, pairs, ids.data());
  logits = to_host<float>(be, d, logits.size());
  return ids;
}

SamplingParams params_of(const SampleRow& r, int32_t repeat_last_n = 0) {
  SamplingParams p;
  p.temperature = r.temperature;
  p.top_k = r.top_k;
  p.top_p = r.top_p;
  p.min_p = r.min_p;
  p.repeat_penalty = r.repeat_penalty;
  p.presence_penalty = r.presence_penalty;
  p.frequency_penalty = r.frequency_penalty;
  p.repeat_last_n = repeat_last_n;
  p.seed = r.seed;
  return p;
}

SampleRow sampled(float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                  uint64_t counter) {
  SampleRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  r.seed = seed;
  r.counter = counter;
  return r;
}

std::span<const float> row_of(const std::vector<float>& l, int V, size_t r) {
  return std::span<const float>(l).subspan(r * size_t(V), size_t(V));
}

int32_t cpu_greedy(std::span<const float> row) {
  std::vector<float> copy(row.begin(), row.end());
  Sampler s(SamplingParams::greedy(), int32_t(row.size()));
  return s.sample(copy, {});
}

// The CPU's candidates after top-k, softmax, top-p and min-p.
std::vector<Sampler::Cand> cpu_kept(std::span<const float> row, const SampleRow& r) {
  Sampler s(params_of(r), int32_t(row.size()));
  s.load_candidates(row);
  s.top_k(r.top_k);
  s.softmax();
  s.top_p(r.top_p);
  s.min_p(r.min_p);
  return s.candidates();
}

// The device's draw on the CPU's kept candidates: u scaled by the kept mass,
// walked in decreasing probability as Sampler::sample walks.
int32_t cpu_draw(const std::vector<Sampler::Cand>& kept, const SampleRow& r) {
  double total = 0;
  for (const auto& c : kept) total += c.p;
  double x = sample_uniform(r.seed, r.counter) * total;
  for (const auto& c : kept) {
    x -= c.p;
    if (x < 0) return c.id;
  }
  return kept.back().id;
}

bool contains(const std::vector<Sampler::Cand>& kept, int32_t id) {
  return std::any_of(kept.begin(), kept.end(), [&](const auto& c) { return c.id == id; });
}

// The engine's (token, count) pairs of a penalty window, sorted by token.
void append_pairs(std::span<const int32_t> history, int32_t last_n, std::vector<int32_t>& pairs,
                  SampleRow& r) {
  size_t n = history.size();
  if (last_n > 0) n = std::min(n, size_t(last_n));
  std::map<int32_t, int32_t> counts;
  for (int32_t t : history.subspan(history.size() - n)) ++counts[t];
  r.penalty_first = int32_t(pairs.size() / 2);
  for (auto [t, c] : counts) {
    pairs.push_back(t);
    pairs.push_back(c);
  }
  r.n_penalty = int32_t(pairs.size() / 2) - r.penalty_first;
}

// Empirical frequencies of ids against the renormalised kept probabilities:
// every id kept, chi-square and the largest deviation under loose bounds.
void expect_distribution(const std::vector<int32_t>& ids, const std::vector<Sampler::Cand>& kept,
                         double max_chi2, double max_dev) {
  double total = 0;
  for (const auto& c : kept) total += c.p;
  std::map<int32_t, double> expect;
  for (const auto& c : kept) expect[c.id] = c.p / total;
  std::map<int32_t, int> seen;
  for (int32_t id : ids) {
    ASSERT_TRUE(expect.count(id)) << "id " << id << " is not in the kept set";
    ++seen[id];
  }
  const double n = double(ids.size());
  double chi2 = 0, dev = 0;
  for (auto [id, p] : expect) {
    const double f = seen.count(id) ? seen[id] / n : 0.0;
    dev = std::max(dev, std::fabs(f - p));
    if (p > 0) chi2 += (f - p) * (f - p) * n / p;
  }
  EXPECT_LT(chi2, max_chi2) << "over " << expect.size() << " kept tokens";
  EXPECT_LT(dev, max_dev);
}

TEST(CudaSample, GreedyMatchesCpuArgmax) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::mt19937 rng(7);
  for (int V : {151936, 1000, 33, 3, 1}) {
    const int R = 8;
    std::vector<float> l = randn(size_t(R) * V, rng, 3.f);
    auto at = [&](int r, int i) -> float& { return l[size_t(r) * V + size_t(i)]; };
    std::uniform_int_distribution<int> any(0, V - 1);
    std::vector<int32_t> expect(R, -1);
    // 1: a tie at the maximum: the lower id wins
    {
      int a = any(rng), b = any(rng);
      if (a > b) std::swap(a, b);
      at(1, a) = at(1, b) = 20.f;
      expect[1] = a;
    }
    // 2: half -inf, and a tie at the maximum
    for (int i = 0; i < V; ++i)
      if (i % 2 == 0) at(2, i) = -kInf;
    if (V >= 3) {
      at(2, V - 1) = at(2, V / 2 | 1) = 30.f;
      expect[2] = std::min(V - 1, V / 2 | 1);
    }
    // 3: all -inf: the CPU keeps id 0
    for (int i = 0; i < V; ++i) at(3, i) = -kInf;
    expect[3] = 0;
    // 4: the maximum at the last id (the row's tail)
    at(4, V - 1) = 50.f;
    expect[4] = V - 1;
    // 5: the maximum at ids 0 and V-1
    at(5, 0) = at(5, V - 1) = 50.f;
    expect[5] = 0;
    // 6: NaN at id 0: the CPU never leaves id 0
    at(6, 0) = std::numeric_limits<float>::quiet_NaN();
    expect[6] = 0;
    // 7: equal logits everywhere, and -0 against +0
    for (int i = 0; i < V; ++i) at(7, i) = i % 3 ? 0.f : -0.f;
    expect[7] = 0;
    std::vector<SampleRow> rows(R);  // temperature 0
    std::vector<float> dev_l = l;
    const auto ids = gpu_sample(*be, dev_l, V, rows);
    for (int r = 0; r < R; ++r) {
      const int32_t cpu = cpu_greedy(row_of(l, V, size_t(r)));
      EXPECT_EQ(ids[size_t(r)], cpu) << "V " << V << " row " << r;
      if (expect[size_t(r)] >= 0) {
        EXPECT_EQ(ids[size_t(r)], expect[size_t(r)]) << "V " << V << " row " << r;
      }
    }
    // no penalties: the logits are untouched
    EXPECT_EQ(0, std::memcmp(dev_l.data(), l.data(), l.size() * sizeof(float))) << "V " << V;
  }
}

TEST(CudaSample, PenaltiesMatchCpu) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::mt19937 rng(11);
  for (int V : {151936, 1000, 37}) {
    struct Case {
      float rep, presence, frequency;
      int32_t last_n;
    };
    const std::vector<Case> cases = {{1.3f, 0, 0, 64},       {1, 0.5f, 0.25f, 64},
                                     {1.1f, -0.4f, 0.7f, 0}, {0.8f, 0.3f, 0, 16},
                                     {1, 0, 0, 64},          {1.5f, 1.f, 1.f, 5}};
    const int R = int(cases.size());
    std::vector<float> l = randn(size_t(R) * V, rng, 3.f);
    for (int r = 0; r < R; ++r) l[size_t(r) * V + 3 % V] = 0.f;  // exact zero: multiplied
    std::vector<SampleRow> rows(R);
    std::vector<int32_t> pairs;
    std::vector<float> expect = l;
    std::uniform_int_distribution<int> few(0, std::min(V, 40) - 1), any(0, V - 1);
    for (int r = 0; r < R; ++r) {
      std::vector<int32_t> history;
      for (int i = 0; i < 120; ++i) history.push_back(i % 3 ? few(rng) : any(rng));
      history.push_back(3 % V);
      history.push_back(-1);  // out of range: skipped by both
      history.push_back(V + 2);
      SampleRow& sr = rows[size_t(r)];
      sr.repeat_penalty = cases[size_t(r)].rep;
      sr.presence_penalty = cases[size_t(r)].presence;
      sr.frequency_penalty = cases[size_t(r)].frequency;
      append_pairs(history, cases[size_t(r)].last_n, pairs, sr);
      Sampler s(params_of(sr, cases[size_t(r)].last_n), V);
      s.apply_penalties(std::span<float>(expect).subspan(size_t(r) * V, size_t(V)), history);
    }
    std::vector<float> dev_l = l;
    const auto ids = gpu_sample(*be, dev_l, V, rows, pairs);
    for (int r = 0; r < R; ++r) {
      size_t changed = 0, bad = 0;
      for (int i = 0; i < V; ++i) {
        const size_t at = size_t(r) * V + size_t(i);
        changed += std::memcmp(&expect[at], &l[at], 4) != 0;
        bad += std::memcmp(&expect[at], &dev_l[at], 4) != 0;
      }
      EXPECT_EQ(bad, 0u) << "V " << V << " row " << r;
      if (r == 4) {
        EXPECT_EQ(changed, 0u);
      } else {
        EXPECT_GT(changed, 0u) << "the case penalises something";
      }
      EXPECT_EQ(ids[size_t(r)], cpu_greedy(row_of(expect, V, size_t(r))))
          << "V " << V << " row " << r;
    }
  }
}

TEST(CudaSample, TopK1IsGreedy) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::mt19937 rng(3);
  const int V = 151936, R = 6;
  std::vector<float> l = randn(size_t(R) * V, rng, 2.f);
  l[size_t(1) * V + 777] = l[size_t(1) * V + 100000] = 15.f;  // a tie: the lower id
  l[size_t(2) * V + V - 1] = 15.f;
  for (int i = 0; i < V; ++i) l[size_t(3) * V + i] = 1.f;  // all equal: id 0
  std::vector<SampleRow> rows;
  for (int r = 0; r < R; ++r)
    rows.push_back(sampled(r % 2 ? 0.7f : 1.3f, 1, r % 3 ? 0.9f : 1.f, r % 2 ? 0.1f : 0.f,
                           uint64_t(r) * 31, uint64_t(r)));
  const auto ids = gpu_sample(*be, l, V, rows);
  for (int r = 0; r < R; ++r) EXPECT_EQ(ids[size_t(r)], cpu_greedy(row_of(l, V, size_t(r)))) << r;
  EXPECT_EQ(ids[1], 777);
  EXPECT_EQ(ids[2], V - 1);
  EXPECT_EQ(ids[3], 0);
}

// Rows of varied logits for the fast path: random, peaked, quantised (many
// ties at the top-k boundary), mostly -inf, all equal, and a rising ramp
// (the last two send the gather past 1024 candidates, to the radix select).
std::vector<float> varied_rows(int V, int R, std::mt19937& rng) {
  std::vector<float> l = randn(size_t(R) * V, rng, 2.5f);
  for (int r = 0; r < R; ++r) {
    float* x = l.data() + size_t(r) * V;
    switch (r % 6) {
      case 1:  // a few strong tokens
        for (int j = 0; j < 12; ++j) x[(j * 7919 + r) % V] = 9.f + float(j) * 0.25f;
        break;
      case 2:  // quantised to halves: ties everywhere
        for (int i = 0; i < V; ++i) x[i] = std::round(x[i] * 2.f) / 2.f;
        break;
      case 3:  // masked: 10 finite tokens
        for (int i = 0; i < V; ++i) x[i] = i % std::max(V / 10, 2) == 1 ? x[i] : -kInf;
        break;
      case 4:  // all equal
        for (int i = 0; i < V; ++i) x[i] = 0.5f;
        break;
      case 5:  // a rising ramp
        for (int i = 0; i < V; ++i) x[i] = float(i) * (8.f / float(V));
        break;
    }
  }
  return l;
}

TEST(CudaSample, FastPathMatchesCpu) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::mt19937 rng(5);
  const float temps[] = {0.5f, 0.8f, 1.f, 1.7f};
  const int ks[] = {1, 2, 40, 100, 300, 1024};
  const float top_ps[] = {1.f, 0.95f, 0.5f};
  const float min_ps[] = {0.f, 0.05f, 0.3f};
  for (int V : {151936, 5000, 1000, 37}) {
    const int R = 72;
    const std::vector<float> l = varied_rows(V, R, rng);
    std::vector<SampleRow> rows;
    for (int r = 0; r < R; ++r)
      rows.push_back(sampled(temps[r % 4], ks[(r / 6) % 6], top_ps[(r / 2) % 3],
                             min_ps[(r / 3) % 3], rng(), uint64_t(rng() % 1000)));
    std::vector<float> dev_l = l;
    const auto ids = gpu_sample(*be, dev_l, V, rows);
    for (int r = 0; r < R; ++r) {
      const auto kept = cpu_kept(row_of(l, V, size_t(r)), rows[size_t(r)]);
      EXPECT_TRUE(contains(kept, ids[size_t(r)])) << "V " << V << " row " << r;
      EXPECT_EQ(ids[size_t(r)], cpu_draw(kept, rows[size_t(r)]))
          << "V " << V << " row " << r << " top_k " << rows[size_t(r)].top_k;
    }
  }
}

TEST(CudaSample, DefaultsKeepToCpuCandidatesAndRepeat) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::mt19937 rng(9);
  const int V = 151936, R = 64;
  std::vector<float> one = randn(size_t(V), rng, 3.f);
  std::vector<float> l;
  for (int r = 0; r < R; ++r) l.insert(l.end(), one.begin(), one.end());
  std::vector<SampleRow> rows;
  for (int r = 0; r < R; ++r) rows.push_back(sampled(1.f, 40, 0.95f, 0.05f, 1234, uint64_t(r)));
  std::vector<float> l2 = l;
  const auto ids = gpu_sample(*be, l, V, rows);
  const auto again = gpu_sample(*be, l2, V, rows);
  EXPECT_EQ(ids, again);
  const auto kept = cpu_kept(one, rows[0]);
  std::set<int32_t> distinct;
  for (int r = 0; r < R; ++r) {
    EXPECT_TRUE(contains(kept, ids[size_t(r)])) << r;
    EXPECT_EQ(ids[size_t(r)], cpu_draw(kept, rows[size_t(r)])) << r;
    distinct.insert(ids[size_t(r)]);
  }
  if (kept.size() > 3) {
    EXPECT_GT(distinct.size(), 1u) << "the counter changes the draw";
  }
}

TEST(CudaSample, GeneralPathKeepsToCpuCandidates) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::mt19937 rng(13);
  struct Case {
    float t;
    int k;
    float top_p, min_p;
  };
  const std::vector<Case> cases = {{1.f, 0, 0.9f, 0.f},   {0.7f, 0, 0.5f, 0.05f},
                                   {1.f, 2000, 1.f, 0.f}, {1.2f, 3000, 0.8f, 0.f},
                                   {1.f, 0, 1.f, 0.1f},   {0.9f, 1500, 0.95f, 0.02f},
                                   {1.f, 0, 0.3f, 0.f},   {2.f, 0, 0.99f, 0.01f}};
  for (int V : {151936, 4099}) {
    const int R = 64;
    std::vector<float> l = varied_rows(V, R, rng);
    std::vector<SampleRow> rows;
    for (int r = 0; r < R; ++r) {
      const Case& c = cases[size_t(r) % cases.size()];
      rows.push_back(sampled(c.t, c.k, c.top_p, c.min_p, 99, uint64_t(r)));
    }
    std::vector<float> dev_l = l;
    const auto ids = gpu_sample(*be, dev_l, V, rows);
    for (int r = 0; r < R; ++r) {
      const auto kept = cpu_kept(row_of(l, V, size_t(r)), rows[size_t(r)]);
      EXPECT_TRUE(contains(kept, ids[size_t(r)]))
          << "V " << V << " row " << r << " id " << ids[size_t(r)] << " kept " << kept.size();
    }
  }
}

TEST(CudaSample, RowsAreIndependent) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::mt19937 rng(17);
  const int V = 151936, R = 8;
  const std::vector<float> l = randn(size_t(R) * V, rng, 3.f);
  std::vector<SampleRow> rows = {SampleRow{},  // greedy
                                 sampled(1.f, 40, 0.95f, 0.05f, 1, 10),
                                 sampled(0.8f, 0, 0.9f, 0.f, 2, 20),
                                 sampled(1.f, 0, 1.f, 0.f, 3, 30),
                                 sampled(1.f, 2000, 1.f, 0.f, 4, 40),
                                 sampled(0.6f, 1024, 0.7f, 0.f, 5, 50),
                                 sampled(1.f, 0, 1.f, 0.2f, 6, 60),
                                 SampleRow{}};
  std::vector<int32_t> pairs;
  std::vector<std::vector<int32_t>> row_pairs(R);
  for (int r : {1, 3, 7}) {
    rows[size_t(r)].repeat_penalty = 1.2f;
    rows[size_t(r)].frequency_penalty = 0.3f;
    std::vector<int32_t> history;
    for (int i = 0; i < 50; ++i) history.push_back(int32_t(rng() % 500));
    SampleRow alone = rows[size_t(r)];
    append_pairs(history, 0, pairs, rows[size_t(r)]);
    append_pairs(history, 0, row_pairs[size_t(r)], alone);
  }
  std::vector<float> batch_l = l;
  const auto ids = gpu_sample(*be, batch_l, V, rows, pairs);
  for (int r = 0; r < R; ++r) {
    SampleRow alone = rows[size_t(r)];
    alone.penalty_first = 0;
    std::vector<float> one(l.begin() + ptrdiff_t(r) * V, l.begin() + ptrdiff_t(r + 1) * V);
    const auto id = gpu_sample(*be, one, V, {alone}, row_pairs[size_t(r)]);
    EXPECT_EQ(id[0], ids[size_t(r)]) << "row " << r;
    EXPECT_EQ(0, std::memcmp(one.data(), batch_l.data() + size_t(r) * V, size_t(V) * 4)) << r;
    EXPECT_GE(ids[size_t(r)], 0);
    EXPECT_LT(ids[size_t(r)], V);
  }
}

// 20000 draws (one row each, counters 0..19999) from 16 logits whose
// order by id is not their order by probability.
std::vector<int32_t> draws16(Backend& be, const SampleRow& proto, std::vector<float>& logits16) {
  const int N = 20000, V = 16;
  std::vector<float> l;
  std::vector<SampleRow> rows;
  for (int r = 0; r < N; ++r) {
    l.insert(l.end(), logits16.begin(), logits16.end());
    SampleRow s = proto;
    s.counter = uint64_t(r);
    rows.push_back(s);
  }
  return gpu_sample(be, l, V, rows);
}

const std::vector<float> kLogits16 = {0.3f,  2.0f, -1.f, 1.2f, 0.f,   -3.f, 1.5f,  0.5f,
                                      -0.2f, 1.0f, -4.f, 0.8f, -1.5f, 0.1f, -0.5f, -2.f};

TEST(CudaSample, FastPathDistribution) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::vector<float> l16 = kLogits16;
  for (const SampleRow& proto :
       {sampled(1.f, 8, 1.f, 0.f, 42, 0), sampled(0.9f, 8, 0.9f, 0.05f, 43, 0)}) {
    const auto ids = draws16(*be, proto, l16);
    const auto kept = cpu_kept(l16, proto);
    expect_distribution(ids, kept, 50.0, 0.015);
    for (size_t r = 0; r < ids.size(); r += 97) {  // and draw by draw, the CPU's walk
      SampleRow s = proto;
      s.counter = r;
      ASSERT_EQ(ids[r], cpu_draw(kept, s)) << r;
    }
  }
}

TEST(CudaSample, GeneralPathDistribution) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  std::vector<float> l16 = kLogits16;
  for (const SampleRow& proto :
       {sampled(1.f, 0, 0.9f, 0.f, 7, 0), sampled(1.f, 0, 1.f, 0.f, 8, 0),
        sampled(0.8f, 0, 1.f, 0.1f, 9, 0), sampled(1.3f, 0, 0.6f, 0.02f, 10, 0),
        sampled(1.f, 2000, 1.f, 0.f, 11, 0)}) {
    const auto ids = draws16(*be, proto, l16);
    expect_distribution(ids, cpu_kept(l16, proto), 50.0, 0.015);
  }
}

// The general path over a full vocabulary: 8 strong tokens spread over the
// row (one in the last chunk of the walk), the rest far below.
TEST(CudaSample, GeneralPathDistributionLargeVocab) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  const int V = 151936, R = 64, calls = 40;
  std::vector<float> one(size_t(V), -30.f);
  const int hot[8] = {3, 4097, 20000, 65536, 70001, 123457, 151000, V - 1};
  for (int j = 0; j < 8; ++j) one[size_t(hot[j])] = 0.4f * float((j * 5) % 8);
  for (const SampleRow& proto :
       {sampled(1.f, 0, 1.f, 0.f, 21, 0), sampled(1.f, 0, 0.8f, 0.f, 22, 0)}) {
    std::vector<int32_t> ids;
    for (int c = 0; c < calls; ++c) {
      std::vector<float> l;
      std::vector<SampleRow> rows;
      for (int r = 0; r < R; ++r) {
        l.insert(l.end(), one.begin(), one.end());
        SampleRow s = proto;
        s.counter = uint64_t(c * R + r);
        rows.push_back(s);
      }
      const auto got = gpu_sample(*be, l, V, rows);
      ids.insert(ids.end(), got.begin(), got.end());
    }
    auto kept = cpu_kept(one, proto);
    if (proto.top_p >= 1.f)  // the cold tokens' mass (1e-8) is never drawn in 2560 draws
      kept.erase(
          std::remove_if(kept.begin(), kept.end(), [](const auto& c) { return c.logit < -20; }),
          kept.end());
    EXPECT_LE(kept.size(), 8u);
    expect_distribution(ids, kept, 40.0, 0.05);
  }
}

// Two plateaus of near-equal logits (200 high, 30000 middle, the rest far
// below): the top-p cut falls inside a crowd of close probabilities, which
// the radix select resolves over several passes. Every draw is in the
// CPU's kept set, and the share of the high plateau is the CPU's.
TEST(CudaSample, GeneralPathPlateaus) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  const int V = 151936, R = 64, calls = 8;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> jitter(0.f, 0.01f);
  std::vector<float> one(static_cast<size_t>(V));
  std::vector<int> group(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) {
    const int h = int((uint32_t(i) * 2654435761u) % 1000u);  // spread over the ids
    group[size_t(i)] = h < 2 ? 0 : h < 200 ? 1 : 2;
    one[size_t(i)] = (group[size_t(i)] == 0   ? 4.f
                      : group[size_t(i)] == 1 ? 0.f
                                              : -8.f) +
                     jitter(rng);
  }
  for (const SampleRow& proto :
       {sampled(1.f, 0, 0.9f, 0.01f, 31, 0), sampled(1.f, 0, 0.97f, 0.f, 32, 0),
        sampled(1.f, 0, 0.5f, 0.f, 33, 0), sampled(1.f, 5000, 0.95f, 0.f, 34, 0)}) {
    const auto kept = cpu_kept(one, proto);
    std::vector<char> in_kept(size_t(V), 0);
    double total = 0, high = 0;
    for (const auto& c : kept) {
      in_kept[size_t(c.id)] = 1;
      total += c.p;
      if (group[size_t(c.id)] == 0) high += c.p;
    }
    int n_high = 0, n = 0;
    for (int c = 0; c < calls; ++c) {
      std::vector<float> l;
      std::vector<SampleRow> rows;
      for (int r = 0; r < R; ++r) {
        l.insert(l.end(), one.begin(), one.end());
        SampleRow s = proto;
        s.counter = uint64_t(c * R + r);
        rows.push_back(s);
      }
      for (int32_t id : gpu_sample(*be, l, V, rows)) {
        ASSERT_TRUE(id >= 0 && id < V && in_kept[size_t(id)])
            << "id " << id << " top_p " << proto.top_p << " kept " << kept.size();
        n_high += group[size_t(id)] == 0;
        ++n;
      }
    }
    EXPECT_NEAR(double(n_high) / n, high / total, 0.08) << "top_p " << proto.top_p;
  }
}

TEST(CudaSample, TinyVocabularies) {
  WICK_REQUIRE_GPU();
  Backend* be = &backend();
  for (int V : {1, 2, 3, 5}) {
    std::vector<float> base = {0.5f, -1.f, 2.f, 2.f, 0.f};
    std::vector<float> l;
    std::vector<SampleRow> rows;
    const SampleRow protos[] = {
        SampleRow{}, sampled(1.f, 0, 1.f, 0.f, 1, 2), sampled(1.f, 2, 0.9f, 0.f, 3, 4),
        sampled(0.5f, 0, 0.5f, 0.1f, 5, 6), sampled(1.f, 1024, 1.f, 0.f, 7, 8)};
    for (const SampleRow& p : protos) {
      l.insert(l.end(), base.begin(), base.begin() + V);
      rows.push_back(p);
    }
    std::vector<float> dev_l = l;
    const auto ids = gpu_sample(*be, dev_l, V, rows);
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto row = row_of(l, V, r);
      if (r == 0) {
        EXPECT_EQ(ids[r], cpu_greedy(row)) << V;
      } else {
        const auto kept = cpu_kept(row, rows[r]);
        EXPECT_TRUE(contains(kept, ids[r])) << "V " << V << " row " << r << " id " << ids[r];
        if (rows[r].top_k > 0) {  // the fast path: the CPU's walk
          EXPECT_EQ(ids[r], cpu_draw(kept, rows[r])) << "V " << V << " row " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace wick::test
