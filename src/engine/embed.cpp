// Engine::embed: final hidden states pooled into one vector per input.
#include <fmt/format.h>

#include <cmath>

#include "engine/engine.h"

namespace wick {

const char* pooling_name(Pooling p) {
  return p == Pooling::Mean ? "mean" : "last";
}

std::optional<Pooling> pooling_from_name(std::string_view name) {
  if (name == "mean") return Pooling::Mean;
  if (name == "last") return Pooling::Last;
  return std::nullopt;
}

namespace {

// Adds rows [0, n) (mean) or the last row into acc, in row order: the sum
// depends on the input's own rows alone.
void add_rows(const float* rows, int32_t n, std::vector<double>& acc) {
  const size_t dim = acc.size();
  for (int32_t r = 0; r < n; ++r)
    for (size_t i = 0; i < dim; ++i) acc[i] += rows[size_t(r) * dim + i];
}

std::vector<float> normalised(const std::vector<double>& acc) {
  double norm = 0;
  for (double v : acc) norm += v * v;
  norm = std::sqrt(norm);
  std::vector<float> out(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) out[i] = float(norm > 0 ? acc[i] / norm : 0.0);
  return out;
}

}  // namespace

std::vector<Embedding> Engine::embed(const std::vector<std::vector<int32_t>>& inputs,
                                     Pooling pooling, int32_t adapter) {
  const int32_t n_vocab = int32_t(model_->config().n_vocab), bs = cfg_.block_size;
  const int32_t max_tokens = cfg_.max_batch_tokens;
  check_adapter(adapter);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) throw GenerateError(fmt::format("input {} has no tokens", i));
    if (int32_t(inputs[i].size()) > cfg_.n_ctx)
      throw GenerateError(fmt::format("input {} has {} tokens but the context holds {}", i,
                                      inputs[i].size(), cfg_.n_ctx));
    for (int32_t id : inputs[i])
      if (id < 0 || id >= n_vocab)
        throw GenerateError(
            fmt::format("input {}: token id {} is outside the vocabulary [0, {})", i, id, n_vocab));
  }
  const size_t dim = size_t(model_->config().n_embd);
  std::vector<Embedding> out(inputs.size());
  Batch batch;
  auto n_blocks_of = [&](size_t k) { return (int32_t(inputs[k].size()) + bs - 1) / bs; };
  for (size_t begin = 0; begin < inputs.size();) {
    // A group: inputs while their tokens fit one step's and their blocks are
    // free; an input longer than a step goes alone, in chunks (as a prefill).
    size_t end = begin + 1;
    int32_t n_tokens = int32_t(inputs[begin].size()), n_blocks = n_blocks_of(begin);
    while (end < inputs.size() && n_tokens + int32_t(inputs[end].size()) <= max_tokens &&
           n_blocks + n_blocks_of(end) <= scheduler_.blocks().n_free()) {
      n_tokens += int32_t(inputs[end].size());
      n_blocks += n_blocks_of(end);
      ++end;
    }
    std::vector<int32_t> blocks = scheduler_.borrow_blocks(n_blocks);
    if (blocks.empty())
      throw std::runtime_error(fmt::format(
          "the KV cache has {} free blocks; input {} needs {} (the cache is busy: retry)",
          scheduler_.blocks().n_free(), begin, n_blocks));
    std::vector<std::vector<double>> acc(end - begin, std::vector<double>(dim, 0.0));
    try {
      for (int32_t from = 0; from < n_tokens; from += max_tokens) {  // chunks of a long input
        batch.clear();
        size_t next_block = 0;
        for (size_t k = begin; k < end; ++k) {
          const auto& ids = inputs[k];
          const size_t nb = size_t(n_blocks_of(k));
          batch.block_tables.emplace_back(blocks.begin() + long(next_block),
                                          blocks.begin() + long(next_block + nb));
          batch.adapters.push_back(adapter);
          next_block += nb;
          const size_t p_end =
              end - begin == 1 ? std::min(ids.size(), size_t(from + max_tokens)) : ids.size();
          for (size_t p = size_t(end - begin == 1 ? from : 0); p < p_end; ++p)
            batch.add(ids[p], int32_t(p), int32_t(k - begin),
                      pooling == Pooling::Mean || p + 1 == ids.size());
        }
        const std::span<const float> rows = runner_.hidden_states(batch);
        // logit rows come in token order: each input's rows are consecutive
        size_t row = 0;
        for (int32_t seq = 0; seq < int32_t(end - begin); ++seq) {
          int32_t n = 0;
          for (int32_t r : batch.logit_rows) n += batch.seq_of[size_t(r)] == seq;
          add_rows(rows.data() + row * dim, n, acc[size_t(seq)]);
          row += size_t(n);
        }
      }
    } catch (...) {
      scheduler_.return_blocks(blocks);
      throw;
    }
    scheduler_.return_blocks(blocks);
    for (size_t k = begin; k < end; ++k) {
      out[k].values = normalised(acc[k - begin]);
      out[k].n_tokens = int32_t(inputs[k].size());
    }
    begin = end;
  }
  return out;
}

}  // namespace wick
