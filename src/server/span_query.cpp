#include "server/span_query.h"

#include "server/chat_prompt.h"
#include "text/chat_template.h"

namespace wick::server {

namespace {

constexpr size_t kMaxDepth = 32;  // nesting of seq/cross/plus

SpanNode parse_node(const json& j, const std::string& path, size_t depth) {
  if (depth > kMaxDepth) bad(path, fmt::format("{}: nested deeper than {}", path, kMaxDepth));
  if (!j.is_object() || j.size() != 1)
    bad(path,
        path +
            " must be an object with one key (system, user, assistant, seq, cross, "
            "plus or par)",
        "invalid_type");
  const std::string& key = j.begin().key();  // not *items().begin(): see parse_span_query
  const json& val = j.begin().value();
  SpanNode n;
  if (key == "system" || key == "user" || key == "assistant") {
    if (!val.is_string())
      bad(path, fmt::format("{}.{} must be a string", path, key), "invalid_type");
    n.role = key;
    n.content = val.get<std::string>();
    return n;
  }
  if (key == "seq")
    n.kind = SpanNode::Kind::Seq;
  else if (key == "cross")
    n.kind = SpanNode::Kind::Cross;
  else if (key == "plus")
    n.kind = SpanNode::Kind::Plus;
  else if (key == "par")
    n.kind = SpanNode::Kind::Par;
  else
    bad(path, fmt::format("{}: unknown node '{}'", path, key));
  if (!val.is_array()) bad(path, fmt::format("{}.{} must be an array", path, key), "invalid_type");
  for (size_t i = 0; i < val.size(); ++i)
    n.children.push_back(parse_node(val[i], fmt::format("{}.{}[{}]", path, key, i), depth + 1));
  return n;
}

// spnl's model names may keep a provider prefix ("spnl/NAME"): the name is what follows.
std::string model_name(const json& obj, const std::string& path) {
  auto it = obj.find("model");
  if (it == obj.end() || !it->is_string() || it->get<std::string>().empty())
    bad(path + ".model", path + ".model must be a non-empty string", "invalid_type");
  std::string name = *it;
  if (auto slash = name.find('/'); slash != std::string::npos && name.rfind("spnl/", 0) == 0)
    name = name.substr(slash + 1);
  return name;
}

void parse_sampling(const json& obj, const std::string& path, SpanGenerate& g) {
  if (auto it = obj.find("max_tokens"); it != obj.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 24))
      bad(path + ".max_tokens", path + ".max_tokens must be an integer in [0, 16777216]");
    const int64_t v = *it;
    g.max_tokens = v == 0 ? 2048 : int32_t(v);
  }
  if (auto it = obj.find("temperature"); it != obj.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() < 0 || it->get<double>() > 2)
      bad(path + ".temperature", path + ".temperature must be a number in [0, 2]");
    g.temperature = it->get<float>();
  }
}

SpanGenerate parse_generate(const json& obj, const std::string& path) {
  if (!obj.is_object()) bad(path, path + " must be an object", "invalid_type");
  SpanGenerate g;
  g.model = model_name(obj, path);
  if (!obj.contains("input")) bad(path + ".input", path + ".input is missing", "missing");
  g.input = parse_node(obj["input"], path + ".input", 0);
  parse_sampling(obj, path, g);
  parse_span_repair(obj, path + ".", g.repair);
  parse_prompt_logprobs(obj, path + ".", false, g.repair);  // stream comes with the URL
  if (auto it = obj.find("continue_final_message"); it != obj.end() && !it->is_null()) {
    if (!it->is_boolean())
      bad(path + ".continue_final_message", path + ".continue_final_message must be a boolean",
          "invalid_type");
    g.continue_final = it->get<bool>();
  }
  if (auto it = obj.find("span_context"); it != obj.end() && !it->is_null()) {
    if (!it->is_boolean())
      bad(path + ".span_context", path + ".span_context must be a boolean", "invalid_type");
    g.span_context = it->get<bool>();
  }
  return g;
}

void flatten_into(const SpanNode& n, std::vector<PromptPiece>& out, bool independent) {
  if (n.kind == SpanNode::Kind::Message) {
    // a plus child's piece was opened by its parent; dependent messages run on
    if (out.empty() || out.back().independent != independent)
      out.push_back({json::array(), independent});
    out.back().messages.push_back({{"role", n.role}, {"content", n.content}});
    return;
  }
  const bool plus = n.kind == SpanNode::Kind::Plus || n.kind == SpanNode::Kind::Par;
  if (plus && !independent) {
    for (const SpanNode& c : n.children) {
      out.push_back({json::array(), true});
      flatten_into(c, out, true);
    }
    return;
  }
  for (const SpanNode& c : n.children) flatten_into(c, out, independent);
}

