// The MLX-shaped stand-in (mlx_shaped_cache.h) judged through the op driver: this file is all the glue.
//   g++ -std=c++17 -O1 -I "$(kvcache cpp --include)" -o serve_mlx_shaped serve_mlx_shaped.cpp
//   kvcache conformance --target cmd:./serve_mlx_shaped --strict
// Its scope leaves out `batch` ([1, H, slots, D] pools) and `mla` (one width for K and V) of spec 1 (no trim, no sinks).
#include "../kvcache_conformance.hpp"
#include "mlx_shaped_cache.h"

namespace op = kvcache_conformance::op;

static mlxs::Array array(const op::Tensor& t) { return {{t.shape.begin(), t.shape.end()}, {t.data.begin(), t.data.end()}}; }

int main(int argc, char** argv) {
  return op::run_main<mlxs::SequenceCache>(
      argc, argv, "MLX-shaped sequence cache", op::Scope::full().without("batch").without("mla"),
      [](const op::Config& c) {   // JSON max_write null (no bound) is MLX's max_write = capacity
        mlxs::CacheConfig cfg{c.capacity, c.n_layers, c.n_kv_heads, c.head_dim, 0, c.max_write.value_or(c.capacity), {}};
        for (const op::Policy& p : c.layers)
          cfg.layers.push_back({p.kind == "ring" ? mlxs::Kind::Ring : mlxs::Kind::Flat, p.window});
        return std::make_unique<mlxs::SequenceCache>(cfg);
      },
      [](mlxs::SequenceCache& cache, int layer, const op::Tensor& k, const op::Tensor& v, const op::Tensor& position) {
        mlxs::AttendSpec s = cache.update_and_fetch(layer, op::int32s(position), array(k), array(v));
        op::Tensor K = op::Tensor::of("float32", s.k.shape, s.k.data), V = op::Tensor::of("float32", s.v.shape, s.v.data);
        if (s.mask == mlxs::MaskKind::Causal) return op::Fetched::lower_right_causal(K, V, k.dim(2));
        if (s.mask == mlxs::MaskKind::None) return op::Fetched{K, V, op::Mask::None, {}};
        const std::vector<int> ts{s.explicit_mask.shape[2], s.explicit_mask.shape[3]};   // [1, 1, T, S] -> [T, S]
        return op::Fetched{K, V, op::Mask::Explicit, op::Tensor::of("bool", ts, s.explicit_mask.data)};
      });
}
