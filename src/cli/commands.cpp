#include "cli/commands.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_limit.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "cli/device_options.h"
#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine/model_runner.h"
#include "engine/model_store.h"
#include "io/error.h"
#include "model/convert.h"
#include "model/forward.h"
#include "model/model.h"

namespace wick::cli {

using json = nlohmann::json;

void apply_env() {
  if (const char* l = std::getenv("WICK_LOG"); l && *l) {  // first: the lines below obey it
    auto level = spdlog::level::from_str(l);
    if (level == spdlog::level::off && std::string(l) != "off")
      throw std::runtime_error(
          fmt::format("WICK_LOG={}: expected trace, debug, info, warn, error or off", l));
    spdlog::set_level(level);
  }
  if (const char* t = std::getenv("WICK_THREADS"); t && *t) {
    char* end = nullptr;
    long n = std::strtol(t, &end, 10);
    if (*end || n < 0 || n > 1024)
      throw std::runtime_error(fmt::format("WICK_THREADS={}: expected a whole number 0..1024", t));
    cpu::set_n_threads(int(n));
  } else {
    cpu::set_n_threads(0);
    if (const auto limit = cpu::process_cpu_limit())
      spdlog::info(
          "{} worker threads: the cgroup's CPU limit is {:.2f} cores (WICK_THREADS sets "
          "the count)",
          cpu::n_threads(), *limit);
  }
  // WICK_ISA checked here, once, so that a bad value is a clear error before any parallel loop
  // (where an exception would end the process) and for every command alike.
  (void)cpu::simd();
}

std::vector<int32_t> parse_int_list(const std::string& s, const std::string& flag,
                                    const char* what) {
  if (s.empty()) throw std::runtime_error(fmt::format("{}: the list is empty", flag));
  std::vector<int32_t> out;
  for (size_t i = 0;;) {  // every item, an empty one ("1,,2", "1,") included
    const size_t j = s.find(',', i);
    const std::string tok = s.substr(i, j == std::string::npos ? j : j - i);
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end || v < 0 || v > INT32_MAX)
      throw std::runtime_error(fmt::format("{}: '{}' is not {}", flag, tok, what));
    out.push_back(int32_t(v));
    if (j == std::string::npos) return out;
    i = j + 1;
  }
}

