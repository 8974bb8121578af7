// Building a Tokenizer from tokenizer.json (+ tokenizer_config.json) or from
// GGUF metadata.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/error.h"
#include "io/gguf.h"
#include "text/tokenizer.h"

namespace wick {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The most token ids a tokenizer.json may use: far above any model's (about
// 256k), and low enough that an id cannot make the vocabulary exhaust memory.
constexpr int64_t kMaxVocab = 1 << 24;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TextError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[noreturn]] void unsupported(const std::string& src, const std::string& what, const json& j) {
  throw TextError(fmt::format("{}: unsupported {} '{}'", src, what,
                              j.is_object() ? j.value("type", std::string("?")) : j.dump()));
}

std::string pattern_of(const json& p, bool& is_regex) {
  is_regex = p.contains("Regex");
  return is_regex ? p["Regex"].get<std::string>() : p.at("String").get<std::string>();
}

void add_normalizer(const json& j, std::vector<NormalizerStep>& out, const std::string& src) {
  if (j.is_null()) return;
  const std::string t = j.at("type");
  if (t == "Sequence") {
    for (auto& x : j.at("normalizers")) add_normalizer(x, out, src);
  } else if (t == "NFC") {
    out.push_back({NormalizerStep::Nfc, "", ""});
  } else if (t == "NFKC") {
    out.push_back({NormalizerStep::Nfkc, "", ""});
  } else if (t == "Lowercase") {
    out.push_back({NormalizerStep::Lowercase, "", ""});
  } else if (t == "Prepend") {
    out.push_back({NormalizerStep::Prepend, j.at("prepend"), ""});
  } else if (t == "Replace") {
    bool re;
    std::string pat = pattern_of(j.at("pattern"), re);
    if (re) unsupported(src, "normalizer (Replace with a regex)", j);
    out.push_back({NormalizerStep::Replace, pat, j.at("content")});
  } else {
    unsupported(src, "normalizer", j);
  }
}

void add_pre(const json& j, std::vector<PreTokenizerStep>& out, const std::string& src) {
  if (j.is_null()) return;
  const std::string t = j.at("type");
  PreTokenizerStep st{};
  if (t == "Sequence") {
    for (auto& x : j.at("pretokenizers")) add_pre(x, out, src);
    return;
  } else if (t == "Split") {
    st.kind = PreTokenizerStep::Split;
    bool re;
    std::string pat = pattern_of(j.at("pattern"), re);
    if (re) {
      try {
        st.regex = std::make_shared<Regex>(pat);
      } catch (const std::runtime_error& e) {
        throw TextError(fmt::format("{}: Split pre-tokenizer: {}", src, e.what()));
      }
    } else {
      st.literal = pat;
    }
    std::string b = j.value("behavior", std::string("Isolated"));
    if (b == "Isolated")
      st.behavior = PreTokenizerStep::Isolated;
    else if (b == "Removed")
      st.behavior = PreTokenizerStep::Removed;
    else if (b == "MergedWithPrevious")
      st.behavior = PreTokenizerStep::MergedWithPrevious;
    else if (b == "MergedWithNext")
      st.behavior = PreTokenizerStep::MergedWithNext;
    else
      unsupported(src, "split behavior", json(b));
    st.invert = j.value("invert", false);
  } else if (t == "ByteLevel") {
    st.kind = PreTokenizerStep::ByteLevel;
    st.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) st.regex = std::make_shared<Regex>(kGpt2Regex);
  } else if (t == "Metaspace") {
    st.kind = PreTokenizerStep::Metaspace;
    st.replacement = j.value("replacement", std::string("\xe2\x96\x81"));
    st.prepend_scheme =
        j.value("prepend_scheme",
                j.value("add_prefix_space", true) ? std::string("always") : std::string("never"));
    st.split = j.value("split", true);
  } else if (t == "Digits") {
    st.kind = PreTokenizerStep::Digits;
    st.individual_digits = j.value("individual_digits", false);
  } else {
    unsupported(src, "pre-tokenizer", j);
  }
  out.push_back(std::move(st));
}

