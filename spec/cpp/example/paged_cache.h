// paged_cache.h - a small paged KV cache in C++, served by the header's paged driver (serve_paged_cache.cpp).
//
// A serving engine's bookkeeping in miniature (vLLM's block pool is the model): one pool of blocks shared by every
// KV group; per request and group a block table; prefix caching by chains of full blocks, each keyed exactly on the
// request's keys and every token up to the block's end (a string key, so two different prefixes never share one);
// reference counts; an LRU free queue holding free and cached-but-unreferenced blocks (a freed request's blocks
// join its back, tail block first, and a new block is taken from its front, which evicts whatever the taken block
// cached); full groups, and window groups that hand back the blocks every future query has left behind.
//
// Build with -DKVCACHE_EXAMPLE_STALE_HIT for a broken variant the suite must find: taking a cached block from the
// free queue forgets to drop its key, so a later request with the old prefix "hits" a block that now holds another
// request's K/V (a stale hit after reuse). -DKVCACHE_EXAMPLE_WINDOW_RELEASED_EARLY is another: a window group hands
// back a block one query too soon, while the next token still reads its last position.
#pragma once

#include <algorithm>
#include <list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache_conformance.hpp"

namespace example {

namespace paged = kvcache_conformance::paged;

class PagedCache {
 public:
  explicit PagedCache(const paged::Config& c) : c_(c) {
    if (c.block_size < 1 || c.num_blocks < 1 || c.max_model_len < 1)
      throw std::invalid_argument("PAGED-CONFIG: block_size, num_blocks and max_model_len are ints >= 1");
    if (c.groups.empty()) throw std::invalid_argument("PAGED-CONFIG: groups is a non-empty list");
    for (const paged::Group& g : c.groups)
      if (!((g.kind == "full" && !g.window) || (g.kind == "window" && g.window && *g.window >= 1)))
        throw std::invalid_argument("PAGED-CONFIG: a group is {kind: full} or {kind: window, window: int >= 1}");
    blocks_.resize(static_cast<size_t>(c.num_blocks));
    for (int id = 0; id < c.num_blocks; ++id) blocks_[id].in_queue = free_queue_.insert(free_queue_.end(), id);
    cached_.resize(c.groups.size());
  }

  std::optional<int> admit(const std::string& request, const paged::Tokens& tokens, const std::vector<std::string>& keys,
                           int budget) {
    if (live_.count(request)) throw std::invalid_argument("PAGED-ARGS: admit: request '" + request + "' is already live");
    if (tokens.empty()) throw std::invalid_argument("PAGED-ARGS: admit: tokens is empty");
    check(tokens, budget, tokens.size(), "admit");
    Request r{tokens, keys, 0, std::vector<paged::Table>(c_.groups.size())};
    const std::vector<std::string> chain = chain_keys(r, 0, (static_cast<int>(tokens.size()) - 1) / c_.block_size);
    const int hit_blocks = hit(chain);
    const int h = hit_blocks * c_.block_size;
    const int end = h + std::min(static_cast<int>(tokens.size()) - h, budget);
    // Fit first, change after: a refusal leaves everything as it was.
    int taken = 0;   // hit blocks that leave the free queue, plus new blocks
    for (size_t g = 0; g < c_.groups.size(); ++g) {
      for (int j = first_needed(g, h); j < hit_blocks; ++j) taken += blocks_[cached_[g].at(chain[j])].refs == 0;
      taken += blocks_for(end) - hit_blocks;
    }
    if (taken > available()) return std::nullopt;
    for (size_t g = 0; g < c_.groups.size(); ++g) {
      r.tables[g].assign(static_cast<size_t>(hit_blocks), std::nullopt);
      for (int j = first_needed(g, h); j < hit_blocks; ++j) r.tables[g][j] = acquire(cached_[g].at(chain[j]));
    }
    r.computed = h;
    reserve(r, end);
    live_.emplace(request, std::move(r));
    return h;
  }

  std::optional<int> extend(const std::string& request, const paged::Tokens& tokens, int budget) {
    Request& r = held(request, "extend");
    check(tokens, budget, r.tokens.size() + tokens.size(), "extend");
    const int total = static_cast<int>(r.tokens.size() + tokens.size());
    if (total == r.computed) throw std::invalid_argument("PAGED-ARGS: extend: request '" + request + "' has nothing to compute");
    const int end = r.computed + std::min(total - r.computed, budget);
    // The blocks every query from `computed` on has left behind go back first; count them before changing anything.
    std::vector<int> behind;
    for (size_t g = 0; g < c_.groups.size(); ++g)
      for (int j = 0; j < left_behind(g, r) && j < static_cast<int>(r.tables[g].size()); ++j)
        if (r.tables[g][j]) behind.push_back(*r.tables[g][j]);
    int freed = 0;
    for (int id : behind) freed += blocks_[id].refs == 1;
    int wanted = 0;
    for (size_t g = 0; g < c_.groups.size(); ++g) wanted += blocks_for(end) - static_cast<int>(r.tables[g].size());
    if (wanted > available() + freed) return std::nullopt;
    for (size_t g = 0; g < c_.groups.size(); ++g)
      for (int j = 0; j < left_behind(g, r) && j < static_cast<int>(r.tables[g].size()); ++j)
        if (r.tables[g][j]) release(*r.tables[g][j]), r.tables[g][j].reset();
    r.tokens.insert(r.tokens.end(), tokens.begin(), tokens.end());
    const int n = end - r.computed;
    reserve(r, end);
    return n;
  }

  void free(const std::string& request) {
    Request& r = held(request, "free", "PAGED-FREE");
    for (paged::Table& table : r.tables)   // tail first: the end of a chain is the first evicted
      for (auto id = table.rbegin(); id != table.rend(); ++id)
        if (*id) release(**id);
    live_.erase(request);
  }

