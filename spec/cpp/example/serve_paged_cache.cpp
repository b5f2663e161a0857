// A paged target in C++: example::PagedCache (paged_cache.h) judged through the shipped header's paged driver
// (spec/PROTOCOL.md, "The C++ paged driver"):
//
//     g++ -std=c++17 -O1 -I "$(kvcache cpp --include)" -o serve_paged_cache serve_paged_cache.cpp
//     kvcache conformance --target cmd:./serve_paged_cache --strict
//
// Build with -DKVCACHE_EXAMPLE_STALE_HIT (a stale hit after reuse) or -DKVCACHE_EXAMPLE_WINDOW_RELEASED_EARLY (a window
// block released one query early) for a broken variant the suite must find.

#include "paged_cache.h"

int main(int argc, char** argv) {
  return kvcache_conformance::paged::run_main<example::PagedCache>(argc, argv, "example paged cache");
}
