// Lexer, parser and evaluator of the Jinja subset (see jinja.h).
#include "text/jinja.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <set>
#include <unordered_map>

#include "text/utf8.h"

namespace wick::jinja {

namespace {

// ---------------------------------------------------------------- lexer

struct Tok {
  enum K { Text, OutBegin, OutEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, End } k;
  std::string s;
  int line;
  int64_t i = 0;
  double f = 0;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name, const Template::Options& opt)
      : src_(src), name_(name), opt_(opt) {}

  std::vector<Tok> run() {
    size_t pos = 0;
    bool lstrip_next = false;  // after a "-%}": strip leading whitespace of the next text
    bool trim_newline = false;
    while (pos < src_.size()) {
      size_t open = find_open(pos);
      std::string text = src_.substr(pos, open - pos);
      if (lstrip_next)
        text.erase(0, text.find_first_not_of(" \t\r\n"));
      else if (trim_newline && !text.empty()) {
        if (text[0] == '\n')
          text.erase(0, 1);
        else if (text.compare(0, 2, "\r\n") == 0)
          text.erase(0, 2);
      }
      lstrip_next = trim_newline = false;
      if (open >= src_.size()) {
        push_text(text, pos);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      size_t inner = open + 2;
      const char mod = inner < src_.size() ? src_[inner] : 0;
      if (mod == '-') {
        text.erase(text.find_last_not_of(" \t\r\n") + 1);
        ++inner;
      } else if (mod == '+') {
        ++inner;
      } else if ((kind == '%' || kind == '#') && opt_.lstrip_blocks) {
        // strip spaces and tabs between the line start and the tag
        size_t nl = text.find_last_of('\n');
        size_t from = nl == std::string::npos ? 0 : nl + 1;
        bool at_line_start =
            nl != std::string::npos || pos == 0 || (pos > 0 && src_[pos - 1] == '\n');
        if (at_line_start && text.find_first_not_of(" \t", from) == std::string::npos)
          text.erase(from);
      }
      push_text(text, pos);
      const int line = line_at(open);
      if (kind == '#') {
        size_t close = src_.find("#}", inner);
        if (close == std::string::npos) fail(line, "unclosed comment");
        lstrip_next = close > 0 && src_[close - 1] == '-';
        trim_newline = !lstrip_next && opt_.trim_blocks;
        pos = close + 2;
        continue;
      }
      toks_.push_back({kind == '{' ? Tok::OutBegin : Tok::BlockBegin, "", line});
      pos = lex_tag(inner, kind == '{' ? "}}" : "%}", line, lstrip_next);
      toks_.push_back({kind == '{' ? Tok::OutEnd : Tok::BlockEnd, "", line_at(pos)});
      trim_newline = !lstrip_next && kind == '%' && opt_.trim_blocks;
      if (kind == '%' && is_raw_block()) pos = lex_raw(pos, lstrip_next, trim_newline);
    }
    toks_.push_back({Tok::End, "", line_at(src_.size())});
    return std::move(toks_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& msg) const {
    throw TemplateError(fmt::format("{}: template syntax error at line {}: {}", name_, line, msg));
  }
  int line_at(size_t pos) const {
    return 1 + int(std::count(src_.begin(), src_.begin() + long(std::min(pos, src_.size())), '\n'));
  }
  size_t find_open(size_t pos) const {
    for (size_t p = src_.find('{', pos); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#'))
        return p;
    return src_.size();
  }
  void push_text(const std::string& t, size_t pos) {
    if (!t.empty()) toks_.push_back({Tok::Text, t, line_at(pos)});
  }
  bool is_raw_block() const {
    size_t n = toks_.size();
    return n >= 3 && toks_[n - 2].k == Tok::Name && toks_[n - 2].s == "raw" &&
           toks_[n - 3].k == Tok::BlockBegin;
  }
  // {% raw %}...{% endraw %}: the body is text.
  size_t lex_raw(size_t pos, bool& lstrip_next, bool& trim_newline) {
    toks_.resize(toks_.size() - 3);
    size_t end = src_.find("endraw", pos);
    if (end == std::string::npos) fail(line_at(pos), "unclosed raw block");
    size_t open = src_.rfind("{%", end);
    size_t close = src_.find("%}", end);
    std::string text = src_.substr(pos, open - pos);
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (src_[open + 2] == '-') text.erase(text.find_last_not_of(" \t\r\n") + 1);
    push_text(text, pos);
    lstrip_next = src_[close - 1] == '-';
    trim_newline = !lstrip_next && opt_.trim_blocks;
    return close + 2;
  }

  size_t lex_tag(size_t p, const char* close, int line, bool& lstrip_next) {
    while (true) {
      while (p < src_.size() && std::isspace(uint8_t(src_[p]))) ++p;
      if (p >= src_.size()) fail(line, std::string("missing '") + close + "'");
      const int l = line_at(p);
      if ((src_[p] == '-' || src_[p] == '+') && src_.compare(p + 1, 2, close) == 0) {
        lstrip_next = src_[p] == '-';
        return p + 3;
      }
      if (src_.compare(p, 2, close) == 0) return p + 2;
      const char c = src_[p];
      if (std::isalpha(uint8_t(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() && (std::isalnum(uint8_t(src_[q])) || src_[q] == '_')) ++q;
        toks_.push_back({Tok::Name, src_.substr(p, q - p), l});
        p = q;
      } else if (std::isdigit(uint8_t(c))) {
        size_t q = p;
        while (q < src_.size() && (std::isdigit(uint8_t(src_[q])) || src_[q] == '_')) ++q;
        bool is_float = false;
        if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(uint8_t(src_[q + 1]))) {
          is_float = true;
          ++q;
          while (q < src_.size() && std::isdigit(uint8_t(src_[q]))) ++q;
        }
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          size_t r = q + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          if (r < src_.size() && std::isdigit(uint8_t(src_[r]))) {
            is_float = true;
            q = r;
            while (q < src_.size() && std::isdigit(uint8_t(src_[q]))) ++q;
          }
        }
        std::string num = src_.substr(p, q - p);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        Tok t{is_float ? Tok::Float : Tok::Int, num, l};
        try {
          if (is_float)
            t.f = std::stod(num);
          else
            t.i = std::stoll(num);
        } catch (const std::out_of_range&) {  // Python's ints are unbounded, wick's 64-bit
          fail(l, "number " + num + " is out of range");
        }
        toks_.push_back(t);
        p = q;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t q = p + 1;
        while (q < src_.size() && src_[q] != c) {
          if (src_[q] == '\\' && q + 1 < src_.size()) {
            const char e = src_[++q];
            switch (e) {
              case 'n':
                s += '\n';
                break;
              case 't':
                s += '\t';
                break;
              case 'r':
                s += '\r';
                break;
              case '\\':
                s += '\\';
                break;
              case '\'':
                s += '\'';
                break;
              case '"':
                s += '"';
                break;
              case '0':
                s += '\0';
                break;
              case 'u': {  // \uXXXX
                if (q + 4 < src_.size()) {
                  const std::string hex = src_.substr(q + 1, 4);
                  if (!std::all_of(hex.begin(), hex.end(),
                                   [](char h) { return std::isxdigit((unsigned char)h); }))
                    fail(l, "\\u needs four hexadecimal digits, got '" + hex + "'");
                  utf8::append(s, uint32_t(std::stoul(hex, nullptr, 16)));
                  q += 4;
                }
                break;
              }
              default:
                s += '\\';
                s += e;
            }
            ++q;
          } else {
            s += src_[q++];
          }
        }
        if (q >= src_.size()) fail(l, "unterminated string");
        toks_.push_back({Tok::Str, s, l});
        p = q + 1;
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                    "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                    "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        bool found = false;
        for (const char* op : ops) {
          const size_t n = std::strlen(op);
          if (src_.compare(p, n, op) == 0) {
            toks_.push_back({Tok::Op, op, l});
            p += n;
            found = true;
            break;
          }
        }
        if (!found) fail(l, std::string("unexpected character '") + c + "'");
      }
    }
  }

  const std::string& src_;
  const std::string& name_;
  const Template::Options& opt_;
  std::vector<Tok> toks_;
};

}  // namespace

// ---------------------------------------------------------------- AST
// Named, not anonymous: Template::Node holds a Body (-Wsubobject-linkage
// once a unity build includes this file).
namespace ast {

struct Expr;
using ExprP = std::shared_ptr<Expr>;
struct Expr {
  enum K {
    Lit,
    Var,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Neg,
    Pos,
    Not,
    Bin,
    And,
    Or,
    Cond,
    ListLit,
    DictLit
  } k;
  int line = 0;
  Value lit;
  std::string name;         // Var, Attr, Filter, Test, Bin op
  std::vector<ExprP> args;  // operands / call args / list items / dict k,v pairs
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negated = false;  // Test: "is not"
};

struct Stmt;
using StmtP = std::shared_ptr<Stmt>;
using Body = std::vector<StmtP>;
struct Stmt {
  enum K { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Scope } k;
  int line = 0;
  std::string text;
  ExprP expr;                                    // Output, For iter, Set value
  std::vector<std::pair<ExprP, Body>> branches;  // If (cond null = else)
  std::vector<std::string> names;                // For targets, Set names, Macro params
  ExprP target;                                  // Set on an attribute (ns.x)
  ExprP cond;                                    // For filter
  Body body, else_body;
  std::vector<ExprP> defaults;  // Macro parameter defaults (null = required)
};

}  // namespace ast

using ast::Body, ast::Expr, ast::ExprP, ast::Stmt, ast::StmtP;

struct Template::Node {
  Body body;
};

namespace {

// ---------------------------------------------------------------- parser

class Parser {
 public:
  Parser(std::vector<Tok> toks, const std::string& name, int max_depth)
      : t_(std::move(toks)), name_(name), max_depth_(max_depth) {}

