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

// name empty: default_model. Ollama names may end in ":latest" (dropped).
// 404 for an unknown model, 400 when it has no tokenizer, 500 when it fails to load.
std::shared_ptr<const LoadedModel> find_model(const std::string& name,
                                              const std::string& default_model, bool ollama);
// The context a request on m may fill: the server's, at most the model's training context.
int32_t request_n_ctx(const LoadedModel& m, int32_t server_n_ctx);
// What the parsers need of m.
ModelView model_view(const LoadedModel& m, int32_t server_n_ctx);

// Models in the store by name (a .gguf file's stem, a folder's name), in directory order.
std::vector<std::string> stored_model_names();
// The file size of a stored model; 0 for a folder or one that does not resolve.
int64_t stored_model_bytes(const std::string& name);

}  // namespace wick::server
