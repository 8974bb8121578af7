// Causal attention through the batch's block table, on f32, f16, bf16 or q8_0 K/V
// (f16, bf16 and q8_0 rows widened to f32 as a chunk is read: fewer bytes), over key
// chunks of 64 positions with an online softmax: no score row longer than a
// chunk is kept, and each K/V chunk is read (and, for pre-RoPE keys, rotated)
// once for every query of a run and every head of a KV head's group, its keys
// transposed so that a query's 64 scores are 64 lanes (SimdKernels::attn_chunk).
//
// Batch invariance: a query's result depends only on its own key range.
// Queries of one work item need not be at consecutive positions (only
// increasing): a chunk outside a query's range is skipped for it.
// Chunks are aligned to multiples of 64 positions whatever the run, a query
// skips chunks outside its range, and within a chunk keys are taken in order.
// Keys are reduced in partitions of kPart positions, also at fixed multiples,
// each a work item of its own (a few KV heads' long contexts keep every core
// busy in decode), and a query's partitions are combined in their order.
// A work item covers one KV head, or in decode every KV head (KvReads): which
// thread computes a head's partition never changes its arithmetic.
// A bf16 cache on a kernel set with AMX tiles takes run_item_bf16 instead: the
// same items and chunks, each chunk's products on tiles in bf16 (q and the
// softmax weights rounded too), every query row alike (attention_amx.inc).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"