  Body parse_all() {
    Body b = parse_body({});
    if (peek().k != Tok::End) fail(peek().line, "unexpected '{% " + peek_block_name() + " %}'");
    return b;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& msg) const {
    throw TemplateError(fmt::format("{}: template syntax error at line {}: {}", name_, line, msg));
  }
  // One level deeper while alive: the parser recurses, so nesting is bounded.
  struct Nest {
    Nest(Parser& p) : p(p) {
      if (++p.depth_ > p.max_depth_)
        p.fail(p.peek().line,
               fmt::format("blocks or expressions nest deeper than {} levels", p.max_depth_));
    }
    ~Nest() { --p.depth_; }
    Parser& p;
  };
  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Tok& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).k == Tok::Op && peek(k).s == op; }
  bool is_name(const char* n, size_t k = 0) const {
    return peek(k).k == Tok::Name && peek(k).s == n;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(peek().line, fmt::format("expected '{}', got '{}'", op, peek().s));
    ++p_;
  }
  std::string expect_name() {
    if (peek().k != Tok::Name)
      fail(peek().line, fmt::format("expected a name, got '{}'", peek().s));
    return next().s;
  }
  void expect_block_end() {
    if (peek().k != Tok::BlockEnd)
      fail(peek().line, fmt::format("expected '%}}', got '{}'", peek().s));
    ++p_;
  }
  std::string peek_block_name() const {
    return peek().k == Tok::BlockBegin && peek(1).k == Tok::Name ? peek(1).s : peek().s;
  }

