// cmd: target for upstream's lax cell port:  kvcache conformance --target cmd:./serve_cell_cache_lax
#include "../kvcache_conformance.hpp"
#include "cell_cache_lax.h"

int main(int argc, char** argv) {
  return kvcache_conformance::run_main<demo::CellCacheLax, demo::CacheConfig>(argc, argv, "demo cell cache, upstream-lax");
}
