#include "engine/model_pool.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/ops.h"
#include "engine/model_store.h"
#include "io/error.h"
#include "model/lora.h"
#include "model/quantize_weights.h"

namespace wick {

namespace fs = std::filesystem;

bool LoadedModel::is_eog(int32_t id) const {
  return std::find(eog_ids.begin(), eog_ids.end(), id) != eog_ids.end();
}

namespace {

// End-of-generation ids: the tokenizer's EOS, GGUF's EOT, generation_config's
// eos_token_id list, and the end-of-turn tokens of the supported families.
std::vector<int32_t> find_eog(const LoadedModel& lm) {
  std::vector<int32_t> ids;
  auto add = [&](std::optional<int64_t> id) {
    if (id && *id >= 0 && std::find(ids.begin(), ids.end(), int32_t(*id)) == ids.end())
      ids.push_back(int32_t(*id));
  };
  const Tokenizer* tk = lm.tokenizer.get();
  if (tk) add(tk->eos_id);
  if (lm.model->gguf) {
    add(lm.model->gguf->get_int("tokenizer.ggml.eos_token_id"));
    add(lm.model->gguf->get_int("tokenizer.ggml.eot_token_id"));
    add(lm.model->gguf->get_int("tokenizer.ggml.eom_token_id"));
  } else {
    for (const char* f : {"generation_config.json", "config.json"}) {
      fs::path p = fs::path(lm.path) / f;
      if (!fs::exists(p)) continue;
      try {
        std::ifstream in(p);
        auto j = nlohmann::json::parse(in);
        auto e = j.value("eos_token_id", nlohmann::json());
        if (e.is_number_integer()) add(e.get<int64_t>());
        if (e.is_array())
          for (auto& x : e)
            if (x.is_number_integer()) add(x.get<int64_t>());
      } catch (const nlohmann::json::exception&) {
      }
    }
  }
  if (tk)
    for (const char* t : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
                          "<|eom_id|>", "<|end|>", "</s>"})
      if (auto id = tk->token_id(t); id && tk->is_special(*id)) add(*id);
  return ids;
}

size_t env_size(const char* name, size_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (*end || errno || v[0] == '-')
    throw std::runtime_error(fmt::format("{}={}: expected a whole number", name, v));
  return size_t(x);
}

}  // namespace

void LoadedModel::count_adapter(int32_t adapter, size_t n) const {
  uncount_adapter(adapter);
  adapter_file_bytes[adapter] = n;
  n_adapter_bytes += n;
}

void LoadedModel::uncount_adapter(int32_t adapter) const {
  if (auto it = adapter_file_bytes.find(adapter); it != adapter_file_bytes.end()) {
    n_adapter_bytes -= it->second;
    adapter_file_bytes.erase(it);
  }
}

size_t path_bytes(const std::string& path) {
  std::error_code ec;
  if (path.rfind("shaped:", 0) == 0) return 0;
  if (!fs::is_directory(path)) return size_t(fs::file_size(path, ec));
  size_t n = 0;
  for (auto& e : fs::directory_iterator(path, ec))
    if (e.path().extension() == ".safetensors") n += size_t(e.file_size(ec));
  return n;
}

std::shared_ptr<LoadedModel> load_model_and_tokenizer(const std::string& name,
                                                      const std::function<void(float)>& progress,
                                                      const BackendOptions& opt) {
  return load_model_at(name, resolve_model(name), progress, opt);
}

