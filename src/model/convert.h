// HF folder -> GGUF in llama.cpp's tensor naming and metadata keys; GGUF -> GGUF of another type.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>

#include "io/dtype.h"
#include "model/quant_plan.h"

namespace wick {

// Writes the model at `hf_dir` as a GGUF file. Matrices are stored as `type`
// (f32, f16, bf16 or q8_0; rows that do not fit the block size stay f32),
// vectors as f32. llama-family q/k rows are interleaved as llama.cpp expects.
void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path, DType type);
// Writes a GGUF file again with its matrices as `type` (dequantized first:
// e.g. a Q4_1 model as f16 or f32); metadata, tokenizer and tensor layout
// are kept, vectors and MoE routers stay f32.
void convert_gguf(const std::string& src, const std::string& out_path, DType type);

// Gets the fraction of elements written (0..1) and the tensor just done.
using ConvertProgress = std::function<void(double fraction, const std::string& tensor)>;
// The same with each tensor's type chosen by `plan` (wick quantize): any
// type quantize_row writes, mixes included. Rows are quantized in parallel;
// the file is written to a temporary name and renamed when complete.
// `lora`: adapters (path, scale) merged into the weights they adapt, each
// row W + scale * B @ A before it is written (llama.cpp's export-lora).
void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path,
                        const QuantPlan& plan, const ConvertProgress& progress = {},
                        std::span<const std::pair<std::string, float>> lora = {});
void convert_gguf(const std::string& src, const std::string& out_path, const QuantPlan& plan,
                  const ConvertProgress& progress = {},
                  std::span<const std::pair<std::string, float>> lora = {});

}  // namespace wick