  // Parses statements until a block tag whose name is in `stops` (left unconsumed).
  Body parse_body(const std::vector<std::string>& stops) {
    Body body;
    while (peek().k != Tok::End) {
      const Tok& t = peek();
      if (t.k == Tok::Text) {
        auto s = std::make_shared<Stmt>();
        s->k = Stmt::Text;
        s->text = t.s;
        s->line = t.line;
        body.push_back(s);
        ++p_;
      } else if (t.k == Tok::OutBegin) {
        ++p_;
        auto s = std::make_shared<Stmt>();
        s->k = Stmt::Output;
        s->line = t.line;
        s->expr = parse_expr();
        if (peek().k != Tok::OutEnd)
          fail(peek().line, fmt::format("expected '}}}}', got '{}'", peek().s));
        ++p_;
        body.push_back(s);
      } else if (t.k == Tok::BlockBegin) {
        const std::string kw = peek(1).k == Tok::Name ? peek(1).s : "";
        if (std::find(stops.begin(), stops.end(), kw) != stops.end()) return body;
        if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0)
          fail(t.line,
               "unexpected '{% " + kw + " %}'" +
                   (stops.empty() ? std::string() : ", missing '{% " + stops.back() + " %}'"));
        p_ += 2;
        body.push_back(parse_statement(kw, t.line));
      } else {
        fail(t.line, "unexpected '" + t.s + "'");
      }
    }
    if (!stops.empty()) fail(peek().line, "missing '{% " + stops.back() + " %}'");
    return body;
  }

