// LoRA adapters on the GPU (lora.cu): an adapter applied at load against
// PEFT's merged reference (--gpu-f32) and against what it changes on the CPU
// (bf16); named adapters batched together, recorded as graphs, each with
// the bits of a model that applies that adapter to every row; adapters
// added and removed while the engine serves.
// Fixtures: tests/python/make_lora_fixtures.py (build/testdata/lora, or
// WICK_TEST_DATA_DIR/lora on a GPU machine).
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine/runtime_lora.h"
#include "engine/session.h"
#include "engine_run.h"
#include "gpu/gpu_helpers.h"
#include "helpers.h"
#include "model/lora.h"

namespace wick::test {
namespace {

using Named = std::vector<std::pair<std::string, std::string>>;

std::string gpu_lora_dir() {
  return data_dir() + "/lora";
}

#define WICK_REQUIRE_GPU_LORA_FIXTURES()                                                           \
  do {                                                                                             \
    if (!std::filesystem::exists(gpu_lora_dir() + "/ids.json"))                                    \
      WICK_SKIP_OR_FAIL("lora fixtures missing at "                                                \
                        << gpu_lora_dir() << " (ctest runs setup.lora_fixtures; on a GPU "         \
                        << "machine scripts/gpu_check sets WICK_TEST_DATA_DIR to .gpu/testdata)"); \
  } while (0)

std::shared_ptr<const LoadedModel> gpu_lora_model(
    bool gpu_f32, const std::vector<std::pair<std::string, float>>& lora, Named named = {}) {
  BackendOptions opt = cuda_opts(gpu_f32);
  opt.lora = lora;
  opt.lora_modules = std::move(named);
  return load_model_at("tiny-llama", tiny_dir("llama"), {}, opt);
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// A host matrix of random values in f32 or f16 (the values then f16 ones).
struct HostMatrix {
  std::vector<float> values;  // as the weight holds them
  std::vector<uint8_t> bytes;
  Weight w;
  HostMatrix(DType t, int64_t n_out, int64_t n_in, std::mt19937& rng, float scale) {
    values = randn(size_t(n_out * n_in), rng, scale);
    if (t == DType::F16) {
      bytes.resize(values.size() * 2);
      auto* h = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < values.size(); ++i) {
        h[i] = f32_to_f16(values[i]);
        values[i] = f16_to_f32(h[i]);
      }
    } else {
      bytes.resize(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
    }
    w = Weight{t, n_out, n_in, bytes.data()};
  }
};

// The kernels alone (lora.cu through CudaBackend::matmul): three terms on one
// weight, one for every row and two named ones, f16 and f32 matrices, rows of
// four adapters in one batch, against a float64 reference; a row's bits do
// not depend on its batch; without adapter rows only the every-row term adds.
TEST(LoraOnGpu, TermsMatchAFloat64Reference) {
  WICK_REQUIRE_GPU();
  const int64_t n_in = 200, n_out = 300, n_rows = 70;
  struct TermSpec {
    DType a, b;
    int64_t rank;
    int32_t adapter;
  };
  const TermSpec specs[3] = {{DType::F16, DType::F32, 8, 0},
                             {DType::F32, DType::F16, 16, 2},
                             {DType::F32, DType::F32, 4, 3}};
  for (bool f32 : {true, false}) {
    SCOPED_TRACE(f32 ? "gpu-f32" : "bf16");
    auto be = cuda_backend(f32);
    std::mt19937 rng(7);
    HostMatrix base(DType::F32, n_out, n_in, rng, 0.05f);
    std::vector<HostMatrix> as, bs;
    std::vector<std::vector<float>> scales;
    std::vector<LoraDelta> terms(3);
    for (int k = 0; k < 3; ++k) {
      const TermSpec& t = specs[k];
      as.emplace_back(t.a, t.rank, n_in, rng, 0.1f);
      bs.emplace_back(t.b, n_out, t.rank, rng, 0.1f);
      scales.push_back(randn(size_t(t.rank), rng, 1.f));
    }
    for (int k = 0; k < 3; ++k) {
      const Weight sc{DType::F32, 1, specs[k].rank, scales[size_t(k)].data()};
      terms[size_t(k)] =
          LoraDelta{be->prepare_matrix(as[size_t(k)].w), be->prepare_matrix(bs[size_t(k)].w),
                    be->prepare_vector(sc), specs[k].adapter};
      if (k) terms[size_t(k - 1)].next = &terms[size_t(k)];
    }
    Weight w = be->prepare_matrix(base.w);
    w.lora = &terms[0];
    be->lora_changed(w);
    auto x = randn(size_t(n_rows * n_in), rng);
    std::vector<int32_t> adapter_of(static_cast<size_t>(n_rows));
    for (int64_t r = 0; r < n_rows; ++r) adapter_of[size_t(r)] = int32_t(r % 4);
    Buffer dx = to_device(*be, x.data(), x.size() * 4);
    Buffer da = to_device(*be, adapter_of.data(), adapter_of.size() * 4);
    Buffer dy = be->alloc(size_t(n_rows * n_out) * 4);
    auto run = [&](const int32_t* rows_adapters, int64_t first, int64_t m) {
      be->set_adapter_rows(rows_adapters, rows_adapters ? m : 0);
      be->matmul(w, dx.as<float>() + first * n_in, m, dy.as<float>());
      be->set_adapter_rows(nullptr, 0);
      return to_host<float>(*be, dy, size_t(m * n_out));
    };
    for (bool with_rows : {true, false}) {
      const auto y = run(with_rows ? da.as<int32_t>() : nullptr, 0, n_rows);
      double worst = 0;
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t o = 0; o < n_out; ++o) {
          double ref = 0, mag = 0;
          for (int64_t i = 0; i < n_in; ++i) {
            const double p = double(base.values[size_t(o * n_in + i)]) * x[size_t(r * n_in + i)];
            ref += p;
            mag += std::fabs(p);
          }
          for (int k = 0; k < 3; ++k) {
            const int32_t ad = specs[k].adapter;
            if (ad != 0 && (!with_rows || adapter_of[size_t(r)] != ad)) continue;
            const int64_t rank = specs[k].rank;
            for (int64_t j = 0; j < rank; ++j) {
              double t = 0, tmag = 0;
              for (int64_t i = 0; i < n_in; ++i) {
                const double p =
                    double(as[size_t(k)].values[size_t(j * n_in + i)]) * x[size_t(r * n_in + i)];
                t += p;
                tmag += std::fabs(p);
              }
              const double bj =
                  double(bs[size_t(k)].values[size_t(o * rank + j)]) * scales[size_t(k)][size_t(j)];
              ref += bj * t;
              mag += std::fabs(bj) * tmag;
            }
          }
          const double err = std::fabs(y[size_t(r * n_out + o)] - ref) / (mag + 1e-30);
          worst = std::max(worst, err);
          ASSERT_LE(err, f32 ? 1e-5 : 8e-3)
              << "row " << r << " (adapter " << adapter_of[size_t(r)] << ") col " << o << " gpu "
              << y[size_t(r * n_out + o)] << " ref " << ref << (with_rows ? "" : ", no rows");
        }
      std::printf("[ report ] LoRA kernels %s%s: worst error %.2e of sum |w x|\n",
                  f32 ? "gpu-f32" : "bf16", with_rows ? "" : " (no adapter rows)", worst);
    }
    // batch invariance: rows 50.. alone or 16 together have the bits of the 70-row batch
    const auto all = run(da.as<int32_t>(), 0, n_rows);
    for (int64_t m : {1, 3, 16}) {
      const auto part = run(da.as<int32_t>() + 50, 50, m);
      for (int64_t i = 0; i < m * n_out; ++i)
        ASSERT_EQ(part[size_t(i)], all[size_t(50 * n_out + i)]) << m << " rows differ from 70";
    }
    w.lora = nullptr;
    be->lora_changed(w);
  }
}

TEST(LoraOnGpu, AdapterAtLoadMatchesTheCpu) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  WICK_REQUIRE_GPU_LORA_FIXTURES();
  const auto ids = read_json(gpu_lora_dir() + "/ids.json").get<std::vector<int32_t>>();
  const std::string one = gpu_lora_dir() + "/llama/peft",
                    rs = gpu_lora_dir() + "/llama/peft-rslora";
  // --gpu-f32: PEFT's merged reference (numpy, float64), one adapter and two stacked
  struct Case {
    std::vector<std::pair<std::string, float>> lora;
    const char* ref;
  };
  for (const Case& c :
       {Case{{{one, 1.f}}, "ref_one.f32"}, Case{{{one, 1.f}, {rs, 0.5f}}, "ref_both.f32"},
        Case{{{gpu_lora_dir() + "/llama/peft-f16", 1.f}}, "ref_f16.f32"}}) {
    const auto want = read_f32(gpu_lora_dir() + "/llama/" + c.ref);
    auto m = load_model(tiny_dir("llama"));
    apply_lora(*m, c.lora);
    auto dm = prepare_model(*m, make_backend(cuda_opts(true)));
    for (int64_t chunk : {0, 7}) {
      const double err =
          rel_err(run_all_logits(*dm->backend, m->config, dm->weights, ids, chunk), want);
      std::printf("[ report ] gpu-f32 LoRA %s, chunk %lld: relative error %.2e\n", c.ref,
                  (long long)chunk, err);
      EXPECT_LT(err, 1e-4) << c.ref << " chunk " << chunk;
    }
  }
  // bf16: what the adapter changes on the GPU against what it changes on the CPU
  auto plain = load_model(tiny_dir("llama"));
  auto adapted = load_model(tiny_dir("llama"));
  const std::vector<std::pair<std::string, float>> just_one{{one, 1.f}};
  apply_lora(*adapted, just_one);
  const auto cpu_delta = minus(run_all_logits(*adapted, ids), run_all_logits(*plain, ids));
  auto gl = prepare_model(*adapted, make_backend(cuda_opts(false)));
  auto gp = prepare_model(*plain, make_backend(cuda_opts(false)));
  const auto gpu_delta = minus(run_all_logits(*gl->backend, adapted->config, gl->weights, ids, 0),
                               run_all_logits(*gp->backend, plain->config, gp->weights, ids, 0));
  const double err = rel_err(gpu_delta, cpu_delta);
  std::printf("[ report ] bf16 LoRA: the adapter's change to the logits, GPU against CPU: %.2e\n",
              err);
  EXPECT_LT(err, 0.1);
}

// Requests choosing two named adapters, or none, in one engine on the GPU,
// long enough for decode steps to be recorded and replayed as graphs
// (bf16 with decode graphs, and --gpu-f32) each give the bits of a model
// that applies its adapter to every row, run alone.
TEST(LoraOnGpu, NamedAdaptersInOneBatchEqualEachAlone) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  WICK_REQUIRE_GPU_LORA_FIXTURES();
  const std::string one = gpu_lora_dir() + "/llama/peft",
                    rs = gpu_lora_dir() + "/llama/peft-rslora";
  const auto reqs = adapter_requests(21, 9, 12, 12);
  for (bool f32 : {false, true}) {
    SCOPED_TRACE(f32 ? "gpu-f32" : "bf16");
    auto named = gpu_lora_model(f32, {}, {{"one", one}, {"rs", rs}});
    std::shared_ptr<const LoadedModel> alone[3] = {gpu_lora_model(f32, {}),
                                                   gpu_lora_model(f32, {{one, 1.f}}),
                                                   gpu_lora_model(f32, {{rs, 1.f}})};
    EngineConfig cfg;
    cfg.max_batch_tokens = 48;
    cfg.max_seqs = 5;
    cfg.n_blocks = 256;
    Engine e(named, cfg);
    const auto got = expect_batched_equal_alone(e, reqs, alone);
    EXPECT_NE(got[1].first_logits, got[0].first_logits);
    if (!f32) continue;
    // and near the CPU's
    BackendOptions cpu;
    cpu.device = Device::Cpu;
    cpu.lora_modules = {{"one", one}, {"rs", rs}};
    Engine on_cpu(load_model_at("tiny-llama", tiny_dir("llama"), {}, cpu), cfg);
    const auto want = run_engine(on_cpu, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_LT(rel_err(got[i].first_logits, want[i].first_logits), 1e-4) << "request " << i;
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    }
  }
}

