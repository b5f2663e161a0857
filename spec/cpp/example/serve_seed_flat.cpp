// cmd: target for the seed-shaped flat-only cache (no max_write, no length()):
//   kvcache conformance --target cmd:./serve_seed_flat --strict      (passes inside its flat-only scope)
#include "../kvcache_conformance.hpp"
#include "seed_flat.h"

int main(int argc, char** argv) {
  return kvcache_conformance::run_main<seed::FlatCache, seed::CacheConfig>(argc, argv, "seed flat-only cache",
                                                                          kvcache_conformance::Scope::flat_only());
}