namespace {

std::shared_ptr<LoadedModel> load_on_this_thread(const std::string& name, const std::string& path,
                                                 const std::function<void(float)>& progress,
                                                 const BackendOptions& opt) {
  auto lm = std::make_shared<LoadedModel>();
  lm->name = name;
  lm->path = path;
  if (progress) progress(0.f);
  lm->model = load_model(lm->path);
  override_rope(lm->model->config, opt.rope_scaling, opt.rope_scale, opt.yarn_orig_ctx, lm->path);
  if (!opt.quantize.empty()) {
    auto plan = quant_plan_from_name(opt.quantize);
    if (!plan)
      throw ModelError(fmt::format("--quantize {}: not a type wick writes ({})", opt.quantize,
                                   quant_plan_names()));
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = quantize_weights(*lm->model, *plan);
    spdlog::info("{}: {} matrices quantized to {} at load in {:.2f} s", name, n, opt.quantize,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  apply_lora(*lm->model, opt.lora);
  for (size_t k = 0; k < opt.lora_modules.size(); ++k) {
    const auto& [module, adapter] = opt.lora_modules[k];
    if (module.empty()) continue;  // removed: its number stays taken
    const std::pair<std::string, float> one{adapter, 1.f};
    add_named_lora(*lm->model, module, std::span(&one, 1), int32_t(k + 1));
  }
  if (progress) progress(0.7f);
  const bool has_tok = lm->model->gguf ? lm->model->gguf->get("tokenizer.ggml.model") != nullptr
                                       : fs::exists(fs::path(lm->path) / "tokenizer.json");
  if (has_tok)
    lm->tokenizer =
        lm->model->gguf ? Tokenizer::from_gguf(*lm->model->gguf) : Tokenizer::load(lm->path);
  // Token ids index the embedding: a tokenizer that makes ids past its rows
  // would read outside it (a hostile file's vocabulary sizes disagree).
  if (lm->tokenizer && lm->tokenizer->n_vocab() > lm->model->config.n_vocab)
    throw_model(
        "{}: the tokenizer has {} tokens but the model's vocabulary (embedding rows) has {}",
        lm->path, lm->tokenizer->n_vocab(), lm->model->config.n_vocab);
  lm->eog_ids = find_eog(*lm);
  if (lm->tokenizer) lm->tool_format = detect_tool_format(lm->tokenizer->chat_template);
  lm->n_bytes = path_bytes(lm->path);
  for (const auto& [adapter, scale] : opt.lora) lm->n_bytes += path_bytes(adapter);
  for (size_t k = 0; k < opt.lora_modules.size(); ++k)
    if (!opt.lora_modules[k].first.empty())
      lm->count_adapter(int32_t(k + 1), path_bytes(opt.lora_modules[k].second));
  auto be = make_backend(opt);
  // a head's rows of a q8_0 cache are whole blocks of 32
  if (be->kv_dtype() == DType::Q8_0 && lm->model->config.head_dim % 32)
    throw_model(
        "{}: --kv-cache-dtype q8_0 needs a head dim that is a multiple of 32 (this model's: "
        "{}); use f16",
        lm->path, lm->model->config.head_dim);
  lm->device = prepare_model(*lm->model, std::move(be));
  if (progress) progress(1.f);
  return lm;
}

}  // namespace

std::shared_ptr<LoadedModel> load_model_at(const std::string& name, const std::string& path,
                                           const std::function<void(float)>& progress,
                                           const BackendOptions& opt) {
  // (its parallel regions' workers must not outlive it: cpu::on_own_thread)
  return cpu::on_own_thread([&] { return load_on_this_thread(name, path, progress, opt); });
}

ModelPool& ModelPool::global() {
  static ModelPool pool(env_size("WICK_MAX_LOADED_MODELS", 2), env_size("WICK_MAX_MODEL_BYTES", 0));
  return pool;
}

void ModelPool::set_backend(const BackendOptions& opt) {
  std::lock_guard<std::mutex> lock(mu_);
  opt_ = opt;
}

std::vector<std::pair<std::string, std::string>> ModelPool::lora_modules() const {
  std::lock_guard<std::mutex> lock(mu_);
  return opt_.lora_modules;
}

void ModelPool::set_lora_module(int32_t adapter, std::string name, std::string path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& mods = opt_.lora_modules;
  if (adapter < 1 || adapter > int32_t(mods.size()) + 1)
    throw std::logic_error(
        fmt::format("adapter number {} after {} adapters", adapter, mods.size()));
  if (adapter == int32_t(mods.size()) + 1) mods.emplace_back();
  mods[size_t(adapter - 1)] = {std::move(name), std::move(path)};
}

bool ModelPool::owns_adapters(const LoadedModel& m) const {
  std::string owner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    owner = opt_.lora_modules_model;
  }
  return !owner.empty() && owner_key(owner) == key_of(m.path);
}

size_t ModelPool::n_loaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void ModelPool::evict_locked(const std::string& keep) {
  auto total_bytes = [&] {
    size_t n = 0;
    for (auto& [k, e] : entries_)
      if (e.ready.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        try {
          n += e.ready.get()->bytes();
        } catch (...) {
        }
      }
    return n;
  };
  while (entries_.size() > 1 && ((max_models_ && entries_.size() > max_models_) ||
                                 (max_bytes_ && total_bytes() > max_bytes_))) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first != keep &&
          (victim == entries_.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == entries_.end()) break;
    entries_.erase(victim);  // requests still holding it keep it alive until they finish
  }
}

bool ModelPool::holds(const LoadedModel& m) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [k, e] : entries_)
    if (e.ready.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      try {
        if (e.ready.get().get() == &m) return true;
      } catch (...) {
      }
    }
  return false;
}

std::shared_ptr<const LoadedModel> ModelPool::get(const std::string& name) {
  return get_at(name, resolve_model(name));
}

std::shared_ptr<const LoadedModel> ModelPool::get_stored(const std::string& name) {
  return get_at(name, resolve_model_name(name));
}

