// BPE tokenizers as HF `tokenizers` runs them (tokenizer.json) and as GGUF
// files carry them (tokenizer.ggml.*): byte-level BPE (GPT-2, Llama 3, Qwen,
// SmolLM2) and SentencePiece-style BPE (Llama 2, Mistral).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/regex.h"

namespace wick {

class GgufFile;

struct TextError : std::runtime_error {  // bad tokenizer files or bad text
  using std::runtime_error::runtime_error;
};

struct EncodeOptions {
  bool add_special = false;    // BOS/EOS from the post-processor
  bool parse_special = false;  // turn special-token text in the input into special ids
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false;
};

// One step of each pipeline stage; a tokenizer holds a list per stage.
struct NormalizerStep {
  enum Kind { Nfc, Nfkc, Prepend, Replace, Lowercase } kind;
  std::string a, b;  // Prepend: a; Replace: a -> b
};
struct PreTokenizerStep {
  enum Kind { Split, ByteLevel, Metaspace, Digits } kind;
  std::shared_ptr<Regex> regex;  // Split, ByteLevel with use_regex
  std::string literal;           // Split on a plain string
  enum Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext } behavior = Isolated;
  bool invert = false;
  bool add_prefix_space = false;             // ByteLevel
  std::string replacement = "\xe2\x96\x81";  // Metaspace: U+2581
  std::string prepend_scheme = "always";     // Metaspace: always, first, never
  bool split = true;                         // Metaspace
  bool individual_digits = false;            // Digits
};
struct DecoderStep {
  enum Kind { ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip } kind;
  std::string a, b;         // Replace: a -> b; Strip: a = content; Metaspace: a = replacement
  int start = 0, stop = 0;  // Strip
  std::string prepend_scheme = "always";
};

class Tokenizer {
 public:
  // SOURCE: a tokenizer.json, a HF folder holding one, or a .gguf file.
  static std::unique_ptr<Tokenizer> load(const std::string& source);
  static std::unique_ptr<Tokenizer> from_json(const std::string& json_text,
                                              const std::string& source);
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

  // Throws TextError for invalid UTF-8 (naming the byte offset).
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;
  // Text of ids; special tokens hidden unless asked. Invalid UTF-8 from byte
  // tokens becomes U+FFFD. Throws TextError for ids outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = true) const;
  // The raw bytes one token adds to the output, as the decoders give them
  // but without the UTF-8 repair and without stripping a first token's
  // leading space (for a grammar matched byte by byte: a token may end
  // inside a character).
  std::string token_bytes(int32_t id) const;

  int32_t n_vocab() const { return int32_t(vocab_.size()); }
  std::optional<int32_t> token_id(const std::string& token) const;
  const std::string& token(int32_t id) const { return vocab_.at(size_t(id)); }
  bool is_special(int32_t id) const;
  const std::string& kind() const {
    return kind_;
  }  // "tokenizer.json:BPE/byte-level", "gguf:llama", ...

  // Ids from the file's metadata (nullopt when absent).
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  // GGUF's fill-in-the-middle ids (text/infill.h finds them by name otherwise)
  std::optional<int32_t> fim_pre_id, fim_suf_id, fim_mid_id, fim_sep_id;
  std::string chat_template;          // from tokenizer_config.json or GGUF metadata
  std::string bos_token, eos_token;   // their text, for templates
  bool strips_leading_space() const;  // SentencePiece decoders drop the first space

 private:
  Tokenizer() = default;
  struct Merge {
    double rank;
    int32_t id;
  };
  std::optional<Merge> merge(int32_t a, int32_t b) const;
  void encode_segment(std::string_view text, bool first_segment, std::vector<int32_t>& out) const;
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void finish_setup();

  std::string kind_;
  std::vector<std::string> vocab_;                // id -> token (model space)
  std::unordered_map<std::string, int32_t> ids_;  // token -> id
  std::unordered_map<uint64_t, Merge> merges_;    // (a << 32 | b) -> rank, merged id
  std::vector<float> scores_;                     // merge by score (SentencePiece in GGUF)
  bool merge_by_score_ = false;
  bool use_unk_ = false;  // unknown characters become unk_id (else they are dropped)
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::vector<AddedToken> added_;      // longest first
  std::vector<int> added_first_[256];  // indices into added_ by first byte
  std::vector<bool> special_;          // id -> special
  std::vector<NormalizerStep> normalizers_;
  std::vector<PreTokenizerStep> pre_;
  std::vector<DecoderStep> decoders_;
  std::vector<std::vector<int32_t>>
      post_single_;  // TemplateProcessing: ids, or empty = the sequence
  bool has_post_template_ = false;
  int32_t byte_ids_[256];  // <0xNN> tokens, -1 if absent

  mutable std::mutex cache_mu_;  // word -> ids, for repeated words
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace wick
