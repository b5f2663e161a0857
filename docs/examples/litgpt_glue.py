"""litgpt 0.5.13's KVCache as an op-face target: the glue docs/your-library.md's trial wrote, from that page only.

    pip install 'kvcache-spec[litgpt]'
    cd docs/examples && kvcache conformance --target python:litgpt_glue:sliding --strict

One update_and_fetch is what litgpt's GPT.forward and CausalSelfAttention.forward do for one layer (litgpt/model.py),
the positions kept as litgpt's generate loop keeps `input_pos` (the cache keeps no length: LayerLengths):
1. the mask: GPT.forward's `batched_index_select(mask_cache, 2, input_pos)` cut to `input_pos_maxp1`, from the
   model's one causal `build_mask_cache(max_seq_length)`; the same forward refuses positions past max_seq_length;
2. the update: `kv_cache(input_pos, k, v)`; then, as the attention does, a sliding layer's mask is cut to the rows
   the cache answered, and the history to `input_pos_maxp1`;
3. F.scaled_dot_product_attention(attn_mask=mask): a bool mask, True attends.
trim(n) is speculative decoding's rollback: `input_pos` moves back past the rejected drafts, nothing else.
"""

import torch
from litgpt.model import KVCache, batched_index_select, build_mask_cache

from kvcache_spec.conformance.op import (LayerLengths, attended_rows, explicit_spec, layer_policies, library_target,
                                         refuse_outside_scope)

torch.set_num_threads(1)


class LitGlue:
    # max_seq_length is the user's (GPT.max_seq_length, set_kv_cache): user-config=capacity; KVCache.forward
    # raises on a prefill longer than a sliding layer's window (its documented limit): window-steps
    scope = ("flat", "ring", "batch", "mla", "trim", "trusted-args", "user-config=capacity", "window-steps")

    def __init__(self, cfg):
        refuse_outside_scope(cfg, self.scope)
        self.max_seq_length = cfg["capacity"]
        policies = layer_policies(cfg)
        if len({p["window"] for p in policies if p["kind"] == "ring"}) > 1:
            raise ValueError("SCOPE-BORDER: litgpt's Config has one sliding_window_size")
        self.mask_cache = build_mask_cache(self.max_seq_length)
        b, h, d, dv = cfg["batch_size"], cfg["n_kv_heads"], cfg["head_dim"], cfg.get("v_head_dim", cfg["head_dim"])
        self.caches = []
        for p in policies:   # CausalSelfAttention.build_kv_cache
            ring = p["kind"] == "ring"
            rows = min(self.max_seq_length, p["window"]) if ring else self.max_seq_length
            self.caches.append(KVCache((b, h, rows, d), (b, h, rows, dv), dtype=torch.float32,
                                       is_sliding_window=ring, sliding_window_size=p["window"] if ring else None))
        self.lengths = LayerLengths(cfg["n_layers"])

    def update_and_fetch(self, layer_id, k, v, position):
        with torch.no_grad():
            q_len, start = k.shape[-2], self.lengths.position(layer_id)
            input_pos, input_pos_maxp1 = torch.arange(start, start + q_len), start + q_len
            mask = batched_index_select(self.mask_cache, 2, input_pos)   # GPT.forward
            if input_pos_maxp1 > self.max_seq_length:
                raise ValueError(f"Positions in 'input_pos' must be in [0,{self.max_seq_length})")
            mask = mask[..., :input_pos_maxp1]
            cache = self.caches[layer_id]   # CausalSelfAttention.forward
            keys, values = cache(input_pos, k, v)
            if cache.is_sliding_window and mask.size(-1) != keys.size(2):
                mask = mask[..., :keys.size(2)]
            keys, values = keys[..., :input_pos_maxp1, :], values[..., :input_pos_maxp1, :]
            self.lengths.advance(layer_id, q_len)
            return keys, values, explicit_spec(attended_rows(mask, q_len, keys.shape[-2]))

    def used(self, layer_id):
        return self.lengths.used(layer_id)

    def reset(self):   # generate's reset: kv_cache.reset_parameters() per block, input_pos from 0 again
        for cache in self.caches:
            cache.reset_parameters()
        self.lengths.reset()

    def trim(self, n):
        self.lengths.trim(n)


class FlatGlue(LitGlue):
    scope = tuple(feature for feature in LitGlue.scope if feature != "ring")


flat = library_target("flat", FlatGlue, FlatGlue.scope, "litgpt KVCache, global attention layers.", tensors="torch")
sliding = library_target("sliding", LitGlue, LitGlue.scope,
                         "litgpt KVCache, sliding-window and global layers (Gemma's).", tensors="torch")
