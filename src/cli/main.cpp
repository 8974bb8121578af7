// wick command-line front end. Each subcommand is a thin layer over the library.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"

int main(int argc, char** argv) {
  spdlog::set_pattern("%^%l%$: %v");
  spdlog::set_default_logger(spdlog::stderr_color_mt("wick"));
  CLI::App app{"wick: run large language models locally and fast (CPU and CUDA)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "wick 0.1.0");
  app.footer(
      "Documents as independent spans (the span cache): wick generate --span FILE [--span FILE "
      "...] --prompt QUESTION\n\n"
      "Environment:\n"
      "  WICK_THREADS             worker threads for CPU kernels (default: all cores, at most\n"
      "                           the container's CPU limit: cgroup cpu.max or CFS quota)\n"
      "  WICK_ISA                 force a CPU kernel set: generic, avx2, avx512, avx512bf16 or amx\n"
      "                           (default: the best this CPU has)\n"
      "  WICK_MATMUL              CPU products: exact (f32 activations for every type) or fast\n"
      "                           (int8 for every quantized type); default: bf16 activations\n"
      "                           for bf16 weights, int8 for most quantized types\n"
      "  WICK_CPU_PREFETCH        1: CPU products prefetch the weights in software (default:\n"
      "                           off, the hardware's prefetch alone)\n"
      "  WICK_LOG                 log level: trace, debug, info, warn, error, off (default: info)\n"
      "  WICK_PREFILL_CHUNK_SIZE  prompt tokens per prefill step; 0 = one pass (default: 512)\n"
      "  WICK_MAX_LOADED_MODELS   models kept loaded at once (default: 2)\n"
      "  WICK_MAX_MODEL_BYTES     byte budget of loaded models; 0 = no limit (default: 0)\n"
      "  WICK_PREFIX_CACHE        0 turns the prefix cache off (default: 1)\n"
      "  WICK_API_KEY             wick serve: require Authorization: Bearer KEY\n"
      "  WICK_ALLOWED_ORIGINS     wick serve: browser origins answered besides loopback ones\n"
      "                           (comma-separated; * = any; --allowed-origins wins)\n"
      "  WICK_DEVICE              cpu, cuda or auto: where models run (--device wins; default "
      "auto)\n"
      "  WICK_CUDA_GRAPHS         0 turns CUDA graphs off (for profilers; default 1)\n"
      "  WICK_CUDA_SKIP           measuring only: kernel kinds left out (norm,qkv,rope,attn,o,\n"
      "                           gate_up,down,head; the output is garbage)\n"
      "  WICK_CUDA_ATTN_DECODE    0: decode attention through the prefill kernel (default 1)\n"
      "  WICK_CUDA_KW_MAX         most slices of k a product takes: 4-32 (default 32)\n"
      "  WICK_CUDA_KW_WAVES       0: slice counts by the rule before session 59, not by waves\n"
      "                           (measuring; default 1)\n"
      "  WICK_CUDA_TALL_NT/_ROWS  decode tiles of tall 16-bit matrices (default 4 from 8192 rows)\n"
      "  WICK_CUDA_TALL_KW        slices of k, 16-bit matrices of >= 8192 rows (default 4)\n"
      "  WICK_CUDA_INT_MMA        1: 8/4-bit weights' products as integer mma (default 0)\n"
      "  WICK_CUDA_NORM_INT       0: integer products quantize x themselves, not the norms,\n"
      "                           attention and gate/up (default 1)\n"
      "  WICK_CUDA_INT_R128       integer products' 8-bit decode kernels at 128 registers: 0 "
      "none,\n"
      "                           1 not gated (default), 2 gate/up too\n"
      "  WICK_CUDA_INT_DP4A       0: integer products of decode steps (<= 4 rows) on the\n"
      "                           tensor cores, not by dp4a (default 1; the same results)\n"
      "  WICK_CUDA_TILED_U4       0: 4-bit weights' prefill on the decode kernel's tiles (default "
      "1)\n"
      "  WICK_CUDA_SMEM_LIMIT     bytes: size kernels for a GPU of this much shared memory\n"
      "                           (tests; default: the GPU's own; the same results)\n"
      "  WICK_CUDA_PREDECODE      0: the prefill kernel's warps decode 8/4-bit weights each,\n"
      "                           not once a CTA (default 1; the same results)\n"
      "  WICK_CUDA_X_STAGE        0: decode products read x from global memory, not staged in\n"
      "                           shared memory as bf16 (default 1; the same results)\n"
      "  WICK_MODELS              the model store, where MODEL names are looked up (default: "
      "~/.cache/wick/models)\n");
  wick::cli::register_run(app);
  wick::cli::register_serve(app);
  wick::cli::register_generate(app);
  wick::cli::register_info(app);
  wick::cli::register_logits(app);
  wick::cli::register_bench(app);
  wick::cli::register_convert(app);
  wick::cli::register_quantize(app);
  wick::cli::register_perplexity(app);
  wick::cli::register_tokenize(app);
  wick::cli::register_detokenize(app);
  wick::cli::register_template(app);
  try {
    wick::cli::apply_env();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
