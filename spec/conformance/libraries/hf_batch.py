"""transformers' caches (5.23.0) on the verbs its generate() moves batch rows with and the rollback of its sliding
layers, as op-face targets (spec 4: `pad`, `batch-verbs`; spec 3: `recording`), driven as the library drives them.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.hf_batch:batch_dynamic_sliding --strict

Each forward is hf.py's (the mask from masking_utils with the cache as `past_key_values`, then `cache.update`),
and the verbs are the library's own calls, nothing added to them:
- `reorder(rows)` is `cache.reorder_cache(beam_idx)`, what beam search calls after every step
  (generation/utils.py:3842); `select(rows)` is `cache.batch_select_indices(indices)` and `repeat(k)`
  `cache.batch_repeat_interleave(k)`, the Cache API's row verbs (cache_utils.py:1833-1841; generate() 5.23.0 itself
  expands the beams before the prefill, on its inputs, and calls neither);
- `pad(left_padding)` is the caller's 2D `attention_mask` with `left_padding[b]` leading zeros in row b, as a
  tokenizer with `padding_side="left"` returns it, grown by a one per token (generate's
  `_update_model_kwargs_for_generation`) and handed to `create_causal_mask` / `create_sliding_window_causal_mask`
  at every forward. The mask belongs to the caller, not the cache: the adapter moves its rows with the cache's rows
  (index_select / repeat_interleave of the same indices, as `_expand_inputs_for_generation` repeats it,
  generation/utils.py:1208), which generate() never has to do across prompts - its beam_idx moves a beam only within
  its own prompt's beams, which share their padding;
- a config with `record_past` true calls `cache.activate_past_recording()` on the new cache, as assisted decoding
  does before its first forward (generation/utils.py:3992), and `trim(n)` is `cache.crop(-n)`
  (generation/utils.py:4168).
The AttendSpec of a padded batch is one mask per row, [B, q_len, rows], what torch's SDPA attends for each row.

The targets: each is hf.py's target of the name without `batch_` (the names differ, so the matrix's rows and anchors
do too), its scope hf.py's with `spec=4` and the verbs its cache has:
- `batch_dynamic_full`, `batch_dynamic_sliding`: `pad`, `batch-verbs`; the sliding one `recording` too (its layers
  are the ones with `activate_past_recording`, cache_utils.py:211);
- `batch_static_full`: `pad` only. StaticCache has `reorder_cache` (CacheLayerMixin's, cache_utils.py:97) but its layers
  lack `batch_select_indices` and `batch_repeat_interleave` (DynamicLayer's, cache_utils.py:183-194), which the
  `batch-verbs` feature bundles with reorder: the feature is left out, so its reorder is not judged;
- `batch_quantized_fp8`: `pad`, `batch-verbs` (the quantized layers inherit DynamicLayer's row verbs); fp8 only, the
  cheapest backend - quanto and hqq share the defect its run finds (tests/library_repros.py: hf_quantized_rows).
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import torch

from ..configs import JsonConfig
from ..op.targets import library_target
from .hf import COMMON_SCOPE, FULL, SLIDING, HFCache, _pretrained_config, _quantized_scope, attended_rows


def rows_attended(mask: Any, batch: int, q_len: int, rows: int) -> Any:
    """What torch's SDPA attends for each batch row, as sdpa_attention.py calls it: a bool [batch, q_len, rows]
    tensor (a mask of masking_utils is [B or 1, 1, q_len, kv]; a shape SDPA cannot broadcast raises, as it would)."""
    if mask is None:   # no mask: one pattern for every row (hf.attended_rows: is_causal, or every row)
        return attended_rows(None, q_len, rows).expand(batch, q_len, rows).clone()
    if mask.dtype != torch.bool:   # an additive float mask: the dtype's min where not attended
        mask = mask > torch.finfo(mask.dtype).min
    spread = torch.broadcast_to(mask, (batch, 1, q_len, rows))
    return spread[:, 0].clone()


def _no_chunk(cfg: JsonConfig) -> None:
    """Spec 3's chunk layers reach a spec-4 target (hf.py's, at spec 2, is never sent one): transformers'
    chunked_attention is a layer type of its own, which these targets do not build - refused (SCOPE-BORDER)."""
    if any(entry["kind"] == "chunk" for entry in cfg["layers"]):
        raise ValueError("SCOPE-BORDER: a chunk layer (transformers' chunked_attention) is not served here")


class HFBatchCache(HFCache):
    """A transformers Cache with the caller's attention_mask beside it: the batch verbs are the cache's own, the
    padding the caller's mask."""

    def __init__(self, config: Any, cache: Any) -> None:
        super().__init__(config, cache)
        self.pads: Optional[list[int]] = None   # None: the caller passes no attention_mask (an unpadded batch)

    def _forward(self, layer_id: Any, k: Any, v: Any) -> tuple[Any, Any, SimpleNamespace]:
        batch, q_len = k.shape[0], k.shape[-2]
        embeds = torch.zeros((batch, q_len, 1), dtype=k.dtype)   # masking_utils reads batch, q_len, dtype
        attention_mask = None
        if self.pads is not None:   # the caller's 2D mask over every token seen and this step's: 0 on a pad
            seen = int(self.cache.get_seq_length(layer_id)) + q_len
            attention_mask = (torch.arange(seen)[None, :] >= torch.tensor(self.pads)[:, None]).long()
        mask = self._mask_for[self.config.layer_types[layer_id]](
            config=self.config, inputs_embeds=embeds, attention_mask=attention_mask, past_key_values=self.cache,
            position_ids=None, layer_idx=layer_id)
        keys, values = self.cache.update(k, v, layer_id)
        return keys, values, SimpleNamespace(kind="EXPLICIT", mask=rows_attended(mask, batch, q_len, keys.shape[-2]))

    def pad(self, left_padding: Sequence[int]) -> None:
        """The caller's attention_mask from here on: left_padding[b] leading zeros in row b."""
        self.pads = list(left_padding)

    def _rows(self, index: list[int]) -> None:
        """The caller's attention_mask rows moved as the cache's rows were."""
        if self.pads is not None:
            self.pads = [self.pads[row] for row in index]

    def select(self, rows: Sequence[int]) -> None:
        self.cache.batch_select_indices(torch.tensor(list(rows), dtype=torch.long))
        self._rows(list(rows))

    def reorder(self, rows: Sequence[int]) -> None:
        self.cache.reorder_cache(torch.tensor(list(rows), dtype=torch.long))   # beam_idx is a LongTensor
        self._rows(list(rows))

    def repeat(self, times: int) -> None:
        self.cache.batch_repeat_interleave(times)
        if self.pads is not None:
            self._rows([row for row in range(len(self.pads)) for _ in range(times)])

    def reset(self) -> None:
        super().reset()
        self.pads = None   # a new batch: its own mask


