// cmd: target for a cell cache of upstream's shape (config-only constructor, private live set, a public
// `static constexpr int kMaxSeqs = 64`):
//   kvcache conformance --target cmd:./serve_cell_cache_upstream_shape
// One line: with no factory and no max_seqs in the scope, the driver reads the class's kMaxSeqs as the one
// max_seqs it serves (the hello says "max_seqs=64"), so the suite drives only those configurations and
// checks that the others are refused (SCOPE-BORDER) - the driver refuses them before the cache is built.
// The same with a factory: Scope::full().fixed_max_seqs(64) and [](const CacheConfig& c, int) {...}.
#include "../kvcache_conformance.hpp"
#include "cell_cache_upstream_shape.h"

int main(int argc, char** argv) {
  return kvcache_conformance::run_main<demo::CellCacheUpstreamShape, demo::CacheConfig>(
      argc, argv, "demo cell cache, upstream's shape");
}