namespace {

// A batch of one sequence at positions [start, start + n) in a contiguous cache.
Batch one_seq_batch(const int32_t* ids, int64_t n, int64_t start, bool all_logits) {
  Batch b;
  b.block_tables = {{0}};
  for (int64_t i = 0; i < n; ++i) b.add(ids[i], int32_t(start + i), 0, all_logits || i == n - 1);
  return b;
}

std::shared_ptr<const LoadedModel> load_on_device(const std::string& path) {
  return load_model_and_tokenizer(path, {}, backend_options());
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("info", "Show a model's architecture, size, tensor types and tokenizer");
  static std::string path;
  static bool as_json = false;
  cmd->add_option("MODEL", path, "a .gguf file, a HF folder, or a name in the model store")
      ->required();
  cmd->add_flag("--json", as_json, "print JSON");
  cmd->callback([] {
    auto m = load_model(resolve_model(path));
    const ModelConfig& c = m->config;
    json types = json::object();
    for (auto& [t, n] : m->n_params_by_dtype) types[t] = n;
    json j = {{"path", path},
              {"format", m->format == ModelFormat::Gguf ? "gguf" : "hf"},
              {"architecture", arch_name(c.arch)},
              {"n_params", m->n_params},
              {"tensor_types", types},
              {"context_length", c.n_ctx_train},
              {"n_vocab", c.n_vocab},
              {"n_embd", c.n_embd},
              {"n_layer", c.n_layer},
              {"n_head", c.n_head},
              {"n_head_kv", c.n_head_kv},
              {"head_dim", c.head_dim},
              {"n_ff", c.n_ff},
              {"n_expert", c.n_expert},
              {"n_expert_used", c.n_expert_used},
              {"rope_theta", c.rope_theta},
              {"rope_type", c.rope_type},
              {"sliding_window", c.sliding_window},
              {"tied_embeddings", c.tie_embeddings},
              {"tokenizer", m->tokenizer_kind}};
    if (c.rope_type == "yarn") {
      j["rope_scale"] = c.rope_scale;
      j["rope_original_context"] = c.rope_orig_ctx;
      j["rope_attention_factor"] = c.rope_attn_factor;
    } else if (c.rope_type == "linear") {
      j["rope_scale"] = c.rope_scale;
    }
    if (is_granite(c.arch))  // 0: 1 / sqrt(head_dim)
      j["multipliers"] = {{"embedding", c.embd_scale},
                          {"residual", c.resid_scale},
                          {"attention", c.attn_scale},
                          {"logits_divisor", c.logit_scale}};
    if (as_json) {
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("model         {}\n", path);
    fmt::print("format        {}\n", j["format"].get<std::string>());
    fmt::print("architecture  {}\n", arch_name(c.arch));
    fmt::print("parameters    {} ({:.1f} M)\n", m->n_params, double(m->n_params) / 1e6);
    std::string ts;
    for (auto& [t, n] : m->n_params_by_dtype)
      ts += fmt::format("{}{}: {}", ts.empty() ? "" : ", ", t, n);
    fmt::print("tensor types  {}\n", ts);
    fmt::print("context       {}\n", c.n_ctx_train);
    fmt::print("shape         vocab {} · embd {} · layers {} · heads {}/{} · head_dim {} · ff {}\n",
               c.n_vocab, c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff);
    if (c.is_moe())
      fmt::print("experts       {} ({} per token, ff {})\n", c.n_expert, c.n_expert_used,
                 c.n_ff_expert);
    fmt::print("rope          theta {} · {}", c.rope_theta, c.rope_type);
    if (c.rope_type == "yarn")
      fmt::print(" · x{} of {} · attention factor {:.4f}", c.rope_scale, c.rope_orig_ctx,
                 c.rope_attn_factor);
    else if (c.rope_type == "linear")
      fmt::print(" · x{}", c.rope_scale);
    fmt::print("\n");
    if (c.sliding_window) fmt::print("window        {}\n", c.sliding_window);
    if (is_granite(c.arch))
      fmt::print("multipliers   embeddings x{} · residual x{} · attention x{} · logits /{}\n",
                 c.embd_scale, c.resid_scale, c.attn_scale, c.logit_scale);
    fmt::print("tokenizer     {}\n", m->tokenizer_kind);
  });
}

namespace {

// rows x n float32 values as a NumPy .npy file (format 1.0: magic, version, a
// little-endian header length, then a Python dict literal padded with spaces
// to a multiple of 64 bytes and a newline). Throws where the file cannot be
// written whole, and leaves no partial file.
void write_npy(const std::string& file, const float* v, int64_t rows, int64_t n, bool matrix) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
      (matrix ? std::to_string(rows) + ", " + std::to_string(n) + ")" : std::to_string(n) + ",)") +
      ", }";
  const size_t prefix = 10;  // magic (6), version (2), header length (2)
  header.append(64 - (prefix + header.size() + 1) % 64, ' ');
  header += '\n';
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (!f) throw std::runtime_error(fmt::format("--npy: cannot write {}", file));
  const unsigned char head[10] = {0x93,
                                  'N',
                                  'U',
                                  'M',
                                  'P',
                                  'Y',
                                  1,
                                  0,
                                  static_cast<unsigned char>(header.size() & 0xff),
                                  static_cast<unsigned char>(header.size() >> 8)};
  const size_t count = size_t(rows * n);
  bool ok = std::fwrite(head, 1, sizeof head, f) == sizeof head &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(v, sizeof(float), count, f) == count;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::error_code ec;  // (a regular file only: never /dev/full or a pipe)
    if (std::filesystem::is_regular_file(file, ec)) std::filesystem::remove(file, ec);
    throw std::runtime_error(fmt::format("--npy: writing {} failed (disk full?)", file));
  }
}

}  // namespace

