// LoRA adapters applied at load: each adapted projection keeps its weight
// as stored and gains a low-rank term (Weight::lora) that the backend adds
// to its product, y = W x + scale * B (A x).
//
// Read: a GGUF adapter as llama.cpp's convert_lora_to_gguf.py writes it
// (general.type "adapter", adapter.type "lora", adapter.lora.alpha; tensors
// blk.N.<name>.weight.lora_a [rank, n_in] and .lora_b [n_out, rank], q/k rows
// of llama-family models interleaved as in their GGUF files), or a PEFT
// folder (adapter_config.json: r, lora_alpha, use_rslora;
// adapter_model.safetensors: ...layers.N.<module>.lora_A/lora_B.weight).
// Scale: llama.cpp's, scale * alpha / rank (alpha 0: scale); PEFT's,
// scale * lora_alpha / r (/ sqrt(r) with use_rslora).
//
// Targets: the attention (q, k, v, o) and dense MLP (gate, up, down)
// projections. Anything else (embeddings, the head, experts, DoRA, biases,
// rank patterns) is refused with an error naming it.
#pragma once

#include <span>
#include <string>
#include <utility>

#include "model/model.h"

namespace wick {

// Applies the adapters (path, scale) to m's weights, several stacked on one
// projection along the rank. Throws ModelError/IoError naming the adapter
// file and what does not fit. Once per model, before it is prepared.
void apply_lora(Model& m, std::span<const std::pair<std::string, float>> adapters);

// A named adapter (a server's --lora-modules): its terms apply only to the
// rows of requests that choose it (GenerateRequest::adapter), so requests
// with different adapters, or none, share one batch and one copy of the
// base. Returns its number (1, 2, ...: Model::adapter_names[number - 1]):
// `number` when given (one no adapter of m holds; the caller never gives a
// number twice, so caches keyed by it never serve another adapter's K/V),
// else the next. After apply_lora; on a prepared model, prepare_adapter
// (model/forward.h) then gives the backend its terms.
int32_t add_named_lora(Model& m, const std::string& name,
                       std::span<const std::pair<std::string, float>> adapters, int32_t number = 0);
// Unlinks named adapter `adapter`'s terms from m's weights and frees them;
// its name becomes "". A prepared model's backend drops its copies first
// (drop_adapter). Only while no forward pass runs on m.
void remove_named_lora(Model& m, int32_t adapter);

// For writing merged weights: row += b[r, :] . a, r a row of the adapted
// weight in HF order; and the term of a GGUF tensor (blk.N.attn_q.weight ...), or null.
void add_lora_row(const LoraDelta& d, int64_t r, float* row);
const LoraDelta* lora_of_gguf_tensor(const Model& m, const std::string& name);

}  // namespace wick
