// cmd: target for the faithful cell port:  kvcache conformance --target cmd:./serve_cell_cache
#include "../kvcache_conformance.hpp"
#include "cell_cache.h"

int main(int argc, char** argv) {
  return kvcache_conformance::run_main<demo::CellCache, demo::CacheConfig>(argc, argv, "demo cell cache");
}