// vLLM's runtime adapters on the GPU: an adapter added while decode steps
// with the others are recorded as graphs answers as one loaded at start
// (the recorded steps are dropped with the old term tables); removed, its
// terms and device memory go and the others keep their bits.
TEST(LoraOnGpu, AddedAndRemovedWhileServingEqualsLoadedAtStart) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  WICK_REQUIRE_GPU_LORA_FIXTURES();
  const std::string one = gpu_lora_dir() + "/llama/peft",
                    rs = gpu_lora_dir() + "/llama/peft-rslora";
  auto at_start = gpu_lora_model(false, {}, {{"one", one}, {"rs", rs}});
  auto serving = gpu_lora_model(false, {}, {{"one", one}});
  const auto reqs = adapter_requests(22, 9, 12, 12);
  std::vector<GenerateRequest> rest;
  std::vector<size_t> at;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (reqs[i].adapter != 2) rest.push_back(reqs[i]), at.push_back(i);
  EngineConfig cfg;
  cfg.max_batch_tokens = 48;
  cfg.max_seqs = 5;
  cfg.n_blocks = 256;
  Engine e(serving, cfg), start(at_start, cfg);
  const auto want = run_engine(start, reqs);
  const auto before = run_engine(e, rest);  // records decode graphs with adapter 1's rows
  for (size_t i = 0; i < rest.size(); ++i) expect_same_result(before[i], want[at[i]], at[i]);

  const size_t n_terms = serving->device->lora.size();
  add_serving_adapter(*serving, "rs", rs, 2);
  EXPECT_GT(serving->device->lora.size(), n_terms);
  const auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) expect_same_result(got[i], want[i], i);

  Backend& be = *serving->device->backend;
  const size_t free_with = be.kv_budget();
  remove_serving_adapter(*serving, 2);
  EXPECT_EQ(serving->device->lora.size(), n_terms);
  EXPECT_GT(be.kv_budget(), free_with) << "the removed adapter's device memory was kept";
  const auto kept = run_engine(e, rest);
  for (size_t i = 0; i < rest.size(); ++i) expect_same_result(kept[i], want[at[i]], at[i]);
}

}  // namespace
}  // namespace wick::test
