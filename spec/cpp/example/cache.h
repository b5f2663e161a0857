// Upstream-shaped types (ExecuTorch extension/llm/cache/cache.h, restated): the example caches use them.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

namespace demo {

struct Run {
  int start;
  int len;
};

struct SeqStepPlan {
  Run write[2];
  int n_write;
  Run read[2];
  int n_read;
  int read_base_pos;
};

enum class Kind : int { Flat = 0, Ring = 1 };

struct LayerPolicy {
  Kind kind;
  int window;
};

struct LayerConfig {
  LayerPolicy policy;
  int n_kv_heads;
  int head_dim;
};

struct CacheConfig {
  int capacity;
  int n_layers;
  std::vector<LayerConfig> layers;
  int initial_capacity = 512;
  std::optional<int> max_write;
  std::optional<int> kv_dtype;  // the stored element type (PR #21902); no layout's bookkeeping reads it
};

// The CFG-* rules, as the faithful ports check them (upstream's valid(cfg), throwing the rule's name).
inline void check_config(const CacheConfig& cfg) {
  if (cfg.capacity < 1) throw std::invalid_argument("CFG-CAPACITY");
  if (cfg.n_layers < 1) throw std::invalid_argument("CFG-LAYERS: n_layers");
  if (cfg.layers.size() != 1 && cfg.layers.size() != static_cast<size_t>(cfg.n_layers))
    throw std::invalid_argument("CFG-LAYERS: layers");
  if (cfg.initial_capacity < 0) throw std::invalid_argument("CFG-INITIAL-CAPACITY");
  if (cfg.max_write && *cfg.max_write < 1) throw std::invalid_argument("CFG-MAX-WRITE");
  if (cfg.kv_dtype && *cfg.kv_dtype < 0) throw std::invalid_argument("CFG-TYPE: kv_dtype");
  for (const LayerConfig& l : cfg.layers) {
    if (l.policy.kind == Kind::Flat && l.policy.window != 0) throw std::invalid_argument("CFG-POLICY");
    if (l.policy.kind == Kind::Ring && l.policy.window < 1) throw std::invalid_argument("CFG-POLICY");
    if (l.n_kv_heads < 1 || l.head_dim < 1) throw std::invalid_argument("CFG-SHAPE");
  }
}

// The shared base of the runner faces (PR #21902).
class CacheControl {
 public:
  virtual ~CacheControl() = default;
  virtual bool can_extend(int n = 1) const = 0;
  virtual int capacity() const = 0;
  virtual void clear() = 0;
};

class SequenceControl : public CacheControl {
 public:
  virtual int length() const = 0;
  virtual bool rewind(int new_len) = 0;
};

class SequencePlanner {
 public:
  virtual ~SequencePlanner() = default;
  virtual std::optional<SeqStepPlan> plan(int layer, int position, int T) const = 0;
  virtual void commit(const SeqStepPlan& plan) = 0;
};

// The cell layout's handoff and faces (PR #21902). A CellStep is owned by the cache and valid until
// its next verb: cells[i] is query token i's cell, mask_bits holds length x read_len bytes, 1 = attend.
struct CellStep {
  int length;
  int read_len;
  const int32_t* cells;
  const uint8_t* mask_bits;
};

class BatchControl : public CacheControl {
 public:
  virtual bool declare_step(const std::vector<int32_t>& seq_ids) = 0;
  virtual std::optional<int32_t> seq_new() = 0;
  virtual std::optional<int32_t> seq_clone(int32_t src, std::optional<int> upto) = 0;
  virtual bool seq_rm(int32_t seq_id, int p0, std::optional<int> p1) = 0;
  virtual int seq_len(int32_t seq_id) const = 0;
  virtual int next_pos(int32_t seq_id) const = 0;
};

class CellStepper {
 public:
  virtual ~CellStepper() = default;
  virtual const CellStep* place_step(int layer, const int32_t* positions, int length) = 0;
};

// Every face has a default that returns null; a cache returns itself from the faces it implements.
class CacheBase {
 public:
  virtual ~CacheBase() = default;
  virtual SequenceControl* as_control() { return nullptr; }
  virtual SequencePlanner* as_planner() { return nullptr; }
  virtual BatchControl* as_batch_control() { return nullptr; }
  virtual CellStepper* as_cell_stepper() { return nullptr; }
};

// Ring/flat layout arithmetic shared by both examples (upstream's policies).
struct Policy {
  int window;  // 0: flat
  int slots;   // ring: window + max_write - 1

  bool operator==(const Policy& o) const { return window == o.window && slots == o.slots; }

  static void runs(int first, int count, int slots, Run out[2], int& n) {
    int head = count < slots - first ? count : slots - first;
    if (head == count) {
      out[0] = {first, count};
      n = 1;
    } else {
      out[0] = {first, head};
      out[1] = {0, count - head};
      n = 2;
    }
  }
  int read_base(int position) const { return window == 0 ? 0 : (position - window + 1 > 0 ? position - window + 1 : 0); }
  SeqStepPlan plan(int position, int T) const {
    SeqStepPlan p{};
    if (window == 0) {
      p.write[0] = {position, T};
      p.n_write = 1;
      p.read[0] = {0, position + T};
      p.n_read = 1;
      p.read_base_pos = 0;
      return p;
    }
    int base = read_base(position);
    runs(position % slots, T, slots, p.write, p.n_write);
    runs(base % slots, position + T - base, slots, p.read, p.n_read);
    p.read_base_pos = base;
    return p;
  }
};

inline bool same_plan(const SeqStepPlan& a, const SeqStepPlan& b) {
  if (a.n_write != b.n_write || a.n_read != b.n_read || a.read_base_pos != b.read_base_pos) return false;
  for (int k = 0; k < a.n_write; ++k)
    if (a.write[k].start != b.write[k].start || a.write[k].len != b.write[k].len) return false;
  for (int k = 0; k < a.n_read; ++k)
    if (a.read[k].start != b.read[k].start || a.read[k].len != b.read[k].len) return false;
  return true;
}

}  // namespace demo
