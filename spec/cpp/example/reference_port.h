// A faithful C++ port of the Python reference (kvcache.SequenceCache): closed-form retained marks,
// every caller error rejected with an exception (the driver answers "rejected").
#pragma once

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "cache.h"

namespace demo {

class ReferencePort : public CacheBase, public SequenceControl, public SequencePlanner {
 public:
  explicit ReferencePort(const CacheConfig& cfg) : capacity_(cfg.capacity) {
    check_config(cfg);
    n_layers_ = cfg.n_layers;
    for (int i = 0; i < cfg.n_layers; ++i) {
      const LayerConfig& l = cfg.layers.size() == 1 ? cfg.layers[0] : cfg.layers[i];
      Policy p{0, 0};
      if (l.policy.kind == Kind::Ring) {
        int m = cfg.max_write ? *cfg.max_write : l.policy.window;
        p = {l.policy.window, l.policy.window + m - 1};
        limit_ = limit_ == 0 ? m : std::min(limit_, m);
      }
      auto it = std::find(policies_.begin(), policies_.end(), p);
      if (it == policies_.end()) {
        policies_.push_back(p);
        it = policies_.end() - 1;
      }
      layer_policy_.push_back(static_cast<int>(it - policies_.begin()));
    }
    retained_.assign(policies_.size(), 0);
  }

  SequenceControl* as_control() override { return this; }
  SequencePlanner* as_planner() override { return this; }

  bool can_extend(int n = 1) const override {
    if (n < 0) throw std::invalid_argument("ARG-RANGE: n");
    return static_cast<long long>(length_) + n <= capacity_;
  }
  int capacity() const override { return capacity_; }
  int length() const override { return length_; }

  bool rewind(int new_len) override {
    if (new_len < 0) throw std::invalid_argument("ARG-RANGE: new_len");
    if (new_len > length_) return false;
    for (size_t k = 0; k < policies_.size(); ++k)
      if (policies_[k].read_base(new_len) < std::min(retained_[k], new_len)) return false;
    length_ = new_len;
    open_ = false;
    for (int& r : retained_) r = std::min(r, new_len);
    return true;
  }

  void clear() override {
    length_ = 0;
    open_ = false;
    std::fill(retained_.begin(), retained_.end(), 0);
  }

  std::optional<SeqStepPlan> plan(int layer, int position, int T) const override {
    check_layer(layer);
    if (position < 0) throw std::invalid_argument("ARG-RANGE: position");
    if (T < 1) throw std::invalid_argument("STEP-T");
    if (limit_ && T > limit_) throw std::invalid_argument("STEP-T-MAX");
    if (!step_allowed(position, T)) throw std::invalid_argument("STEP-APPEND");
    if (static_cast<long long>(position) + T > capacity_) return std::nullopt;
    return policies_[layer_policy_[layer]].plan(position, T);
  }

  void commit(const SeqStepPlan& p) override {
    if (p.n_write < 1 || p.n_write > 2 || p.n_read < 1 || p.n_read > 2) throw std::invalid_argument("PLAN-SHAPE");
    long long T = 0, read = 0;
    for (int k = 0; k < p.n_write; ++k) T += p.write[k].len;
    for (int k = 0; k < p.n_read; ++k) read += p.read[k].len;
    long long end = p.read_base_pos + read, position = end - T;
    if (T < 1 || position < 0 || end > capacity_ || (limit_ && T > limit_) ||
        !step_allowed(static_cast<int>(position), static_cast<int>(T)))
      throw std::invalid_argument("COMMIT-ISSUED");
    bool issued = false;
    for (const Policy& policy : policies_)
      issued |= same_plan(policy.plan(static_cast<int>(position), static_cast<int>(T)), p);
    if (!issued) throw std::invalid_argument("COMMIT-ISSUED");
    if (end > length_) {
      length_ = static_cast<int>(end);
      open_ = true;
      open_position_ = static_cast<int>(position);
      open_T_ = static_cast<int>(T);
      for (size_t k = 0; k < policies_.size(); ++k)
        if (policies_[k].window) retained_[k] = std::max(retained_[k], length_ - policies_[k].slots);
    }
  }

  int depth(int layer) const {
    check_layer(layer);
    const Policy& p = policies_[layer_policy_[layer]];
    return p.window == 0 ? capacity_ : std::min(capacity_, p.slots);
  }
  int retained_from(int layer) const {
    check_layer(layer);
    return retained_[layer_policy_[layer]];
  }

 private:
  int capacity_;
  int n_layers_ = 0;
  int length_ = 0;
  int limit_ = 0;  // 0: no ring layer
  bool open_ = false;
  int open_position_ = 0, open_T_ = 0;
  std::vector<Policy> policies_;
  std::vector<int> layer_policy_;
  std::vector<int> retained_;

  void check_layer(int layer) const {
    if (layer < 0 || layer >= n_layers_) throw std::out_of_range("LAYER-RANGE");
  }
  bool step_allowed(int position, int T) const {
    return position == length_ || (open_ && open_position_ == position && open_T_ == T);
  }
};

}  // namespace demo
