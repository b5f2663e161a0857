// cmd: target for the faithful port:  kvcache conformance --target cmd:./serve_reference_port
#include "../kvcache_conformance.hpp"
#include "reference_port.h"

int main(int argc, char** argv) {
  return kvcache_conformance::run_main<demo::ReferencePort, demo::CacheConfig>(argc, argv, "demo reference port");
}
