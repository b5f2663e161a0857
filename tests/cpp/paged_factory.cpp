// A paged cache the driver cannot build from a paged::Config and that shows no reference counts: built by the
// factory given to paged::run_main, announced with no optional method, `ref_counts` answered `unsupported`
// (tests/test_cpp_paged.py).
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "example/paged_cache.h"

namespace paged = kvcache_conformance::paged;

class WithoutCounts {
 public:
  explicit WithoutCounts(std::unique_ptr<example::PagedCache> cache) : cache_(std::move(cache)) {}
  std::optional<int> admit(const std::string& request, const paged::Tokens& tokens, const std::vector<std::string>& keys,
                           int budget) {
    return cache_->admit(request, tokens, keys, budget);
  }
  std::optional<int> extend(const std::string& request, const paged::Tokens& tokens, int budget) {
    return cache_->extend(request, tokens, budget);
  }
  void free(const std::string& request) { cache_->free(request); }
  std::vector<paged::Table> table(const std::string& request) { return cache_->table(request); }
  int available() const { return cache_->available(); }

 private:
  std::unique_ptr<example::PagedCache> cache_;
};

int main(int argc, char** argv) {
  return paged::run_main<WithoutCounts>(argc, argv, "paged cache without counts", [](const paged::Config& config) {
    return std::make_unique<WithoutCounts>(std::make_unique<example::PagedCache>(config));
  });
}
