// wick tokenize / detokenize / template.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "engine/model_store.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace wick::cli {

using json = nlohmann::json;

namespace {

std::string read_all(std::istream& in) {
  return {std::istreambuf_iterator<char>(in), {}};
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& source) {
  return Tokenizer::load(resolve_model(source));
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Turn text into token ids");
  static std::string source, text;
  static bool as_json = false, add_special = false, parse_special = false;
  cmd->add_option("SOURCE", source,
                  "a tokenizer.json, a HF folder, a .gguf, or a stored model name")
      ->required();
  cmd->add_option("TEXT", text, "the text; - reads standard input")->required();
  cmd->add_flag("--json", as_json, "print a JSON array of ids and nothing else");
  cmd->add_flag("--add-special", add_special, "add the tokenizer's BOS/EOS (its post-processor)");
  cmd->add_flag("--parse-special", parse_special,
                "turn special-token text (e.g. <|im_end|>) into special ids");
  cmd->callback([] {
    auto tk = load_tokenizer(source);
    const std::string input = text == "-" ? read_all(std::cin) : text;
    auto ids = tk->encode(input, {.add_special = add_special, .parse_special = parse_special});
    if (as_json) {
      fmt::print("{}\n", json(ids).dump());
      return;
    }
    for (int32_t id : ids) fmt::print("{:>8}  {}\n", id, json(tk->token(id)).dump());
  });
}

void register_detokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("detokenize", "Turn token ids into text");
  static std::string source, ids_str;
  static bool show_special = false;
  cmd->add_option("SOURCE", source,
                  "a tokenizer.json, a HF folder, a .gguf, or a stored model name")
      ->required();
  cmd->add_option("IDS", ids_str, "comma-separated ids, or a JSON array")->required();
  cmd->add_flag("--show-special", show_special, "print special tokens too");
  cmd->callback([] {
    auto tk = load_tokenizer(source);
    std::vector<int32_t> ids;
    std::string s = ids_str;
    if (!s.empty() && s.front() == '[') {
      try {
        ids = json::parse(s).get<std::vector<int32_t>>();
      } catch (const json::exception& e) {
        throw std::runtime_error(fmt::format("IDS: not a JSON array of integers: {}", e.what()));
      }
    } else {
      std::stringstream ss(s);
      for (std::string part; std::getline(ss, part, ',');) {
        try {
          size_t used = 0;
          long v = std::stol(part, &used);
          if (used != part.size() || v < INT32_MIN || v > INT32_MAX)
            throw std::invalid_argument(part);
          ids.push_back(int32_t(v));
        } catch (const std::logic_error&) {
          throw std::runtime_error(fmt::format("IDS: '{}' is not a token id", part));
        }
      }
    }
    fmt::print("{}", tk->decode(ids, !show_special));
  });
}

void register_template(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("template", "Render a conversation with the model's chat template");
  static std::string source, messages_path, template_path;
  static bool add_generation_prompt = false;
  cmd->add_option("SOURCE", source,
                  "a HF folder / tokenizer_config.json's folder, a .gguf, or a stored model name")
      ->required();
  cmd->add_option("--messages", messages_path,
                  "JSON file (- = stdin): a list of messages, or {\"messages\": [...], \"tools\": "
                  "[...], ...}")
      ->required();
  cmd->add_option("--template", template_path,
                  "use this Jinja template file instead of the model's");
  cmd->add_flag("--add-generation-prompt", add_generation_prompt,
                "end with the assistant's turn opening");
  cmd->callback([] {
    auto tk = load_tokenizer(source);
    std::string tmpl = tk->chat_template;
    if (!template_path.empty()) {
      std::ifstream in(template_path);
      if (!in) throw std::runtime_error(template_path + ": cannot open");
      tmpl = read_all(in);
    }
    if (tmpl.empty())
      throw std::runtime_error(source + ": no chat template (give one with --template)");
    std::string text;
    if (messages_path == "-") {
      text = read_all(std::cin);
    } else {
      std::ifstream in(messages_path);
      if (!in) throw std::runtime_error(messages_path + ": cannot open");
      text = read_all(in);
    }
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text);
    } catch (const json::exception& e) {
      throw std::runtime_error(fmt::format("{}: not valid JSON: {}", messages_path, e.what()));
    }
    nlohmann::ordered_json ctx = j;
    if (j.is_array()) ctx = nlohmann::ordered_json{{"messages", j}};
    if (!ctx.contains("messages")) throw std::runtime_error(messages_path + ": no \"messages\"");
    ctx["add_generation_prompt"] =
        add_generation_prompt || ctx.value("add_generation_prompt", false);
    if (!ctx.contains("bos_token")) ctx["bos_token"] = tk->bos_token;
    if (!ctx.contains("eos_token")) ctx["eos_token"] = tk->eos_token;
    ChatTemplate t(tmpl, template_path.empty() ? source : template_path);
    fmt::print("{}", t.render(ctx));
  });
}

}  // namespace wick::cli
