// A faithful C++ port of the cell layout as this spec defines it (kvcache.CellCache), shaped like
// upstream's PR #21902: per cell a position (-1 = free) and a 64-bit owner set, per sequence id its
// cell count and newest position, the live ids as a bitset, one placement per forward and one memoized
// step per window. Every caller error is rejected with an exception naming the rule (the driver
// answers "rejected"); refusals are false / nullopt exactly where the spec says so.
//
// Two deliberate points where a port must choose:
// - positions are int and next_pos() returns an int, as upstream's do: CELL-POS makes INT_MAX - 1 the
//   largest position, so one past the newest always fits (upstream's unchecked newest + 1 overflows at
//   a position INT_MAX); newest positions are kept as int64_t all the same, so no sum here can wrap;
// - the table holds `capacity` cells up front, as upstream's does.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "cache.h"

namespace demo {

constexpr int kMaxSeqs = 64;

class CellCache : public CacheBase, public BatchControl, public CellStepper {
 public:
  explicit CellCache(const CacheConfig& cfg, int max_seqs = kMaxSeqs) : max_seqs_(max_seqs) {
    check_config(cfg);
    if (max_seqs < 1 || max_seqs > kMaxSeqs) throw std::invalid_argument("CELL-MAX-SEQS");
    capacity_ = cfg.capacity;
    n_layers_ = cfg.n_layers;
    for (int i = 0; i < cfg.n_layers; ++i) {
      const LayerConfig& l = cfg.layers.size() == 1 ? cfg.layers[0] : cfg.layers[i];
      int window = l.policy.kind == Kind::Ring ? l.policy.window : 0;  // 0: flat
      int group = 0;
      while (group < static_cast<int>(windows_.size()) && windows_[group] != window) ++group;
      if (group == static_cast<int>(windows_.size())) windows_.push_back(window);
      layer_group_.push_back(group);
    }
    pos_.assign(capacity_, -1);
    owners_.assign(capacity_, 0);
    memo_.resize(windows_.size());
    clear();
  }

  BatchControl* as_batch_control() override { return this; }
  CellStepper* as_cell_stepper() override { return this; }

  // --- CacheControl --------------------------------------------------------------------------------
  bool can_extend(int n = 1) const override {
    if (n < 0) throw std::invalid_argument("ARG-RANGE: n");
    return n <= free_cells();
  }
  int capacity() const override { return capacity_; }
  void clear() override {
    std::fill(pos_.begin(), pos_.end(), -1);
    std::fill(owners_.begin(), owners_.end(), 0);
    count_.assign(kMaxSeqs, 0);
    newest_.assign(kMaxSeqs, -1);
    live_ = 0;
    used_end_ = occupied_ = 0;
    close_forward();
  }

  // --- BatchControl ----------------------------------------------------------------------------------
  bool declare_step(const std::vector<int32_t>& seq_ids) override {
    for (int32_t s : seq_ids) check_id(s);
    if (seq_ids.empty()) throw std::invalid_argument("CELL-DECLARE: seq_ids is empty");
    check_no_forward();
    for (int32_t s : seq_ids) check_live(s);
    if (static_cast<long long>(seq_ids.size()) > free_cells()) return false;
    close_forward();
    declared_ = seq_ids;
    open_ = true;
    return true;
  }

  std::optional<int32_t> seq_new() override {
    check_no_forward();
    if (all_live()) return std::nullopt;
    int32_t s = lowest_not_live();
    live_ |= bit(s);
    return s;
  }

  std::optional<int32_t> seq_clone(int32_t src, std::optional<int> upto) override {
    check_id(src);
    if (upto && *upto < 0) throw std::invalid_argument("ARG-RANGE: upto");
    check_no_forward();
    check_live(src);
    if (all_live()) return std::nullopt;
    int32_t fork = lowest_not_live();
    share(src, fork, upto);
    live_ |= bit(fork);
    return fork;
  }

