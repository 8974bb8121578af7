// A Jinja2 subset, enough for the chat templates that models ship: the
// statements if/elif/else, for (loop.*, else, filters), set (also on a
// namespace and as a block), macro, break/continue, generation; the
// expressions, filters, tests and string/dict methods those templates use.
// Options as transformers renders chat templates: trim_blocks, lstrip_blocks.
// A render is bounded (Options): its output, the strings and lists it makes,
// its loop iterations and its nesting; past a bound it fails with a
// TemplateError naming the line, so a template cannot hang or exhaust memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace wick::jinja {

struct TemplateError : std::runtime_error {  // names the template line
  using std::runtime_error::runtime_error;
};

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, as Python dicts
using Function = std::function<Value(std::vector<Value>& args,
                                     std::vector<std::pair<std::string, Value>>& kwargs)>;

struct Value {
  enum Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable } kind = Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> list;  // shared: namespaces and loop objects are mutable
  std::shared_ptr<Object> dict;
  std::shared_ptr<Function> fn;
  bool is_namespace = false;

  static Value none() { return Value{None}; }
  static Value boolean(bool x) {
    Value v{Bool};
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v{Int};
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v{Float};
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v{String};
    v.s = std::move(x);
    return v;
  }
  static Value array(Array xs = {}) {
    Value v{List};
    v.list = std::make_shared<Array>(std::move(xs));
    return v;
  }
  static Value object(Object xs = {}) {
    Value v{Dict};
    v.dict = std::make_shared<Object>(std::move(xs));
    return v;
  }
  static Value function(Function f) {
    Value v{Callable};
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  const Value* find(const std::string& key) const;  // dict lookup
  void set(const std::string& key, Value v);        // dict insert or replace
};

class Template {
 public:
  struct Options {
    bool trim_blocks = true;
    bool lstrip_blocks = true;
    size_t max_output_bytes = 16u << 20;  // the output, and each string made on the way
    // Loop iterations, items walked by filters and slices, range() items and
    // macro calls, in all; also the most items of one list.
    int64_t max_steps = 100000;
    int max_depth = 100;  // nested macro calls; nested blocks and expressions in the source
  };
  Template(const std::string& source, const std::string& name, Options opt);
  Template(const std::string& source, const std::string& name)
      : Template(source, name, Options{}) {}
  ~Template();
  // Renders with these variables (an object) and extra globals.
  std::string render(const nlohmann::ordered_json& vars,
                     const std::vector<std::pair<std::string, Value>>& globals = {}) const;

  struct Node;  // parsed template

 private:
  std::string name_;
  Options opt_;
  std::shared_ptr<Node> root_;
};

// Whether name is one of the functions every template sees (range, namespace, ...).
bool is_global(const std::string& name);

// Python's str() and json.dumps (ensure_ascii=False) of a value. to_json
// throws TemplateError past max_bytes or 256 levels of nesting (a namespace
// can hold itself).
std::string to_str(const Value& v);
std::string to_json(const Value& v, int indent = -1, bool sort_keys = false,
                    const std::string& item_sep = "", const std::string& key_sep = ": ",
                    size_t max_bytes = SIZE_MAX);

}  // namespace wick::jinja
