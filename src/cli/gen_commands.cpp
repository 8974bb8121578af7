// wick generate / wick run.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_options.h"
#include "cli/spec_options.h"
#include "engine/model_pool.h"
#include "engine/model_store.h"
#include "engine/session.h"
#include "engine/span_markers.h"
#include "engine/span_prompt.h"
#include "server/http_server.h"
#include "server/keep_alive.h"
#include "server/parse_common.h"
#include "text/chat_template.h"

namespace wick::cli {

using json = nlohmann::json;

namespace {

struct GenOptions {
  std::string model;
  int32_t max_tokens = 256, ctx_size = 4096, prefill_chunk = 512;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int32_t min_tokens = 0;
  std::vector<std::string> logit_bias;  // llama.cpp's ID+BIAS / ID-BIAS
  SamplingParams sampling;
  SpecOptions spec;
};

int32_t env_prefill_chunk() {
  const char* v = std::getenv("WICK_PREFILL_CHUNK_SIZE");
  if (!v || !*v) return 512;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end || n < 0 || n > (1 << 24))
    throw std::runtime_error(
        fmt::format("WICK_PREFILL_CHUNK_SIZE={}: expected a whole number >= 0", v));
  return int32_t(n);
}

void add_gen_options(CLI::App* cmd, GenOptions& o) {
  o.prefill_chunk = -1;  // from the environment unless given
  cmd->add_option("--max-tokens,-n", o.max_tokens, "tokens to generate at most (default 256)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--ctx-size,-c", o.ctx_size, "context tokens (default 4096, at most the model's)")
      ->check(CLI::Range(16, 1 << 24));
  cmd->add_option(
         "--prefill-chunk", o.prefill_chunk,
         "prompt tokens per prefill step (0 = one pass; env WICK_PREFILL_CHUNK_SIZE, default 512)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--temperature,--temp", o.sampling.temperature, "0 = greedy (default 0.8)");
  cmd->add_option("--top-k", o.sampling.top_k,
                  "keep the k most likely tokens (0 = off, default 40)");
  cmd->add_option("--top-p", o.sampling.top_p,
                  "nucleus: smallest set reaching this probability (1 = off, default 0.95)");
  cmd->add_option("--min-p", o.sampling.min_p,
                  "drop tokens below min-p x the top probability (0 = off, default 0.05)");
  cmd->add_option("--repeat-penalty", o.sampling.repeat_penalty,
                  "penalty for repeated tokens (1 = off, default 1)");
  cmd->add_option("--repeat-last-n", o.sampling.repeat_last_n,
                  "window of the repeat penalty (0 = all, default 64)");
  cmd->add_option("--presence-penalty", o.sampling.presence_penalty,
                  "subtracted once from seen tokens (default 0)");
  cmd->add_option("--frequency-penalty", o.sampling.frequency_penalty,
                  "subtracted per occurrence (default 0)");
  cmd->add_option("--seed", o.sampling.seed,
                  "random seed (default 12648430; same seed, same output)");
  cmd->add_option("--stop", o.stop, "stop when this text appears (repeatable)");
  cmd->add_flag("--ignore-eos", o.ignore_eos, "do not stop at end-of-generation tokens");
  cmd->add_option("--min-tokens", o.min_tokens,
                  "no end-of-generation token before this many tokens (default 0)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--logit-bias,-l", o.logit_bias,
                  "ID+BIAS or ID-BIAS: add BIAS (at most 100) to token ID's logit; -100 bans it "
                  "(repeatable)");
  add_spec_options(cmd, o.spec);
}

// Speculative decoding's statistics of one result (--json, --verbose).
json spec_stats(const GenerateResult& r) {
  const double n = double(r.tokens.size());
  return {
      {"spec_proposed", r.n_spec_proposed},
      {"spec_accepted", r.n_spec_accepted},
      {"acceptance_rate", r.n_spec_proposed ? double(r.n_spec_accepted) / r.n_spec_proposed : 0.0},
      {"forwards", r.n_forwards},
      {"tokens_per_forward", r.n_forwards ? n / r.n_forwards : 0.0}};
}

std::shared_ptr<const LoadedModel> load_with_progress(const std::string& name) {
  const bool tty = isatty(STDERR_FILENO);
  if (tty) fmt::print(stderr, "loading {} ...", name);
  auto m = ModelPool::global().get(name);
  if (tty) fmt::print(stderr, "\r\033[K");
  return m;
}

// llama.cpp's form: "15043+1", "15043-100" (the sign belongs to the bias).
std::pair<int32_t, float> parse_logit_bias(const std::string& s) {
  const size_t at = s.find_first_of("+-");
  auto fail = [&] {
    throw std::runtime_error(
        fmt::format("--logit-bias {}: expected ID+BIAS or ID-BIAS, e.g. 15043+1 or 15043-100", s));
  };
  if (at == 0 || at == std::string::npos ||
      s.find_first_not_of("0123456789") != at)  // digits, then the sign
    fail();
  char* end = nullptr;
  const float bias = std::strtof(s.c_str() + at, &end);
  if (*end || at > 9) fail();
  return {int32_t(std::stol(s.substr(0, at))), bias};
}

GenerateRequest make_request(const GenOptions& o, std::vector<int32_t> prompt) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.sampling = o.sampling;
  for (const auto& b : o.logit_bias) r.sampling.logit_bias.push_back(parse_logit_bias(b));
  r.min_tokens = o.min_tokens;
  r.max_tokens = o.max_tokens;
  r.stop = o.stop;
  r.ignore_eos = o.ignore_eos;
  r.prefill_chunk = o.prefill_chunk >= 0 ? o.prefill_chunk : env_prefill_chunk();
  return r;
}