  void end_tag(const char* name) {
    if (!(peek().k == Tok::BlockBegin && is_name(name, 1)))
      fail(peek().line, std::string("missing '{% ") + name + " %}'");
    p_ += 2;
    expect_block_end();
  }

  StmtP parse_statement(const std::string& kw, int line) {
    Nest nest(*this);
    auto s = std::make_shared<Stmt>();
    s->line = line;
    if (kw == "if") {
      s->k = Stmt::If;
      ExprP cond = parse_expr();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"});
        s->branches.emplace_back(cond, std::move(b));
        const std::string k = peek(1).s;
        p_ += 2;
        if (k == "elif") {
          cond = parse_expr();
          expect_block_end();
        } else if (k == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, parse_body({"endif"}));
          end_tag("endif");
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (kw == "for") {
      s->k = Stmt::For;
      s->names.push_back(expect_name());
      while (is_op(",")) {
        ++p_;
        s->names.push_back(expect_name());
      }
      if (!is_name("in")) fail(peek().line, "expected 'in' in for loop");
      ++p_;
      s->expr = parse_or_cond(false);
      if (is_name("if")) {
        ++p_;
        s->cond = parse_or_cond(false);
      }
      if (is_name("recursive")) fail(peek().line, "recursive loops are not supported");
      expect_block_end();
      s->body = parse_body({"else", "endfor"});
      if (is_name("else", 1)) {
        p_ += 2;
        expect_block_end();
        s->else_body = parse_body({"endfor"});
      }
      end_tag("endfor");
    } else if (kw == "set") {
      ExprP target = parse_primary_target();
      if (target->k == Expr::Var) {
        s->names.push_back(target->name);
        while (is_op(",")) {
          ++p_;
          s->names.push_back(expect_name());
        }
      } else {
        s->target = target;
      }
      if (is_op("=")) {
        ++p_;
        s->k = Stmt::Set;
        s->expr = parse_expr();
        expect_block_end();
      } else {
        s->k = Stmt::SetBlock;
        expect_block_end();
        s->body = parse_body({"endset"});
        end_tag("endset");
      }
    } else if (kw == "macro") {
      s->k = Stmt::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        s->names.push_back(expect_name());
        if (is_op("=")) {
          ++p_;
          s->defaults.push_back(parse_expr());
        } else {
          s->defaults.push_back(nullptr);
        }
        if (is_op(","))
          ++p_;
        else if (!is_op(")"))
          fail(peek().line, "expected ',' or ')' in macro parameters");
      }
      ++p_;
      expect_block_end();
      s->body = parse_body({"endmacro"});
      end_tag("endmacro");
    } else if (kw == "break" || kw == "continue") {
      s->k = kw == "break" ? Stmt::Break : Stmt::Continue;
      expect_block_end();
    } else if (kw == "generation") {
      s->k = Stmt::Scope;  // transformers' assistant-mask marker: renders its body
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      end_tag("endgeneration");
    } else {
      fail(line, kw.empty() ? "expected a statement name" : "unknown statement '" + kw + "'");
    }
    return s;
  }