void add_decoder(const json& j, std::vector<DecoderStep>& out, const std::string& src) {
  if (j.is_null()) return;
  const std::string t = j.at("type");
  DecoderStep d{};
  if (t == "Sequence") {
    for (auto& x : j.at("decoders")) add_decoder(x, out, src);
    return;
  } else if (t == "ByteLevel") {
    d.kind = DecoderStep::ByteLevel;
  } else if (t == "Replace") {
    d.kind = DecoderStep::Replace;
    bool re;
    d.a = pattern_of(j.at("pattern"), re);
    if (re) unsupported(src, "decoder (Replace with a regex)", j);
    d.b = j.at("content");
  } else if (t == "ByteFallback") {
    d.kind = DecoderStep::ByteFallback;
  } else if (t == "Fuse") {
    d.kind = DecoderStep::Fuse;
  } else if (t == "Strip") {
    d.kind = DecoderStep::Strip;
    d.a = j.at("content");
    // counts of characters: a float past int would convert with undefined behaviour
    // (fuzz_tokenizer)
    for (auto [key, field] : {std::pair{"start", &d.start}, std::pair{"stop", &d.stop}}) {
      const json v = j.value(key, json(0));
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20))
        throw TextError(
            fmt::format("{}: Strip decoder's {} {} is not a count", src, key, v.dump()));
      *field = decltype(d.start)(v.get<int64_t>());
    }
  } else if (t == "Metaspace") {
    d.kind = DecoderStep::Metaspace;
    d.a = j.value("replacement", std::string("\xe2\x96\x81"));
    d.prepend_scheme =
        j.value("prepend_scheme",
                j.value("add_prefix_space", true) ? std::string("always") : std::string("never"));
  } else {
    unsupported(src, "decoder", j);
  }
  out.push_back(std::move(d));
}