std::string ModelPool::key_of(const std::string& path) {
  if (path.rfind("shaped:", 0) == 0) return path;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// The pool's key of a MODEL argument; "" when it does not resolve.
std::string ModelPool::owner_key(const std::string& model) {
  try {
    return key_of(resolve_model(model));
  } catch (const std::exception&) {
    return "";
  }
}

std::shared_ptr<const LoadedModel> ModelPool::get_at(const std::string& name,
                                                     const std::string& path) {
  const std::string key = key_of(path);
  std::shared_future<std::shared_ptr<LoadedModel>> ready;
  std::promise<std::shared_ptr<LoadedModel>> promise;
  bool load_here = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    // A model whose file was truncated under it is dropped and loaded again
    // (a clear load error if the file is now broken) rather than read past
    // the file's end, which is SIGBUS for the whole server.
    if (it != entries_.end() &&
        it->second.ready.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      std::shared_ptr<LoadedModel> m;
      try {
        m = it->second.ready.get();
      } catch (...) {
      }
      if (m && m->model->file_shrunk()) {
        spdlog::warn("{}: the file shrank since it was loaded; loading it again", key);
        entries_.erase(it);
        it = entries_.end();
      }
    }
    if (it == entries_.end()) {
      ready = promise.get_future().share();
      Entry& e = entries_[key];
      e.ready = ready;
      e.last_used = ++clock_;
      e.keep_alive = default_keep_alive_;
      load_here = true;
      ++n_loads_;
    } else {
      it->second.last_used = ++clock_;
      if (it->second.n_uses == 0) it->second.idle_since = Clock::now();  // asked for: used
      ready = it->second.ready;
    }
  }
  if (load_here) {
    try {
      BackendOptions opt;
      {
        std::lock_guard<std::mutex> lock(mu_);
        opt = opt_;
      }
      // named adapters belong to one model
      if (!opt.lora_modules.empty() && owner_key(opt.lora_modules_model) != key)
        opt.lora_modules.clear();
      promise.set_value(load_model_at(name, path, {}, opt));
    } catch (...) {
      promise.set_exception(std::current_exception());
      std::lock_guard<std::mutex> lock(mu_);
      entries_.erase(key);  // a failed load is not cached
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    evict_locked(key);
  }
  return ready.get();
}

std::shared_ptr<const LoadedModel> ModelPool::Entry::ready_model() const {
  if (!ready.valid() || ready.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return nullptr;
  try {
    return ready.get();
  } catch (...) {
    return nullptr;
  }
}

bool ModelPool::Entry::expired(Clock::time_point now) const {
  return n_uses == 0 && keep_alive.count() >= 0 && now - idle_since >= keep_alive &&
         ready_model() != nullptr;  // a load in progress is waited for, not expired
}

ModelPool::Use& ModelPool::Use::operator=(Use&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::exchange(o.pool_, nullptr);
    model_ = std::move(o.model_);
  }
  return *this;
}

void ModelPool::Use::release() {
  if (auto* p = std::exchange(pool_, nullptr)) p->end_use(model_);
  model_.reset();
}

void ModelPool::set_default_keep_alive(Duration d) {
  std::lock_guard<std::mutex> lock(mu_);
  default_keep_alive_ = d;
}

ModelPool::Duration ModelPool::default_keep_alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return default_keep_alive_;
}

ModelPool::Use ModelPool::use(const std::shared_ptr<const LoadedModel>& m, Duration keep_alive) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string key = key_of(m->path);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.ready_model() != m)
    return Use();  // another copy is loaded or loading: m runs unheld and goes after
  if (it == entries_.end()) {
    // back into the pool: const_pointer_cast only to fit the future's type; nothing writes it
    std::promise<std::shared_ptr<LoadedModel>> p;
    p.set_value(std::const_pointer_cast<LoadedModel>(m));
    Entry e;
    e.ready = p.get_future().share();
    it = entries_.insert_or_assign(key, std::move(e)).first;
  }
  Entry& e = it->second;
  e.last_used = ++clock_;
  e.keep_alive = keep_alive;
  ++e.n_uses;
  return Use(this, m);
}

void ModelPool::end_use(const std::shared_ptr<const LoadedModel>& m) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key_of(m->path));
  if (it == entries_.end() || it->second.ready_model() != m) return;  // unloaded meanwhile
  Entry& e = it->second;
  if (e.n_uses > 0) --e.n_uses;
  if (e.n_uses == 0) e.idle_since = Clock::now();
}

bool ModelPool::unload(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key_of(path));
  if (it == entries_.end() || !it->second.ready_model()) return false;
  entries_.erase(it);  // requests still holding it keep it alive until they finish
  return true;
}

size_t ModelPool::expire(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();)
    if (it->second.expired(now)) {
      it = entries_.erase(it);
      ++n;
    } else {
      ++it;
    }
  return n;
}

std::shared_ptr<const LoadedModel> ModelPool::find_loaded(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key_of(path));
  return it == entries_.end() ? nullptr : it->second.ready_model();
}

std::vector<ModelPool::Loaded> ModelPool::loaded() const {
  std::vector<std::pair<uint64_t, Loaded>> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    const auto sys_now = std::chrono::system_clock::now();
    for (auto& [k, e] : entries_) {
      auto m = e.ready_model();
      if (!m) continue;
      Loaded l{m, e.n_uses, std::nullopt};
      if (e.keep_alive.count() >= 0) {
        // in use: the keep-alive will count from the end of the last use (now at the earliest)
        const auto left = e.n_uses > 0 ? e.keep_alive : e.keep_alive - (now - e.idle_since);
        l.expires_at = sys_now + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                     std::max<Clock::duration>(left, Clock::duration::zero()));
      }
      out.emplace_back(e.last_used, std::move(l));
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<Loaded> r;
  for (auto& [t, l] : out) r.push_back(std::move(l));
  return r;
}

}  // namespace wick
