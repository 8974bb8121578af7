#include "server/response_store.h"

namespace wick::server {

void ResponseStore::put(const std::string& id, json response, json conversation) {
  // measured outside the lock: a long conversation takes a while to serialise
  const size_t n_bytes = response.dump().size() + conversation.dump().size();
  if (n_max_ == 0 || n_bytes > max_bytes_) return;
  auto r = std::make_shared<const json>(std::move(response));
  auto c = std::make_shared<const json>(std::move(conversation));
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) drop(it);
  while (!order_.empty() && (entries_.size() >= n_max_ || n_bytes_ + n_bytes > max_bytes_))
    drop(entries_.find(order_.front()));
  order_.push_back(id);
  entries_[id] = Entry{std::move(r), std::move(c), n_bytes, std::prev(order_.end())};
  n_bytes_ += n_bytes;
}

void ResponseStore::drop(std::unordered_map<std::string, Entry>::iterator it) {
  n_bytes_ -= it->second.n_bytes;
  order_.erase(it->second.age);
  entries_.erase(it);
}

std::shared_ptr<const json> ResponseStore::response(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.response;
}

std::shared_ptr<const json> ResponseStore::conversation(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.conversation;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  drop(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace wick::server