std::string render(const ChatTemplate& t, const Tokenizer& tk, const json& msgs, bool gen) {
  json vars = {{"messages", msgs},
               {"add_generation_prompt", gen},
               {"bos_token", tk.bos_token},
               {"eos_token", tk.eos_token}};
  return t.render(vars);
}

// The text msgs add after `before` (the template must render `before` as a prefix).
std::string added_text(const ChatTemplate& t, const Tokenizer& tk, const json& before,
                       const json& msgs, bool gen) {
  json all = before;
  for (const auto& m : msgs) all.push_back(m);
  const std::string head = before.empty() ? std::string() : render(t, tk, before, false);
  const std::string full = render(t, tk, all, gen);
  if (full.compare(0, head.size(), head) != 0)
    bad("input",
        "this model's chat template does not render a conversation as a prefix of "
        "its continuation; span queries need one that does",
        "template_error");
  return full.substr(head.size());
}

// An independent piece follows the system messages alone (an empty one if
// none, so that a template's default system prompt stays out of the span).
json anchor_of(const json& systems) {
  return systems.empty() ? json::array({{{"role", "system"}, {"content", ""}}}) : systems;
}

void append_text(const Tokenizer& tk, const std::string& text, std::vector<int32_t>& ids) {
  auto piece = tk.encode(text, {.add_special = false, .parse_special = true});
  ids.insert(ids.end(), piece.begin(), piece.end());
}

// The marker layout's walk: ids in the tree's order, markers where spnl's
// layout puts them.
class MarkerWalk {
 public:
  MarkerWalk(const ModelView& m, const SpanMarkers& mk)
      : tk_(m.tokenizer), t_(tk_.chat_template, m.name), mk_(mk) {}

  // local: the context of the plus child being walked (null outside one)
  void walk(const SpanNode& n, json* local) {
    switch (n.kind) {
      case SpanNode::Kind::Message:
        message(n, local);
        break;
      case SpanNode::Kind::Seq:
      case SpanNode::Kind::Par:
        for (const SpanNode& c : n.children) walk(c, local);
        break;
      case SpanNode::Kind::Cross:
        for (size_t i = 0; i + 1 < n.children.size(); ++i) walk(n.children[i], local);
        if (!n.children.empty()) {
          marker(mk_.cross);
          walk(n.children.back(), local);
        }
        break;
      case SpanNode::Kind::Plus:
        for (const SpanNode& c : n.children) {
          marker(mk_.plus);
          if (local) {  // nested: the outer child's context runs on
            walk(c, local);
          } else {
            json child = anchor_of(systems_);
            walk(c, &child);
          }
        }
        break;
    }
  }

  std::vector<int32_t> finish() {
    if (all_.empty()) bad("input", "the query's input has no messages");
    if (last_marker_ == mk_.plus) marker(mk_.plus);  // the question is no span
    append_text(tk_, added_text(t_, tk_, all_, json::array(), true), ids_);
    return std::move(ids_);
  }

  std::vector<int32_t> map_input(const std::string& text) {
    marker(mk_.plus);
    const json msg = {{"role", "user"}, {"content", text}};
    append_text(tk_, added_text(t_, tk_, anchor_of(systems_), json::array({msg}), false), ids_);
    pad_to_block(ids_, mk_);
    return std::move(ids_);
  }

 private:
  void message(const SpanNode& n, json* local) {
    const json msg = {{"role", n.role}, {"content", n.content}};
    append_text(tk_, added_text(t_, tk_, local ? *local : all_, json::array({msg}), false), ids_);
    if (local)
      local->push_back(msg);
    else if (n.role == "system")
      systems_.push_back(msg);
    all_.push_back(msg);
  }

  void marker(int32_t id) {
    push_marker(ids_, id, mk_);
    last_marker_ = id;
  }

  const Tokenizer& tk_;
  const ChatTemplate t_;
  const SpanMarkers& mk_;
  std::vector<int32_t> ids_;
  json all_ = json::array(), systems_ = json::array();  // every message; the dependent systems
  int32_t last_marker_ = -1;
};

template <class F>
std::vector<int32_t> with_template(const ModelView& m, F&& lay_out) {
  if (m.tokenizer.chat_template.empty())
    bad("input", "this model has no chat template; span queries need one");
  try {
    return lay_out();
  } catch (const jinja::TemplateError& e) {
    bad("input", e.what(), "template_error");
  }
}

}  // namespace

