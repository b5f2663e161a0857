// A stand-in with the shape of upstream's cell cache (PR #21902, as restated in
// reference/upstream-cell-cache.md) and this spec's behaviour: what the C++ driver must adapt unchanged.
// - the constructor takes the config only (`explicit CellCache(const CacheConfig&)`): there is no
//   max_seqs argument, the id count is the constant kMaxSeqs = 64;
// - the live set is not public (no live() the driver could call);
// - the faces are as_batch_control() / as_cell_stepper().
// Behaviour is the faithful port's (cell_cache.h), so a conformance run inside the declared scope
// max_seqs=64 must be CONFORMING: any finding would be the driver's adaptation, not the cache.
#pragma once

#include "cell_cache.h"

namespace demo {

class CellCacheUpstreamShape : public CellCache {
 public:
  static constexpr int kMaxSeqs = 64;
  explicit CellCacheUpstreamShape(const CacheConfig& cfg) : CellCache(cfg, kMaxSeqs) {}

 private:
  using CellCache::live;  // upstream keeps the live set to itself
};

}  // namespace demo
