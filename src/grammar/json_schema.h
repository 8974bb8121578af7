// A JSON-schema subset compiled to GBNF (grammar/grammar.h compiles that),
// so that constrained decoding gives JSON valid for the schema.
//
// Supported: type (object, array, string, number, integer, boolean, null,
// or a list of them), properties, required (optional properties may be left
// out; properties come in the schema's order), additionalProperties (false,
// or a schema for objects without properties), enum, const, items,
// prefixItems, minItems / maxItems, minLength / maxLength, pattern (a regex
// subset: literals, escapes, classes, \d \w \s, ., groups, |, * + ? {m,n};
// always matched as a whole), format (date, time, date-time, uuid, email,
// ipv4), anyOf, oneOf (treated as anyOf: the output matches at least one
// branch, so branches that overlap can give output that oneOf rejects),
// allOf with one schema, $ref to #/$defs/... or #/definitions/... (also
// recursive). Annotations (title, description, examples, default, $schema,
// $id, $comment, ...) are ignored. Any other keyword is an error naming it
// and where it is.
//
// Objects never get properties the schema does not declare (with strict
// or not: output stays valid either way). Whitespace between tokens is
// bounded (a space, or a newline and up to 24 spaces or tabs) so that a
// model cannot loop on it; numbers have at most 16 digits before and after
// the point.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace wick::grammar {

struct SchemaOptions {
  std::string root_name = "root";  // the rule matching one value of the schema
  std::string rule_prefix;         // before every other rule's name (to embed in a larger grammar)
};

// GBNF rules for the schema; throws GrammarError naming the unsupported
// keywords (with JSON pointers) or the malformed part.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                const SchemaOptions& opt = {});
// Any JSON object (OpenAI's json_object, Ollama's "json").
std::string json_object_gbnf(const SchemaOptions& opt = {});

// vLLM's guided_regex: GBNF whose language is the plain-text strings the
// regex (the pattern subset above; . is any character but a newline)
// matches as a whole.
std::string regex_to_gbnf(std::string_view regex);
// vLLM's guided_choice: exactly one of the (non-empty) strings.
std::string choice_to_gbnf(const std::vector<std::string>& choices);

}  // namespace wick::grammar
