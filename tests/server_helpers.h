// What the server's parser and writer tests share.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "engine/model_pool.h"
#include "helpers.h"
#include "server/parse_common.h"
#include "text/tokenizer.h"

namespace wick::server {

// The shared Qwen3 tokenizer as a model without weights (what the writers
// read of one: its tokenizer and tool format); null without ../shared. The
// caller keeps it for the process, like the model pool.
inline std::shared_ptr<const LoadedModel>* load_qwen3_model() {
  if (!std::filesystem::exists(test::shared_dir() + "/tokenizers/qwen3")) return nullptr;
  auto m = std::make_shared<LoadedModel>();
  m->tokenizer = Tokenizer::load(test::shared_dir() + "/tokenizers/qwen3");
  m->tool_format = detect_tool_format(m->tokenizer->chat_template);
  return new std::shared_ptr<const LoadedModel>(m);
}

// The ApiError f throws (a failure when it throws none).
template <typename F>
ApiError error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return {0, ""};
}

}  // namespace wick::server
