"""mlx-lm's batch caches (mlx-lm 0.32.2 on mlx 0.32.4, the Linux CPU build) as op-face targets, driven as its
BatchGenerator (mlx_lm/generate.py) drives them.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.mlxlm_batch:batch --strict

`batch`: BatchKVCache per layer; `batch_rotating`: a model whose make_cache gives RotatingKVCache(max_size=w)
on its sliding layers (llama) or make_prompt_cache(model, max_kv_size=w), merged by BatchGenerator into
BatchRotatingKVCache(w) (RotatingKVCache.merge keeps max_size and drops keep: a batch ring has no sinks), with
BatchKVCache on full layers. Needs the `mlx` extra.

What BatchGenerator does to its caches (generate.py, 0.32.2), and what each op-face call is here:
- it builds a request's caches with make_prompt_cache and merges a batch's with `_merge_caches` (generate.py:826,
  the caches' `merge`): `create` builds the caches so, one empty per batch row, merged;
- rows of different lengths are left-padded: `merge` of caches of different sizes builds the batch cache with
  `left_padding` (cache.py:1057-1086), a right-padded prompt is rolled into left padding by
  `prepare(lengths, right_padding)` and `finalize` (generate.py:1219-1236); the op face's `pad(left_padding)` on a
  cache holding nothing is the cache's own `prepare(left_padding=...)` (cache.py:938-946), which leaves the cache as
  a constructor's `left_padding` does: rows' positions below their pad are no tokens of theirs;
- it drops finished rows with `filter(sorted(keep))` (generate.py:1179-1190, 1448-1466, 1744-1767): the op face's
  `select(rows)` is every layer's `filter(rows)`. It never reorders nor repeats rows (no beam search), nor trims a
  batch cache (the server trims the per-request caches `extract` gives back): `reorder`, `repeat` and `trim` are not
  declared, and tests/test_library_targets.py reads the installed generate.py to hold that;
- a forward builds the mask first, `create_attention_mask(h, cache, window_size=...)` (models/base.py:45-54): the
  cache's own `make_mask`, an array [B, 1, q_len, rows] that differs per row by its left padding; then each layer's
  `update_and_fetch`. The AttendSpec is what `mx.fast.scaled_dot_product_attention` attends under that mask, an
  EXPLICIT [B, q_len, rows] mask, one per batch row (OP-PAD).
- it adds rows with `extend` (`_extend_cache`, generate.py:842-849) and hands a request's cache back with
  `extract` (`extract_cache`, generate.py:1144-1145, 1445-1446): the op face's `extend(other)` and `extract(row)`
  (scope feature `merge`, spec 5); an extracted request cache goes back into a batch only merged (insert).
Nothing is validated here: what the library raises is the refusal. `position` is not read (a row's RoPE position
is its cache `offset`, the tokens it holds past its pads). Scope: `trusted-args` (model code and BatchGenerator
are the only callers), `unbounded`, `pad`, `select`, `merge`, `batch`, `mla`; `no-length`: a batch cache has no one length
of the op face's `used(layer)` - its `offset` is one count per row (its tokens past its pads), and its shared
`_idx` is a storage index that `filter` lowers when it drops pad columns every row has (cache.py:992-999), while
positions are kept. The sizes are not lazy: the batch size is the batch cache's, fixed when it is merged.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any, Callable, Optional

from ..._extras import missing_line, version_line
from ..configs import JsonConfig
from ..op.targets import library_target

# Without the extra, or on another version of the library, loading a target names this module (as mlxlm.py does).
_MISSING = (missing_line("mlx", "kvcache_spec.conformance.libraries.mlxlm_batch")
            or version_line("mlx", "kvcache_spec.conformance.libraries.mlxlm_batch"))
if _MISSING:
    raise ImportError(_MISSING)

from .mlxlm import _cache_module, _default_mask, _mx, _numpy, _only, _policies  # noqa: E402  (after the check)

SCOPE = ("batch", "mla", "trusted-args", "unbounded", "no-length", "pad", "select", "merge")
SPEC_VERSION = "spec=5"   # pad and select came with spec 4, merge (extend and extract) with spec 5


def attended_per_row(mask: Any, batch: int, q_len: int, rows: int) -> Any:
    """What mx.fast.scaled_dot_product_attention attends under the model's mask, per batch row: a bool
    [batch, q_len, rows] array (a mask of no batch axis is every row's; the head axis is 1 in every batch mask)."""
    import numpy as np

    if mask is None:
        return np.ones((batch, q_len, rows), dtype=bool)
    if isinstance(mask, str):   # "causal": lower-right aligned
        one = np.arange(rows)[None, :] <= (rows - q_len + np.arange(q_len))[:, None]
        return np.broadcast_to(one, (batch, q_len, rows)).copy()
    array = _numpy(mask)
    if array.dtype != np.bool_:   # an additive mask: -inf where not attended
        array = array > np.finfo(array.dtype).min / 2
    while array.ndim < 4:
        array = array[None]
    return np.broadcast_to(array, (batch, array.shape[1], q_len, rows))[:, 0].copy()


def _generate_module() -> Any:
    return importlib.import_module("mlx_lm.generate")


class MlxBatchCaches:
    """One mlx-lm batch cache per layer, as BatchGenerator merges them; `make_mask(layer_cache, q_len)` is the
    mask the model builds for that layer's kind."""

    kvcache_layout = "op-contiguous"

    def __init__(self, build: Callable[[int], list[Any]], batch: int, make_mask: Callable[[Any, int], Any],
                 caches: Optional[list[Any]] = None) -> None:
        self.build, self.make_mask = build, make_mask
        self.caches = build(batch) if caches is None else caches

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> tuple[Any, Any, SimpleNamespace]:
        mx = _mx()
        cache = self.caches[layer_id]
        batch, q_len = k.shape[0], k.shape[-2]
        mask = self.make_mask(cache, q_len)
        keys, values = cache.update_and_fetch(mx.array(k), mx.array(v))
        keys, values = _numpy(keys), _numpy(values)
        return keys, values, SimpleNamespace(kind="EXPLICIT",
                                             mask=attended_per_row(mask, batch, q_len, keys.shape[-2]))

    def pad(self, left_padding: Any) -> None:
        """Every layer's prepare(left_padding=...): the library's own left padding of an empty batch cache (it
        raises ValueError on one holding tokens)."""
        for cache in self._batched():
            cache.prepare(left_padding=left_padding)

    def select(self, rows: Any) -> None:
        """Every layer's filter(rows), a list of row indices: BatchGenerator drops finished rows so."""
        for cache in self._batched():
            cache.filter(list(rows))

    def reset(self) -> None:
        """BatchGenerator has no reset: a new batch gets new caches, merged as these were, of the rows the batch
        has now (a select keeps fewer: the cache's `offset` holds one count per row; an extracted request's cache
        is one row)."""
        offset = self.caches[0].offset
        self.caches = self.build(int(offset.shape[0]) if hasattr(offset, "shape") else 1)

    def extend(self, other: "MlxBatchCaches") -> None:
        """generate.py's `_extend_cache` (generate.py:842-849): every layer's `extend(other's)`, as
        PromptProcessingBatch.extend and GenerationBatch.extend add a batch's rows to a running one."""
        for mine, theirs in zip(self._batched(), other._batched()):
            mine.extend(theirs)

    def extract(self, row: Any) -> "MlxBatchCaches":
        """`extract_cache(idx)` (generate.py:1144-1145, 1445-1446): every layer's `extract(row)`, the request's own
        caches handed back (BatchGenerator.remove(uids, return_prompt_caches=True), the server's prompt cache): a
        KVCache (RotatingKVCache for a batch ring) of the row with its left padding stripped, driven from here on
        as the model drives a request's cache (generate_step's forward: the cache's own make_mask, then
        update_and_fetch). The op face keeps the row's pads and positions; the request cache's offset is the row's
        tokens past its pads, which is what the batch cache's offset held for it (RoPE's position), and `position` is
        not read, so a batch position p is the request's p - pad with nothing to translate. A request's cache has
        no `prepare`, `filter` nor `extend`: BatchGenerator batches it again by `insert(..., caches=[...])`, whose
        `_make_batch` merges it (`_merge_caches`, generate.py:1778-1810): a pad, select or extend of an extracted
        cache merges it so first (_batched)."""
        return MlxBatchCaches(self.build, 1, self.make_mask, [cache.extract(row) for cache in self.caches])

    def _batched(self) -> list[Any]:
        """The layers' batch caches; request caches (an extract's) merged first, as BatchGenerator's insert does."""
        if not hasattr(self.caches[0], "filter"):
            self.caches = _merged_requests([self.caches])
        return self.caches


def _merged(per_row: Callable[[], list[Any]], batch: int) -> list[Any]:
    """BatchGenerator's batch caches: one request's caches per batch row (make_prompt_cache's), merged layer by
    layer by generate.py's own `_merge_caches`."""
    return _merged_requests([per_row() for _ in range(batch)])


def _merged_requests(requests: list[list[Any]]) -> list[Any]:
    return list(_generate_module()._merge_caches(requests))


def _no_recording(cfg: JsonConfig) -> JsonConfig:
    """A spec-4 config may ask rings to record their past (record_past, OP-RECORD): no mlx-lm cache does."""
    if cfg.get("record_past"):
        raise ValueError("SCOPE-BORDER: mlx-lm's caches do not record a ring's past (record_past)")
    return cfg


def _batch(cfg: JsonConfig) -> Any:
    module = _cache_module()
    layers = len(_only(_no_recording(cfg), "flat"))
    return MlxBatchCaches(lambda rows: _merged(lambda: [module.KVCache() for _ in range(layers)], rows),
                          cfg["batch_size"], _default_mask())


def _batch_rotating(cfg: JsonConfig) -> Any:
    """llama's make_cache (KVCache full layers, RotatingKVCache(max_size=sliding_window) sliding ones), merged:
    BatchKVCache and BatchRotatingKVCache(sliding_window); the sliding layers' mask from a sliding cache with
    window_size=sliding_window, as llama's forward builds it. One window, no sinks (a batch ring has no keep)."""
    module = _cache_module()
    policies = _policies(_no_recording(cfg))
    windows = {entry["window"] for entry in policies if entry["kind"] == "ring"}
    if len(windows) > 1 or any(entry.get("keep", 0) or entry["kind"] not in ("flat", "ring") for entry in policies):
        raise ValueError(f"SCOPE-BORDER: full and sliding layers, one sliding_window and no sinks "
                         f"(BatchRotatingKVCache has no keep), the config asks for {policies}")
    window: Optional[int] = windows.pop() if windows else None

    def per_row() -> list[Any]:
        return [module.RotatingKVCache(max_size=entry["window"]) if entry["kind"] == "ring" else module.KVCache()
                for entry in policies]

    full, sliding = _default_mask(), _default_mask(window)
    return MlxBatchCaches(lambda rows: _merged(per_row, rows), cfg["batch_size"], lambda cache, q_len: (
        sliding if isinstance(cache, (module.BatchRotatingKVCache, module.RotatingKVCache)) else full)(cache, q_len))


def _declared(factory: Callable[[JsonConfig], Any], scope: tuple[str, ...]) -> Callable[[JsonConfig], Any]:
    """library_target's factory, written against spec 4 (library_target says spec 2: pad and select are 4's)."""
    factory.kvcache_scope = (*scope, SPEC_VERSION)   # type: ignore[attr-defined]
    return factory


batch = _declared(library_target("batch", _batch, (), "BatchKVCache per layer, as BatchGenerator merges them."),
                  ("flat", *SCOPE))
batch_rotating = _declared(library_target(
    "batch_rotating", _batch_rotating, (),
    "BatchKVCache full layers, BatchRotatingKVCache(sliding_window) sliding ones, as BatchGenerator merges llama's "
    "make_cache."), ("flat", "ring", *SCOPE))

TARGETS = ("batch", "batch_rotating")