class HFCroppableBatchCache(HFBatchCache):
    """One whose `is_croppable` says True (DynamicCache, QuantizedCache): `trim(n)` is `cache.crop(-n)`, as
    assisted decoding crops it (generation/utils.py:4168)."""

    def trim(self, n: int) -> None:
        self.cache.crop(-n)


def _static(allowed: frozenset[str]) -> Callable[[JsonConfig], Any]:
    def build(cfg: JsonConfig) -> Any:
        _no_chunk(cfg)
        config = _pretrained_config(cfg, allowed)
        cache = importlib.import_module("transformers").StaticCache(config=config, max_cache_len=cfg["capacity"])
        return HFBatchCache(config, cache)
    return build


def _quantized(backend: str) -> Callable[[JsonConfig], Any]:
    def build(cfg: JsonConfig) -> Any:
        _no_chunk(cfg)
        config = _pretrained_config(cfg, frozenset({FULL}))
        return HFCroppableBatchCache(config, importlib.import_module("transformers").QuantizedCache(backend, config))
    return build


def _dynamic(allowed: frozenset[str]) -> Callable[[JsonConfig], Any]:
    def build(cfg: JsonConfig) -> Any:
        _no_chunk(cfg)
        config = _pretrained_config(cfg, allowed)
        cache = importlib.import_module("transformers").DynamicCache(config=config)
        if cfg.get("record_past") is True:   # OP-RECORD: what assisted decoding calls on its cache
            cache.activate_past_recording()
        return HFCroppableBatchCache(config, cache)
    return build


def _target(name: str, build: Callable[[JsonConfig], Any], scope: tuple[str, ...],
            doc: str) -> Callable[[JsonConfig], Any]:
    """hf.py's kind of target, written against spec 4 (library_target declares spec 2: the verbs came later)."""
    factory = library_target(name, build, scope, doc, tensors="torch")
    factory.kvcache_scope = (*scope, "spec=4")   # type: ignore[attr-defined]
    return factory


BATCH_SCOPE = ("pad", "batch-verbs")
batch_dynamic_full = _target("batch_dynamic_full", _dynamic(frozenset({FULL})),
                       ("flat", *COMMON_SCOPE, "unbounded", "trim", *BATCH_SCOPE),
                       "DynamicCache(config=...) over full layers: padding, beam verbs, crop.")
batch_dynamic_sliding = _target("batch_dynamic_sliding", _dynamic(frozenset({FULL, SLIDING})),
                          ("flat", "ring", *COMMON_SCOPE, "unbounded", "trim", "recording", *BATCH_SCOPE),
                          "DynamicCache(config=...) over sliding and full layers: padding, beam verbs, crop, "
                          "activate_past_recording.")

batch_static_full = _target("batch_static_full", _static(frozenset({FULL})),
                      ("flat", *COMMON_SCOPE, "user-config=capacity", "pad"),
                      "StaticCache(config=..., max_cache_len=capacity) over full layers: padding (its reorder_cache "
                      "is not judged: `batch-verbs` bundles select and repeat, which StaticLayer lacks).")
batch_quantized_fp8 = _target("batch_quantized_fp8", _quantized("fp8"), (*_quantized_scope("fp8"), *BATCH_SCOPE),
                        "QuantizedCache('fp8', config): padding, beam verbs, crop.")

TARGETS = ("batch_dynamic_full", "batch_dynamic_sliding", "batch_static_full", "batch_quantized_fp8")
