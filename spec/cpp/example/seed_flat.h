// Shaped like ExecuTorch's first sequence cache (PR #21412, the seed): the flat policy only, a
// CacheConfig WITHOUT max_write (the field arrived with the ring policy), and a runner face without
// length() (a later version adds it). Kind already names Ring - the shapes were general - but this
// cache implements flat layers only, so it declares the flat-only scope and refuses ring layers at
// construction (SCOPE-BORDER) instead of serving them as full history.
#pragma once

#include <optional>
#include <stdexcept>
#include <vector>

#include "cache.h"

namespace seed {

// The plan and layer shapes are upstream's from the start (the example's cache.h); what differs in
// the seed is the config and the runner face.
using demo::Kind;
using demo::LayerConfig;
using demo::LayerPolicy;
using demo::Run;
using demo::SeqStepPlan;
using demo::SequencePlanner;

struct CacheConfig {  // no max_write in the seed
  int capacity;
  int n_layers;
  std::vector<LayerConfig> layers;
  int initial_capacity = 512;
};

class SequenceControl {  // no length() in the seed
 public:
  virtual ~SequenceControl() = default;
  virtual bool can_extend(int n = 1) const = 0;
  virtual int capacity() const = 0;
  virtual bool rewind(int new_len) = 0;
  virtual void clear() = 0;
};

class CacheBase {
 public:
  virtual ~CacheBase() = default;
  virtual SequenceControl* as_control() = 0;
  virtual SequencePlanner* as_planner() = 0;
};

// The flat-only sequence cache, with the spec's checks (caller errors throw: the driver answers
// "rejected").
class FlatCache : public CacheBase, public SequenceControl, public SequencePlanner {
 public:
  explicit FlatCache(const CacheConfig& cfg) : FlatCache(cfg, true) {}

  SequenceControl* as_control() override { return this; }
  SequencePlanner* as_planner() override { return this; }

  bool can_extend(int n = 1) const override {
    if (n < 0) throw std::invalid_argument("ARG-RANGE: n");
    return static_cast<long long>(length_) + n <= capacity_;
  }
  int capacity() const override { return capacity_; }
  bool rewind(int new_len) override {  // flat keeps every row: any target up to the length is sound
    if (new_len < 0) throw std::invalid_argument("ARG-RANGE: new_len");
    if (new_len > length_) return false;
    length_ = new_len;
    open_ = false;
    return true;
  }
  void clear() override {
    length_ = 0;
    open_ = false;
  }

  std::optional<SeqStepPlan> plan(int layer, int position, int T) const override {
    if (layer < 0 || layer >= n_layers_) throw std::out_of_range("LAYER-RANGE");
    if (position < 0) throw std::invalid_argument("ARG-RANGE: position");
    if (T < 1) throw std::invalid_argument("STEP-T");
    if (!step_allowed(position, T)) throw std::invalid_argument("STEP-APPEND");
    if (static_cast<long long>(position) + T > capacity_) return std::nullopt;
    return flat_plan(position, T);
  }

  void commit(const SeqStepPlan& p) override {
    if (p.n_write != 1 || p.n_read != 1) throw std::invalid_argument("COMMIT-ISSUED: flat plans have one run each");
    int T = p.write[0].len, position = p.write[0].start;
    if (T < 1 || position < 0 || static_cast<long long>(position) + T > capacity_ || !step_allowed(position, T) ||
        !demo::same_plan(flat_plan(position, T), p))   // the rows too, not only the span
      throw std::invalid_argument("COMMIT-ISSUED");
    if (position + T > length_) {
      length_ = position + T;
      open_ = true;
      open_position_ = position;
      open_T_ = T;
    }
  }

 protected:
  // serve_other_kinds: the bug SCOPE-BORDER catches - accept a ring layer and plan it as flat.
  FlatCache(const CacheConfig& cfg, bool refuse_other_kinds) : capacity_(cfg.capacity), n_layers_(cfg.n_layers) {
    if (cfg.capacity < 1) throw std::invalid_argument("CFG-CAPACITY");
    if (cfg.n_layers < 1) throw std::invalid_argument("CFG-LAYERS: n_layers");
    if (cfg.layers.size() != 1 && cfg.layers.size() != static_cast<size_t>(cfg.n_layers))
      throw std::invalid_argument("CFG-LAYERS: layers");
    if (cfg.initial_capacity < 0) throw std::invalid_argument("CFG-INITIAL-CAPACITY");
    for (const LayerConfig& l : cfg.layers) {
      if (l.policy.kind == Kind::Ring && refuse_other_kinds)
        throw std::invalid_argument("SCOPE-BORDER: this cache implements flat layers only");
      if (l.policy.kind == Kind::Flat && l.policy.window != 0) throw std::invalid_argument("CFG-POLICY");
      if (l.policy.kind == Kind::Ring && l.policy.window < 1) throw std::invalid_argument("CFG-POLICY");
      if (l.n_kv_heads < 1 || l.head_dim < 1) throw std::invalid_argument("CFG-SHAPE");
    }
  }

 private:
  int capacity_;
  int n_layers_;
  int length_ = 0;
  bool open_ = false;
  int open_position_ = 0, open_T_ = 0;

  static SeqStepPlan flat_plan(int position, int T) { return demo::Policy{0, 0}.plan(position, T); }
  bool step_allowed(int position, int T) const {
    return position == length_ || (open_ && open_position_ == position && open_T_ == T);
  }
};

}  // namespace seed
