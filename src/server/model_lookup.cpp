#include "server/model_lookup.h"

#include <algorithm>
#include <atomic>
#include <filesystem>

#include "engine/model_store.h"
#include "io/error.h"
#include "text/reasoning.h"

namespace wick::server {

namespace {
// Whether the default model's last load failed (its file broken under the server).
std::atomic<bool> g_default_failed{false};
}  // namespace

bool default_model_failed() {
  return g_default_failed.load();
}

bool adapter_named(const std::string& name) {
  const auto mods = ModelPool::global().lora_modules();
  return !name.empty() &&
         std::any_of(mods.begin(), mods.end(), [&](const auto& m) { return m.first == name; });
}

std::shared_ptr<const LoadedModel> find_model(const std::string& name,
                                              const std::string& default_model, bool ollama,
                                              int32_t* adapter) {
  std::string n = name.empty() ? default_model : name;
  if (ollama && n.size() > 7 && n.compare(n.size() - 7, 7, ":latest") == 0) n.resize(n.size() - 7);
  if (adapter) *adapter = 0;
  const auto mods = ModelPool::global().lora_modules();
  for (size_t k = 0; k < mods.size(); ++k)
    if (!n.empty() && mods[k].first == n) {
      if (adapter) *adapter = int32_t(k + 1);
      n = default_model;
    }
  const bool is_default = n == default_model;
  auto failed = [&] {
    if (is_default) g_default_failed = true;
  };
  try {
    auto m = is_default ? ModelPool::global().get(n) : ModelPool::global().get_stored(n);
    if (is_default) g_default_failed = false;
    if (!m->tokenizer)
      throw ApiError{400, fmt::format("model '{}' has no tokenizer", n), "invalid_request_error",
                     "model", "model_without_tokenizer"};
    return m;
  } catch (const ModelError& e) {
    if (std::string(e.what()).rfind("unknown model", 0) == 0)
      throw ApiError{404, fmt::format("The model '{}' does not exist", n), "invalid_request_error",
                     "model", "model_not_found"};
    failed();
    throw ApiError{500, e.what(), "server_error", "model", "model_load_failed"};
  } catch (const IoError& e) {
    failed();
    throw ApiError{500, e.what(), "server_error", "model", "model_load_failed"};
  }
}

int32_t request_n_ctx(const LoadedModel& m, int32_t server_n_ctx) {
  return std::min<int32_t>(server_n_ctx, int32_t(m.model->config.n_ctx_train));
}

ModelView model_view(const LoadedModel& m, int32_t server_n_ctx, bool split_reasoning) {
  return {.tokenizer = *m.tokenizer,
          .name = m.name,
          .n_ctx = request_n_ctx(m, server_n_ctx),
          .tool_format = m.tool_format,
          .reasoning = split_reasoning && template_has_reasoning(m.tokenizer->chat_template)};
}

int64_t stored_model_bytes(const std::string& name) {
  try {
    std::string path = resolve_model_name(name);
    std::error_code ec;
    if (!std::filesystem::is_directory(path)) return int64_t(std::filesystem::file_size(path, ec));
  } catch (...) {
  }
  return 0;
}

}  // namespace wick::server
