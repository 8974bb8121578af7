#include "engine/model_store.h"

#include <cstdlib>
#include <filesystem>
#include <set>

#include "io/error.h"

namespace wick {

namespace fs = std::filesystem;

std::string model_store_dir() {
  if (const char* d = std::getenv("WICK_MODELS"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/wick/models";
}

std::string resolve_model(const std::string& model) {
  if (fs::exists(model) || model.rfind("shaped:", 0) == 0) return model;  // shaped: made in memory
  const fs::path store = model_store_dir();
  const bool plain_name = model.find('/') == std::string::npos && !model.empty();
  if (plain_name) {
    for (const fs::path& p : {store / (model + ".gguf"), store / model})
      if (fs::exists(p)) return p.string();
  }
  std::set<std::string> names;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(store, ec)) {
    auto n = e.path().filename();
    names.insert(n.extension() == ".gguf" ? n.stem().string() : n.string());
  }
  std::string have;
  for (auto& n : names) have += (have.empty() ? "" : ", ") + n;
  throw_model(
      "unknown model '{}': not a file, a folder, or a name in the model store {} ({})", model,
      store.string(),
      have.empty() ? "empty; `make run` puts the default model there as smollm2" : "has: " + have);
}

}  // namespace wick
