#include "text/infill.h"

#include <array>

namespace wick {

namespace {

struct FimNames {
  const char *prefix, *suffix, *middle, *file_sep;
};

// The names each family's vocabulary gives them (model space: CodeLlama's
// SentencePiece pieces start with U+2581, DeepSeek's use full-width bars).
constexpr std::array<FimNames, 4> kFamilies = {{
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"},  // Qwen2.5-Coder, Qwen3
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"},          // StarCoder
    {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ""},              // DeepSeek-Coder
    {"▁<PRE>", "▁<SUF>", "▁<MID>", ""},                                      // CodeLlama
}};

int32_t id_or_none(const Tokenizer& tk, const char* name) {
  if (!*name) return -1;
  return tk.token_id(name).value_or(-1);
}

}  // namespace

std::optional<FimTokens> find_fim_tokens(const Tokenizer& tk) {
  if (tk.fim_pre_id && tk.fim_suf_id && tk.fim_mid_id)
    return FimTokens{.prefix = *tk.fim_pre_id,
                     .suffix = *tk.fim_suf_id,
                     .middle = *tk.fim_mid_id,
                     .file_sep = tk.fim_sep_id.value_or(-1)};
  for (const FimNames& f : kFamilies) {
    FimTokens t{.prefix = id_or_none(tk, f.prefix),
                .suffix = id_or_none(tk, f.suffix),
                .middle = id_or_none(tk, f.middle),
                .file_sep = id_or_none(tk, f.file_sep)};
    if (t.prefix >= 0 && t.suffix >= 0 && t.middle >= 0) return t;
  }
  return std::nullopt;
}

std::vector<int32_t> infill_prompt(const Tokenizer& tk, const FimTokens& fim,
                                   const std::string& prefix, const std::string& suffix,
                                   const std::string& middle,
                                   const std::vector<InfillFile>& files) {
  // the tokenizer's own additions (a BOS) once, at the start
  std::vector<int32_t> out = tk.encode("", {.add_special = true});
  auto add = [&](const std::string& text) {
    auto ids = tk.encode(text);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  for (const InfillFile& f : files) {
    if (fim.file_sep >= 0) {
      out.push_back(fim.file_sep);
      add(f.name + "\n" + f.text);
    } else {
      add(f.text.ends_with('\n') ? f.text : f.text + "\n");
    }
  }
  out.push_back(fim.prefix);
  add(prefix);
  out.push_back(fim.suffix);
  add(suffix);
  out.push_back(fim.middle);
  if (!middle.empty()) add(middle);
  return out;
}

}  // namespace wick
