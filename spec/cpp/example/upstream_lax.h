// Upstream-faithful (ExecuTorch PR #21412 + #21447 as described in reference/upstream-api.md): plan
// checks only the layer, the capacity and max_write; commit trusts the plan; the rewind floor is
// max(0, L - window) per ring; no depth() and no retained_from(). The suite should find it lax.
#pragma once

#include <algorithm>

#include "cache.h"

namespace demo {

class UpstreamLax : public CacheBase, public SequenceControl, public SequencePlanner {
 public:
  explicit UpstreamLax(const CacheConfig& cfg) : capacity_(cfg.capacity), n_layers_(cfg.n_layers) {
    for (int i = 0; i < cfg.n_layers; ++i) {
      const LayerConfig& l = cfg.layers.size() == 1 ? cfg.layers[0] : cfg.layers[i];  // unchecked upstream
      Policy p{0, 0};
      int m = 0;
      if (l.policy.kind == Kind::Ring) {
        m = cfg.max_write ? *cfg.max_write : l.policy.window;
        p = {l.policy.window, l.policy.window + m - 1};
      }
      auto it = std::find(policies_.begin(), policies_.end(), p);
      if (it == policies_.end()) {
        policies_.push_back(p);
        max_writes_.push_back(m);
        it = policies_.end() - 1;
      }
      layer_policy_.push_back(static_cast<int>(it - policies_.begin()));
    }
  }

  SequenceControl* as_control() override { return this; }
  SequencePlanner* as_planner() override { return this; }

  bool can_extend(int n = 1) const override { return length_ + n <= capacity_; }
  int capacity() const override { return capacity_; }
  int length() const override { return length_; }

  bool rewind(int new_len) override {
    if (new_len > length_) return false;
    int floor = 0;
    for (const Policy& p : policies_)
      if (p.window) floor = std::max(floor, std::max(0, length_ - p.window));  // retained_from(length)
    if (new_len < floor) return false;
    length_ = new_len;
    return true;
  }

  void clear() override { length_ = 0; }

  std::optional<SeqStepPlan> plan(int layer, int position, int T) const override {
    if (layer < 0 || layer >= n_layers_) return std::nullopt;
    if (position + T > capacity_) return std::nullopt;
    int index = layer_policy_[layer];
    if (policies_[index].window && T > max_writes_[index]) return std::nullopt;
    return policies_[index].plan(position, T);
  }

  void commit(const SeqStepPlan& p) override {
    int read = 0;
    for (int k = 0; k < p.n_read && k < 2; ++k) read += p.read[k].len;
    length_ = std::max(length_, p.read_base_pos + read);
  }

 private:
  int capacity_;
  int n_layers_;
  int length_ = 0;
  std::vector<Policy> policies_;
  std::vector<int> max_writes_;
  std::vector<int> layer_policy_;
};

}  // namespace demo
