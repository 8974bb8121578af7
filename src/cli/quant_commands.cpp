// wick quantize and wick perplexity: writing a model at another type, and
// measuring what a type costs in quality.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/device_options.h"
#include "engine/model_store.h"
#include "engine/perplexity.h"
#include "io/error.h"
#include "model/convert.h"
#include "text/tokenizer.h"

namespace wick::cli {

using json = nlohmann::json;

namespace {

// "[#####     ]  45%" on a terminal, redrawn in place.
std::string bar(double fraction) {
  const int n = 30, full = int(fraction * n + 0.5);
  return fmt::format("[{}{}] {:3.0f}%", std::string(size_t(full), '#'),
                     std::string(size_t(n - full), ' '), fraction * 100);
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "quantize", "Write a model (HF folder or GGUF of any type) as a GGUF file of another type");
  static std::string src, dst, type;
  static LoraFlags lora;
  cmd->add_option("IN", src,
                  "HF folder (config.json + safetensors; FP8 ones dequantized first) or .gguf file "
                  "(dequantized first), or a "
                  "name in the model store")
      ->required();
  cmd->add_option("OUT", dst, "output .gguf path (written to a temporary file, then renamed)")
      ->required();
  cmd->add_option(
         "--type", type,
         fmt::format("{} (mixes and kept tensors: see docs/quantize.md)", quant_plan_names()))
      ->required();
  add_lora_options(cmd, lora,
                   "merge a LoRA adapter into the weights it adapts (llama.cpp's export-lora)");
  cmd->callback([] {
    const auto adapters = lora.adapters();
    auto plan = quant_plan_from_name(type);
    if (!plan)
      throw std::runtime_error(
          fmt::format("--type {}: not a type wick writes ({})", type, quant_plan_names()));
    // A file-size limit then fails the write with EFBIG (reported, no file
    // left) instead of killing the process mid-file.
    std::signal(SIGXFSZ, SIG_IGN);
    const std::string in = std::filesystem::exists(src) ? src : resolve_model(src);
    const bool tty = isatty(STDERR_FILENO);
    const auto t0 = std::chrono::steady_clock::now();
    ConvertProgress progress = [tty](double f, const std::string& name) {
      if (tty) fmt::print(stderr, "\r\033[Kquantizing {} {}", bar(f), name);
    };
    if (std::filesystem::is_directory(in))
      convert_hf_to_gguf(in, dst, *plan, progress, adapters);
    else
      convert_gguf(in, dst, *plan, progress, adapters);
    if (tty) fmt::print(stderr, "\r\033[K");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("wrote {} ({}, {:.1f} MiB) in {:.1f} s", dst, type,
                 double(std::filesystem::file_size(dst)) / (1 << 20), s);
  });
}

void register_perplexity(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity of a model on a text file, as llama-perplexity computes it (and the KL "
      "divergence from a base model)");
  static std::string model, text_path, base_path;
  static PerplexityOptions opt;
  static bool as_json = false;
  cmd->add_option("MODEL", model, "a .gguf file, a HF folder, or a name in the model store")
      ->required();
  cmd->add_option("TEXTFILE", text_path, "UTF-8 text to score")->required();
  cmd->add_option("--ctx", opt.n_ctx, "window length in tokens; the second half is scored")
      ->capture_default_str()
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_option("--chunks", opt.n_chunks, "windows to score (default: all that fit)")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--kl-divergence", base_path,
                  "BASE model: also the KL divergence of MODEL from BASE and how often their top "
                  "tokens agree, on the same windows");
  cmd->add_flag("--json", as_json, "print the result as JSON");
  add_device_options(cmd);
  cmd->callback([] {
    std::ifstream f(text_path, std::ios::binary);
    if (!f) throw std::runtime_error(fmt::format("{}: cannot read", text_path));
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();

    const auto t0 = std::chrono::steady_clock::now();
    auto m = load_model_and_tokenizer(model, {}, backend_options());
    std::shared_ptr<const LoadedModel> base;
    if (!base_path.empty()) {  // the adapters are the model's, not the base's
      BackendOptions bo = backend_options();
      bo.lora.clear();
      base = load_model_and_tokenizer(base_path, {}, bo);
    }
    if (!m->tokenizer) throw std::runtime_error(model + ": the model has no tokenizer");
    const Tokenizer& tk = *m->tokenizer;
    EncodeOptions eo;
    eo.add_special = true;  // BOS where the tokenizer adds one (llama.cpp: add_special)
    const std::vector<int32_t> ids = tk.encode(text, eo);
    const auto plain = tk.encode("a");
    const auto special = tk.encode("a", eo);
    PerplexityOptions o = opt;
    o.add_bos = tk.bos_id && special.size() > plain.size() && special[0] == *tk.bos_id;
    o.bos_id = tk.bos_id.value_or(0);

    const bool tty = isatty(STDERR_FILENO);
    const auto t1 = std::chrono::steady_clock::now();
    auto progress = [&](int32_t done, int32_t n, double ppl) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      if (tty)
        fmt::print(stderr, "\r\033[Kperplexity {} chunk {}/{}  PPL {:.4f}  ({:.1f} s/chunk)",
                   bar(double(done) / n), done, n, ppl, s / done);
      else if (!as_json)
        fmt::print(stderr, "[{}]{:.4f}{}", done, ppl, done == n ? "\n" : ",");
    };
    const PerplexityResult r = perplexity(m, base, ids, o, progress);
    if (tty) fmt::print(stderr, "\r\033[K");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (as_json) {
      json j = {{"model", model},
                {"text", text_path},
                {"n_ctx", o.n_ctx},
                {"n_chunks", r.n_chunks},
                {"n_tokens", r.n_tokens},
                {"n_scored", r.n_scored},
                {"add_bos", o.add_bos},
                {"ppl", r.ppl},
                {"ppl_err", r.ppl_err},
                {"running", r.running},
                {"seconds", s}};
      if (r.kl)
        j["kl_divergence"] = {{"base", base_path},
                              {"ppl_base", r.kl->ppl_base},
                              {"ppl_base_err", r.kl->ppl_base_err},
                              {"mean", r.kl->kld.mean},
                              {"mean_err", r.kl->kld.err},
                              {"p99", r.kl->kld_p99},
                              {"median", r.kl->kld_median},
                              {"max", r.kl->kld_max},
                              {"same_top", r.kl->same_top.mean},
                              {"same_top_err", r.kl->same_top.err}};
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("{} on {}: {} tokens, {} windows of {}, {} scored{}\n", model, text_path, r.n_tokens,
               r.n_chunks, o.n_ctx, r.n_scored, o.add_bos ? " (BOS first)" : "");
    fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_err);
    if (r.kl) {
      fmt::print("PPL(base)     : {:.4f} +/- {:.5f}\n", r.kl->ppl_base, r.kl->ppl_base_err);
      fmt::print("Mean    KLD   : {:.6f} +/- {:.6f}\n", r.kl->kld.mean, r.kl->kld.err);
      fmt::print("99.0%   KLD   : {:.6f}\n", r.kl->kld_p99);
      fmt::print("Median  KLD   : {:.6f}\n", r.kl->kld_median);
      fmt::print("Maximum KLD   : {:.6f}\n", r.kl->kld_max);
      fmt::print("Same top p    : {:.3f} +/- {:.3f} %\n", 100 * r.kl->same_top.mean,
                 100 * r.kl->same_top.err);
    }
    fmt::print("{:.1f} s\n", s);
  });
}

}  // namespace wick::cli