  bool seq_rm(int32_t seq_id, int p0, std::optional<int> p1) override {
    check_id(seq_id);
    if (p0 < 0) throw std::invalid_argument("ARG-RANGE: p0");
    if (p1 && *p1 < 0) throw std::invalid_argument("ARG-RANGE: p1");
    if (p1 && *p1 < p0) throw std::invalid_argument("CELL-RM: p1 < p0");
    check_no_forward();
    check_live(seq_id);
    remove(seq_id, p0, p1);
    return true;
  }

  int seq_len(int32_t seq_id) const override {
    check_id(seq_id);
    check_live(seq_id);
    return count_[seq_id];
  }

  int next_pos(int32_t seq_id) const override {
    check_id(seq_id);
    check_live(seq_id);
    return static_cast<int>(newest_[seq_id] + 1);  // newest <= INT_MAX - 1 (CELL-POS): fits an int
  }

  int free_cells() const { return capacity_ - occupied_; }
  int used_end() const { return used_end_; }
  bool live(int32_t s) const { return s >= 0 && s < max_seqs_ && (live_ >> s & 1); }

  // --- CellStepper -----------------------------------------------------------------------------------
  const CellStep* place_step(int layer, const int32_t* positions, int length) override {
    if (layer < 0 || layer >= n_layers_) throw std::out_of_range("LAYER-RANGE");
    if (length < 0 || (length > 0 && positions == nullptr)) throw std::invalid_argument("CELL-POS: positions");
    for (int i = 0; i < length; ++i)
      if (positions[i] < 0 || positions[i] > INT_MAX - 1)
        throw std::invalid_argument("CELL-POS: a position outside [0, INT_MAX - 1]");
    if (!open_) throw std::invalid_argument("CELL-FORWARD: no step is declared");
    if (served_[layer]) throw std::invalid_argument("CELL-FORWARD: layer already served");
    if (length != static_cast<int>(declared_.size())) throw std::invalid_argument("CELL-POS: length");
    if (placed_) {
      for (int i = 0; i < length; ++i)
        if (positions[i] != positions_[i]) throw std::invalid_argument("CELL-FORWARD: other positions");
    } else {
      check_newer(positions);
      place(positions);
    }
    int group = layer_group_[layer];
    if (!memo_[group].valid) build(group);
    served_[layer] = true;
    if (++n_served_ == n_layers_) {  // the forward closes; the steps stay valid until the next verb
      open_ = false;
      std::fill(served_.begin(), served_.end(), false);
      n_served_ = 0;
    }
    return &memo_[group].step;
  }

 protected:
  struct Memo {
    bool valid = false;
    std::vector<uint8_t> mask;
    CellStep step{};
  };

  static uint64_t bit(int32_t s) { return uint64_t{1} << s; }
  bool all_live() const { return live_ == (max_seqs_ == 64 ? ~uint64_t{0} : (bit(max_seqs_) - 1)); }
  int32_t lowest_not_live() const {
    int32_t s = 0;
    while (live_ >> s & 1) ++s;
    return s;
  }
  void check_id(int32_t s) const {
    if (s < 0 || s >= max_seqs_) throw std::invalid_argument("CELL-SEQ-ID");
  }
  void check_live(int32_t s) const {
    if (!(live_ >> s & 1)) throw std::invalid_argument("CELL-SEQ-LIVE");
  }
  void check_no_forward() const {
    if (open_) throw std::invalid_argument("CELL-FORWARD: a verb while a forward is open");
  }
  void check_newer(const int32_t* positions) const {
    std::vector<int64_t> newest = newest_;
    for (size_t i = 0; i < declared_.size(); ++i) {
      int32_t s = declared_[i];
      if (positions[i] <= newest[s]) throw std::invalid_argument("CELL-POS: not newer");
      newest[s] = positions[i];
    }
  }

