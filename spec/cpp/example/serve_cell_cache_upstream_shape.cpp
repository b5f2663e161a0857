// cmd: target for a cell cache of upstream's shape (config-only constructor, private live set, 64 ids):
//   kvcache conformance --target cmd:./serve_cell_cache_upstream_shape
// The factory receives each config's max_seqs and builds the cache from the config alone; the scope
// declares the one max_seqs it serves, so the suite drives only those configurations and checks that
// the others are refused (SCOPE-BORDER) - the driver refuses them before the factory is called.
#include <memory>
#include <stdexcept>

#include "../kvcache_conformance.hpp"
#include "cell_cache_upstream_shape.h"

int main(int argc, char** argv) {
  using Cache = demo::CellCacheUpstreamShape;
  return kvcache_conformance::run_main<Cache, demo::CacheConfig>(
      argc, argv, "demo cell cache, upstream's shape",
      kvcache_conformance::Scope::full().fixed_max_seqs(Cache::kMaxSeqs),
      [](const demo::CacheConfig& config, int max_seqs) {
        if (max_seqs != Cache::kMaxSeqs) throw std::invalid_argument("CELL-MAX-SEQS: this cache has 64 ids");
        return std::make_unique<Cache>(config);
      });
}
