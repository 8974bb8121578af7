// Model names -> loaded models (through the process-wide pool) and the names
// in the model store, with failures as API errors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_pool.h"
#include "server/parse_common.h"

namespace wick::server {

// name empty or default_model (the operator's: a path or a name): the default
// model; else a name in the model store only. Ollama names may end in
// ":latest" (dropped). 404 for an unknown model (any refused name alike),
// 400 when it has no tokenizer, 500 when it fails to load.
// A name of a named LoRA adapter (the pool's lora_modules: serve's
// --lora-modules and /v1/load_lora_adapter) gives the default model, and
// *adapter its number (GenerateRequest::adapter; 0 for any other name);
// without `adapter`, the default model alone (its tokenizer, its show).
std::shared_ptr<const LoadedModel> find_model(const std::string& name,
                                              const std::string& default_model, bool ollama,
                                              int32_t* adapter = nullptr);
// Whether the last load of the default model failed (and none succeeded
// since): /health answers 503 then.
bool default_model_failed();
// Whether NAME is a LoRA adapter's (--lora-modules, or loaded while serving).
bool adapter_named(const std::string& name);
// The context a request on m may fill: the server's, at most the model's training context.
int32_t request_n_ctx(const LoadedModel& m, int32_t server_n_ctx);
// What the parsers need of m; split_reasoning: the server's --reasoning-format
// is not "none".
ModelView model_view(const LoadedModel& m, int32_t server_n_ctx, bool split_reasoning = true);

// The file size of a stored model; 0 for a folder or one that does not resolve.
int64_t stored_model_bytes(const std::string& name);

}  // namespace wick::server