void register_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Print the logits of a token sequence (for tests)");
  static std::string path, ids_str, npy;
  static bool all = false, as_json = false;
  cmd->add_option("MODEL", path, "a .gguf file, a HF folder, or a name in the model store")
      ->required();
  cmd->add_option("--ids", ids_str, "comma-separated token ids")->required();
  cmd->add_flag("--all", all, "logits at every position (a list of rows)");
  cmd->add_flag("--json", as_json, "print JSON (the only output format)");
  cmd->add_option("--npy", npy,
                  "write the logits to this file as float32 NumPy .npy ([rows, n_vocab] with "
                  "--all, else [n_vocab]; the JSON then has no logits): exact and ~100x quicker "
                  "to read than JSON");
  add_device_options(cmd);
  cmd->callback([] {
    auto ids = parse_int_list(ids_str, "--ids", "a token id");
    auto m = load_on_device(path);
    const ModelConfig& c = m->config();
    const int64_t n = int64_t(ids.size());
    ModelRunner runner(m, 1, n);
    Batch b = one_seq_batch(ids.data(), n, 0, all);
    std::span<float> logits = runner.execute(b);
    json out = {{"n_vocab", c.n_vocab}};
    if (!npy.empty()) {
      const int64_t rows = all ? int64_t(b.logit_rows.size()) : 1;
      write_npy(npy, logits.data(), rows, c.n_vocab, all);
      out["rows"] = rows;
      out["npy"] = npy;
      fmt::print("{}\n", out.dump());
      return;
    }
    auto row = [&](size_t r) {
      return std::vector<float>(logits.begin() + long(r * c.n_vocab),
                                logits.begin() + long((r + 1) * c.n_vocab));
    };
    if (all) {
      json rows = json::array();
      for (size_t r = 0; r < b.logit_rows.size(); ++r) rows.push_back(row(r));
      out["logits"] = rows;
    } else {
      out["logits"] = row(0);
    }
    fmt::print("{}\n", out.dump());
  });
}