std::string render_chat(const LoadedModel& m, const nlohmann::ordered_json& messages) {
  const Tokenizer& tk = *m.tokenizer;
  if (tk.chat_template.empty())
    throw std::runtime_error(m.name + ": the model has no chat template (use --raw)");
  ChatTemplate t(tk.chat_template, m.name + " chat template");
  return t.render({{"messages", messages},
                   {"add_generation_prompt", true},
                   {"bos_token", tk.bos_token},
                   {"eos_token", tk.eos_token}});
}

// A rendered template carries its own special tokens (and BOS where the
// template writes it); raw text gets the tokenizer's BOS/EOS rule.
EncodeOptions prompt_encoding(bool templated) {
  return {.add_special = !templated, .parse_special = templated};
}

std::vector<int32_t> encode_prompt(const LoadedModel& m, const std::string& text, bool templated) {
  return m.tokenizer->encode(text, prompt_encoding(templated));
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) throw std::runtime_error(fmt::format("--span {}: the file is empty", path));
  return text;
}

// The question over the documents in span_files, each a span of the prompt:
// one user message (the documents, then the question) in the chat template,
// or, raw, the same text alone.
SpanPrompt span_prompt(const LoadedModel& m, const std::vector<std::string>& span_files,
                       const std::string& question, bool raw) {
  std::vector<std::string> docs;
  for (const auto& f : span_files) docs.push_back(span_document(read_text_file(f)));
  const std::string text = span_message(docs.size(), question);
  const std::string prompt =
      raw ? text
          : render_chat(m, nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}}));
  return tokenize_span_prompt(*m.tokenizer, prompt, docs, prompt_encoding(!raw));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "generate",
      "Generate a continuation of one prompt (--span FILE: documents computed alone and cached)");
  static GenOptions o;
  static std::string prompt, prompt_ids;
  static bool raw = false, as_json = false, truncate = false, span_context = false;
  static int32_t n_logprobs = -1, span_recompute = 16;
  static float span_blend = 0.f;
  static std::vector<std::string> span_files;
  cmd->add_option("--model,-m", o.model,
                  "a .gguf, a HF folder, or a stored model name (default: smollm2)")
      ->default_val("smollm2");
  auto* p = cmd->add_option("--prompt,-p", prompt, "the prompt text (- reads stdin)");
  auto* pi = cmd->add_option("--prompt-ids", prompt_ids, "the prompt as comma-separated token ids");
  p->excludes(pi);
  cmd->add_flag("--raw", raw, "no chat template: the prompt text is the model input");
  cmd->add_flag("--json", as_json, "print one JSON object at the end instead of streaming text");
  cmd->add_flag("--truncate", truncate,
                "drop the oldest prompt tokens when the prompt does not fit the context");
  cmd->add_option("--logprobs", n_logprobs,
                  "with --json: the log-probability of each token and of the N most likely")
      ->check(CLI::Range(0, 20));
  cmd->add_option("--span", span_files,
                  "a file holding one document (repeatable): the documents come before the "
                  "question --prompt, each computed as if alone and kept in the span cache "
                  "(turned on), so that it is reused in any order")
      ->check(CLI::ExistingFile);
  cmd->add_option("--span-recompute", span_recompute,
                  "tokens at the start of each span computed again with attention over what "
                  "precedes them (default 16)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--span-blend", span_blend,
                  "and this fraction (0-1) of each span's tokens, those whose K/V deviates most "
                  "from the cached span's once it sees what precedes it (CacheBlend-style; "
                  "default 0: off)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--span-context", span_context,
                "each span computed after the prompt's text before the first span (the chat "
                "template's start) instead of alone, and cached under it");
  static std::string span_markers;
  cmd->add_option("--span-markers", span_markers,
                  "PLUS,CROSS,PAD[,BLOCK]: the spans of --prompt-ids are those its markers lay "
                  "out (spnl's layout for models trained with block attention, as wick serve "
                  "--span-markers reads token ids); --span-recompute then defaults to 0")
      ->needs(pi);
  add_gen_options(cmd, o);
  add_device_options(cmd);
  cmd->callback([cmd] {
    if (prompt.empty() && prompt_ids.empty())
      throw std::runtime_error("give --prompt or --prompt-ids");
    if (!span_files.empty() && prompt.empty())
      throw std::runtime_error("--span needs the question as --prompt text");
    auto m = load_with_progress(o.model);
    std::vector<int32_t> ids;
    std::vector<std::pair<int32_t, int32_t>> spans;
    if (!prompt_ids.empty()) {
      ids = parse_int_list(prompt_ids, "--prompt-ids", "a token id");
      if (!span_markers.empty()) {
        try {
          spans = marker_spans(ids, parse_span_markers(span_markers));
        } catch (const std::invalid_argument& e) {
          throw CLI::ValidationError("--span-markers", e.what());
        }
        // a model trained with block attention needs no repair of its spans
        if (cmd->count("--span-recompute") == 0) span_recompute = 0;
      }
    } else {
      if (!m->tokenizer)
        throw std::runtime_error(m->name + ": the model has no tokenizer (use --prompt-ids)");
      std::string text =
          prompt == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {}) : prompt;
      if (!span_files.empty()) {
        auto sp = span_prompt(*m, span_files, text, raw);
        ids = std::move(sp.ids);
        spans = std::move(sp.spans);
      } else {
        ids = raw ? encode_prompt(*m, text, false)
                  : encode_prompt(*m,
                                  render_chat(*m, nlohmann::ordered_json::array(
                                                      {{{"role", "user"}, {"content", text}}})),
                                  true);
      }
    }
    Session s(m, o.ctx_size, !spans.empty(), span_recompute, spec_config(o.spec), span_blend);
    GenerateRequest req = make_request(o, ids);
    req.spans = spans;
    if (span_context && !spans.empty()) req.span_context = spans.front().first;
    req.truncate = truncate;
    req.top_logprobs = n_logprobs;
    auto res = s.generate(req, [](std::string_view t) {
      if (!as_json) {
        fmt::print("{}", t);
        std::fflush(stdout);
      }
      return true;
    });
    if (as_json) {
      json out = {{"text", res.text},
                  {"tokens", res.tokens},
                  {"prompt_tokens", res.n_prompt},
                  {"generated_tokens", res.tokens.size()},
                  {"stop_reason", res.stop_reason},
                  {"ttft_ms", res.ttft_ms},
                  {"prefill_tok_s", res.prefill_tok_s},
                  {"decode_tok_s", res.decode_tok_s}};
      if (!spans.empty()) {
        out["reused_tokens"] = res.n_reused;
        out["computed_tokens"] = res.n_prefilled;
        out["span_hits"] = res.n_span_hits;
        out["span_misses"] = res.n_span_misses;
        out["span_tokens_reused"] = res.n_span_reused;
        out["span_tokens_recomputed"] = res.n_span_recomputed;
      }
      if (s.engine().config().spec.method != SpecMethod::Off) out.update(spec_stats(res));
      if (n_logprobs >= 0) {
        json lps = json::array();
        for (const auto& t : res.logprobs) {
          json top = json::array();
          for (auto [id, lp] : t.top) top.push_back({{"id", id}, {"logprob", lp}});
          lps.push_back({{"id", t.id}, {"logprob", t.logprob}, {"top_logprobs", top}});
        }
        out["logprobs"] = lps;
      }
      fmt::print("{}\n", out.dump());
    } else {
      fmt::print("\n");
    }
  });
}

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run", "Chat with a model: answer PROMPT, or hold a conversation on a terminal");
  static GenOptions o;
  static std::string prompt, system;
  static bool verbose = false, span_cache = false;
  cmd->add_option("MODEL", o.model, "a .gguf, a HF folder, or a stored model name")->required();
  cmd->add_option("PROMPT", prompt, "answer this and exit");
  cmd->add_option("--system", system, "a system message");
  cmd->add_flag("--verbose", verbose, "print timings after each answer");
  cmd->add_flag("--span-cache", span_cache,
                "keep keys before RoPE (the span cache's KV layout; for comparison)");
  add_gen_options(cmd, o);
  add_device_options(cmd);
  cmd->callback([] {
    auto m = load_with_progress(o.model);
    if (!m->tokenizer) throw std::runtime_error(m->name + ": the model has no tokenizer");
    Session s(m, o.ctx_size, span_cache, 16, spec_config(o.spec));
    const bool speculates = s.engine().config().spec.method != SpecMethod::Off;
    auto messages = nlohmann::ordered_json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    auto turn = [&](const std::string& user) {
      messages.push_back({{"role", "user"}, {"content", user}});
      auto ids = encode_prompt(*m, render_chat(*m, messages), true);
      auto res = s.generate(make_request(o, ids), [](std::string_view t) {
        fmt::print("{}", t);
        std::fflush(stdout);
        return true;
      });
      fmt::print("\n");
      if (verbose)
        fmt::print(stderr,
                   "[{} prompt tokens, {} from cache; ttft {:.0f} ms; {:.1f} tok/s; stop: {}{}]\n",
                   res.n_prompt, res.n_reused, res.ttft_ms, res.decode_tok_s, res.stop_reason,
                   speculates ? fmt::format("; {} of {} drafts accepted, {:.2f} tokens per forward",
                                            res.n_spec_accepted, res.n_spec_proposed,
                                            double(res.tokens.size()) / std::max(1, res.n_forwards))
                              : "");
      messages.push_back({{"role", "assistant"}, {"content", res.text}});
    };
    if (!prompt.empty()) {
      turn(prompt);
      return;
    }
    const bool tty = isatty(STDIN_FILENO);
    if (tty) fmt::print(stderr, "wick: chatting with {} (Ctrl-D to quit)\n", m->name);
    for (std::string line;;) {
      if (tty) fmt::print(stderr, ">>> ");
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      turn(line);
    }
  });
}

}  // namespace wick::cli