  ExprP make(Expr::K k, int line) {
    auto e = std::make_shared<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  ExprP parse_primary_target() {
    const int line = peek().line;
    auto e = make(Expr::Var, line);
    e->name = expect_name();
    while (is_op(".")) {
      ++p_;
      auto a = make(Expr::Attr, line);
      a->args.push_back(e);
      a->name = expect_name();
      e = a;
    }
    return e;
  }

  ExprP parse_expr() { return parse_or_cond(true); }

  // or-expression with an optional "x if c else y" (not inside for-in).
  ExprP parse_or_cond(bool allow_cond) {
    Nest nest(*this);
    ExprP e = parse_or();
    if (allow_cond && is_name("if")) {
      const int line = next().line;
      auto c = make(Expr::Cond, line);
      c->args.push_back(parse_or());
      c->args.push_back(e);
      if (is_name("else")) {
        ++p_;
        c->args.push_back(parse_or_cond(true));
      }
      return c;
    }
    return e;
  }
  ExprP parse_or() {
    ExprP l = parse_and();
    while (is_name("or")) {
      auto e = make(Expr::Or, next().line);
      e->args = {l, parse_and()};
      l = e;
    }
    return l;
  }
  ExprP parse_and() {
    ExprP l = parse_not();
    while (is_name("and")) {
      auto e = make(Expr::And, next().line);
      e->args = {l, parse_not()};
      l = e;
    }
    return l;
  }
  ExprP parse_not() {
    Nest nest(*this);
    if (is_name("not")) {
      auto e = make(Expr::Not, next().line);
      e->args = {parse_not()};
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP l = parse_add();
    while (true) {
      std::string op;
      if (peek().k == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                  peek().s == "<=" || peek().s == ">" || peek().s == ">="))
        op = next().s;
      else if (is_name("in"))
        op = (++p_, "in");
      else if (is_name("not") && is_name("in", 1))
        op = (p_ += 2, "not in");
      else
        return l;
      auto e = make(Expr::Bin, peek().line);
      e->name = op;
      e->args = {l, parse_add()};
      l = e;
    }
  }
  ExprP parse_add() {
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      auto e = make(Expr::Bin, peek().line);
      e->name = next().s;
      e->args = {l, parse_concat()};
      l = e;
    }
    return l;
  }
  ExprP parse_concat() {
    ExprP l = parse_mul();
    while (is_op("~")) {
      auto e = make(Expr::Bin, next().line);
      e->name = "~";
      e->args = {l, parse_mul()};
      l = e;
    }
    return l;
  }
  ExprP parse_mul() {
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto e = make(Expr::Bin, peek().line);
      e->name = next().s;
      e->args = {l, parse_pow()};
      l = e;
    }
    return l;
  }
  ExprP parse_pow() {
    ExprP l = parse_unary();
    while (is_op("**")) {
      auto e = make(Expr::Bin, next().line);
      e->name = "**";
      e->args = {l, parse_unary()};
      l = e;
    }
    return l;
  }
  ExprP parse_unary() {
    Nest nest(*this);
    if (is_op("-") || is_op("+")) {
      const Expr::K k = is_op("-") ? Expr::Neg : Expr::Pos;
      auto e = make(k, next().line);
      e->args = {parse_unary()};
      return e;
    }
    return parse_filters(parse_postfix(parse_primary()));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().k == Tok::Name && is_op("=", 1)) {
        std::string k = next().s;
        ++p_;
        e.kwargs.emplace_back(k, parse_expr());
      } else {
        e.args.push_back(parse_expr());
      }
      if (is_op(","))
        ++p_;
      else if (!is_op(")"))
        fail(peek().line, "expected ',' or ')' in call");
    }
    ++p_;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      const int line = peek().line;
      if (is_op(".")) {
        ++p_;
        auto a = make(Expr::Attr, line);
        a->args = {e};
        if (peek().k == Tok::Int)
          a->name = std::to_string(next().i);
        else
          a->name = expect_name();
        e = a;
      } else if (is_op("[")) {
        ++p_;
        ExprP parts[3];
        bool is_slice = false;
        int k = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            is_slice = true;
            ++p_;
            if (++k > 2) fail(line, "too many ':' in slice");
            continue;
          }
          if (parts[k]) fail(line, "expected ':' or ']' in a subscript");
          parts[k] = parse_expr();
        }
        ++p_;
        if (!is_slice && !parts[0]) fail(line, "empty subscript: x[] needs an index");
        auto it = make(is_slice ? Expr::Slice : Expr::Item, line);
        it->args = {e, parts[0], parts[1], parts[2]};
        e = it;
      } else if (is_op("(")) {
        auto c = make(Expr::Call, line);
        c->args.push_back(e);
        parse_call_args(*c);
        e = c;
      } else {
        return e;
      }
    }
  }

  ExprP parse_filters(ExprP e) {
    while (true) {
      const int line = peek().line;
      if (is_op("|")) {
        ++p_;
        auto f = make(Expr::Filter, line);
        f->name = expect_name();
        f->args.push_back(e);
        if (is_op("(")) parse_call_args(*f);
        e = f;
      } else if (is_name("is")) {
        ++p_;
        auto t = make(Expr::Test, line);
        if (is_name("not")) {
          ++p_;
          t->negated = true;
        }
        t->name = expect_name();
        t->args.push_back(e);
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (peek().k == Tok::Str || peek().k == Tok::Int || peek().k == Tok::Float ||
                   (peek().k == Tok::Name && !is_name("and") && !is_name("or") &&
                    !is_name("else") && !is_name("if"))) {
          t->args.push_back(parse_primary());  // "is divisibleby 3", "is sameas none"
        }
        e = t;
      } else {
        return e;
      }
    }
  }

  ExprP parse_primary() {
    const Tok& t = peek();
    const int line = t.line;
    if (t.k == Tok::Str) {
      std::string s = next().s;
      while (peek().k == Tok::Str) s += next().s;  // adjacent literals concatenate
      auto e = make(Expr::Lit, line);
      e->lit = Value::str(s);
      return e;
    }
    if (t.k == Tok::Int || t.k == Tok::Float) {
      auto e = make(Expr::Lit, line);
      e->lit = t.k == Tok::Int ? Value::integer(t.i) : Value::real(t.f);
      ++p_;
      return e;
    }
    if (t.k == Tok::Name) {
      ++p_;
      auto e = make(Expr::Lit, line);
      if (t.s == "true" || t.s == "True")
        e->lit = Value::boolean(true);
      else if (t.s == "false" || t.s == "False")
        e->lit = Value::boolean(false);
      else if (t.s == "none" || t.s == "None")
        e->lit = Value::none();
      else {
        e->k = Expr::Var;
        e->name = t.s;
      }
      return e;
    }
    if (is_op("(")) {
      ++p_;
      if (is_op(")")) {  // empty tuple
        ++p_;
        return make(Expr::ListLit, line);
      }
      ExprP first = parse_expr();
      if (is_op(",")) {  // a tuple: treated as a list
        auto l = make(Expr::ListLit, line);
        l->args.push_back(first);
        while (is_op(",")) {
          ++p_;
          if (is_op(")")) break;
          l->args.push_back(parse_expr());
        }
        expect_op(")");
        return l;
      }
      expect_op(")");
      return first;
    }
    if (is_op("[")) {
      ++p_;
      auto l = make(Expr::ListLit, line);
      while (!is_op("]")) {
        l->args.push_back(parse_expr());
        if (is_op(","))
          ++p_;
        else if (!is_op("]"))
          fail(peek().line, "expected ',' or ']' in list");
      }
      ++p_;
      return l;
    }
    if (is_op("{")) {
      ++p_;
      auto d = make(Expr::DictLit, line);
      while (!is_op("}")) {
        d->args.push_back(parse_expr());
        expect_op(":");
        d->args.push_back(parse_expr());
        if (is_op(","))
          ++p_;
        else if (!is_op("}"))
          fail(peek().line, "expected ',' or '}' in dict");
      }
      ++p_;
      return d;
    }
    fail(line, t.k == Tok::OutEnd || t.k == Tok::BlockEnd ? "expected an expression"
                                                          : "unexpected '" + t.s + "'");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  const std::string& name_;
  int max_depth_;
  int depth_ = 0;
};