  // CELL-FORK: the fork co-owns src's cells below upto; nothing is copied.
  void share(int32_t src, int32_t fork, std::optional<int> upto) {
    count_[fork] = 0;
    newest_[fork] = -1;
    for (int j = 0; j < used_end_; ++j)
      if ((owners_[j] & bit(src)) && (!upto || pos_[j] < *upto)) {
        owners_[j] |= bit(fork);
        ++count_[fork];
        if (pos_[j] > newest_[fork]) newest_[fork] = pos_[j];
      }
  }

  // CELL-RM: drop the ownership of [p0, p1); unowned cells become free; trim the extent; retire the id.
  void remove(int32_t s, int p0, std::optional<int> p1) {
    int64_t kept = -1;
    for (int j = 0; j < used_end_; ++j) {
      if (!(owners_[j] & bit(s))) continue;
      if (pos_[j] >= p0 && (!p1 || pos_[j] < *p1)) {
        owners_[j] &= ~bit(s);
        --count_[s];
        if (!owners_[j]) {
          pos_[j] = -1;
          --occupied_;
        }
      } else if (pos_[j] > kept) {
        kept = pos_[j];
      }
    }
    newest_[s] = kept;
    while (used_end_ > 0 && pos_[used_end_ - 1] < 0) --used_end_;
    if (count_[s] == 0) live_ &= ~bit(s);
    invalidate();
  }

  // CELL-PLACE, CELL-LAYOUT-CANON: each token takes the lowest free cell, in token order.
  void place(const int32_t* positions) {
    positions_.assign(positions, positions + declared_.size());
    cells_.clear();
    int j = 0;
    for (size_t i = 0; i < declared_.size(); ++i) {
      while (pos_[j] >= 0) ++j;  // admission guaranteed a free cell
      int32_t s = declared_[i];
      pos_[j] = positions[i];
      owners_[j] = bit(s);
      ++count_[s];
      newest_[s] = positions[i];
      ++occupied_;
      if (j + 1 > used_end_) used_end_ = j + 1;
      cells_.push_back(j);
    }
    placed_ = true;
  }

  // CELL-MASK for one window group: token i attends cell j iff j is its sequence's, at a position in
  // [q - window + 1, q] (window 0: [0, q]).
  void build(int group) {
    Memo& m = memo_[group];
    int length = static_cast<int>(declared_.size());
    int window = windows_[group];
    m.mask.assign(static_cast<size_t>(length) * used_end_, 0);
    for (int i = 0; i < length; ++i) {
      int64_t q = positions_[i];
      int64_t low = window == 0 ? 0 : q - window + 1;
      for (int j = 0; j < used_end_; ++j)
        if ((owners_[j] & bit(declared_[i])) && pos_[j] <= q && pos_[j] >= low)
          m.mask[static_cast<size_t>(i) * used_end_ + j] = 1;
    }
    m.step = CellStep{length, used_end_, cells_.data(), m.mask.data()};
    m.valid = true;
  }

  void invalidate() {
    for (Memo& m : memo_) m.valid = false;
  }

  void close_forward() {
    open_ = placed_ = false;
    declared_.clear();
    served_.assign(n_layers_, false);
    n_served_ = 0;
    invalidate();
  }

  int capacity_ = 0;
  int n_layers_ = 0;
  int max_seqs_;
  std::vector<int> windows_;      // per window group: 0 (flat) or the ring's window
  std::vector<int> layer_group_;  // layer -> window group
  std::vector<int64_t> pos_;      // per cell: position, -1 = free
  std::vector<uint64_t> owners_;  // per cell: owner set
  std::vector<int> count_;        // per id: cells owned
  std::vector<int64_t> newest_;   // per id: newest position, -1 = none
  uint64_t live_ = 0;
  int used_end_ = 0;
  int occupied_ = 0;
  bool open_ = false;  // a forward is declared and not every layer is served
  bool placed_ = false;
  std::vector<int32_t> declared_, positions_, cells_;
  std::vector<bool> served_;
  int n_served_ = 0;
  std::vector<Memo> memo_;
};

}  // namespace demo
