#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

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

// "1,2,3": non-negative integers; errors name `flag` and say what an item is
// ("--ids: 'x' is not a token id").
std::vector<int32_t> parse_int_list(const std::string& s, const std::string& flag,
                                    const char* what);

}  // namespace wick::cli
