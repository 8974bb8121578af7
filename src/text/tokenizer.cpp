#include "text/tokenizer.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <queue>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace wick {

namespace {

constexpr size_t kCacheMaxWord = 64;  // longer words are not cached
constexpr size_t kCacheMaxEntries = 1 << 16;

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  out.reserve(s.size());
  size_t last = 0;
  for (size_t pos; (pos = s.find(from, last)) != std::string::npos; last = pos + from.size()) {
    out.append(s, last, pos - last);
    out += to;
  }
  out.append(s, last, std::string::npos);
  return out;
}

std::string utf8proc_map_str(std::string_view s, int options) {
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                        utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(options));
  if (n < 0) throw TextError(std::string("normalization failed: ") + utf8proc_errmsg(n));
  std::string r(reinterpret_cast<char*>(out), size_t(n));
  std::free(out);
  return r;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

std::string normalize(std::string s, const std::vector<NormalizerStep>& steps) {
  for (const auto& st : steps) {
    switch (st.kind) {
      case NormalizerStep::Nfc:
        if (!is_ascii(s)) s = utf8proc_map_str(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        break;
      case NormalizerStep::Nfkc:
        if (!is_ascii(s))
          s = utf8proc_map_str(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case NormalizerStep::Prepend:
        if (!s.empty()) s = st.a + s;
        break;
      case NormalizerStep::Replace:
        s = replace_all(std::move(s), st.a, st.b);
        break;
      case NormalizerStep::Lowercase:
        s = utf8proc_map_str(s, UTF8PROC_STABLE | UTF8PROC_CASEFOLD);
        break;
    }
  }
  return s;
}

using Pieces = std::vector<std::string>;

// Whether the character at s[i] is numeric (Unicode N*, as Rust's
// char::is_numeric); advances i past it either way.
bool is_numeric(const std::string& s, size_t& i) {
  const uint32_t cp = utf8::next(s, i);
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

// Splits each piece at the matches of `find`, keeping what `behavior` says.
template <typename Find>
Pieces split_pieces(const Pieces& in, PreTokenizerStep::Behavior behavior, bool invert, Find find) {
  Pieces out;
  std::vector<std::pair<size_t, size_t>> m;
  for (const auto& p : in) {
    m.clear();
    find(p, m);
    if (invert) {  // the gaps are the delimiters
      std::vector<std::pair<size_t, size_t>> gaps;
      size_t last = 0;
      for (auto [b, e] : m) {
        if (b > last) gaps.emplace_back(last, b);
        last = e;
      }
      if (last < p.size()) gaps.emplace_back(last, p.size());
      m.swap(gaps);
    }
    size_t last = 0;
    std::string pending;  // for MergedWithNext
    for (auto [b, e] : m) {
      std::string gap = p.substr(last, b - last), match = p.substr(b, e - b);
      switch (behavior) {
        case PreTokenizerStep::Isolated:
          if (!gap.empty()) out.push_back(gap);
          out.push_back(match);
          break;
        case PreTokenizerStep::Removed:
          if (!gap.empty()) out.push_back(gap);
          break;
        case PreTokenizerStep::MergedWithPrevious:
          if (!gap.empty())
            out.push_back(gap + match);
          else if (!out.empty() && last > 0)
            out.back() += match;
          else
            out.push_back(match);
          break;
        case PreTokenizerStep::MergedWithNext:
          if (!pending.empty() || !gap.empty()) out.push_back(pending + gap);
          pending = match;
          break;
      }
      last = e;
    }
    std::string tail = p.substr(last);
    if (behavior == PreTokenizerStep::MergedWithNext) tail = pending + tail;
    if (!tail.empty()) out.push_back(tail);
  }
  return out;
}

void find_literal(const std::string& lit, const std::string& s,
                  std::vector<std::pair<size_t, size_t>>& m) {
  for (size_t pos = 0; !lit.empty() && (pos = s.find(lit, pos)) != std::string::npos;
       pos += lit.size())
    m.emplace_back(pos, pos + lit.size());
}

Pieces pre_tokenize(const std::string& text, const std::vector<PreTokenizerStep>& steps,
                    bool first_segment) {
  Pieces pieces{text};
  for (const auto& st : steps) {
    switch (st.kind) {
      case PreTokenizerStep::Split:
        if (st.regex)
          pieces = split_pieces(pieces, st.behavior, st.invert,
                                [&](const std::string& s, auto& m) { st.regex->find_all(s, m); });
        else
          pieces = split_pieces(pieces, st.behavior, st.invert, [&](const std::string& s, auto& m) {
            find_literal(st.literal, s, m);
          });
        break;
      case PreTokenizerStep::Digits:
        pieces = split_pieces(pieces, PreTokenizerStep::Isolated, false,
                              [&](const std::string& s, auto& m) {
                                for (size_t i = 0; i < s.size();) {
                                  size_t j = i;
                                  if (is_numeric(s, j)) {
                                    if (!st.individual_digits)
                                      for (size_t k = j; k < s.size() && is_numeric(s, k);) j = k;
                                    m.emplace_back(i, j);
                                    i = j;
                                  } else {
                                    i = j;
                                  }
                                }
                              });
        break;
      case PreTokenizerStep::ByteLevel: {
        if (st.add_prefix_space)
          for (auto& p : pieces)
            if (p.empty() || p[0] != ' ') p.insert(0, 1, ' ');
        if (st.regex)
          pieces = split_pieces(pieces, PreTokenizerStep::Isolated, false,
                                [&](const std::string& s, auto& m) { st.regex->find_all(s, m); });
        const auto& table = byte_level::byte_to_utf8();
        for (auto& p : pieces) {
          std::string mapped;
          mapped.reserve(p.size() * 2);
          for (unsigned char c : p) mapped += table[c];
          p.swap(mapped);
        }
        break;
      }
      case PreTokenizerStep::Metaspace: {
        for (auto& p : pieces) p = replace_all(p, " ", st.replacement);
        if (!pieces.empty()) {
          bool prepend =
              st.prepend_scheme == "always" || (st.prepend_scheme == "first" && first_segment);
          if (prepend && pieces[0].compare(0, st.replacement.size(), st.replacement) != 0)
            pieces[0].insert(0, st.replacement);
        }
        if (st.split)
          pieces = split_pieces(
              pieces, PreTokenizerStep::MergedWithNext, false,
              [&](const std::string& s, auto& m) { find_literal(st.replacement, s, m); });
        break;
      }
    }
  }
  return pieces;
}

}  // namespace

std::optional<int32_t> Tokenizer::token_id(const std::string& token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < special_.size() && special_[size_t(id)];
}

bool Tokenizer::strips_leading_space() const {
  for (auto& d : decoders_)
    if (d.kind == DecoderStep::Strip || d.kind == DecoderStep::Metaspace) return true;
  return false;
}

void Tokenizer::finish_setup() {
  std::sort(added_.begin(), added_.end(),
            [](auto& a, auto& b) { return a.content.size() > b.content.size(); });
  for (auto& v : added_first_) v.clear();
  for (size_t k = 0; k < added_.size(); ++k)
    if (!added_[k].content.empty()) added_first_[uint8_t(added_[k].content[0])].push_back(int(k));
  special_.assign(vocab_.size(), false);
  for (auto& a : added_)
    if (a.special && a.id >= 0 && size_t(a.id) < special_.size()) special_[size_t(a.id)] = true;
  for (int b = 0; b < 256; ++b) {
    auto id = token_id(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = id ? *id : -1;
  }
}

std::optional<Tokenizer::Merge> Tokenizer::merge(int32_t a, int32_t b) const {
  if (merge_by_score_) {
    auto it = ids_.find(vocab_[size_t(a)] + vocab_[size_t(b)]);
    if (it == ids_.end()) return std::nullopt;
    return Merge{-double(scores_[size_t(it->second)]), it->second};
  }
  auto it = merges_.find(uint64_t(uint32_t(a)) << 32 | uint32_t(b));
  if (it == merges_.end()) return std::nullopt;
  return it->second;
}

// BPE over one pre-tokenized word: start from characters (or byte tokens),
// repeatedly apply the best-ranked merge, leftmost first among equals.
void Tokenizer::bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto it = ids_.find(word); it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Sym {
    int32_t id;
    int prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  const int32_t unk = use_unk_ ? unk_id.value_or(-1) : -1;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min<size_t>(size_t(utf8::seq_len(uint8_t(word[i]))), word.size() - i);
    auto it = ids_.find(word.substr(i, n));
    if (it != ids_.end()) {
      syms.push_back({it->second, int(syms.size()) - 1, int(syms.size()) + 1});
    } else if (byte_fallback_ && std::all_of(word.begin() + long(i), word.begin() + long(i + n),
                                             [&](char c) { return byte_ids_[uint8_t(c)] >= 0; })) {
      for (size_t k = 0; k < n; ++k)
        syms.push_back(
            {byte_ids_[uint8_t(word[i + k])], int(syms.size()) - 1, int(syms.size()) + 1});
    } else if (unk >= 0) {
      if (!(fuse_unk_ && !syms.empty() && syms.back().id == unk))
        syms.push_back({unk, int(syms.size()) - 1, int(syms.size()) + 1});
    }  // else dropped, as `tokenizers` does without an unknown token
    i += n;
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  struct Cand {
    double rank;
    int left;
    int32_t a, b, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int l) {
    if (l < 0 || syms[size_t(l)].next < 0) return;
    const Sym& x = syms[size_t(l)];
    if (auto m = merge(x.id, syms[size_t(x.next)].id))
      heap.push({m->rank, l, x.id, syms[size_t(x.next)].id, m->id});
  };
  for (int i = 0; i + 1 < int(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& l = syms[size_t(c.left)];
    if (l.id != c.a || l.next < 0 || syms[size_t(l.next)].id != c.b) continue;  // stale
    const int r = l.next;
    l.id = c.merged;
    l.next = syms[size_t(r)].next;
    if (l.next >= 0) syms[size_t(l.next)].prev = c.left;
    syms[size_t(r)].id = -1;  // removed
    push(l.prev);
    push(c.left);
  }
  for (int i = 0; i >= 0; i = syms[size_t(i)].next) out.push_back(syms[size_t(i)].id);
}

void Tokenizer::encode_segment(std::string_view text, bool first_segment,
                               std::vector<int32_t>& out) const {
  std::string norm = normalize(std::string(text), normalizers_);
  Pieces words;
  try {
    words = pre_tokenize(norm, pre_, first_segment);
  } catch (const RegexError& e) {  // the file's pattern past its limits on this text
    throw TextError(std::string("the tokenizer cannot split this text: ") + e.what());
  }
  for (const std::string& word : words) {
    if (word.empty()) continue;
    if (word.size() <= kCacheMaxWord) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (auto it = cache_.find(word); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    const size_t start = out.size();
    bpe_word(word, out);
    if (word.size() <= kCacheMaxWord) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (cache_.size() >= kCacheMaxEntries) cache_.clear();
      cache_.emplace(word, std::vector<int32_t>(out.begin() + long(start), out.end()));
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  if (size_t bad = utf8::find_invalid(text); bad != std::string_view::npos)
    throw TextError(fmt::format("text is not valid UTF-8 (byte {} of {})", bad, text.size()));
  std::vector<int32_t> ids;
  // Added tokens are cut out first; the text between them is tokenized.
  size_t seg_start = 0, i = 0;
  bool first = true;
  auto flush = [&](size_t end) {
    if (end > seg_start) {
      encode_segment(text.substr(seg_start, end - seg_start), first, ids);
    }
    first = false;
  };
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (int k : added_first_[uint8_t(text[i])]) {
      const AddedToken& a = added_[size_t(k)];
      if (a.special && !opt.parse_special) continue;
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t end = i;
    if (hit->lstrip)
      while (end > seg_start && std::isspace(uint8_t(text[end - 1]))) --end;
    flush(end);
    ids.push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip)
      while (i < text.size() && std::isspace(uint8_t(text[i]))) ++i;
    seg_start = i;
  }
  if (seg_start < text.size() || first) flush(text.size());
  if (opt.add_special && has_post_template_) {
    std::vector<int32_t> out;
    for (const auto& item : post_single_) {
      if (item.empty())
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), item.begin(), item.end());
    }
    return out;
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab())
      throw TextError(fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab()));
    if (skip_special && special_[size_t(id)]) continue;
    toks.push_back(vocab_[size_t(id)]);
  }
  for (const auto& d : decoders_) {
    switch (d.kind) {
      case DecoderStep::ByteLevel: {
        std::string bytes;
        for (const auto& t : toks)
          for (size_t i = 0; i < t.size();) {
            const size_t at = i;
            const int b = byte_level::char_to_byte(utf8::next(t, i));
            if (b >= 0)
              bytes += char(b);
            else
              bytes.append(t, at, i - at);
          }
        toks = {utf8::lossy(bytes)};
        break;
      }
      case DecoderStep::Replace:
        for (auto& t : toks) t = replace_all(t, d.a, d.b);
        break;
      case DecoderStep::ByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        size_t n_bytes = 0;
        auto flush = [&] {
          if (!n_bytes) return;
          if (utf8::find_invalid(bytes) == std::string::npos)
            out.push_back(bytes);
          else
            for (size_t k = 0; k < n_bytes; ++k) out.push_back("\xef\xbf\xbd");
          bytes.clear();
          n_bytes = 0;
        };
        for (auto& t : toks) {
          unsigned v;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
              std::sscanf(t.c_str() + 3, "%2X", &v) == 1) {
            bytes += char(v);
            ++n_bytes;
          } else {
            flush();
            out.push_back(t);
          }
        }
        flush();
        toks.swap(out);
        break;
      }
      case DecoderStep::Fuse: {
        std::string all;
        for (auto& t : toks) all += t;
        toks = {all};
        break;
      }
      case DecoderStep::Strip:
        for (auto& t : toks) {
          size_t b = 0, e = t.size();
          for (int k = 0; k < d.start && b < e && t.compare(b, d.a.size(), d.a) == 0; ++k)
            b += d.a.size();
          for (int k = 0;
               k < d.stop && e >= b + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0;
               ++k)
            e -= d.a.size();
          t = t.substr(b, e - b);
        }
        break;
      case DecoderStep::Metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          toks[i] = replace_all(toks[i], d.a, " ");
          if (i == 0 && d.prepend_scheme != "never" && !toks[i].empty() && toks[i][0] == ' ')
            toks[i].erase(0, 1);
        }
        break;
    }
  }
  std::string out;
  for (auto& t : toks) out += t;
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  std::string t = vocab_.at(size_t(id));
  for (const auto& d : decoders_) {
    switch (d.kind) {
      case DecoderStep::ByteLevel: {
        std::string bytes;
        for (size_t i = 0; i < t.size();) {
          const size_t at = i;
          const int b = byte_level::char_to_byte(utf8::next(t, i));
          if (b >= 0)
            bytes += char(b);
          else
            bytes.append(t, at, i - at);
        }
        t = std::move(bytes);
        break;
      }
      case DecoderStep::Replace:
        t = replace_all(t, d.a, d.b);
        break;
      case DecoderStep::ByteFallback: {
        unsigned v;
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
            std::sscanf(t.c_str() + 3, "%2X", &v) == 1)
          t = std::string(1, char(v));
        break;
      }
      case DecoderStep::Metaspace:
        t = replace_all(t, d.a, " ");
        break;
      case DecoderStep::Fuse:
      case DecoderStep::Strip:  // whole-text steps (a first space), not a token's
        break;
    }
  }
  return t;
}

}  // namespace wick
