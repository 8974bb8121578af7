#pragma once

#include <CLI/CLI.hpp>

namespace wick::cli {

void apply_env();  // WICK_THREADS, WICK_LOG; throws on invalid values
void register_info(CLI::App& app);
void register_logits(CLI::App& app);
void register_bench(CLI::App& app);
void register_convert(CLI::App& app);
void register_quantize(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_generate(CLI::App& app);
void register_run(CLI::App& app);
void register_serve(CLI::App& app);
void register_detokenize(CLI::App& app);
void register_template(CLI::App& app);

}  // namespace wick::cli
