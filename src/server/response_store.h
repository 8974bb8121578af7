// Responses kept for previous_response_id and GET / DELETE /v1/responses/ID
// (the Responses API's store: true): in memory, the oldest dropped past
// n_max responses or max_bytes of JSON in all.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "server/parse_common.h"

namespace wick::server {

class ResponseStore {
 public:
  ResponseStore(size_t n_max, size_t max_bytes) : n_max_(n_max), max_bytes_(max_bytes) {}

  // The response object, and the conversation (chat messages, the answer
  // last) that a request naming it as previous_response_id continues. One
  // larger than max_bytes alone is not kept.
  void put(const std::string& id, json response, json conversation);
  std::shared_ptr<const json> response(const std::string& id) const;
  std::shared_ptr<const json> conversation(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const json> response, conversation;
    size_t n_bytes = 0;
    std::list<std::string>::iterator age;  // in order_
  };
  void drop(std::unordered_map<std::string, Entry>::iterator it);  // mu_ held

  const size_t n_max_, max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> order_;  // oldest first
  size_t n_bytes_ = 0;
};

}  // namespace wick::server
