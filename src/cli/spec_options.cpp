#include "cli/spec_options.h"

#include "cli/device_options.h"

namespace wick::cli {

void add_spec_options(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--spec", o.method,
                  "speculative decoding: off, ngram (prompt lookup: guesses copied from the "
                  "prompt and output) or draft (a draft model guesses); greedy output stays "
                  "plain decoding's (default: draft with --draft, else off)")
      ->check(CLI::IsMember({"off", "ngram", "draft"}));
  cmd->add_option("--draft", o.draft,
                  "the draft model (a .gguf, a HF folder or a stored name); it must share the "
                  "model's vocabulary");
  cmd->add_option("--draft-max", o.cfg.draft_max, "tokens guessed per step, at most (default 8)")
      ->check(CLI::Range(1, kMaxDraft));
  cmd->add_option("--draft-min", o.cfg.draft_min,
                  "fewer guessed: the step decodes plainly (default 1)")
      ->check(CLI::Range(0, kMaxDraft));
  cmd->add_option("--draft-p-min", o.cfg.draft_p_min,
                  "the draft model stops guessing where its choice's probability is below this "
                  "(default 0: never)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--ngram-min", o.cfg.ngram_min,
                  "prompt lookup: the shortest n-gram matched (default 2)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--ngram-max", o.cfg.ngram_max,
                  "prompt lookup: the longest n-gram matched, tried first (default 4)")
      ->check(CLI::Range(1, 64));
}

SpecConfig spec_config(const SpecOptions& o) {
  SpecConfig c = o.cfg;
  const std::string method = o.method.empty() ? (o.draft.empty() ? "off" : "draft") : o.method;
  c.method = *spec_method_from_name(method);
  if (!o.draft.empty()) {
    // the draft keeps its own RoPE: --rope-scaling describes the target
    BackendOptions draft = backend_options();
    draft.rope_scaling.clear();
    draft.rope_scale = 0.f;
    draft.yarn_orig_ctx = 0;
    draft.lora.clear();  // the adapters are the target's
    c.draft = load_model_and_tokenizer(o.draft, {}, draft);
  }
  if (auto err = c.validate(); !err.empty()) throw std::runtime_error(err);
  return c;
}

}  // namespace wick::cli