#include "text/jinja_eval.inc"

}  // namespace

Template::Template(const std::string& source, const std::string& name, Options opt)
    : name_(name), opt_(opt) {
  Lexer lx(source, name_, opt);
  Parser ps(lx.run(), name_, opt.max_depth);
  root_ = std::make_shared<Node>();
  root_->body = ps.parse_all();
}

Template::~Template() = default;

std::string Template::render(const nlohmann::ordered_json& vars,
                             const std::vector<std::pair<std::string, Value>>& globals) const {
  Eval ev(name_, opt_);
  struct Release {
    Eval& ev;
    ~Release() { ev.release(); }
  } release{ev};
  Eval::Scope g, top;
  install_globals(g, ev);
  for (auto& [k, v] : globals) g[k] = v;
  if (vars.is_object())
    for (auto& [k, v] : vars.items()) top[k] = Value::from_json(v);
  ev.scopes = {&g, &top};
  ev.root = &top;
  std::string out;
  try {
    ev.exec(root_->body, out);
  } catch (const LoopBreak&) {
    throw TemplateError(name_ + ": 'break' outside a loop");
  } catch (const LoopContinue&) {
    throw TemplateError(name_ + ": 'continue' outside a loop");
  } catch (const TemplateError&) {
    throw;
  } catch (const std::runtime_error& e) {  // a filter's or test's own error: still the template's
    throw TemplateError(name_ + ": " + e.what());
  }
  return out;
}

bool is_global(const std::string& name) {
  static const std::set<std::string> names = [] {
    const std::string none;
    Eval ev(none, Template::Options{});
    Eval::Scope g;
    install_globals(g, ev);
    std::set<std::string> out;
    for (auto& [k, v] : g) out.insert(k);
    return out;
  }();
  return names.count(name) > 0;
}

}  // namespace wick::jinja
