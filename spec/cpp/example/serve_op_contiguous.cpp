// An op-face target in C++: a contiguous `update_and_fetch` cache (one sequence; per layer a history of
// K/V rows) judged through the shipped header's op driver (spec/PROTOCOL.md, "The C++ op driver"):
//
//     g++ -std=c++17 -O1 -I "$(kvcache cpp --include)" -o serve_op_contiguous serve_op_contiguous.cpp
//     kvcache conformance --target cmd:./serve_op_contiguous --strict
//
// It is shaped like upstream's Python ContiguousReferenceCache: each layer is its own history that
// appends at its used length, `position` is not read, and a ring layer keeps every row and applies its
// window through the mask. So its scope leaves out `positions`, `steps` and `max_write` (SPEC.md 6.1, SCOPE-BORDER),
// and the suite says so in its verdict. It serves batch rows, an MLA value width of its own, attention sinks
// (a ring's `keep`) and the trim verb (SPEC.md part 5: OP-SINKS, OP-TRIM: spec 2, Scope::full(2)): keeping every row, it serves every
// n in [0, held], those a ring of the least size could not give back included (optional there); and left padding
// with the batch verbs (OP-PAD, OP-ROWS: spec 4, Scope::full(4)): a mask per batch row while a row has pads. Its
// state is saved and loaded (OP-STATE, the feature `state` of spec 3, in Scope::full(4)) in a text format of its own, checksummed.
// quantize(bits) turns it into a quantized cache mid-generation (OP-QUANTIZE, spec 4): each row of a batch row and head
// held as affine codes of `bits` bits over its range, what it holds and what it is written later. extend and extract
// (OP-ROWS, the feature `merge` of spec 5, Scope::full(5)): another cache's rows appended, one row out as a cache of
// its own, the side cache held by the driver.
// Build with -DKVCACHE_EXAMPLE_WINDOW_OFF_BY_ONE, -DKVCACHE_EXAMPLE_RING_LOSES_ROWS,
// -DKVCACHE_EXAMPLE_REORDER_DROPS_PADS, -DKVCACHE_EXAMPLE_STATE_UNCHECKED (a loader that never checks the
// checksum) or -DKVCACHE_EXAMPLE_EXTEND_DROPS_PADS (the appended rows lose their pads) for a broken variant the
// suite must catch.
// (spec/cpp/example/serve_mlx_shaped.cpp is the other shape: the MLX runtime's, positions and rings.)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcache_conformance.hpp"

namespace op = kvcache_conformance::op;

class ContiguousCache {
 public:
  explicit ContiguousCache(const op::Config& c)
      : c_(c), k_(c.n_layers > 0 ? c.n_layers : 0), v_(k_.size()) {
    if (c.n_layers < 1 || c.n_kv_heads < 1 || c.head_dim < 1 || c.v_head_dim < 1 || c.batch_size < 1 || c.capacity < 1)
      throw std::invalid_argument("OP-CONFIG: every size is an int >= 1");
    if (c.layers.size() != 1 && c.layers.size() != static_cast<size_t>(c.n_layers))
      throw std::invalid_argument("OP-CONFIG: layers must be one policy, or one per layer");
    for (const op::Policy& p : c.layers)
      if (!((p.kind == "flat" && p.window == 0 && p.keep == 0) || (p.kind == "ring" && p.window >= 1 &&
                                                                  p.keep >= 0 && p.keep < p.window)))
        throw std::invalid_argument("OP-CONFIG: a layer policy is flat (window 0) or ring (window >= 1, keep below)");
  }
  int used(int layer) const { return static_cast<int>(k_.at(checked(layer)).size()); }
  void reset() {
    for (size_t l = 0; l < k_.size(); ++l) k_[l].clear(), v_[l].clear();
    pads_.assign(pads_.size(), 0);   // OP-PAD: the padding goes with the tokens
  }

