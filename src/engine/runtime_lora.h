// Named LoRA adapters added to and taken from a model while it serves
// (vLLM's /v1/load_lora_adapter): the host terms (model/lora.h) and the
// backend's prepared copies (model/forward.h) together. Only on the thread
// that runs m's forward passes, between steps.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model_pool.h"

namespace wick {

// Adds adapter `adapter` (a number never given before), named `name`,
// from `path` (a GGUF adapter or a PEFT folder, at scale 1). Throws
// ModelError/IoError naming what does not fit (a backend without LoRA
// included); m is unchanged then.
void add_serving_adapter(const LoadedModel& m, const std::string& name, const std::string& path,
                         int32_t adapter);
// Removes adapter `adapter` from m: no request may be using it.
void remove_serving_adapter(const LoadedModel& m, int32_t adapter);

}  // namespace wick
