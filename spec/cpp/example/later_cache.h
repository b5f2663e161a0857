// Shaped like a later upstream version: CacheConfig gains fields the driver does not know (kv_dtype)
// and a valid(cfg) check, the runner face gains length(), and depth() / retained_from() are still
// absent (upstream removed depth in review). The layout is the reference port's (flat + ring).
#pragma once

#include <optional>
#include <stdexcept>
#include <vector>

#include "reference_port.h"

namespace later {

enum class DType : int { Float32 = 0, BFloat16 = 1 };

struct CacheConfig {
  int capacity;
  int n_layers;
  std::vector<demo::LayerConfig> layers;
  int initial_capacity = 512;
  std::optional<int> max_write;
  DType kv_dtype = DType::BFloat16;  // unknown to the driver: left as value-initialized
};

// Upstream's later check: capacity > 0, n_layers > 0, initial_capacity >= 0, layers size 1 or n_layers.
inline bool valid(const CacheConfig& c) {
  return c.capacity > 0 && c.n_layers > 0 && c.initial_capacity >= 0 &&
         (c.layers.size() == 1 || c.layers.size() == static_cast<size_t>(c.n_layers));
}

// Private inheritance keeps depth() and retained_from() out of the public API: the driver detects
// them as absent.
class Cache : private demo::ReferencePort {
 public:
  explicit Cache(const CacheConfig& c) : demo::ReferencePort(checked(c)), dtype_(c.kv_dtype) {}

  using demo::ReferencePort::as_control;
  using demo::ReferencePort::as_planner;
  using demo::ReferencePort::can_extend;
  using demo::ReferencePort::capacity;
  using demo::ReferencePort::clear;
  using demo::ReferencePort::commit;
  using demo::ReferencePort::length;
  using demo::ReferencePort::plan;
  using demo::ReferencePort::rewind;

  DType kv_dtype() const { return dtype_; }

 private:
  DType dtype_;

  static demo::CacheConfig checked(const CacheConfig& c) {
    if (!valid(c)) throw std::invalid_argument("CFG-LAYERS: valid(cfg) is false");
    return demo::CacheConfig{c.capacity, c.n_layers, c.layers, c.initial_capacity, c.max_write, std::nullopt};
  }
};

}  // namespace later
