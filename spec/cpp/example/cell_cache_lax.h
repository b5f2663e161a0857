// Upstream's lax cell cache (PR #21902 as restated in reference/upstream-cell-cache.md), for the
// conformance suite to report lenient: the same table and placement as the faithful port (it derives
// from it), with upstream's answers where this spec raises:
// - ids out of 0..max_seqs-1 answer false / 0 / nullopt; seq_rm of an id that is not live answers
//   true; seq_len / next_pos of an id that is not live answer 0; seq_clone of a src owning no cell
//   answers nullopt; declare_step refuses (false) an empty list or an id that is not live;
// - nothing is refused mid-forward: seq_new, seq_clone, seq_rm and declare_step between the layers of
//   one forward silently invalidate the placement and the memoized steps, so the next layer places the
//   tokens again (or, with their positions now taken, gets null) - cells that hold K/V on some layers only;
// - place_step answers null instead of raising (layer out of range or served, nothing declared, other
//   length, a negative position, positions not newer); can_extend(n < 0) answers true.
#pragma once

#include "cell_cache.h"

namespace demo {

class CellCacheLax : public CellCache {
 public:
  using CellCache::CellCache;

  bool can_extend(int n = 1) const override { return n <= free_cells(); }

  bool declare_step(const std::vector<int32_t>& seq_ids) override {
    if (seq_ids.empty() || static_cast<long long>(seq_ids.size()) > free_cells()) return false;
    for (int32_t s : seq_ids)
      if (!live(s)) return false;
    close_forward();  // mid-forward: the old declaration is silently dropped
    declared_ = seq_ids;
    open_ = true;
    return true;
  }

  std::optional<int32_t> seq_new() override {
    if (all_live()) return std::nullopt;
    int32_t s = lowest_not_live();
    live_ |= bit(s);
    invalidate_placement();
    return s;
  }

  std::optional<int32_t> seq_clone(int32_t src, std::optional<int> upto) override {
    if (!live(src) || count_[src] == 0 || all_live()) return std::nullopt;
    int32_t fork = lowest_not_live();
    share(src, fork, upto);
    live_ |= bit(fork);
    invalidate_placement();
    return fork;
  }

  bool seq_rm(int32_t seq_id, int p0, std::optional<int> p1) override {
    if (seq_id < 0 || seq_id >= max_seqs_) return false;
    if (!live(seq_id)) return true;
    remove(seq_id, p0, p1);
    invalidate_placement();
    return true;
  }

  int seq_len(int32_t seq_id) const override { return live(seq_id) ? count_[seq_id] : 0; }
  int next_pos(int32_t seq_id) const override {
    return live(seq_id) ? static_cast<int>(newest_[seq_id] + 1) : 0;
  }

  const CellStep* place_step(int layer, const int32_t* positions, int length) override {
    try {
      return CellCache::place_step(layer, positions, length);
    } catch (const std::exception&) {  // the faithful checks run first, so nothing changed
      return nullptr;
    }
  }

 private:
  // Upstream: seq_new / seq_clone / seq_rm invalidate the memoized steps and the placement; a forward
  // in progress is not closed, so its next layer places the declared tokens again.
  void invalidate_placement() {
    placed_ = false;
    std::fill(served_.begin(), served_.end(), false);
    n_served_ = 0;
    invalidate();
  }
};

}  // namespace demo
