// A stand-in shaped like ExecuTorch's MLX runtime cache (`MLXSequenceCache`, backends/mlx/runtime),
// written from its header's description, not from its code: one sequence, per layer a K and a V pool
// of shape [1, H, slots, D] (batch 1 only; one width for K and V, so no MLA) that starts at
// `initial_capacity` rows (0: empty) and doubles on demand up to the layer's slots: `capacity` for a flat
// layer, `window + max_write - 1` for a ring layer, which recycles them. `max_write` is the most tokens
// one step may write (unset: the smallest ring window); the runner chunks prefill to fit. A step is
// planned from its positions (a contiguous run starting at the tokens held), each layer served once per
// step; the answer is the retained span (flat: every row; ring: the newest window + T - 1) with a mask:
// none for one token, an explicit band on a ring narrower than the span, else MLX's causal, which is
// lower-right aligned.
//
// Broken variants, each a realistic bug the conformance suite must find (compile with -D...):
//   MLXS_BUG_WINDOW_OFF_BY_ONE    the ring band lets a query see one position more than its window
//   MLXS_BUG_MAX_WRITE_UNCHECKED  a step longer than max_write is served into a ring that cannot hold it
//   MLXS_BUG_POSITIONS_IGNORED    the step is placed at the tokens held, whatever positions it names
//   MLXS_BUG_GROWTH_DROPS_ROWS    a growing pool forgets the rows it held
//   MLXS_BUG_ABORTS_PAST_CAPACITY a step past capacity aborts the process (an assert, not a refusal)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace mlxs {

// A dense float array, row-major (what an MLX array is to this stand-in).
struct Array {
  std::vector<int> shape;
  std::vector<float> data;
};

enum class Kind { Flat, Ring };
struct LayerPolicy {
  Kind kind = Kind::Flat;
  int window = 0;  // 0 for flat
};

struct CacheConfig {
  int capacity = 0;
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int initial_capacity = 0;        // rows a pool starts with (clamped to its slots)
  std::optional<int> max_write;    // unset: the smallest ring window
  std::vector<LayerPolicy> layers; // one for every layer, or one per layer
};

enum class MaskKind { None, Causal, Explicit };
struct AttendSpec {
  Array k, v;                         // [1, H, S, D]: the retained span, oldest first
  MaskKind mask = MaskKind::None;
  Array explicit_mask;                // [1, 1, T, S], 1 = attend (Explicit only)
};

// One layer's pool: [1, H, rows, D], growing by doubling up to `slots`.
class Pool {
 public:
  Pool(int initial, int slots, int heads, int dim)
      : slots_(slots), heads_(heads), dim_(dim), rows_(std::min(initial, slots)),
        data_(static_cast<size_t>(rows_) * heads * dim) {}

  void reserve(int rows) {
    if (rows <= rows_) return;
    int grown = std::max(rows_, 1);
    while (grown < rows) grown *= 2;
    grown = std::min(grown, slots_);
    std::vector<float> next(static_cast<size_t>(grown) * heads_ * dim_);
#ifndef MLXS_BUG_GROWTH_DROPS_ROWS
    for (int h = 0; h < heads_ && rows_ > 0; ++h)
      std::copy_n(&data_[static_cast<size_t>(h) * rows_ * dim_], static_cast<size_t>(rows_) * dim_,
                  &next[static_cast<size_t>(h) * grown * dim_]);
#endif
    data_.swap(next);
    rows_ = grown;
  }
  // Token t of `update` ([1, H, T, D]) into slot `slot`.
  void write(int slot, const Array& update, int t) {
    const int T = update.shape[2];
    for (int h = 0; h < heads_; ++h)
      std::copy_n(&update.data[(static_cast<size_t>(h) * T + t) * dim_], dim_, &at(h, slot));
  }
  // Slots in order into [1, H, slots.size(), D].
  Array read(const std::vector<int>& slots) const {
    Array out{{1, heads_, static_cast<int>(slots.size()), dim_}, {}};
    for (int h = 0; h < heads_; ++h)
      for (int slot : slots) out.data.insert(out.data.end(), &at(h, slot), &at(h, slot) + dim_);
    return out;
  }
  void clear() { *this = Pool(0, slots_, heads_, dim_); }

 private:
  const float& at(int h, int slot) const { return data_[(static_cast<size_t>(h) * rows_ + slot) * dim_]; }
  float& at(int h, int slot) { return data_[(static_cast<size_t>(h) * rows_ + slot) * dim_]; }
  int slots_, heads_, dim_, rows_;
  std::vector<float> data_;
};

class SequenceCache {
 public:
  explicit SequenceCache(const CacheConfig& cfg) : cfg_(cfg) {
    if (cfg.capacity < 1 || cfg.n_layers < 1 || cfg.n_kv_heads < 1 || cfg.head_dim < 1 || cfg.initial_capacity < 0 ||
        (cfg.max_write && *cfg.max_write < 1))
      throw std::invalid_argument("OP-CONFIG: capacity, n_layers, n_kv_heads, head_dim, max_write >= 1");
    if (cfg.layers.size() != 1 && cfg.layers.size() != static_cast<size_t>(cfg.n_layers))
      throw std::invalid_argument("OP-CONFIG: layers is one policy, or one per layer");
    int smallest_window = 0;
    for (const LayerPolicy& p : cfg.layers) {
      if ((p.kind == Kind::Flat) != (p.window == 0) || p.window < 0)
        throw std::invalid_argument("OP-CONFIG: a flat layer has window 0, a ring layer a window >= 1");
      if (p.kind == Kind::Ring) smallest_window = smallest_window ? std::min(smallest_window, p.window) : p.window;
    }
    max_write_ = cfg.max_write ? *cfg.max_write : smallest_window;
    for (int l = 0; l < cfg.n_layers; ++l) {
      const LayerPolicy& p = policy(l);
      const int slots = p.kind == Kind::Ring ? p.window + (cfg.max_write ? *cfg.max_write : p.window) - 1 : cfg.capacity;
      kpool_.emplace_back(cfg.initial_capacity, slots, cfg.n_kv_heads, cfg.head_dim);
      vpool_.emplace_back(cfg.initial_capacity, slots, cfg.n_kv_heads, cfg.head_dim);
      slots_.push_back(slots);
    }
  }

