#include "engine/model_store.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "io/error.h"

namespace wick {

namespace fs = std::filesystem;

namespace {

// One file or folder name: nothing that walks the file system.
bool is_plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." &&
         n.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

bool is_inside(const fs::path& p, const fs::path& root) {
  const fs::path rel = p.lexically_relative(root);
  return !rel.empty() && *rel.begin() != ".." && rel != ".";
}

// The canonical path of NAME in the store, when it resolves inside it.
std::optional<fs::path> find_in_store(const std::string& name) {
  if (!is_plain_name(name)) return std::nullopt;
  std::error_code ec;
  const fs::path root = fs::canonical(model_store_dir(), ec);
  if (ec) return std::nullopt;
  for (const fs::path& p : {root / (name + ".gguf"), root / name}) {
    const fs::path real = fs::canonical(p, ec);  // follows symlinks: they must stay inside
    if (!ec && is_inside(real, root)) return real;
  }
  return std::nullopt;
}

}  // namespace

std::string model_store_dir() {
  if (const char* d = std::getenv("WICK_MODELS"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/wick/models";
}

std::vector<std::string> stored_model_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(model_store_dir(), ec)) {
    const fs::path n = e.path().filename();
    std::string name = n.extension() == ".gguf" ? n.stem().string() : n.string();
    if (find_in_store(name)) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::string resolve_model_name(const std::string& name) {
  if (auto p = find_in_store(name)) return p->string();
  std::string have;
  for (auto& n : stored_model_names()) have += (have.empty() ? "" : ", ") + n;
  throw_model(
      "unknown model '{}': not a file, a folder, or a name in the model store {} ({})", name,
      model_store_dir(),
      have.empty() ? "empty; `make run` puts the default model there as smollm2" : "has: " + have);
}

std::string resolve_model(const std::string& model) {
  if (fs::exists(model) || model.rfind("shaped:", 0) == 0) return model;  // shaped: made in memory
  return resolve_model_name(model);
}

}  // namespace wick