namespace wick::cli {

namespace {

// A --lora-modules value: NAME=PATH, or vLLM's JSON form {"name", "path"[,
// "base_model_name"]} (the base is always --model here).
std::pair<std::string, std::string> parse_lora_module(const std::string& m) {
  if (!m.empty() && m.front() == '{') {
    const json j = json::parse(m, nullptr, false);
    auto text = [&](const char* key) {
      if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j[key].is_string() ||
          j[key].get<std::string>().empty())
        throw CLI::ValidationError("--lora-modules",
                                   m + ": expected {\"name\": NAME, \"path\": PATH}");
      return j[key].get<std::string>();
    };
    return {text("name"), text("path")};
  }
  const size_t eq = m.find('=');
  if (eq == 0 || eq == std::string::npos || eq + 1 == m.size())
    throw CLI::ValidationError("--lora-modules", m + ": expected NAME=PATH");
  return {m.substr(0, eq), m.substr(eq + 1)};
}

}  // namespace

void register_serve(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("serve", "Serve models over an OpenAI- and Ollama-compatible HTTP API");
  static server::ServerConfig cfg;
  static SpecOptions spec;
  static size_t kv_mib = 0;
  static int n_ctx = 4096;
  cmd->add_option("--model,-m", cfg.default_model,
                  "the model served by default and loaded at start (default: smollm2)");
  cmd->add_option("--host", cfg.host, "address to bind (default 127.0.0.1)");
  cmd->add_option("--port", cfg.port, "port (default 8080)")->check(CLI::Range(1, 65535));
  cmd->add_option("--api-key", cfg.api_key, "require Authorization: Bearer KEY (env WICK_API_KEY)");
  cmd->add_option("--allowed-hosts", cfg.allowed_hosts,
                  "Host header names answered besides localhost, 127.x.x.x and ::1 (comma-"
                  "separated; * = any). On a loopback --host other names get 403 (against DNS "
                  "rebinding); on another address, a list turns the same check on")
      ->delimiter(',');
  cmd->add_option("--allowed-origins", cfg.allowed_origins,
                  "browser page origins answered besides http(s)://localhost, 127.x.x.x and "
                  "[::1] on any port, e.g. https://ui.example:3000 (comma-separated; * = any; "
                  "env WICK_ALLOWED_ORIGINS). Other pages' requests get 403; allowed ones get "
                  "CORS headers")
      ->delimiter(',')
      ->envname("WICK_ALLOWED_ORIGINS");
  cmd->add_option("--kv-memory", kv_mib,
                  "KV cache memory per model in MiB (default: 512 on the CPU, on a GPU 90% of "
                  "what --gpu-memory-fraction leaves after the weights)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--ctx-size,-c", n_ctx,
                  "longest sequence, prompt and output (default 4096, at most the model's)")
      ->check(CLI::Range(16, 1 << 24));
  cmd->add_option("--max-batch-tokens", cfg.engine.max_batch_tokens,
                  "tokens per engine step (default 512 on the CPU, 2048 on a GPU)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-seqs", cfg.engine.max_seqs, "sequences computed at once (default 64)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-queue", cfg.max_queue,
                  "requests in flight before answering 429 (default 256)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-body", cfg.max_body_bytes,
                  "largest request body in bytes (default 8 MiB)");
  cmd->add_option("--max-header-bytes", cfg.max_header_bytes,
                  "largest request line and headers in bytes, which must also arrive within "
                  "the 30 s read timeout (default 64 KiB; past it: 431)")
      ->check(CLI::Range(size_t(1) << 10, size_t(1) << 24));
  cmd->add_option("--http-threads", cfg.n_http_threads, "HTTP worker threads (default 128)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--responses-store", cfg.n_responses_stored,
                  "responses (POST /v1/responses with store true, OpenAI's default) kept in "
                  "memory for previous_response_id and GET /v1/responses/ID; the oldest go "
                  "first, and past 128 MiB of them in all (default 1024; 0: none kept)")
      ->check(CLI::Range(0, 1 << 20));
  static std::string reasoning_format = "auto";
  cmd->add_option("--reasoning-format", reasoning_format,
                  "auto: the <think> reasoning of models whose chat template names it (Qwen3, "
                  "QwQ, DeepSeek-R1) is answered apart: message.reasoning_content (OpenAI chat), "
                  "message.thinking / thinking (Ollama), a reasoning item (Responses); none: it "
                  "stays in the content (default auto)")
      ->check(CLI::IsMember({"auto", "none"}));
  cmd->add_option("--kv-events", cfg.kv_events,
                  "publish KV-cache events (blocks stored in / removed from the prefix cache) "
                  "as vLLM does, ZMQ PUB + msgpack, on this address, e.g. tcp://*:5557 (default: "
                  "off)");
  cmd->add_option("--kv-events-topic", cfg.kv_events_topic,
                  "the ZMQ topic of --kv-events messages (default kv-events)");
  cmd->add_flag("--span-cache", cfg.engine.span_cache,
                "each model's engine keeps keys before RoPE, so that the documents of a span "
                "query (POST /v1/query/execute, the children of plus) are computed once and "
                "reused at any offset");
  cmd->add_option("--span-recompute", cfg.engine.span_recompute,
                  "with --span-cache: tokens at the start of each reused span computed again "
                  "with attention over what precedes them (default 16)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--span-blend", cfg.engine.span_blend,
                  "with --span-cache: and this fraction (0-1) of each reused span's tokens, those "
                  "whose K/V deviates most from the cached span's once it sees what precedes it "
                  "(CacheBlend-style, measured at layer 1; default 0: off)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--span-context", cfg.engine.span_context,
                "with --span-cache: each span of a query is computed after the text before the "
                "first span (the system messages) instead of alone, and cached under it: spans "
                "keep the real start of the prompt and miss only each other (request extra "
                "span_context on spnl's g; default off)");
  static std::string span_markers;
  cmd->add_option("--span-markers", span_markers,
                  "PLUS,CROSS,PAD[,BLOCK]: spnl's marker layout for models trained with block "
                  "attention, e.g. 10,13,27 (block 16). Span queries are laid out with these "
                  "ids, and a prompt of token ids gets a span from each PLUS at a multiple of "
                  "BLOCK to the next PLUS or CROSS there. Turns on --span-cache; --span-recompute "
                  "then defaults to 0");
  static std::string keep_alive, pooling = "mean";
  cmd->add_option("--keep-alive", keep_alive,
                  "how long a model stays loaded after a request that sets no keep_alive: a "
                  "duration (5m, 1h30m, 10s) or seconds; 0 unloads at once, negative keeps "
                  "models loaded (default 5m, env WICK_KEEP_ALIVE)");
  cmd->add_option("--pooling", pooling,
                  "how embeddings (/v1/embeddings, /api/embed) pool the final hidden states: "
                  "mean over the input's tokens, or the last token's (default mean: chat models "
                  "are not trained to sum a text up in its last token)")
      ->check(CLI::IsMember({"mean", "last"}));
  static std::vector<std::string> lora_modules;
  cmd->add_option("--lora-modules", lora_modules,
                  "NAME=PATH or {\"name\": NAME, \"path\": PATH} (repeatable, vLLM's): a LoRA "
                  "adapter of --model (a GGUF adapter or "
                  "a PEFT folder, as --lora) that requests choose by naming NAME as their model; "
                  "requests with different adapters, or none, share one batch and one copy of "
                  "the model; NAME may not be a stored model's name");
  cmd->add_flag("--allow-runtime-lora", cfg.runtime_lora,
                "let clients load and unload LoRA adapters of --model while serving (vLLM's "
                "POST /v1/load_lora_adapter {lora_name, lora_path} and "
                "/v1/unload_lora_adapter {lora_name}); the paths are read with the server's "
                "rights, so this is off by default (403)");
  add_spec_options(cmd, spec);
  add_device_options(cmd);
  cmd->footer(fmt::format(
      "Clients name models; only names in the model store resolve (no paths, no '..', no "
      "symlinks out of the store). --model is the operator's and may be a path.\n"
      "Request limits (400 naming the field): JSON nesting {} levels, {} messages, {} tools, "
      "n <= {}, stop <= 4 strings (Ollama 16) of <= {} bytes, max_tokens <= {} and then at "
      "most what the context leaves; the body must be UTF-8. Chat templates render at most "
      "16 MiB, 100000 loop iterations and 100 nested macro calls; chat_template_kwargs cannot "
      "replace messages, tools, add_generation_prompt, bos_token, eos_token or the template's "
      "functions.",
      server::kMaxJsonDepth, server::kMaxMessages, server::kMaxTools, server::kMaxChoices,
      server::kMaxStopBytes, server::kMaxTokensAsked));
  cmd->callback([cmd] {
    const bool prefix = cfg.engine.prefix_cache;
    EngineConfig env = EngineConfig::from_env();
    cfg.engine.prefix_cache = prefix && env.prefix_cache;
    cfg.engine.kv_bytes = kv_mib << 20;
    cfg.engine.n_ctx = n_ctx;
    cfg.engine.spec = spec_config(spec);  // the draft serves --model (requests may turn it off)
    if (cfg.api_key.empty())
      if (const char* k = std::getenv("WICK_API_KEY")) cfg.api_key = k;
    if (keep_alive.empty())
      if (const char* k = std::getenv("WICK_KEEP_ALIVE")) keep_alive = k;
    if (!keep_alive.empty()) {
      auto d = server::parse_duration(keep_alive);
      if (!d)
        throw CLI::ValidationError("--keep-alive", keep_alive +
                                                       ": expected a duration such as 5m, 1h30m "
                                                       "or 10s, or a number of seconds");
      cfg.keep_alive = *d;
    }
    cfg.pooling = *pooling_from_name(pooling);
    cfg.split_reasoning = reasoning_format == "auto";
    if (!span_markers.empty()) {
      try {
        cfg.span_markers = parse_span_markers(span_markers);
      } catch (const std::invalid_argument& e) {
        throw CLI::ValidationError("--span-markers", e.what());
      }
      cfg.engine.span_cache = true;
      // a model trained with block attention needs no repair of its spans
      if (cmd->count("--span-recompute") == 0) cfg.engine.span_recompute = 0;
    }
    cfg.lora_modules.clear();
    for (const std::string& m : lora_modules) {
      auto [name, path] = parse_lora_module(m);
      if (name == cfg.default_model)
        throw CLI::ValidationError("--lora-modules", name + " is the name of --model");
      if (!stored_model_entry(name).empty())
        throw CLI::ValidationError(
            "--lora-modules", name + " is the name of a model in the store (" + model_store_dir() +
                                  "): requests naming it would get the "
                                  "adapter; choose another name");
      for (const auto& [other, p] : cfg.lora_modules)
        if (other == name)
          throw CLI::ValidationError("--lora-modules", "two adapters are named " + name);
      if (!std::filesystem::exists(path))
        throw CLI::ValidationError("--lora-modules", path + ": no such adapter file or folder");
      cfg.lora_modules.emplace_back(std::move(name), std::move(path));
    }
    if (!cfg.lora_modules.empty() || cfg.runtime_lora) {  // on --model alone
      BackendOptions o = backend_options();
      o.lora_modules = cfg.lora_modules;
      o.lora_modules_model = cfg.default_model;
      ModelPool::global().set_backend(o);
    }
    const int rc = server::serve(cfg);
    if (rc) throw std::runtime_error("the server could not start");
  });
}

}  // namespace wick::cli