  // The tokens layer `layer` holds: the committed length, plus the open step where this layer served it.
  int used(int layer) const {
    check_layer(layer);
    return step_ && step_->served[layer] ? step_->start + step_->T : length_;
  }

  void reset() {
    length_ = 0;
    step_.reset();
    for (Pool& p : kpool_) p.clear();
    for (Pool& p : vpool_) p.clear();
  }

  AttendSpec update_and_fetch(int layer, const std::vector<int32_t>& positions, const Array& k, const Array& v) {
    check_layer(layer);
    const int H = cfg_.n_kv_heads, D = cfg_.head_dim;
    const int T = k.shape.size() == 4 ? k.shape[2] : 0;
    if (k.shape != std::vector<int>{1, H, T, D} || v.shape != k.shape)
      throw std::invalid_argument("OP-ARGS: k and v are [1, n_kv_heads, T, head_dim]");
    if (T < 1 || static_cast<int>(positions.size()) != T)
      throw std::invalid_argument("OP-ARGS: one position per key/value token");
    for (int i = 1; i < T; ++i)
      if (positions[i] != positions[0] + i) throw std::invalid_argument("OP-POS: a step is a contiguous run");
    int start = positions[0];
    const bool continues = step_ && !step_->served[layer];
    if (continues && (start != step_->start || T != step_->T))
      throw std::invalid_argument("OP-STEP: every layer of a step takes its positions");
    if (!continues) {   // a new step: one not every layer served is abandoned (the length never moved)
#ifdef MLXS_BUG_POSITIONS_IGNORED
      start = length_;
#endif
      if (start != length_) throw std::invalid_argument("OP-POS: a step starts at the tokens held");
#ifdef MLXS_BUG_ABORTS_PAST_CAPACITY
      if (start + T > cfg_.capacity) std::abort();
#endif
      if (start + T > cfg_.capacity) throw std::runtime_error("OP-CAP: the step exceeds capacity");
#ifndef MLXS_BUG_MAX_WRITE_UNCHECKED
      if (max_write_ && T > max_write_) throw std::runtime_error("OP-MAX-WRITE: the step exceeds max_write");
#endif
      step_ = Step{start, T, std::vector<bool>(cfg_.n_layers, false)};
    }
    const LayerPolicy& p = policy(layer);
    const bool ring = p.kind == Kind::Ring;
    const int end = start + T, first = ring ? std::max(0, start - p.window + 1) : 0;
    kpool_[layer].reserve(std::min(end, slots_[layer]));
    vpool_[layer].reserve(std::min(end, slots_[layer]));
    for (int t = 0; t < T; ++t) {
      kpool_[layer].write(slot(layer, start + t), k, t);
      vpool_[layer].write(slot(layer, start + t), v, t);
    }
    std::vector<int> span;
    for (int pos = first; pos < end; ++pos) span.push_back(slot(layer, pos));
    AttendSpec out{kpool_[layer].read(span), vpool_[layer].read(span), MaskKind::Causal, {}};
    step_->served[layer] = true;
    if (std::count(step_->served.begin(), step_->served.end(), true) == cfg_.n_layers) {
      length_ = end;
      step_.reset();
    }
    const int S = end - first;
    if (T == 1) out.mask = MaskKind::None;   // its span is exactly what it may attend
    if (T > 1 && ring && p.window < S) {     // the band: query i sees keys j with S-T-window < j-i <= S-T
      int window = p.window;
#ifdef MLXS_BUG_WINDOW_OFF_BY_ONE
      window += 1;
#endif
      out.mask = MaskKind::Explicit;
      out.explicit_mask = Array{{1, 1, T, S}, {}};
      for (int i = 0; i < T; ++i)
        for (int j = 0; j < S; ++j) out.explicit_mask.data.push_back(j - i <= S - T && j - i > S - T - window);
    }
    return out;
  }

 private:
  struct Step {
    int start, T;
    std::vector<bool> served;
  };
  const LayerPolicy& policy(int layer) const { return cfg_.layers.size() == 1 ? cfg_.layers[0] : cfg_.layers[layer]; }
  int slot(int layer, int pos) const { return pos % slots_[layer]; }   // flat: slots = capacity > pos
  void check_layer(int layer) const {
    if (layer < 0 || layer >= cfg_.n_layers) throw std::out_of_range("OP-ARGS: layer out of range");
  }

  CacheConfig cfg_;
  int max_write_ = 0;   // 0: no ring, no bound
  std::vector<Pool> kpool_, vpool_;
  std::vector<int> slots_;
  int length_ = 0;
  std::optional<Step> step_;
};

}  // namespace mlxs