SpanQuery parse_span_query(const json& body) {
  if (!body.is_object() || body.size() != 1)
    bad("query", "a span query is an object with one key: g, repeat or map", "invalid_type");
  // Through the object's own iterator: a binding to *items().begin() would
  // outlive the temporary proxy it points into.
  const std::string& key = body.begin().key();
  const json& val = body.begin().value();
  SpanQuery q;
  if (key == "g") {
    q.g = parse_generate(val, "g");
  } else if (key == "repeat") {
    if (!val.is_object()) bad("repeat", "repeat must be an object", "invalid_type");
    auto n = val.find("n");
    if (n == val.end() || !n->is_number_integer() || n->get<int64_t>() < 1 ||
        n->get<int64_t>() > 128)
      bad("repeat.n", "repeat.n must be an integer in [1, 128]");
    q.top = SpanQuery::Top::Repeat;
    q.n = int32_t(n->get<int64_t>());
    if (!val.contains("g")) bad("repeat.g", "repeat.g is missing", "missing");
    q.g = parse_generate(val["g"], "repeat.g");
  } else if (key == "map") {
    if (!val.is_object()) bad("map", "map must be an object", "invalid_type");
    q.top = SpanQuery::Top::Map;
    const json meta = val.value("metadata", json::object());
    if (!meta.is_object()) bad("map.metadata", "map.metadata must be an object", "invalid_type");
    q.g.model = model_name(meta, "map.metadata");
    parse_sampling(meta, "map.metadata", q.g);
    auto in = val.find("inputs");
    if (in == val.end() || !in->is_array() || in->empty() || in->size() > 128)
      bad("map.inputs", "map.inputs must be an array of 1 to 128 strings", "invalid_type");
    for (size_t i = 0; i < in->size(); ++i) {
      if (!(*in)[i].is_string())
        bad(fmt::format("map.inputs[{}]", i), "map inputs must be strings", "invalid_type");
      q.inputs.push_back((*in)[i]);
    }
  } else {
    bad("query", fmt::format("unknown top-level '{}': a span query is g, repeat or map", key));
  }
  return q;
}

std::vector<PromptPiece> flatten(const SpanNode& input) {
  std::vector<PromptPiece> out;
  flatten_into(input, out, false);
  std::erase_if(out, [](const PromptPiece& p) { return p.messages.empty(); });
  return out;
}

std::vector<int32_t> span_prompt(const ModelView& m, std::vector<PromptPiece> pieces,
                                 std::vector<std::pair<int32_t, int32_t>>& spans,
                                 bool continue_final) {
  const Tokenizer& tk = m.tokenizer;
  if (pieces.empty()) bad("input", "the query's input has no messages");
  json final_msg;  // continue_final: the message the answer continues, rendered last
  if (continue_final) {
    PromptPiece& last = pieces.back();
    if (last.independent || last.messages.back()["role"] != "assistant")
      bad("continue_final_message",
          "continue_final_message needs the input to end with an assistant message outside plus");
    final_msg = last.messages.back();
    last.messages.erase(last.messages.size() - 1);
    if (last.messages.empty()) pieces.pop_back();
  }
  return with_template(m, [&] {
    std::vector<int32_t> ids;
    const ChatTemplate t(tk.chat_template, m.name);
    json before = json::array(), systems = json::array();
    for (const PromptPiece& p : pieces) {
      const int32_t begin = int32_t(ids.size());
      append_text(tk,
                  added_text(t, tk, p.independent ? anchor_of(systems) : before, p.messages, false),
                  ids);
      if (p.independent) spans.emplace_back(begin, int32_t(ids.size()));
      for (const auto& msg : p.messages) {
        before.push_back(msg);
        if (!p.independent && msg["role"] == "system") systems.push_back(msg);
      }
    }
    if (continue_final)
      append_text(
          tk,
          cut_after_final_content(added_text(t, tk, before, json::array({final_msg}), false),
                                  final_msg["content"], "continue_final_message"),
          ids);
    else
      append_text(tk, added_text(t, tk, before, json::array(), true), ids);
    return ids;
  });
}

std::vector<int32_t> marker_prompt(const ModelView& m, const SpanNode& input,
                                   const SpanMarkers& mk) {
  return with_template(m, [&] {
    MarkerWalk w(m, mk);
    w.walk(input, nullptr);
    return w.finish();
  });
}

std::vector<int32_t> marker_map_prompt(const ModelView& m, const std::string& input,
                                       const SpanMarkers& mk) {
  return with_template(m, [&] { return MarkerWalk(m, mk).map_input(input); });
}

}  // namespace wick::server
