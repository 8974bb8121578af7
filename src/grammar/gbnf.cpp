// GBNF text -> Grammar: a recursive-descent parser that builds rules of
// alternatives, turns groups and repetitions into rules of their own and
// characters into UTF-8 byte sequences, then flattens and checks the result.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "grammar/grammar.h"
#include "grammar/utf8_ranges.h"

namespace wick::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

struct AElem {
  bool is_ref = false;
  ByteSet set{};
  int32_t rule = -1;
};
using ASeq = std::vector<AElem>;
struct ARule {
  std::string name;
  std::vector<ASeq> alts;
  bool defined = false;
  size_t first_use = 0;  // offset of the first reference (for "undefined rule")
};

AElem byte_elem(uint8_t lo, uint8_t hi) {
  AElem e;
  for (unsigned b = lo; b <= hi; ++b) e.set[b >> 6] |= uint64_t(1) << (b & 63);
  return e;
}

constexpr int kMaxNesting = 256;  // nested groups (the parser recurses on them)

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::vector<ARule> parse() {
    for (;;) {
      skip_space(true);
      if (at_end()) break;
      parse_rule();
    }
    for (const auto& r : rules_)
      if (!r.defined) fail_at(r.first_use, fmt::format("undefined rule '{}'", r.name));
    if (!names_.count("root")) fail_at(0, "the grammar has no 'root' rule");
    return std::move(rules_);
  }

 private:
  [[noreturn]] void fail_at(size_t at, const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError(fmt::format("grammar line {}, column {}: {}", line, col, msg));
  }
  [[noreturn]] void fail(const std::string& msg) const { fail_at(pos_, msg); }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }

  // Spaces, tabs and comments; newlines too when newline_ok.
  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  int32_t rule_index(const std::string& name, size_t at) {
    auto [it, fresh] = names_.try_emplace(name, int32_t(rules_.size()));
    if (fresh) {
      rules_.push_back({});
      rules_.back().name = name;
      rules_.back().first_use = at;
    }
    return it->second;
  }

  int32_t new_rule(const std::string& parent, std::vector<ASeq> alts) {
    std::string name;
    do {
      name = fmt::format("{}-{}", parent, ++n_generated_);
    } while (names_.count(name));
    const int32_t id = rule_index(name, pos_);
    rules_[size_t(id)].alts = std::move(alts);
    rules_[size_t(id)].defined = true;
    count_elems(rules_[size_t(id)].alts);
    return id;
  }

  void count_elems(const std::vector<ASeq>& alts) {
    for (const auto& a : alts) n_elems_ += a.size() + 1;
    if (n_elems_ > kMaxGrammarElems)
      fail(fmt::format("the grammar expands to more than {} elements", kMaxGrammarElems));
  }

  std::string parse_name() {
    const size_t b = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == b) fail(fmt::format("expected a rule name, found '{}'", printable(peek())));
    return std::string(s_.substr(b, pos_ - b));
  }

  static std::string printable(char c) {
    if (c == '\0') return "end of text";
    if (c == '\n') return "\\n";
    return std::string(1, c);
  }

  void parse_rule() {
    const size_t at = pos_;
    const std::string name = parse_name();
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") fail(fmt::format("expected '::=' after rule name '{}'", name));
    pos_ += 3;
    skip_space(true);
    const int32_t id = rule_index(name, at);
    if (rules_[size_t(id)].defined) fail_at(at, fmt::format("rule '{}' is defined twice", name));
    rules_[size_t(id)].defined = true;  // before the body: self references are fine
    auto alts = parse_alternates(name, false);
    count_elems(alts);
    rules_[size_t(id)].alts = std::move(alts);
    if (!at_end() && peek() != '\n' && peek() != '\r')
      fail(fmt::format("unexpected '{}' after rule '{}'", printable(peek()), name));
  }

  std::vector<ASeq> parse_alternates(const std::string& rule, bool nested) {
    std::vector<ASeq> alts;
    alts.push_back(parse_sequence(rule, nested));
    for (;;) {
      skip_space(nested);
      if (!nested && (peek() == '\n' || peek() == '\r')) {
        // a following line that starts with '|' continues the rule
        const size_t save = pos_;
        skip_space(true);
        if (peek() != '|') {
          pos_ = save;
          return alts;
        }
      }
      if (peek() != '|') return alts;
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(rule, nested));
    }
  }

  ASeq parse_sequence(const std::string& rule, bool nested) {
    ASeq seq;
    size_t last_begin = 0;  // where the last item's elements start in seq
    bool have_last = false;
    for (;;) {
      skip_space(nested);
      if (at_end()) break;
      const char c = peek();
      if (c == '"') {
        last_begin = seq.size();
        parse_literal(seq);
        have_last = true;
      } else if (c == '[') {
        last_begin = seq.size();
        seq.push_back(parse_class(rule));
        have_last = true;
      } else if (c == '.') {
        ++pos_;
        last_begin = seq.size();
        seq.push_back(chars_elem(rule, normalize_ranges({{0, kMaxCodePoint}})));
        have_last = true;
      } else if (c == '(') {
        if (++depth_ > kMaxNesting)
          fail(fmt::format("groups nest deeper than {} levels", kMaxNesting));
        ++pos_;
        skip_space(true);
        auto alts = parse_alternates(rule, true);
        --depth_;
        skip_space(true);
        if (peek() != ')') fail("expected ')' to close the group");
        ++pos_;
        last_begin = seq.size();
        seq.push_back(ref(new_rule(rule, std::move(alts))));
        have_last = true;
      } else if (is_name_char(c)) {
        const size_t at = pos_;
        const std::string name = parse_name();
        skip_space(false);
        if (s_.substr(pos_, 3) == "::=")
          fail_at(at, fmt::format("rule '{}' starts before the previous rule ended (a newline "
                                  "ends a rule)",
                                  name));
        last_begin = seq.size();
        seq.push_back(ref(rule_index(name, at)));
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) fail(fmt::format("'{}' with nothing before it to repeat", c));
        repeat(rule, seq, last_begin);
        have_last = false;  // "x**" is an error, as in llama.cpp
      } else {
        break;  // '|', ')', a newline: the caller decides
      }
    }
    return seq;
  }

  static AElem ref(int32_t rule) {
    AElem e;
    e.is_ref = true;
    e.rule = rule;
    return e;
  }

  // The last item (seq[begin..]) as one element: itself, or a rule of it.
  AElem last_item(const std::string& rule, ASeq& seq, size_t begin) {
    if (seq.size() - begin == 1) {
      AElem e = seq.back();
      seq.pop_back();
      return e;
    }
    ASeq item(seq.begin() + long(begin), seq.end());
    seq.resize(begin);
    return ref(new_rule(rule, {item}));
  }

  int64_t parse_count() {
    const size_t b = pos_;
    int64_t v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 100000) fail("repetition count too large (at most 100000)");
      ++pos_;
    }
    return pos_ == b ? -1 : v;
  }

  void repeat(const std::string& rule, ASeq& seq, size_t begin) {
    const char op = peek();
    ++pos_;
    int64_t lo = 0, hi = -1;  // hi -1: unbounded
    if (op == '+') lo = 1;
    if (op == '?') hi = 1;
    if (op == '{') {
      skip_space(false);
      lo = parse_count();
      skip_space(false);
      if (peek() == ',') {
        ++pos_;
        skip_space(false);
        hi = parse_count();
      } else {
        if (lo < 0) fail("expected a count in '{m,n}'");
        hi = lo;
      }
      skip_space(false);
      if (peek() != '}') fail("expected '}' to close the repetition");
      ++pos_;
      if (lo < 0) lo = 0;
      if (hi >= 0 && hi < lo) fail(fmt::format("repetition {{{},{}}}: max below min", lo, hi));
    }
    const AElem x = last_item(rule, seq, begin);
    n_elems_ += size_t(lo) + size_t(std::max<int64_t>(hi - lo, 0)) * 3;
    if (n_elems_ > kMaxGrammarElems)
      fail(fmt::format("the grammar expands to more than {} elements", kMaxGrammarElems));
    for (int64_t i = 0; i < lo; ++i) seq.push_back(x);
    if (hi < 0) {  // x*: r ::= x r | (empty)
      const int32_t r = new_rule(rule, {});
      rules_[size_t(r)].alts = {ASeq{x, ref(r)}, ASeq{}};
      seq.push_back(ref(r));
    } else if (hi > lo) {  // nested optionals: (x (x (x)?)?)?
      int32_t inner = -1;
      for (int64_t i = 0; i < hi - lo; ++i) {
        ASeq body{x};
        if (inner >= 0) body.push_back(ref(inner));
        inner = new_rule(rule, {body, ASeq{}});
      }
      seq.push_back(ref(inner));
    }
  }

  // One code point of the text (UTF-8), or an escape.
  uint32_t parse_char() {
    if (at_end()) fail("unexpected end of text");
    const unsigned char c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return uint32_t(e);
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        default:
          pos_ -= 2;
          fail(fmt::format("unknown escape '\\{}'", printable(e)));
      }
    }
    // decode UTF-8
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + size_t(n) > s_.size()) fail("invalid UTF-8 in the grammar");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i) {
      const unsigned char k = static_cast<unsigned char>(s_[pos_ + size_t(i)]);
      if ((k >> 6) != 2) fail("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (k & 0x3F);
    }
    pos_ += size_t(n);
    return cp;
  }

  uint32_t parse_hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const char h = peek();
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) fail(fmt::format("expected {} hex digits", n));
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    if (v > kMaxCodePoint) fail(fmt::format("code point {:#x} is past U+10FFFF", v));
    return v;
  }

  void parse_literal(ASeq& seq) {
    const size_t at = pos_;
    ++pos_;  // "
    std::vector<uint8_t> bytes;
    for (;;) {
      if (at_end() || peek() == '\n') fail_at(at, "unterminated string literal");
      if (peek() == '"') break;
      append_utf8(parse_char(), bytes);
    }
    ++pos_;
    for (uint8_t b : bytes) seq.push_back(byte_elem(b, b));
  }

  AElem parse_class(const std::string& rule) {
    const size_t at = pos_;
    ++pos_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges ranges;
    for (;;) {
      if (at_end() || peek() == '\n') fail_at(at, "unterminated character class");
      if (peek() == ']') break;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail(fmt::format("character range {:#x}-{:#x} is reversed", lo, hi));
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    ranges = normalize_ranges(ranges);
    if (negated) ranges = complement_ranges(ranges);
    if (ranges.empty()) fail_at(at, "the character class matches nothing");
    return chars_elem(rule, ranges);
  }

  // An element matching one character of the ranges: a byte set when all
  // are ASCII, else a rule with an alternative per UTF-8 byte sequence.
  AElem chars_elem(const std::string& rule, const Ranges& ranges) {
    AElem ascii;
    bool has_ascii = false;
    std::vector<ByteSeq> seqs;
    for (auto [lo, hi] : ranges) {
      if (lo < 0x80) {
        const AElem a = byte_elem(uint8_t(lo), uint8_t(std::min<uint32_t>(hi, 0x7F)));
        for (int i = 0; i < 4; ++i) ascii.set[size_t(i)] |= a.set[size_t(i)];
        has_ascii = true;
        if (hi < 0x80) continue;
        lo = 0x80;
      }
      utf8_sequences(lo, hi, seqs);
    }
    if (seqs.empty()) return ascii;
    const std::string key = fmt::format("{}", fmt::join(flatten(ranges), ","));
    if (auto it = class_rules_.find(key); it != class_rules_.end()) return ref(it->second);
    std::vector<ASeq> alts;
    if (has_ascii) alts.push_back({ascii});
    for (const auto& s : seqs) {
      ASeq a;
      for (auto r : s) a.push_back(byte_elem(r.lo, r.hi));
      alts.push_back(std::move(a));
    }
    const int32_t id = new_rule(rule, std::move(alts));
    class_rules_[key] = id;
    return ref(id);
  }

  static std::vector<uint32_t> flatten(const Ranges& r) {
    std::vector<uint32_t> v;
    for (auto [a, b] : r) {
      v.push_back(a);
      v.push_back(b);
    }
    return v;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::vector<ARule> rules_;
  std::map<std::string, int32_t> names_;
  std::map<std::string, int32_t> class_rules_;  // one rule per distinct non-ASCII class
  int n_generated_ = 0;
  size_t n_elems_ = 0;
  int depth_ = 0;  // open groups
};

// Rules that can match the empty string: an alternative is nullable once
// all its elements are nullable rules (a worklist, linear in the grammar).
std::vector<bool> nullable_rules(const std::vector<ARule>& rules) {
  std::vector<bool> nullable(rules.size(), false);
  struct Alt {
    int32_t rule;
    size_t n_left;  // elements not known to be nullable yet
  };
  std::vector<Alt> alts;
  std::vector<std::vector<size_t>> used_in(rules.size());  // rule -> alts that hold it
  std::vector<int32_t> work;
  for (size_t r = 0; r < rules.size(); ++r)
    for (const auto& alt : rules[r].alts) {
      bool has_bytes = false;
      for (const auto& e : alt) has_bytes |= !e.is_ref;
      if (has_bytes) continue;
      alts.push_back({int32_t(r), alt.size()});
      for (const auto& e : alt) used_in[size_t(e.rule)].push_back(alts.size() - 1);
      if (alt.empty() && !nullable[r]) {
        nullable[r] = true;
        work.push_back(int32_t(r));
      }
    }
  while (!work.empty()) {
    const int32_t r = work.back();
    work.pop_back();
    for (size_t a : used_in[size_t(r)])
      if (--alts[a].n_left == 0 && !nullable[size_t(alts[a].rule)]) {
        nullable[size_t(alts[a].rule)] = true;
        work.push_back(alts[a].rule);
      }
  }
  return nullable;
}

// A rule that can reach itself without matching a byte never ends expanding.
void check_left_recursion(const std::vector<ARule>& rules) {
  const auto nullable = nullable_rules(rules);
  std::vector<std::vector<int32_t>> left(rules.size());  // rules that can start a rule
  for (size_t r = 0; r < rules.size(); ++r)
    for (const auto& alt : rules[r].alts)
      for (const auto& e : alt) {
        if (!e.is_ref) break;
        left[r].push_back(e.rule);
        if (!nullable[size_t(e.rule)]) break;
      }
  // depth-first without recursion (a chain of rules may be long)
  std::vector<int> color(rules.size(), 0);       // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;  // rule, next edge
  for (size_t start = 0; start < rules.size(); ++start) {
    if (color[start]) continue;
    path.push_back({int32_t(start), 0});
    color[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == left[size_t(r)].size()) {
        color[size_t(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t n = left[size_t(r)][next++];
      if (color[size_t(n)] == 1) {
        std::string cycle;
        size_t from = 0;
        while (path[from].first != n) ++from;
        for (size_t i = from; i < path.size(); ++i)
          cycle += rules[size_t(path[i].first)].name + " -> ";
        throw GrammarError("grammar: left recursion (" + cycle + rules[size_t(n)].name +
                           ") would never end; rewrite it with repetition");
      }
      if (color[size_t(n)] == 0) {
        color[size_t(n)] = 1;
        path.push_back({n, 0});
      }
    }
  }
}

}  // namespace

std::shared_ptr<const Grammar> compile_gbnf(std::string_view text) {
  if (text.size() > kMaxGrammarBytes)
    throw GrammarError(
        fmt::format("the grammar is {} bytes; at most {}", text.size(), kMaxGrammarBytes));
  std::vector<ARule> rules = Parser(text).parse();
  check_left_recursion(rules);
  auto g = std::make_shared<Grammar>();
  std::map<ByteSet, int32_t> set_ids;
  g->alts.resize(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    g->rule_names.push_back(rules[r].name);
    if (rules[r].name == "root") g->root = int32_t(r);
    for (const auto& alt : rules[r].alts) {
      g->alts[r].push_back(int32_t(g->elems.size()));
      for (const auto& e : alt) {
        if (e.is_ref) {
          g->elems.push_back({Grammar::Kind::Ref, e.rule});
        } else {
          auto [it, fresh] = set_ids.try_emplace(e.set, int32_t(g->sets.size()));
          if (fresh) g->sets.push_back(e.set);
          g->elems.push_back({Grammar::Kind::Bytes, it->second});
        }
      }
      g->elems.push_back({Grammar::Kind::End, int32_t(r)});
    }
  }
  set_byte_classes(*g);
  return g;
}

void set_byte_classes(Grammar& g) {
  // refine one partition set by set: a class splits into its bytes in the
  // set and those outside it
  std::array<uint16_t, 256> cls{};
  size_t n_classes = 1;
  std::array<int16_t, 512> renum;
  for (const ByteSet& s : g.sets) {
    renum.fill(-1);
    size_t n_next = 0;
    for (unsigned b = 0; b < 256; ++b) {
      const size_t key = size_t(cls[b]) * 2 + has_byte(s, uint8_t(b));
      if (renum[key] < 0) renum[key] = int16_t(n_next++);
      cls[b] = uint16_t(renum[key]);
    }
    n_classes = n_next;
    if (n_classes == 256) break;  // every byte alone already
  }
  g.class_bytes.assign(n_classes, {});
  for (unsigned b = 0; b < 256; ++b) {
    g.byte_class[b] = uint8_t(cls[b]);
    g.class_bytes[cls[b]].push_back(uint8_t(b));
  }
}

std::string gbnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (char c : bytes) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace wick::grammar
