// cmd: target for the upstream-faithful, lax cache:  kvcache conformance --target cmd:./serve_upstream_lax
#include "../kvcache_conformance.hpp"
#include "upstream_lax.h"

int main(int argc, char** argv) {
  return kvcache_conformance::run_main<demo::UpstreamLax, demo::CacheConfig>(argc, argv, "demo upstream lax");
}