  // OP-PAD, OP-ROWS: pad(left_padding) on an empty cache; select, reorder, repeat move whole rows (K, V and pads)
  // on every layer. Every check first (OP-ATOMIC).
  void batch(const std::string& verb, const std::vector<int>& ints) {
    const long long B = c_.batch_size;
    if (verb == "pad") {
      if (static_cast<long long>(ints.size()) != B) throw std::invalid_argument("OP-PAD: one pad count per batch row");
      for (int p : ints)
        if (p < 0 || p > c_.capacity) throw std::invalid_argument("OP-PAD: a pad count lies in [0, capacity]");
      for (const Rows& rows : k_)
        if (!rows.empty()) throw std::invalid_argument("OP-PAD: padding comes before the first step");
      pads_.assign(ints.begin(), ints.end());
      return;
    }
    std::vector<long long> rows;
    if (verb == "repeat") {
      if (ints.at(0) < 1) throw std::invalid_argument("OP-ROWS: times is an int >= 1");
      for (long long b = 0; b < B; ++b) rows.insert(rows.end(), ints[0], b);
    } else {
      if (ints.empty()) throw std::invalid_argument("OP-ROWS: an empty batch");
      for (int r : ints)
        if (r < 0 || r >= B) throw std::invalid_argument("OP-ROWS: a row index lies in [0, batch_size)");
      std::vector<int> sorted(ints);
      std::sort(sorted.begin(), sorted.end());
      if (verb == "select" && std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        throw std::invalid_argument("OP-ROWS: select keeps each row at most once");
      if (verb == "reorder" && static_cast<long long>(ints.size()) != B)
        throw std::invalid_argument("OP-ROWS: reorder names one source row per batch row");
      rows.assign(ints.begin(), ints.end());
    }
    const long long H = c_.n_kv_heads;
    for (size_t l = 0; l < k_.size(); ++l) move_rows(k_[l], rows, H * c_.head_dim), move_rows(v_[l], rows, H * c_.v_head_dim);
    std::vector<long long> pads;
#ifdef KVCACHE_EXAMPLE_REORDER_DROPS_PADS   // the pads stay at their old indices (and a new index has none)
    for (size_t b = 0; b < rows.size(); ++b) pads.push_back(b < pads_.size() ? pads_[b] : 0);
#else
    for (long long r : rows) pads.push_back(pads_[r]);
#endif
    pads_ = pads;
    c_.batch_size = static_cast<int>(rows.size());
  }

  // OP-ROWS: extend appends other's rows (each with its history and pads) after this cache's: a cache of this config
  // but batch_size, holding as many rows on every layer; extract(row) is row `row` as a cache of its own, this one
  // unchanged. Every check first (OP-ATOMIC).
  void extend(const ContiguousCache& other) {
    if (&other == this) throw std::invalid_argument("OP-ROWS: extend takes another cache");
    if (other.describe(0) != describe(0) || other.bits_ != bits_)
      throw std::invalid_argument("OP-ROWS: other is a cache of another config");
    for (size_t l = 0; l < k_.size(); ++l)
      if (other.k_[l].size() != k_[l].size()) throw std::invalid_argument("OP-ROWS: other holds other positions");
    for (size_t l = 0; l < k_.size(); ++l)   // a row holds [B][H][width] values: other's batch rows after these
      for (size_t r = 0; r < k_[l].size(); ++r) {
        k_[l][r].insert(k_[l][r].end(), other.k_[l][r].begin(), other.k_[l][r].end());
        v_[l][r].insert(v_[l][r].end(), other.v_[l][r].begin(), other.v_[l][r].end());
      }
#ifdef KVCACHE_EXAMPLE_EXTEND_DROPS_PADS   // the appended rows come without their pads
    pads_.insert(pads_.end(), other.pads_.size(), 0);
#else
    pads_.insert(pads_.end(), other.pads_.begin(), other.pads_.end());
#endif
    c_.batch_size += other.c_.batch_size;
  }
  std::unique_ptr<ContiguousCache> extract(int row) const {
    if (row < 0 || row >= c_.batch_size) throw std::invalid_argument("OP-ROWS: a row index lies in [0, batch_size)");
    auto out = std::make_unique<ContiguousCache>(*this);
    out->batch("select", {row});
    return out;
  }

  // OP-QUANTIZE: every row held, and every one written later, as `bits`-bit codes over its own range (low + code *
  // scale, scale = (max - min) / (2^bits - 1)): each value within scale / 2 of what was written. Checks first.
  void quantize(int bits) {
    if (bits < 2 || bits > 8) throw std::invalid_argument("OP-QUANTIZE: bits lies in [2, 8]");
    if (bits_) throw std::invalid_argument("OP-QUANTIZE: the cache is quantized already");
    bits_ = bits;
    for (size_t l = 0; l < k_.size(); ++l)
      for (size_t r = 0; r < k_[l].size(); ++r) quantized(k_[l][r], c_.head_dim), quantized(v_[l][r], c_.v_head_dim);
  }
  void quantized(std::vector<double>& row, long long width) const {   // each batch row and head's values on their own
    for (size_t start = 0; bits_ && width > 0 && start < row.size(); start += static_cast<size_t>(width)) {
      const auto first = row.begin() + static_cast<long long>(start), last = first + width;
      const double low = *std::min_element(first, last), high = *std::max_element(first, last);
      const double scale = (high - low) / ((1 << bits_) - 1);
      for (auto x = first; x != last; ++x)   // held as the float32 the answer carries
        *x = static_cast<float>(scale > 0 ? low + std::nearbyint((*x - low) / scale) * scale : low);
    }
  }

  // OP-TRIM: drop the newest n tokens of every layer (each layer is its own history: each drops its own).
  void trim(int n) {
    for (size_t l = 0; l < k_.size(); ++l)
      if (n < 0 || static_cast<long long>(k_[l].size()) < n) throw std::invalid_argument("OP-TRIM: n must lie in [0, held]");
    for (size_t l = 0; l < k_.size(); ++l) k_[l].resize(k_[l].size() - n), v_[l].resize(v_[l].size() - n);
  }

  // OP-STATE: the state as text - a first line naming the format and its version, the config, each layer's rows,
  // and a last line with the FNV-1a checksum of everything before it; a load checks all of it before it changes
  // anything (a version, a checksum, a config or a row count that differ are refused, naming which).
  std::string state() const {
    std::ostringstream body;
    body << "kvcache-example-state 1\n" << describe() << "\n";
    for (long long pad : pads_) body << pad << ' ';   // OP-PAD: the pads are held too
    body << "\n";
    char number[32];
    for (size_t l = 0; l < k_.size(); ++l) {
      body << k_[l].size() << "\n";
      for (const Rows* rows : {&k_[l], &v_[l]})
        for (const auto& row : *rows) {
          for (double x : row) std::snprintf(number, sizeof number, "%.17g ", x), body << number;
          body << "\n";
        }
    }
    const std::string text = body.str();
    return text + "checksum " + std::to_string(fnv1a(text)) + "\n";
  }

  void load_state(const std::string& data) {
    if (data.rfind("kvcache-example-state ", 0) != 0) throw std::invalid_argument("OP-STATE: data is not a state of this cache");
    if (data.rfind("kvcache-example-state 1\n", 0) != 0) throw std::invalid_argument("OP-STATE: data is of another state version");
    const size_t tail = data.rfind("checksum ");
    if (tail == std::string::npos || data.back() != '\n') throw std::invalid_argument("OP-STATE: data is truncated");
#ifndef KVCACHE_EXAMPLE_STATE_UNCHECKED
    if (data.substr(tail) != "checksum " + std::to_string(fnv1a(data.substr(0, tail))) + "\n")
      throw std::invalid_argument("OP-STATE: data is corrupted or truncated: its checksum does not match");
#endif
    std::istringstream in(data.substr(0, tail));
    std::string line;
    std::getline(in, line), std::getline(in, line);
    if (line != describe()) throw std::invalid_argument("OP-STATE: data was taken under another config");
    std::vector<long long> pads(pads_.size());
    for (long long& pad : pads)
      if (!(in >> pad) || pad < 0 || pad > c_.capacity) throw std::invalid_argument("OP-STATE: data holds a bad pad");
    std::vector<Rows> k(k_.size()), v(v_.size());
    const size_t widths[2] = {static_cast<size_t>(c_.batch_size * c_.n_kv_heads * c_.head_dim),
                              static_cast<size_t>(c_.batch_size * c_.n_kv_heads * c_.v_head_dim)};
    for (size_t l = 0; l < k.size(); ++l) {
      long long rows = -1;
      if (!(in >> rows) || rows < 0 || rows > c_.capacity) throw std::invalid_argument("OP-STATE: data holds a bad row count");
      for (int side = 0; side < 2; ++side)
        for (long long r = 0; r < rows; ++r) {
          std::vector<double> row(widths[side]);
          for (double& x : row)
            if (!(in >> x)) throw std::invalid_argument("OP-STATE: data holds fewer values than its rows");
          (side ? v : k)[l].push_back(std::move(row));
        }
    }
    k_ = std::move(k), v_ = std::move(v), pads_ = std::move(pads);   // everything checked: the cache changes only now
  }

  // Every check first, then the append (OP-ATOMIC); the answer is the layer's whole history and an
  // EXPLICIT mask: query i attends the rows up to its own, and on a ring only the newest `window`.
  op::Fetched update_and_fetch(int layer, const op::Tensor& k, const op::Tensor& v, const op::Tensor& position) {
    const long long B = c_.batch_size, H = c_.n_kv_heads, D = c_.head_dim, Dv = c_.v_head_dim, q = k.dim(2);
    checked(layer);
    if (k.shape != std::vector<long long>{B, H, q, D} || v.shape != std::vector<long long>{B, H, q, Dv} ||
        position.shape != std::vector<long long>{q, 1} || q < 1)
      throw std::invalid_argument("OP-ARGS: k, v, position are not [B, Hkv, q_len, D], [B, Hkv, q_len, Dv], [q_len, 1]");
    const long long before = static_cast<long long>(k_[layer].size()), rows = before + q;
    if (rows > c_.capacity) throw std::invalid_argument("OP-CAP: the step does not fit the capacity");
    const op::Policy& p = policy(layer);
    for (long long i = 0; i < q; ++i) {   // a row holds every batch row and head of one token
      k_[layer].emplace_back(), v_[layer].emplace_back();
      for (long long bh = 0; bh < B * H; ++bh) {
        for (long long d = 0; d < D; ++d) k_[layer].back().push_back(k.data[(bh * q + i) * D + d]);
        for (long long d = 0; d < Dv; ++d) v_[layer].back().push_back(v.data[(bh * q + i) * Dv + d]);
      }
      quantized(k_[layer].back(), D), quantized(v_[layer].back(), Dv);   // OP-QUANTIZE: once quantized, held so
    }
    op::Fetched out{history(k_[layer], B * H, D, "float32"), history(v_[layer], B * H, Dv, "float32"),
                    op::Mask::Explicit, {}};
    out.k_hist.shape = {B, H, rows, D}, out.v_hist.shape = {B, H, rows, Dv};
    long long window = p.window, keep = p.keep;
#ifdef KVCACHE_EXAMPLE_WINDOW_OFF_BY_ONE
    if (window > 0) window += 1;
#endif
    std::vector<bool> mask;
    for (long long own = before; own < rows; ++own)
      for (long long r = 0; r < rows; ++r)
        mask.push_back(r <= own && (window == 0 || r < keep || r > own - (window - keep)));   // sinks and window
    out.mask = op::Tensor::of("bool", std::vector<long long>{q, rows}, mask);
    if (std::any_of(pads_.begin(), pads_.end(), [](long long p) { return p > 0; })) {   // OP-PAD: a mask per row
      std::vector<bool> per_row;   // a real query attends none of its row's pads; a pad query only itself
      for (long long b = 0; b < B; ++b)
        for (long long own = before; own < rows; ++own)
          for (long long r = 0; r < rows; ++r)
            per_row.push_back(own < pads_[b] ? r == own : mask[(own - before) * rows + r] && r >= pads_[b]);
      out.mask = op::Tensor::of("bool", std::vector<long long>{B, q, rows}, per_row);
    }
#ifdef KVCACHE_EXAMPLE_RING_LOSES_ROWS   // a ring of the least size after the answer: beside its sinks only the
    for (long long r = keep; window > 0 && r < rows - (window - keep - 1); ++r)   // next query's rows stay; yet it trims
      std::fill(k_[layer][r].begin(), k_[layer][r].end(), 0.0), std::fill(v_[layer][r].begin(), v_[layer][r].end(), 0.0);
#endif
    return out;
  }

 private:
  using Rows = std::vector<std::vector<double>>;   // [row] -> B * H * width values
  int checked(int layer) const {   // layer -1 is not Python's last layer here
    if (layer < 0 || layer >= c_.n_layers) throw std::out_of_range("OP-ARGS: layer_id must be in [0, n_layers)");
    return layer;
  }
  const op::Policy& policy(int layer) const { return c_.layers.size() == 1 ? c_.layers[0] : c_.layers[layer]; }
  // each row of a layer holds [B][H][width] values: the batch becomes the rows named
  static void move_rows(Rows& layer, const std::vector<long long>& rows, long long group) {
    for (auto& row : layer) {
      std::vector<double> moved;
      for (long long r : rows) moved.insert(moved.end(), row.begin() + r * group, row.begin() + (r + 1) * group);
      row = moved;
    }
  }
  std::string describe(int batch = -1) const {   // the config, one line: a state names the one it was taken under
    std::ostringstream line;   // (`batch`: in place of batch_size, when not -1: extend compares configs but for it)
    line << c_.n_layers << ' ' << c_.n_kv_heads << ' ' << c_.head_dim << ' ' << c_.v_head_dim << ' '
         << (batch < 0 ? c_.batch_size : batch)
         << ' ' << c_.capacity << ' ' << c_.sizing << ' ' << (c_.max_write ? *c_.max_write : 0);
    for (const op::Policy& p : c_.layers) line << ' ' << p.kind << ':' << p.window << ':' << p.keep;
    return line.str();
  }
  static uint64_t fnv1a(const std::string& text) {
    uint64_t hash = 14695981039346656037ull;
    for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
    return hash;
  }
  // [rows][B*H][width] -> [B*H][rows][width], as a tensor's flat data
  static op::Tensor history(const Rows& rows, long long bh, long long width, const char* dtype) {
    std::vector<double> data;
    for (long long g = 0; g < bh; ++g)
      for (const auto& row : rows) data.insert(data.end(), row.begin() + g * width, row.begin() + (g + 1) * width);
    return op::Tensor::of(dtype, std::vector<long long>{}, data);
  }
  op::Config c_;
  std::vector<Rows> k_, v_;
  std::vector<long long> pads_ = std::vector<long long>(c_.batch_size > 0 ? c_.batch_size : 0, 0);   // OP-PAD
  int bits_ = 0;   // OP-QUANTIZE: the bits every row is held at (0: as written)
};

int main(int argc, char** argv) {
  return op::run_main<ContiguousCache>(
      argc, argv, "serve_op_contiguous (C++ example)",
      op::Scope::full(5).without("positions").without("steps").without("max_write"),
      [](const op::Config& c) { return std::make_unique<ContiguousCache>(c); },
      [](ContiguousCache& cache, int layer, const op::Tensor& k, const op::Tensor& v, const op::Tensor& position) {
        return cache.update_and_fetch(layer, k, v, position);
      },
      [](ContiguousCache& cache, int n) { cache.trim(n); },
      [](ContiguousCache& cache, const std::string& verb, const std::vector<int>& ints) { cache.batch(verb, ints); },
      {[](ContiguousCache& cache) { return cache.state(); },
       [](ContiguousCache& cache, const std::string& data) { cache.load_state(data); }},
      [](ContiguousCache& cache, int bits) { cache.quantize(bits); },
      {[](ContiguousCache& cache, ContiguousCache& other) { cache.extend(other); },
       [](ContiguousCache& cache, int row) { return cache.extract(row); }});
}
