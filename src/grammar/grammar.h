// A context-free grammar over bytes, compiled from GBNF (llama.cpp's grammar
// format) or from a JSON schema (grammar/json_schema.h), for constrained
// decoding: grammar/matcher.h follows it token by token and masks the tokens
// that cannot continue it.
//
// The seam for other features (tool calls, say): build the text of a GBNF
// grammar, possibly with a schema's rules inside it, and compile it:
//
//   std::string call = json_schema_to_gbnf(args_schema, {.root_name = "call"});
//   auto g = compile_gbnf(call + "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
//
// Characters (classes, `.`, literals) are expanded into UTF-8 byte
// sequences, so the matcher works on bytes and a token may end in the middle
// of a character; the output is always valid UTF-8 where the grammar is.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace wick::grammar {

// A bad grammar or schema; the message says where (line:column for GBNF,
// the JSON pointer for a schema) and what.
struct GrammarError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using ByteSet = std::array<uint64_t, 4>;  // bit b: byte b matches
inline bool has_byte(const ByteSet& s, uint8_t b) {
  return (s[b >> 6] >> (b & 63)) & 1;
}

struct Grammar {
  // Every alternative of every rule is a run of elements in `elems` ending
  // with an End; a Bytes element matches one byte of its set, a Ref one
  // string of its rule. Repetitions and groups are rules of their own.
  enum class Kind : uint8_t { Bytes, Ref, End };
  struct Elem {
    Kind kind;
    int32_t arg;  // Bytes: index into sets; Ref: rule index; End: the rule it ends
  };
  std::vector<Elem> elems;
  std::vector<ByteSet> sets;
  std::vector<std::vector<int32_t>> alts;  // rule -> start of each alternative in elems
  std::vector<std::string> rule_names;     // generated rules are named "<parent>-<n>"
  int32_t root = -1;
  // Bytes that lie in exactly the same sets form a class: from any state
  // they lead to the same state, so the matcher computes one transition per
  // class. class_bytes[c]: the bytes of class c (set_byte_classes fills both).
  std::array<uint8_t, 256> byte_class{};
  std::vector<std::vector<uint8_t>> class_bytes;
};

// Fills g.byte_class and g.class_bytes from g.sets.
void set_byte_classes(Grammar& g);

// Limits on what one grammar may build (a request's grammar is user input).
inline constexpr size_t kMaxGrammarBytes = 1 << 20;  // GBNF text
inline constexpr size_t kMaxGrammarElems = 1 << 20;  // after expanding repetitions

// Parses GBNF text: `name ::= alternatives` rules (a rule ends at a newline
// outside parentheses; a line starting with `|` continues it), "literals"
// with \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH escapes, [character
// classes] with ranges and ^ negation, `.` (any character), ( groups ),
// `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`, `#` comments. Needs a `root`
// rule; undefined rules and left recursion are errors. Throws GrammarError.
std::shared_ptr<const Grammar> compile_gbnf(std::string_view text);

// A GBNF literal matching exactly these bytes: "..." with quotes,
// backslashes and control bytes escaped.
std::string gbnf_literal(std::string_view bytes);

}  // namespace wick::grammar
