// A loaded model: config, weights, and the storage they point into. Holds no
// request state; many requests may run on one Model.
#pragma once

#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace wick {

enum class ModelFormat { Gguf, HfFolder };

struct Model {
  ModelConfig config;
  ModelWeights weights;
  ModelFormat format = ModelFormat::Gguf;
  std::string path;
  std::string tokenizer_kind;  // e.g. "gguf:gpt2/smollm", "tokenizer.json:BPE", "none"
  int64_t n_params = 0;
  std::map<std::string, int64_t> n_params_by_dtype;  // "q4_1" -> count

  // What the views point into.
  std::unique_ptr<GgufFile> gguf;
  TensorSet tensors;
  std::vector<std::vector<uint8_t>> owned;  // converted or re-ordered tensors
  std::list<LoraDelta> lora;                // adapters' terms (apply_lora; Weight::lora)
  std::vector<std::string> adapters;        // their paths, as applied
  // named adapters (add_named_lora), adapter k at k - 1; "" where one was removed
  std::vector<std::string> adapter_names;
  std::map<int32_t, std::vector<std::vector<uint8_t>>> adapter_bytes;  // a named adapter's terms

  // Whether a mapped file of this model was truncated since it was loaded
  // (its weights may no longer be readable: see docs/security.md, "Faults").
  bool file_shrunk() const {
    return tensors.files_shrunk() || (gguf && gguf->tensors().files_shrunk());
  }
};

// Loads a .gguf file or a HF folder (config.json + safetensors). Every
// expected tensor is checked for presence, shape and type; errors (IoError,
// ModelError) name the file, the tensor and what was expected.
std::unique_ptr<Model> load_model(const std::string& path);

}  // namespace wick