std::string token_text(const json& t) {
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content")) return t["content"].get<std::string>();
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& text, const std::string& src) {
  std::unique_ptr<Tokenizer> tk(new Tokenizer);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw TextError(fmt::format("{}: not valid JSON: {}", src, e.what()));
  }
  try {
    const json& m = j.at("model");
    const std::string type = m.value("type", std::string("BPE"));
    if (type != "BPE")
      throw TextError(
          fmt::format("{}: unsupported model type '{}' (wick supports BPE)", src, type));
    if (!m.value("continuing_subword_prefix", json()).is_null() &&
        m["continuing_subword_prefix"] != "")
      throw TextError(src + ": continuing_subword_prefix is not supported");
    if (!m.value("end_of_word_suffix", json()).is_null() && m["end_of_word_suffix"] != "")
      throw TextError(src + ": end_of_word_suffix is not supported");
    const json& vocab = m.at("vocab");
    // Ids index the vocabulary: each one checked before it sizes or indexes it.
    auto checked_id = [&](const json& id) {
      if (!id.is_number_integer())  // a float past int64 would convert with undefined behaviour
        throw TextError(fmt::format("{}: token id {} is not an integer", src, id.dump()));
      const int64_t x = id.get<int64_t>();
      if (x < 0 || x >= kMaxVocab)
        throw TextError(fmt::format("{}: token id {} is outside [0, {})", src, x, kMaxVocab));
      return int32_t(x);
    };
    int32_t max_id = -1;
    for (auto& [tok, id] : vocab.items()) max_id = std::max(max_id, checked_id(id));
    for (auto& a : j.value("added_tokens", json::array()))
      max_id = std::max(max_id, checked_id(a.at("id")));
    tk->vocab_.assign(size_t(max_id + 1), "");
    for (auto& [tok, id] : vocab.items()) {
      tk->vocab_[size_t(id.get<int32_t>())] = tok;
      tk->ids_.emplace(tok, id.get<int32_t>());
    }
    int32_t rank = 0;
    for (auto& mg : m.at("merges")) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg;
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos)
          throw TextError(fmt::format("{}: merge '{}' has no space", src, s));
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else {
        a = mg.at(0), b = mg.at(1);
      }
      auto ia = tk->ids_.find(a), ib = tk->ids_.find(b), iab = tk->ids_.find(a + b);
      if (ia == tk->ids_.end() || ib == tk->ids_.end() || iab == tk->ids_.end()) {
        ++rank;
        continue;  // as `tokenizers` does, merges of unknown tokens never fire
      }
      tk->merges_.emplace(uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second),
                          Merge{double(rank++), iab->second});
    }
    tk->byte_fallback_ = m.value("byte_fallback", false);
    tk->fuse_unk_ = m.value("fuse_unk", false);
    tk->ignore_merges_ = m.value("ignore_merges", false);
    if (auto u = m.value("unk_token", json()); u.is_string())
      if (auto it = tk->ids_.find(u.get<std::string>()); it != tk->ids_.end()) {
        tk->unk_id = it->second;
        tk->use_unk_ = true;
      }
    for (auto& a : j.value("added_tokens", json::array())) {
      AddedToken t{a.at("content"), a.at("id"), a.value("special", false), a.value("lstrip", false),
                   a.value("rstrip", false)};
      tk->vocab_[size_t(t.id)] = t.content;
      tk->ids_[t.content] = t.id;
      tk->added_.push_back(std::move(t));
    }
    add_normalizer(j.value("normalizer", json()), tk->normalizers_, src);
    add_pre(j.value("pre_tokenizer", json()), tk->pre_, src);
    add_decoder(j.value("decoder", json()), tk->decoders_, src);
    std::function<void(const json&)> post = [&](const json& p) {
      if (p.is_null()) return;
      const std::string t = p.at("type");
      if (t == "Sequence") {
        for (auto& x : p.at("processors")) post(x);
      } else if (t == "TemplateProcessing") {
        tk->has_post_template_ = true;
        tk->post_single_.clear();
        for (auto& item : p.at("single")) {
          if (item.contains("Sequence")) {
            tk->post_single_.push_back({});
          } else {
            const std::string id = item.at("SpecialToken").at("id");
            std::vector<int32_t> ids;
            for (const json& x : p.at("special_tokens").at(id).at("ids")) {
              // a float past int32 would convert with undefined behaviour (fuzz_tokenizer)
              if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= kMaxVocab)
                throw TextError(
                    fmt::format("{}: post-processor token id {} is not an integer in "
                                "[0, {})",
                                src, x.dump(), kMaxVocab));
              ids.push_back(int32_t(x.get<int64_t>()));
            }
            tk->post_single_.push_back(std::move(ids));
          }
        }
      } else if (t != "ByteLevel") {
        unsupported(src, "post-processor", p);
      }
    };
    post(j.value("post_processor", json()));
  } catch (const json::exception& e) {
    throw TextError(fmt::format("{}: malformed tokenizer: {}", src, e.what()));
  }
  bool byte_level = false;
  for (auto& p : tk->pre_) byte_level |= p.kind == PreTokenizerStep::ByteLevel;
  tk->kind_ = std::string("tokenizer.json:BPE/") + (byte_level ? "byte-level" : "sentencepiece");
  tk->finish_setup();
  return tk;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  const std::string& src = f.path();
  auto model = f.get_str("tokenizer.ggml.model");
  if (!model)
    throw TextError(src + ": no tokenizer in this GGUF file (tokenizer.ggml.model missing)");
  auto* tokens = f.get("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != GgufType::ARRAY || tokens->elem_type != GgufType::STRING)
    throw TextError(src + ": tokenizer.ggml.tokens is missing or not a string array");
  // An array's elements all have its element type: checking it once makes
  // the typed reads below safe.
  auto array_of = [&](const char* key, bool (*ok)(GgufType)) -> const GgufValue* {
    const GgufValue* v = f.get(key);
    if (v && (v->type != GgufType::ARRAY || !ok(v->elem_type)))
      throw TextError(fmt::format("{}: {} has the wrong type", src, key));
    return v;
  };
  auto is_int = [](GgufType t) { return GgufValue{t}.is_int(); };
  auto is_number = [](GgufType t) { return GgufValue{t}.is_int() || GgufValue{t}.is_float(); };
  auto is_string = [](GgufType t) { return t == GgufType::STRING; };
  std::unique_ptr<Tokenizer> tk(new Tokenizer);
  const auto& toks = tokens->as_array();
  if (toks.size() > size_t(INT32_MAX))
    throw TextError(fmt::format("{}: {} tokens is more than wick's ids hold", src, toks.size()));
  tk->vocab_.reserve(toks.size());
  for (size_t i = 0; i < toks.size(); ++i) {
    tk->vocab_.push_back(toks[i].as_str());
    tk->ids_.emplace(toks[i].as_str(), int32_t(i));
  }
  std::vector<int64_t> types(toks.size(), 1);
  if (auto* tt = array_of("tokenizer.ggml.token_type", is_int))
    for (size_t i = 0; i < std::min(types.size(), tt->as_array().size()); ++i)
      types[i] = tt->as_array()[i].as_int();
  auto id_of = [&](const char* key) -> std::optional<int32_t> {
    auto v = f.get_int(key);
    if (!v || *v < 0 || *v >= int64_t(toks.size())) return std::nullopt;
    return int32_t(*v);
  };
  tk->bos_id = id_of("tokenizer.ggml.bos_token_id");
  tk->eos_id = id_of("tokenizer.ggml.eos_token_id");
  tk->unk_id = id_of("tokenizer.ggml.unknown_token_id");
  tk->pad_id = id_of("tokenizer.ggml.padding_token_id");
  tk->fim_pre_id = id_of("tokenizer.ggml.fim_pre_token_id");
  if (!tk->fim_pre_id) tk->fim_pre_id = id_of("tokenizer.ggml.prefix_token_id");  // older files
  tk->fim_suf_id = id_of("tokenizer.ggml.fim_suf_token_id");
  if (!tk->fim_suf_id) tk->fim_suf_id = id_of("tokenizer.ggml.suffix_token_id");
  tk->fim_mid_id = id_of("tokenizer.ggml.fim_mid_token_id");
  if (!tk->fim_mid_id) tk->fim_mid_id = id_of("tokenizer.ggml.middle_token_id");
  tk->fim_sep_id = id_of("tokenizer.ggml.fim_sep_token_id");
  // unknown (2) and control (3) tokens are special; user-defined (4) are
  // always-parsed added tokens
  for (size_t i = 0; i < types.size(); ++i)
    if (types[i] == 2 || types[i] == 3 || types[i] == 4)
      tk->added_.push_back({tk->vocab_[i], int32_t(i), types[i] != 4, false, false});
  const bool add_bos = f.get_int("tokenizer.ggml.add_bos_token").value_or(*model == "llama");
  const bool add_eos = f.get_int("tokenizer.ggml.add_eos_token").value_or(0) != 0;
  if ((add_bos && tk->bos_id) || (add_eos && tk->eos_id)) {
    tk->has_post_template_ = true;
    if (add_bos && tk->bos_id) tk->post_single_.push_back({*tk->bos_id});
    tk->post_single_.push_back({});
    if (add_eos && tk->eos_id) tk->post_single_.push_back({*tk->eos_id});
  }
  if (*model == "gpt2") {
    auto* merges = array_of("tokenizer.ggml.merges", is_string);
    if (!merges) throw TextError(src + ": tokenizer.ggml.merges is missing");
    int32_t rank = 0;
    for (auto& mv : merges->as_array()) {
      const std::string& s = mv.as_str();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos)
        throw TextError(fmt::format("{}: merge '{}' has no space", src, s));
      auto ia = tk->ids_.find(s.substr(0, sp)), ib = tk->ids_.find(s.substr(sp + 1)),
           iab = tk->ids_.find(s.substr(0, sp) + s.substr(sp + 1));
      if (ia != tk->ids_.end() && ib != tk->ids_.end() && iab != tk->ids_.end())
        tk->merges_.emplace(uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second),
                            Merge{double(rank), iab->second});
      ++rank;
    }
    const std::string pre = f.get_str("tokenizer.ggml.pre").value_or("default");
    PreTokenizerStep bl{};
    bl.kind = PreTokenizerStep::ByteLevel;
    auto split = [&](const char* re) {
      PreTokenizerStep s{};
      s.kind = PreTokenizerStep::Split;
      s.regex = std::make_shared<Regex>(re);
      tk->pre_.push_back(s);
    };
    if (pre == "llama3" || pre == "llama-bpe") {
      split(kLlama3Regex);
      tk->ignore_merges_ = true;
    } else if (pre == "qwen2") {
      tk->normalizers_.push_back({NormalizerStep::Nfc, "", ""});
      split(kQwen2Regex);
    } else if (pre == "smollm" || pre == "refact" || pre == "starcoder") {
      // single digits, then GPT-2's split (Granite's GGUF files name it refact)
      PreTokenizerStep d{};
      d.kind = PreTokenizerStep::Digits;
      d.individual_digits = true;
      tk->pre_.push_back(d);
      bl.regex = std::make_shared<Regex>(kGpt2Regex);
    } else if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
      bl.regex = std::make_shared<Regex>(kGpt2Regex);
    } else {
      throw TextError(fmt::format(
          "{}: tokenizer.ggml.pre '{}' is not supported (llama-bpe, llama3, qwen2, smollm, refact, "
          "starcoder, gpt-2)",
          src, pre));
    }
    tk->pre_.push_back(bl);
    tk->decoders_.push_back({DecoderStep::ByteLevel, "", "", 0, 0, "always"});
    tk->kind_ = "gguf:gpt2/" + pre;
  } else if (*model == "llama") {
    auto* scores = array_of("tokenizer.ggml.scores", is_number);
    if (!scores || scores->as_array().size() != toks.size())
      throw TextError(src + ": tokenizer.ggml.scores is missing or has the wrong length");
    for (auto& s : scores->as_array()) tk->scores_.push_back(float(s.as_float()));
    tk->merge_by_score_ = true;
    tk->byte_fallback_ = true;
    tk->fuse_unk_ = true;
    tk->use_unk_ = true;
    const std::string space = "\xe2\x96\x81";
    if (f.get_int("tokenizer.ggml.add_space_prefix").value_or(1))
      tk->normalizers_.push_back({NormalizerStep::Prepend, space, ""});
    tk->normalizers_.push_back({NormalizerStep::Replace, " ", space});
    tk->decoders_ = {{DecoderStep::Replace, space, " ", 0, 0, "always"},
                     {DecoderStep::ByteFallback, "", "", 0, 0, "always"},
                     {DecoderStep::Fuse, "", "", 0, 0, "always"},
                     {DecoderStep::Strip, " ", "", 1, 0, "always"}};
    // unknown, control and byte tokens do not take part in merges
    for (size_t i = 0; i < types.size(); ++i)
      if (types[i] == 2 || types[i] == 3 || types[i] == 6) tk->scores_[i] = -1e30f;
    tk->kind_ = "gguf:llama";
  } else {
    throw TextError(
        fmt::format("{}: tokenizer model '{}' is not supported (gpt2, llama)", src, *model));
  }
  tk->chat_template = f.get_str("tokenizer.chat_template").value_or("");
  if (tk->bos_id) tk->bos_token = tk->vocab_[size_t(*tk->bos_id)];
  if (tk->eos_id) tk->eos_token = tk->vocab_[size_t(*tk->eos_id)];
  tk->finish_setup();
  return tk;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& source) {
  fs::path p(source);
  if (fs::is_directory(p)) {
    fs::path tj = p / "tokenizer.json";
    if (!fs::exists(tj)) throw TextError(source + ": no tokenizer.json in this folder");
    auto tk = from_json(read_file(tj.string()), tj.string());
    fs::path cfg = p / "tokenizer_config.json";
    if (fs::exists(cfg)) {
      json c;
      try {
        c = json::parse(read_file(cfg.string()));
      } catch (const json::exception& e) {
        throw TextError(fmt::format("{}: not valid JSON: {}", cfg.string(), e.what()));
      }
      if (c.contains("chat_template")) {
        const json& t = c["chat_template"];
        if (t.is_string())
          tk->chat_template = t;
        else if (t.is_array())  // named templates: take "default"
          for (auto& x : t)
            if (x.is_object() && x.contains("name") && x["name"] == "default" &&
                x.contains("template") && x["template"].is_string())
              tk->chat_template = x["template"];
      }
      tk->bos_token = token_text(c.value("bos_token", json()));
      tk->eos_token = token_text(c.value("eos_token", json()));
      if (auto id = tk->token_id(tk->bos_token); id && !tk->bos_token.empty()) tk->bos_id = id;
      if (auto id = tk->token_id(tk->eos_token); id && !tk->eos_token.empty()) tk->eos_id = id;
    }
    return tk;
  }
  if (!fs::exists(p)) throw TextError(source + ": no such file or folder");
  if (p.extension() == ".gguf") {
    GgufFile f(source);
    return from_gguf(f);
  }
  return from_json(read_file(source), source);
}

}  // namespace wick