namespace {

std::vector<int32_t> random_ids(std::mt19937& rng, int64_t n_vocab, int n) {
  std::uniform_int_distribution<int32_t> tok(0, int32_t(n_vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = tok(rng);
  return ids;
}

// N sequences at once through the engine, as llama-batched-bench measures:
// generated tok/s and total (prompt + generated) tok/s over the wall time.
// max_batch_tokens: the engine's tokens a step (0: the engine's default).
json run_parallel(const std::shared_ptr<const LoadedModel>& m, std::mt19937& rng, int n_seq,
                  int max_batch_tokens, int n_prompt, int n_gen) {
  EngineConfig cfg = EngineConfig::from_env();
  cfg.n_blocks = n_seq * ((n_prompt + n_gen) / cfg.block_size + 2);
  cfg.max_seqs = std::max(cfg.max_seqs, n_seq);
  if (max_batch_tokens > 0) cfg.max_batch_tokens = max_batch_tokens;
  Engine e(m, cfg);
  double last_first_ms = 0;  // when the last sequence got its first token
  for (int i = 0; i < n_seq; ++i) {
    GenerateRequest r;
    r.prompt = random_ids(rng, m->model->config.n_vocab, n_prompt);
    r.sampling = SamplingParams::greedy();
    r.max_tokens = n_gen;
    r.ignore_eos = true;
    e.add_request(r, {nullptr, [&](const GenerateResult& res) {
                        last_first_ms = std::max(last_first_ms, res.ttft_ms);
                      }});
  }
  auto t0 = std::chrono::steady_clock::now();
  e.run_until_idle();
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // the generation phase alone (as llama-batched-bench's S_TG): tokens after
  // each sequence's first, over the time after the last first token
  const double t_gen = t - last_first_ms / 1e3;
  return {{"test", "parallel"},
          {"sequences", n_seq},
          {"n_prompt", n_prompt},
          {"n_gen", n_gen},
          {"max_batch_tokens", e.config().max_batch_tokens},
          {"seconds", t},
          {"generated_tok_s", double(n_seq) * n_gen / t},
          {"generation_phase_tok_s", t_gen > 0 ? double(n_seq) * (n_gen - 1) / t_gen : 0},
          {"total_tok_s", double(n_seq) * (n_prompt + n_gen) / t},
          {"preemptions", e.n_preemptions()}};
}

// run_parallel for each count, at each of the budgets (0: the engine's default).
void bench_parallel(const std::shared_ptr<const LoadedModel>& m, const std::vector<int>& ns,
                    const std::vector<int>& budgets, int n_prompt, int n_gen, bool as_json,
                    nlohmann::json& results) {
  std::mt19937 rng(7);
  if (!as_json)
    fmt::print(
        "| sequences | prompt | gen | step tokens | time s | generated tok/s | generation phase "
        "tok/s | total tok/s | preemptions |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int n_seq : ns) {
    const std::mt19937 at_count = rng;  // the same prompts at every budget
    for (int budget : budgets) {
      rng = at_count;
      const json r = run_parallel(m, rng, n_seq, budget, n_prompt, n_gen);
      results.push_back(r);
      if (!as_json)
        fmt::print("| {} | {} | {} | {} | {:.2f} | {:.1f} | {:.1f} | {:.1f} | {} |\n", n_seq,
                   n_prompt, n_gen, r["max_batch_tokens"].get<int>(), r["seconds"].get<double>(),
                   r["generated_tok_s"].get<double>(), r["generation_phase_tok_s"].get<double>(),
                   r["total_tok_s"].get<double>(), r["preemptions"].get<uint64_t>());
    }
  }
}

// TTFT of a request whose prefix of n_prefix tokens is cached, against a cold one.
void bench_prefix_ttft(const std::shared_ptr<const LoadedModel>& m, int n_prefix, bool as_json,
                       nlohmann::json& results) {
  std::mt19937 rng(11);
  auto prefix = random_ids(rng, m->model->config.n_vocab, n_prefix);
  auto request = [&](int salt) {
    GenerateRequest r;
    r.prompt = prefix;
    auto tail = random_ids(rng, m->model->config.n_vocab, 16 + salt);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.sampling = SamplingParams::greedy();
    r.max_tokens = 1;
    return r;
  };
  auto ttft = [&](Engine& e, const GenerateRequest& r) {
    double v = 0;
    e.add_request(r, {nullptr, [&](const GenerateResult& res) { v = res.ttft_ms; }});
    e.run_until_idle();
    return v;
  };
  EngineConfig cfg = EngineConfig::from_env();
  cfg.n_blocks = 2 * (n_prefix / cfg.block_size + 4);
  cfg.max_batch_tokens = std::max(cfg.max_batch_tokens, n_prefix + 64);
  cfg.n_ctx = n_prefix + 128;
  Engine cold_engine(m, cfg);
  const double cold = ttft(cold_engine, request(0));
  Engine warm_engine(m, cfg);
  ttft(warm_engine, request(1));  // caches the prefix
  const double warm = ttft(warm_engine, request(2));
  results.push_back({{"test", "prefix_ttft"},
                     {"n_prefix", n_prefix},
                     {"cold_ms", cold},
                     {"cached_ms", warm},
                     {"ratio", warm / cold},
                     {"hit_rate", warm_engine.blocks().hit_rate()}});
  if (!as_json)
    fmt::print(
        "| TTFT, {}-token prefix | cold {:.1f} ms | cached {:.1f} ms | cached/cold {:.3f} |\n",
        n_prefix, cold, warm, warm / cold);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench",
                                 "Measure prefill (pp) and decode (tg) speed as llama-bench does, "
                                 "batched throughput, and prefix-cache TTFT");
  static std::string path, parallel;
  static std::string prompts = "512";
  static int n_gen = 128, reps = 3, prefix_ttft = 0, depth = 0;
  static std::string batch_tokens;
  static bool as_json = false;
  cmd->add_option("MODEL", path, "a .gguf file, a HF folder, or a name in the model store")
      ->required();
  cmd->add_option("-p,--n-prompt", prompts,
                  "prompt tokens for pp; a list (512,1024,4096) runs each (0 = skip; default 512)");
  cmd->add_option("-n,--n-gen", n_gen, "generated tokens for tg (0 = skip)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-d,--n-depth", depth,
                  "pp and tg start after this many context tokens (prefilled once), as "
                  "llama-bench -d")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-r,--repetitions", reps, "timed repetitions (after one warm-up)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--parallel", parallel,
                  "instead: throughput of N concurrent sequences (list, e.g. 1,8,32) with -p "
                  "prompt and -n generated tokens each");
  cmd->add_option("--max-batch-tokens", batch_tokens,
                  "with --parallel: the engine's tokens a step, decodes and prefill chunks; a "
                  "list (512,2048) runs each (default 512, as wick serve)");
  cmd->add_option("--prefix-ttft", prefix_ttft,
                  "instead: TTFT with this many prefix tokens cached, against cold")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", as_json, "print JSON");
  add_device_options(cmd);
  cmd->callback([] {
    std::vector<int> pp_sizes;
    for (auto& n :
         prompts == "0" ? std::vector<int32_t>{} : parse_int_list(prompts, "-p", "a prompt size"))
      pp_sizes.push_back(n <= (1 << 20) ? n : throw std::runtime_error("-p: at most 1048576"));
    const int n_prompt = pp_sizes.empty() ? 0 : pp_sizes.front();
    // the lists before the model, so that a typo fails at once
    std::vector<int> ns;
    for (auto& id : parallel.empty() ? std::vector<int32_t>{}
                                     : parse_int_list(parallel, "--parallel", "a count"))
      ns.push_back(id > 0 ? id : throw std::runtime_error("--parallel: counts must be positive"));
    std::vector<int> budgets{0};
    if (!batch_tokens.empty()) budgets.clear();
    for (auto& n : batch_tokens.empty()
                       ? std::vector<int32_t>{}
                       : parse_int_list(batch_tokens, "--max-batch-tokens", "a token count"))
      budgets.push_back(n > 0 && n <= (1 << 20)
                            ? n
                            : throw std::runtime_error("--max-batch-tokens: 1 to 1048576"));
    if (!ns.empty() || prefix_ttft > 0) {
      auto m = ModelPool::global().get(path);
      json results = json::array();
      if (!ns.empty()) bench_parallel(m, ns, budgets, n_prompt, n_gen, as_json, results);
      if (prefix_ttft > 0) bench_prefix_ttft(m, prefix_ttft, as_json, results);
      if (as_json)
        fmt::print(
            "{}\n",
            json{{"model", path}, {"threads", cpu::n_threads()}, {"results", results}}.dump(2));
      return;
    }
    const auto t_load = std::chrono::steady_clock::now();
    auto lm = load_on_device(path);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    spdlog::info("{}: loaded in {:.2f} s", path, load_s);
    const Model* m = lm->model.get();
    const ModelConfig& c = m->config;
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> tok(0, int32_t(c.n_vocab - 1));
    const int max_pp = pp_sizes.empty() ? 0 : *std::max_element(pp_sizes.begin(), pp_sizes.end());
    const int32_t n_ctx = depth + std::max(max_pp, n_gen) + 1;
    // one block of n_ctx tokens; a fixed table width lets a GPU replay decode steps
    ModelRunner runner(lm, RunnerLimits{1, n_ctx, n_ctx, std::max({1, max_pp, depth}), 1});
    using clk = std::chrono::steady_clock;
    int pp_n = 0, pp_at = 0;
    auto run_pp = [&] {
      std::vector<int32_t> ids(static_cast<size_t>(pp_n));
      for (auto& x : ids) x = tok(rng);
      // after the depth's context (each run rewrites the same slots)
      Batch b = one_seq_batch(ids.data(), pp_n, pp_at, false);
      auto t0 = clk::now();
      runner.execute(b);
      lm->backend().sync();
      return std::chrono::duration<double>(clk::now() - t0).count();
    };
    auto run_tg = [&] {
      int32_t id = tok(rng);
      const SampleRow greedy;  // temperature 0
      auto t0 = clk::now();
      for (int i = 0; i < n_gen; ++i) {
        Batch b = one_seq_batch(&id, 1, depth + i, true);
        if (runner.can_sample()) {  // on the device: only the id comes back
          runner.run(b);
          runner.sample({&greedy, 1}, {}, &id);
          continue;
        }
        std::span<float> logits = runner.execute(b);
        id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      return std::chrono::duration<double>(clk::now() - t0).count();
    };
    auto measure = [&](auto fn, int n_tok) {
      fn();  // warm-up
      std::vector<double> rates;
      for (int r = 0; r < reps; ++r) rates.push_back(n_tok / fn());
      double mean = 0, var = 0;
      for (double x : rates) mean += x / reps;
      for (double x : rates) var += (x - mean) * (x - mean) / reps;
      return std::pair{mean, std::sqrt(var)};
    };
    json results = json::array();
    std::string types;
    for (auto& [t, n] : m->n_params_by_dtype) types += (types.empty() ? "" : "+") + t;
    if (!as_json)
      fmt::print(
          "| model | arch | types | params | threads | backend | test | t/s "
          "|\n|---|---|---|---|---|---|---|---|\n");
    auto report = [&](const std::string& test, std::pair<double, double> r) {
      results.push_back({{"test", test}, {"tok_s", r.first}, {"stddev", r.second}});
      if (!as_json)
        fmt::print("| {} | {} | {} | {:.1f}M | {} | {} | {} | {:.2f} ± {:.2f} |\n", path,
                   arch_name(c.arch), types, double(m->n_params) / 1e6, cpu::n_threads(),
                   lm->backend().name(), test, r.first, r.second);
    };
    if (depth > 0) {  // the context pp and tg read: depth tokens, prefilled once
      pp_n = depth;
      run_pp();
      pp_at = depth;
    }
    const std::string at = depth > 0 ? fmt::format(" @ d{}", depth) : "";
    for (int n : pp_sizes) {
      pp_n = n;
      report(fmt::format("pp{}{}", n, at), measure(run_pp, n));
    }
    if (n_gen > 0) report(fmt::format("tg{}{}", n_gen, at), measure(run_tg, n_gen));
    if (as_json)
      fmt::print("{}\n", json{{"model", path},
                              {"threads", cpu::n_threads()},
                              {"isa", cpu::simd().isa},
                              {"backend", lm->backend().name()},
                              {"load_s", load_s},
                              {"results", results}}
                             .dump(2));
  });
}

void register_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert",
      "Convert a HF folder to a GGUF file (llama.cpp naming), or a GGUF file to another type");
  static std::string src, dst, type = "f16";
  cmd->add_option("SRC", src,
                  "HF folder (config.json + safetensors: f32, f16, bf16, or FP8 with its scales), "
                  "or a .gguf file (its matrices "
                  "dequantized and written as --type; metadata and tokenizer kept)")
      ->required();
  cmd->add_option("OUT", dst, "output .gguf path (written whole or not at all)")->required();
  cmd->add_option("--type", type, "f32, f16, bf16 or q8_0")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd->callback([] {
    if (std::filesystem::is_directory(src))
      convert_hf_to_gguf(src, dst, *dtype_from_name(type));
    else
      convert_gguf(src, dst, *dtype_from_name(type));
    spdlog::info("wrote {}", dst);
  });
}

}  // namespace wick::cli
