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

std::string stored_model_entry(const std::string& name) {
  if (!find_in_store(name)) return "";
  std::error_code ec;
  const fs::path root = fs::path(model_store_dir());
  for (const fs::path& p : {root / (name + ".gguf"), root / name})  // find_in_store's order
    if (fs::exists(p, ec)) return p.string();
  return "";
}

bool is_valid_new_model_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

void copy_stored_model(const std::string& from, const std::string& to) {
  const std::string src = resolve_model_name(from);  // canonical, inside the store
  if (!is_valid_new_model_name(to))
    throw_model(
        "invalid model name '{}': use 1-128 letters, digits, '.', '_', ':' or '-', "
        "not starting with '.'",
        to);
  const fs::path root = fs::path(model_store_dir());
  std::error_code ec;
  if (fs::exists(root / (to + ".gguf"), ec) || fs::exists(root / to, ec) ||
      fs::is_symlink(root / (to + ".gguf"), ec) || fs::is_symlink(root / to, ec))
    throw_model("model '{}' already exists in the model store", to);
  auto link_or_copy = [](const fs::path& a, const fs::path& b) {
    std::error_code e;
    fs::create_hard_link(a, b, e);
    if (e) fs::copy_file(a, b);  // another file system: a copy
  };
  if (fs::is_directory(src)) {
    const fs::path dst = root / to;
    fs::create_directory(dst);
    for (auto& e : fs::directory_iterator(src))
      if (e.is_regular_file()) link_or_copy(e.path(), dst / e.path().filename());
  } else {
    link_or_copy(src, root / (to + ".gguf"));
  }
}

void delete_stored_model(const std::string& name) {
  const std::string entry = stored_model_entry(name);
  if (entry.empty()) {
    resolve_model_name(name);  // throws "unknown model ..." naming the store
    throw_model("unknown model '{}'", name);
  }
  std::error_code ec;
  if (fs::is_symlink(entry, ec) || !fs::is_directory(entry, ec))
    fs::remove(entry);
  else
    fs::remove_all(entry);
}

std::string resolve_model(const std::string& model) {
  if (fs::exists(model) || model.rfind("shaped:", 0) == 0) return model;  // shaped: made in memory
  return resolve_model_name(model);
}

}  // namespace wick