  std::vector<paged::Table> table(const std::string& request) { return held(request, "table").tables; }

  int available() const { return static_cast<int>(free_queue_.size()); }

  std::map<int, int> ref_counts() const {
    std::map<int, int> counts;
    for (int id = 0; id < c_.num_blocks; ++id)
      if (blocks_[id].refs > 0) counts[id] = blocks_[id].refs;
    return counts;
  }

 private:
  struct Block {
    int refs = 0;
    std::string key;   // the chain key it is cached under ("" when it caches nothing)
    size_t group = 0;  // the group whose map holds that key
    std::list<int>::iterator in_queue;   // valid while refs == 0
  };
  struct Request {
    paged::Tokens tokens;
    std::vector<std::string> keys;
    int computed = 0;                    // positions reserved so far (the harness computes each at once)
    std::vector<paged::Table> tables;    // per group
  };

  paged::Config c_;
  std::vector<Block> blocks_;
  std::list<int> free_queue_;   // LRU: taken from the front, released to the back
  std::vector<std::unordered_map<std::string, int>> cached_;   // per group: chain key -> block
  std::map<std::string, Request> live_;

  void check(const paged::Tokens& tokens, int budget, size_t total, const char* call) const {
    for (int t : tokens)
      if (t < 0) throw std::invalid_argument("PAGED-ARGS: " + std::string(call) + ": a token id is negative");
    if (budget < 1) throw std::invalid_argument("PAGED-ARGS: " + std::string(call) + ": budget is below 1");
    if (total > static_cast<size_t>(c_.max_model_len))
      throw std::invalid_argument("PAGED-ARGS: " + std::string(call) + ": more tokens than max_model_len");
  }

  Request& held(const std::string& request, const char* call, const char* rule = "PAGED-ARGS") {
    auto found = live_.find(request);
    if (found == live_.end())
      throw std::invalid_argument(std::string(rule) + ": " + call + ": request '" + request + "' is not live");
    return found->second;
  }

  int blocks_for(int positions) const { return (positions + c_.block_size - 1) / c_.block_size; }

  // The first block index a query at position `from` or later still reads in group g.
  int first_needed(size_t g, int from) const {
    const paged::Group& group = c_.groups[g];
    return group.kind == "full" ? 0 : std::max(0, from - *group.window + 1) / c_.block_size;
  }

  // The block indexes of group g below this one are behind every query the request still makes: released.
  int left_behind(size_t g, const Request& r) const {
#ifdef KVCACHE_EXAMPLE_WINDOW_RELEASED_EARLY
    return first_needed(g, r.computed + 1);   // measured from the query after next: the next one's oldest block goes
#else
    return first_needed(g, r.computed);
#endif
  }

  // The chain key of each of the request's blocks `from` .. `to` - 1 (chain[j - from]): its keys (length-prefixed)
  // and every token up to the block's end, so equal keys mean equal prefixes.
  std::vector<std::string> chain_keys(const Request& r, int from, int to) const {
    std::string key;
    for (const std::string& k : r.keys) key += std::to_string(k.size()) + ":" + k + ";";
    key += "|";
    std::vector<std::string> chain;
    for (int p = 0; p < to * c_.block_size; ++p) {
      key += std::to_string(r.tokens[p]) + ",";
      if ((p + 1) % c_.block_size == 0 && p / c_.block_size >= from) chain.push_back(key);
    }
    return chain;
  }

  // The longest hit, in blocks, that every group holds: a full group all blocks before it, a window group those the
  // first computed query still reads. One hit length for all groups.
  int hit(const std::vector<std::string>& chain) const {
    if (!c_.prefix_caching) return 0;
    for (int k = static_cast<int>(chain.size()); k > 0; --k) {
      bool held_everywhere = true;
      for (size_t g = 0; g < c_.groups.size() && held_everywhere; ++g)
        for (int j = first_needed(g, k * c_.block_size); j < k && held_everywhere; ++j)
          held_everywhere = cached_[g].count(chain[j]) > 0;
      if (held_everywhere) return k;
    }
    return 0;
  }

  int acquire(int id) {
    Block& b = blocks_[id];
    if (b.refs++ == 0) free_queue_.erase(b.in_queue);
    return id;
  }

  void release(int id) {
    Block& b = blocks_[id];
    if (--b.refs == 0) b.in_queue = free_queue_.insert(free_queue_.end(), id);
  }

  // A block from the front of the free queue; whatever it cached is evicted.
  int take() {
    const int id = free_queue_.front();
    Block& b = blocks_[id];
    if (!b.key.empty()) {
#ifndef KVCACHE_EXAMPLE_STALE_HIT
      cached_[b.group].erase(b.key);
#endif
      b.key.clear();
    }
    return acquire(id);
  }

  // Blocks for positions up to `end` in every group, then every block that became full is cached under its key.
  void reserve(Request& r, int end) {
    const int was_full = r.computed / c_.block_size;
    for (paged::Table& table : r.tables)
      while (static_cast<int>(table.size()) < blocks_for(end)) table.push_back(take());
    r.computed = end;
    if (!c_.prefix_caching) return;
    const std::vector<std::string> chain = chain_keys(r, was_full, end / c_.block_size);
    for (size_t g = 0; g < c_.groups.size(); ++g)
      for (int j = was_full; j < end / c_.block_size; ++j) {
        Block& b = blocks_[*r.tables[g][j]];
        const std::string& key = chain[j - was_full];
        if (b.key.empty() && cached_[g].emplace(key, *r.tables[g][j]).second) b.key = key, b.group = g;
      }
  }
};

}  // namespace example
