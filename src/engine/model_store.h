// Where models live: MODEL arguments are a .gguf path, a HF folder, or a name
// in the model store ($WICK_MODELS, default ~/.cache/wick/models).
#pragma once

#include <string>

namespace wick {

std::string model_store_dir();
// The path MODEL refers to; throws ModelError naming the store when it is
// neither a path nor a stored name.
std::string resolve_model(const std::string& model);

}  // namespace wick