namespace wick::cpu {

namespace {

constexpr int64_t kChunk = 64;
constexpr int64_t kMaxRunPart = 128;  // queries of one work item (long runs are split)
constexpr int64_t kPart = 256;        // key positions of one work item (a multiple of kChunk)
// Floats of partition states computed at once: longer batches go in waves of whole query runs.
constexpr size_t kWaveStates = size_t(2) << 20;

// The queries [first, first + n) of one stretch (runs of one sequence) and
// one KV head, over partitions [part0, part0 + n_parts).
struct Group {
  int64_t first, n, kv_head, part0, n_parts;
  size_t state;  // the first partition's states in the buffer; the next ones follow
};
struct Item {
  size_t group;  // the first of the item's groups (heads_per_item: consecutive KV heads)
  int64_t part;  // key positions [part * kPart, (part + 1) * kPart)
};

std::atomic<KvReads> kv_reads{KvReads::Auto};

// The first key position a query at p reads.
int64_t first_key(const AttnShape& s, int64_t p) {
  return s.sliding_window > 0 ? std::max<int64_t>(0, p - s.sliding_window + 1) : 0;
}

// The slots of positions [c0, c1) of a sequence (block table `table`, fills `fill` or none),
// and the bits of those that hold keys (j: c0 + j; holes past a block's fill do not).
uint64_t chunk_slots(int64_t bs, const int32_t* table, const int32_t* fill, int64_t c0, int64_t c1,
                     int64_t* slot) {
  uint64_t valid = 0;
  for (int64_t j = c0; j < c1; ++j) {
    const int64_t blk = j / bs;
    slot[j - c0] = int64_t(table[blk]) * bs + j % bs;
    if (!fill || (j % bs >= (fill[blk] >> 16) && j % bs < (fill[blk] & 0xffff)))
      valid |= uint64_t(1) << (j - c0);
  }
  return valid;
}

// The keys of chunk [c0, c1) a query at p sees (0: none).
uint64_t live_keys(const AttnShape& s, int64_t p, int64_t c0, int64_t c1, uint64_t valid) {
  const int64_t j0 = std::max(c0, first_key(s, p)) - c0, j1 = std::min(c1, p + 1) - c0;
  if (j0 >= j1) return 0;
  return valid & (j1 - j0 == 64 ? ~uint64_t(0) : (uint64_t(1) << (j1 - j0)) - 1) << j0;
}

// A key row rotated to position j (keys kept before RoPE): rope()'s arithmetic.
void rotate_key(const float* src, const float* cs, int64_t half, float* row) {
  for (int64_t i = 0; i < half; ++i) {
    const float x0 = src[i], x1 = src[i + half];
    row[i] = x0 * cs[i] - x1 * cs[half + i];
    row[i + half] = x1 * cs[i] + x0 * cs[half + i];
  }
}

// What every work item of one call reads.
struct Call {
  const float* q;
  const uint8_t *kb, *vb;  // the layer's key and value rows
  DType dtype;
  int64_t kv_dim;
  const BatchArgs& b;
  const AttnShape& s;
  const RopeTable* rope;   // keys kept before RoPE: rotated here
  int64_t heads_per_item;  // 1, or every KV head (whole rows)
};

// The states of an item's groups for its partition, cleared: (max -inf, sum 0, out 0) for each
// (query, head of the group).
void clear_states(const std::vector<Group>& groups, const Item& item, int64_t heads_per_item,
                  int64_t n_q, int64_t n_st, float* states) {
  for (size_t g = item.group; g < item.group + size_t(heads_per_item); ++g) {
    const Group& w = groups[g];
    float* state = states + w.state + size_t((item.part - w.part0) * n_q * n_st);
    std::fill(state, state + n_q * n_st, 0.f);
    for (int64_t i = 0; i < n_q; ++i) state[i * n_st] = -INFINITY;
  }
}

// run_item for a bf16 cache where the kernel set has AMX tiles (attention_amx.inc): each
// chunk's keys and values laid out once for all the item's rows (a row: one query head of one
// token, rounded to bf16 once an item), then through attn_bf16. Keys kept before RoPE are
// widened, rotated as run_item does and rounded again.
void run_item_bf16(const Call& c, const std::vector<Group>& groups, const Item& item,
                   float* states) {
  const auto& k = simd();
  const BatchArgs& b = c.b;
  const AttnShape& s = c.s;
  const int64_t hd = s.head_dim, half = hd / 2, group = s.n_head / s.n_head_kv, bs = b.block_size,
                n_st = hd + 2, hd32 = (hd + 31) / 32 * 32;
  const size_t row_b = row_bytes(DType::BF16, c.kv_dim);
  const float scale = 1.f / std::sqrt(float(hd)) * s.score_factor;
  const Group& w0 = groups[item.group];
  const int64_t seq = b.seq_of[w0.first];
  const int32_t* table = b.block_table + seq * b.max_blocks;
  const int32_t* fill = b.block_fill ? b.block_fill + seq * b.max_blocks : nullptr;
  const int32_t* shift = b.block_fill ? b.block_shift + seq * b.max_blocks : nullptr;
  const int64_t p_first = b.positions[w0.first], p_last = b.positions[w0.first + w0.n - 1];
  const int64_t n_q = w0.n * group, n_rows = (n_q + 15) / 16 * 16;
  clear_states(groups, item, c.heads_per_item, n_q, n_st, states);
  // the item's query rows in bf16, each group's n_rows apart
  thread_local std::vector<uint16_t> qh, rotated;
  thread_local std::vector<uint32_t> kt, vt;
  thread_local std::vector<float> wide;
  thread_local std::vector<uint64_t> live;
  qh.assign(size_t(c.heads_per_item * n_rows * hd32), 0);
  for (int64_t g = 0; g < c.heads_per_item; ++g) {
    const Group& w = groups[item.group + size_t(g)];
    for (int64_t t = 0; t < w.n; ++t)  // the group's heads of a token are adjacent rows
      k.bf16_rows(c.q + ((w.first + t) * s.n_head + w.kv_head * group) * hd, hd, group, hd,
                  reinterpret_cast<uint32_t*>(qh.data() + (g * n_rows + t * group) * hd32),
                  hd32 / 2);
  }
  kt.resize(size_t(4 * hd32 / 32 * 256));
  vt.resize(size_t((hd + 15) / 16 * 2 * 256));
  live.resize(size_t(n_rows));
  if (c.rope) {
    rotated.resize(size_t(kChunk * hd));
    wide.resize(size_t(2 * hd));
  }
  const int64_t k_end = std::min(p_last + 1, (item.part + 1) * kPart);
  for (int64_t c0 = std::max(first_key(s, p_first) / kChunk * kChunk, item.part * kPart);
       c0 < k_end; c0 += kChunk) {
    const int64_t c1 = std::min(c0 + kChunk, k_end);
    int64_t slot[kChunk];
    const uint64_t valid = chunk_slots(bs, table, fill, c0, c1, slot);
    // each row's live keys (the item's groups share their queries' positions)
    uint64_t any = 0;
    for (int64_t t = 0; t < w0.n; ++t) {
      const uint64_t lv = live_keys(s, b.positions[w0.first + t], c0, c1, valid);
      for (int64_t h = 0; h < group; ++h) live[size_t(t * group + h)] = lv;
      any |= lv;
    }
    if (!any) continue;
    for (int64_t g = 0; g < c.heads_per_item; ++g) {
      const Group& w = groups[item.group + size_t(g)];
      const size_t head_off = size_t(w.kv_head) * row_bytes(DType::BF16, hd);
      const uint16_t* kp[kChunk];
      const uint16_t* vp[kChunk];
      for (int64_t jj = 0; jj < kChunk; ++jj) {
        kp[jj] = vp[jj] = nullptr;  // not valid: zeros
        if (!((valid >> jj) & 1)) continue;
        const size_t off = size_t(slot[jj]) * row_b + head_off;
        kp[jj] = reinterpret_cast<const uint16_t*>(c.kb + off);
        vp[jj] = reinterpret_cast<const uint16_t*>(c.vb + off);
        if (c.rope) {
          const int64_t j = c0 + jj, blk = j / bs;
          k.dequant_row(DType::BF16, kp[jj], wide.data(), hd);  // exact
          rotate_key(wide.data(), c.rope->row(shift ? j - shift[blk] : j), half, wide.data() + hd);
          uint16_t* row = rotated.data() + jj * hd;
          for (int64_t d = 0; d < hd; ++d) row[d] = f32_to_bf16(wide[size_t(hd + d)]);
          kp[jj] = row;
        }
      }
      k.attn_bf16_kv(kp, vp, hd, kt.data(), vt.data());
      float* state = states + w.state + size_t((item.part - w.part0) * n_q * n_st);
      k.attn_bf16(qh.data() + g * n_rows * hd32, n_q, hd, scale, kt.data(), vt.data(), live.data(),
                  state, n_st);
    }
  }
  k.attn_bf16_done();
}

// One work item: the online softmax of its groups' queries over its partition's chunks, into
// their states for that partition.
void run_item(const Call& c, const std::vector<Group>& groups, const Item& item, float* states) {
  const auto& k = simd();
  if (c.dtype == DType::BF16 && k.attn_bf16) return run_item_bf16(c, groups, item, states);
  const BatchArgs& b = c.b;
  const AttnShape& s = c.s;
  const RopeTable* rope = c.rope;
  const float* q = c.q;
  const uint8_t *kb = c.kb, *vb = c.vb;
  const DType dtype = c.dtype;
  const int64_t kv_dim = c.kv_dim, heads_per_item = c.heads_per_item;
  const int64_t hd = s.head_dim, half = hd / 2, group = s.n_head / s.n_head_kv, bs = b.block_size,
                n_st = hd + 2;
  const size_t row_b = row_bytes(dtype, kv_dim), head_b = row_bytes(dtype, hd);
  const float scale = 1.f / std::sqrt(float(hd)) * s.score_factor;
  const bool widened = dtype != DType::F32;
  // An item of several heads copies (and widens) its chunks' whole K and V rows first, so the
  // memory is read in order: one head's slice of each row streams at about 60 % of that.
  const bool whole_rows = heads_per_item > 1;
  // Keys not rotated here are widened by the transposition itself, not first into a buffer: f16
  // keys, and q8_0 keys once copied whole (their transposition from memory waits on the reads).
  const bool keys_as_stored =
      !rope && (dtype == DType::F16 || (dtype == DType::Q8_0 && whole_rows));
  const int64_t ld = whole_rows ? kv_dim : hd;  // the stride of the widened rows
  const Group& w0 = groups[item.group];         // the item's groups differ only in their KV head
  const int64_t part = item.part;
  const int64_t seq = b.seq_of[w0.first];
  const int32_t* table = b.block_table + seq * b.max_blocks;
  const int32_t* fill = b.block_fill ? b.block_fill + seq * b.max_blocks : nullptr;
  const int32_t* shift = b.block_fill ? b.block_shift + seq * b.max_blocks : nullptr;
  const int64_t p_first = b.positions[w0.first], p_last = b.positions[w0.first + w0.n - 1];
  const int64_t n_q = w0.n * group;
  auto state_of = [&](const Group& w) {
    return states + w.state + size_t((part - w.part0) * n_q * n_st);
  };
  clear_states(groups, item, heads_per_item, n_q, n_st, states);
  thread_local std::vector<float> kt, wide, rotated;
  kt.resize(size_t(hd * kChunk));
  if (rope) rotated.resize(size_t(kChunk * hd));
  // The chunk's key rows, then its value rows, in f32: whole rows (whole_rows) or one
  // head's (f16, q8_0), a block's rows at a time.
  if (widened || whole_rows) wide.resize(size_t(2 * kChunk * ld));
  float* const wide_k = wide.data();
  float* const wide_v = wide.data() + kChunk * ld;
  const int64_t k_end = std::min(p_last + 1, (part + 1) * kPart);
  for (int64_t c0 = std::max(first_key(s, p_first) / kChunk * kChunk, part * kPart); c0 < k_end;
       c0 += kChunk) {
    const int64_t c1 = std::min(c0 + kChunk, k_end);
    // the chunk's slots and valid rows, for every KV head of the item
    int64_t slot[kChunk];
    const uint64_t valid = chunk_slots(bs, table, fill, c0, c1, slot);
    if (whole_rows)
      for (int64_t j = c0; j < c1;) {
        const int64_t n = std::min(c1, (j / bs + 1) * bs) - j;
        const size_t off = size_t(slot[j - c0]) * row_b;
        float* dk = wide_k + (j - c0) * ld;
        float* dv = wide_v + (j - c0) * ld;
        // a block's rows are adjacent; keys_as_stored are copied as stored
        if (!widened || keys_as_stored)
          std::memcpy(reinterpret_cast<uint8_t*>(wide_k) + size_t(j - c0) * row_b, kb + off,
                      size_t(n) * row_b);
        else
          k.kv_rows(dtype, kb + off, row_b, dk, ld, n, kv_dim);
        if (widened)
          k.kv_rows(dtype, vb + off, row_b, dv, ld, n, kv_dim);
        else
          std::memcpy(dv, vb + off, size_t(n) * row_b);
        j += n;
      }
    for (size_t g = item.group; g < item.group + size_t(heads_per_item); ++g) {
      const Group& w = groups[g];
      const size_t head_off = size_t(w.kv_head) * head_b;
      if (widened && !whole_rows)
        for (int64_t j = c0; j < c1;) {
          const int64_t n = std::min(c1, (j / bs + 1) * bs) - j;
          const size_t off = size_t(slot[j - c0]) * row_b + head_off;
          if (!keys_as_stored) k.kv_rows(dtype, kb + off, row_b, wide_k + (j - c0) * ld, ld, n, hd);
          k.kv_rows(dtype, vb + off, row_b, wide_v + (j - c0) * ld, ld, n, hd);
          j += n;
        }
      // the key rows (rotated for pre-RoPE keys; nullptr: not valid, zeros), then transposed
      // into kt; the value rows as f32
      const bool copied = widened || whole_rows;
      const int64_t col = whole_rows ? w.kv_head * hd : 0;
      const void* kp[kChunk];
      const float* vp[kChunk];
      for (int64_t jj = 0; jj < kChunk; ++jj) {
        kp[jj] = vp[jj] = nullptr;  // not live: never read
        if (!((valid >> jj) & 1)) continue;
        const size_t off = size_t(slot[jj]) * row_b + head_off;
        vp[jj] = copied ? wide_v + jj * ld + col : reinterpret_cast<const float*>(vb + off);
        const void* key = keys_as_stored ? (whole_rows ? reinterpret_cast<const uint8_t*>(wide_k) +
                                                             size_t(jj) * row_b + head_off
                                                       : kb + off)
                          : copied       ? wide_k + jj * ld + col
                                         : static_cast<const void*>(kb + off);
        if (rope) {
          const int64_t j = c0 + jj, blk = j / bs;
          float* row = rotated.data() + jj * hd;
          // holes do not count
          rotate_key(static_cast<const float*>(key), rope->row(shift ? j - shift[blk] : j), half,
                     row);
          key = row;
        }
        kp[jj] = key;
      }
      k.keys_t(kp, keys_as_stored ? dtype : DType::F32, hd, kt.data());
      float* state = state_of(w);
      for (int64_t t = 0; t < w.n; ++t) {
        const uint64_t live = live_keys(s, b.positions[w.first + t], c0, c1, valid);
        if (!live) continue;  // nothing of this query's range here
        // the group's query heads two at a time, three once for an odd group (one load of kt
        // and the value rows for them all)
        const float* qt = q + ((w.first + t) * s.n_head + w.kv_head * group) * hd;
        float* st = state + t * group * n_st;
        int64_t h = 0;
        if (group % 2 && group >= 3) {
          const float* qh[3] = {qt, qt + hd, qt + 2 * hd};
          float* sh[3] = {st, st + n_st, st + 2 * n_st};
          k.attn_chunk3(qh, hd, scale, kt.data(), vp, live, sh);
          h = 3;
        }
        for (; h + 2 <= group; h += 2) {
          const float* qh[2] = {qt + h * hd, qt + (h + 1) * hd};
          float* sh[2] = {st + h * n_st, st + (h + 1) * n_st};
          k.attn_chunk2(qh, hd, scale, kt.data(), vp, live, sh);
        }
        if (h < group) k.attn_chunk(qt + h * hd, hd, scale, kt.data(), vp, live, st + h * n_st);
      }
    }
  }
}

// Each query head's partitions in order: sums and outputs rescaled to the largest maximum (one
// partition: weight exp(0) = 1, its own bits).
void combine(const AttnShape& s, const Group& w, const float* states, float* out) {
  const int64_t hd = s.head_dim, group = s.n_head / s.n_head_kv, n_st = hd + 2;
  const int64_t n_q = w.n * group;
  float acc[512];
  for (int64_t i = 0; i < n_q; ++i) {
    const float* st0 = states + w.state + size_t(i * n_st);
    float m = -INFINITY;
    for (int64_t pt = 0; pt < w.n_parts; ++pt) m = std::max(m, st0[pt * n_q * n_st]);
    float sum = 0.f;
    std::fill(acc, acc + hd, 0.f);
    for (int64_t pt = 0; pt < w.n_parts; ++pt) {
      const float* st = st0 + pt * n_q * n_st;
      if (st[0] == -INFINITY) continue;  // no key of this partition in the query's range
      const float wt = std::exp(st[0] - m);
      sum += st[1] * wt;
      for (int64_t d = 0; d < hd; ++d) acc[d] += st[2 + d] * wt;
    }
    const int64_t t = i / group, h = i % group;
    float* o = out + ((w.first + t) * s.n_head + w.kv_head * group + h) * hd;
    const float inv = 1.f / sum;
    for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
  }
}

}  // namespace

void set_kv_reads(KvReads r) {
  kv_reads = r;
}

void RopeTable::ensure(const float* inv_freq, int64_t head_dim, int64_t n_pos) {
  // keyed by the frequencies' values: another model's may sit at a freed one's address
  if (head_dim != head_dim_ || !std::equal(freq_.begin(), freq_.end(), inv_freq)) {
    freq_.assign(inv_freq, inv_freq + head_dim / 2);
    head_dim_ = head_dim;
    n_pos_ = 0;
    cs_.clear();
  }
  if (n_pos <= n_pos_) return;
  const int64_t half = head_dim / 2, from = n_pos_;
  n_pos = std::max(n_pos, 2 * n_pos_);
  cs_.resize(size_t(n_pos * head_dim));
  for (int64_t p = from; p < n_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      // the same float expression as rope(), so rotated keys match it bit for bit
      const float angle = float(p) * inv_freq[i];
      cs_[size_t(p * head_dim + i)] = std::cos(angle);
      cs_[size_t(p * head_dim + half + i)] = std::sin(angle);
    }
  n_pos_ = n_pos;
}

void attention(const float* q, const void* kl, const void* vl, DType dtype, int64_t kv_dim,
               const BatchArgs& b, const AttnShape& s, const RopeTable* rope, float* out) {
  const int64_t hd = s.head_dim, group = s.n_head / s.n_head_kv;
  if (hd > 512) throw std::runtime_error("CPU attention: head_dim above 512");
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16 && dtype != DType::Q8_0)
    throw std::runtime_error("CPU attention: KV cache of f32, f16, bf16 or q8_0 only");
  if (dtype == DType::Q8_0 && hd % 32)
    throw std::runtime_error(
        "CPU attention: a q8_0 KV cache needs a head dim that is a multiple "
        "of 32");
  // Adjacent runs of one sequence at increasing positions (a placed span's
  // scattered rows) are one stretch: its key chunks are read once for all.
  std::vector<std::pair<int64_t, int64_t>> stretches;  // first token, count
  for (int64_t r = 0; r < b.n_runs; ++r) {
    const int64_t first = b.runs[2 * r], n = b.runs[2 * r + 1];
    if (!stretches.empty()) {
      auto& [f, m] = stretches.back();
      if (f + m == first && b.seq_of[f] == b.seq_of[first] &&
          b.positions[first] > b.positions[f + m - 1]) {
        m += n;
        continue;
      }
    }
    stretches.push_back({first, n});
  }
  // per (query, head of the group, partition): running max, sum, output (a run of 128 queries
  // at depth D keeps 128 * n_head * (hd + 2) * D / 256 floats, 0.5 * group / n_layer of the
  // f32 cache's bytes: more than one run's go in waves of kWaveStates floats)
  const int64_t n_st = hd + 2;
  std::vector<Group> groups;
  std::vector<size_t> waves{0};  // each wave's first group, then the end
  size_t n_states = 0, wave_states = 0;
  int64_t max_m = 0, n_part_items = 0;
  for (auto [first, n] : stretches)
    for (int64_t off = 0; off < n; off += kMaxRunPart) {
      const int64_t m = std::min(kMaxRunPart, n - off);
      const int64_t part0 = first_key(s, b.positions[first + off]) / kPart,
                    n_parts = b.positions[first + off + m - 1] / kPart - part0 + 1;
      const size_t per_head = size_t(n_parts * m * group * n_st);
      if (wave_states > 0 && wave_states + size_t(s.n_head_kv) * per_head > kWaveStates) {
        waves.push_back(groups.size());
        wave_states = 0;
      }
      for (int64_t g = 0; g < s.n_head_kv; ++g) {
        groups.push_back({first + off, m, g, part0, n_parts, wave_states});
        wave_states += per_head;
      }
      n_states = std::max(n_states, wave_states);
      max_m = std::max(max_m, m);
      n_part_items += n_parts;
    }
  waves.push_back(groups.size());
  // A few queries a stretch (decode) are bound by reading the cache: an item then takes every
  // KV head of its partition, when that leaves work enough for every thread.
  const KvReads reads = kv_reads;
  const bool few_queries = max_m <= 16 && kv_dim <= 1024;
  const bool enough_items = n_threads() == 1 || n_part_items >= 2 * n_threads();
  const int64_t heads_per_item =
      reads == KvReads::WholeRows || (reads == KvReads::Auto && few_queries && enough_items)
          ? s.n_head_kv
          : 1;
  thread_local std::vector<float> states_buf;  // the calling thread's: workers use the pointer
  states_buf.resize(n_states);
  float* const states = states_buf.data();
  const auto *kb = static_cast<const uint8_t*>(kl), *vb = static_cast<const uint8_t*>(vl);
  const Call c{q, kb, vb, dtype, kv_dim, b, s, rope, heads_per_item};
  std::vector<Item> items;
  for (size_t wave = 0; wave + 1 < waves.size(); ++wave) {
    items.clear();
    for (size_t gi = waves[wave]; gi < waves[wave + 1]; gi += size_t(heads_per_item))
      for (int64_t pt = 0; pt < groups[gi].n_parts; ++pt)
        items.push_back({gi, groups[gi].part0 + pt});
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads())
    for (size_t it = 0; it < items.size(); ++it) run_item(c, groups, items[it], states);
#pragma omp parallel for schedule(static) num_threads(n_threads())
    for (size_t gi = waves[wave]; gi < waves[wave + 1]; ++gi) combine(s, groups[gi], states, out);
  }
}

}  // namespace wick::cpu
