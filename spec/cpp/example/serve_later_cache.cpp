// cmd: target for a later-version cache (kv_dtype in the config, length(), no depth()):
//   kvcache conformance --target cmd:./serve_later_cache --strict
#include "../kvcache_conformance.hpp"
#include "later_cache.h"

int main(int argc, char** argv) {
  return kvcache_conformance::run_main<later::Cache, later::CacheConfig>(argc, argv, "later-version cache");
}
