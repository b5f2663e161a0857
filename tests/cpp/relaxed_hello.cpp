// A C++ op cache declaring relaxations through the op driver (tests/test_cpp_op_target.py): its hello announces
// them after the features, and a lazy-shapes cache is handed a config without sizes (they read as 0) instead of
// the driver refusing it. The cache only records what its factory was given; it has no used(layer) (no length of
// its own), so the driver announces `no-length` and answers `used` unsupported.
#include "kvcache_conformance.hpp"

namespace op = kvcache_conformance::op;

struct Recorder {
  op::Config given;
  void reset() {}
};

int main(int argc, char** argv) {
  return op::run_main<Recorder>(
      argc, argv, "relaxed hello",
      op::Scope::full(2).without("batch").with("trusted-args").with("lazy-shapes").with("lossy=0.25"),
      [](const op::Config& c) {
        if (c.n_kv_heads != 0 || c.head_dim != 0) throw std::invalid_argument("OP-CONFIG: sizes were sent");
        return std::make_unique<Recorder>(Recorder{c});
      },
      [](Recorder&, int, const op::Tensor&, const op::Tensor&, const op::Tensor&) -> op::Fetched {
        throw std::runtime_error("not served");
      });
}
