// HF folder -> GGUF in llama.cpp's tensor naming and metadata keys; GGUF -> GGUF of another type.
#pragma once

#include <string>

#include "io/dtype.h"

namespace wick {

// Writes the model at `hf_dir` as a GGUF file. Matrices are stored as `type`
// (f32, f16, bf16 or q8_0; rows that do not fit the block size stay f32),
// vectors as f32. llama-family q/k rows are interleaved as llama.cpp expects.
void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path, DType type);
// Writes a GGUF file again with its matrices as `type` (dequantized first:
// e.g. a Q4_1 model as f16 or f32); metadata, tokenizer and tensor layout
// are kept, vectors and MoE routers stay f32.
void convert_gguf(const std::string& src, const std::string& out_path, DType type);

}  // namespace wick
