"""Hugging Face transformers' KV caches (5.23.0) as op-face targets, driven as the library's model code drives them.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.hf:static_sliding --strict

One factory per cache class and setup users build: `dynamic_full`, `dynamic_sliding` (DynamicCache over full and
sliding layers), `static_full`, `static_sliding` (StaticCache), `quantized_quanto`, `quantized_hqq` and
`quantized_fp8` (QuantizedCache per backend). Needs the `hf` extra (transformers, torch CPU, optimum-quanto, hqq).

What one `update_and_fetch(layer_id, k, v, position)` does is what an attention layer of a transformers model does
in a forward (modeling_llama / modeling_mistral with `attn_implementation="sdpa"`, the default on torch):
1. the mask first, from `masking_utils` with the cache as `past_key_values` - `create_causal_mask` for a
   full-attention layer, `create_sliding_window_causal_mask` for a sliding one - before the layer's update. The
   model builds each kind's mask once per forward from the first layer of that kind; every layer of a kind holds
   the same tokens at a forward's start, so the mask is built here for the layer being served (`layer_idx`,
   which masking_utils takes for caches whose layers differ), before its update;
2. then `cache.update(k, v, layer_idx)`, whose (keys, values) are the answer's history as they are;
3. the AttendSpec is what torch's scaled_dot_product_attention then attends, spelled out as an EXPLICIT
   `[q_len, rows]` mask (sdpa_attention.py): a mask tensor broadcast over the rows as torch broadcasts it
   (a shape torch cannot broadcast raises, as the forward would); no mask and q_len > 1 is `is_causal=True`
   (upper-left: query i attends rows 0..i); no mask and q_len 1 attends every row.
Nothing is validated here: a call the library accepts is served as it serves it, and what it raises is the
refusal. `position` is not read: the library places a step at its held length (`get_seq_length`), as a model's
forward does, so the scopes leave out `positions` and `steps` (each layer is its own history).

The config maps onto a `PreTrainedConfig` as a model's does: `num_hidden_layers`, `layer_types`
("full_attention" / "sliding_attention") and one `sliding_window` (masking_utils reads the config's single
window, so a config with two ring windows is not one HF can describe: refused at creation). The sizes (heads,
head_dim, batch) are learnt from the first update (`lazy-shapes`); `capacity` is StaticCache's `max_cache_len`
and is ignored by the growing caches (`unbounded`). The scopes (INTERFACES; features and relaxations: SPEC.md section 6.1):
- every target: `trusted-args` (`Cache.update` validates nothing: model code is its only caller) and
  `lazy-shapes`; `batch` and `mla` (K and V are stored as given, widths apart).
- DynamicCache: `unbounded` (no capacity; a sliding layer keeps window-1 rows and forgets the rest) and `trim`:
  `trim(n)` is `cache.crop(-n)`, what assisted and speculative decoding call to drop rejected tokens.
- StaticCache: full layers are bounded by `max_cache_len` (OP-CAP owed); sliding layers roll forever, so
  `static_sliding` (every layer sliding, as Mistral's) is `unbounded`. StaticCache cannot crop: no `trim`.
- QuantizedCache: full layers only (it refuses sliding ones), `unbounded`, `lossy=<tol>`, `min_head_dim` and
  `trim` (its layers are DynamicLayer's: `is_croppable` is True, so assisted decoding crops it).
Each target's `trim` is the library's own word: a cache declares it exactly where its `is_croppable` says True
(tests/test_library_targets.py reads the flag from the installed library).
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace
from typing import Any, Callable

from ..._extras import missing_line, version_line
from ..configs import JsonConfig
from ..op.targets import library_target

# Without the extra, loading a target names it (the CLI's "cannot load" line, exit 2), rather than every config
# refused; on a version of the library this adapter was not written for, it names both versions (_extras.py).
_MISSING = (missing_line("hf", "kvcache_spec.conformance.libraries.hf")
            or version_line("hf", "kvcache_spec.conformance.libraries.hf"))
if _MISSING:
    raise ImportError(_MISSING)

import torch  # noqa: E402  (the extra is installed: checked just above)

# One intra-op thread. The suite drives tensors of a few dozen elements one call at a time, where torch's thread
# pool only adds wake-ups: on a loaded 2-core machine one `torch.tril` of a 7 x 7 mask took 765 us with two
# threads and 1 us with one, and `hf:quantized_quanto` at strict pre-merge took 140 s (127 s CPU) instead of
# 36-49 s (32-34 s CPU). The verdicts do not depend on it: elementwise results are the same, and a reduction summed
# in another order (hqq's optimiser) differs in the last bits, far below the row codes' tolerance.
torch.set_num_threads(1)

FULL, SLIDING = "full_attention", "sliding_attention"
COMMON_SCOPE = ("batch", "mla", "trusted-args", "lazy-shapes")
# The quantized backends' tolerance (the lossy relaxation: row codes whose elements are 1 or 2, so a quantizer's error
# stays far below it) and the head widths they serve (docs/hf-findings.md).
QUANTIZED_MIN_HEAD_DIM = 64   # QuantizedCache's default q_group_size: a group is 64 channels
QUANTIZED_TOLERANCE = {"quanto": 0.25, "hqq": 0.25, "fp8": 0.25}


def _layer_types(cfg: JsonConfig) -> tuple[list[str], int | None]:
    """The config's layers as transformers' `layer_types`, and its one sliding window (None without a ring).
    transformers' caches have no per-step bound (max_write) and no sinks (keep): such configs are refused."""
    if cfg.get("max_write") is not None:
        raise ValueError(f"SCOPE-BORDER: transformers' caches have no max_write (got {cfg['max_write']!r})")
    policies = cfg["layers"] if len(cfg["layers"]) == cfg["n_layers"] else list(cfg["layers"]) * cfg["n_layers"]
    windows = {entry["window"] for entry in policies if entry["kind"] == "ring"}
    if any(entry.get("keep", 0) for entry in policies):
        raise ValueError("SCOPE-BORDER: transformers' sliding layers keep no sinks")
    if len(windows) > 1:
        raise ValueError(f"SCOPE-BORDER: a transformers config has one sliding_window, this one asks for {sorted(windows)}")
    return [SLIDING if entry["kind"] == "ring" else FULL for entry in policies], (windows.pop() if windows else None)


def _pretrained_config(cfg: JsonConfig, allowed: frozenset[str]) -> Any:
    """A model config carrying what the library's caches and masks read from a model's config."""
    layer_types, window = _layer_types(cfg)
    if not set(layer_types) <= allowed:
        raise ValueError(f"SCOPE-BORDER: this target serves {sorted(allowed)} layers, the config has {layer_types}")
    return _model_config(tuple(layer_types), window)


@functools.lru_cache(maxsize=None)
def _model_config(layer_types: tuple[str, ...], window: int | None) -> Any:
    """One config per layout, as a model has one for all its forwards and every cache built for it: neither the
    caches nor masking_utils write to it, and validating a new one per program cost 1.3 s of a run's 1745 caches."""
    transformers = importlib.import_module("transformers")
    return transformers.PreTrainedConfig(num_hidden_layers=len(layer_types), layer_types=list(layer_types),
                                         sliding_window=window, attn_implementation="sdpa")


def attended_rows(mask: Any, q_len: int, rows: int) -> Any:
    """What torch's SDPA attends, as sdpa_attention.py calls it: a bool [q_len, rows] tensor."""
    if mask is None:   # `is_causal = q_length > 1 and attention_mask is None`, upper-left aligned
        full = torch.ones((q_len, rows), dtype=torch.bool)
        return torch.tril(full) if q_len > 1 else full
    if mask.dtype != torch.bool:   # an additive float mask: -inf (the dtype's min) where not attended
        mask = mask > torch.finfo(mask.dtype).min
    spread = torch.broadcast_to(mask, (*mask.shape[:-2], q_len, rows))   # raises where SDPA would
    first = spread.reshape(-1, q_len, rows)
    if not bool((first == first[0]).all()):
        raise ValueError("the mask differs across batch rows (padding), which one op-face mask cannot carry")
    return first[0].clone()


class HFCache:
    """One transformers Cache, served one layer call at a time as a model's attention layers serve it."""

    kvcache_layout = "op-contiguous"
    kvcache_tensors = "torch"

    def __init__(self, config: Any, cache: Any) -> None:
        self.config, self.cache = config, cache
        masking = importlib.import_module("transformers.masking_utils")
        self._mask_for = {FULL: masking.create_causal_mask, SLIDING: masking.create_sliding_window_causal_mask}

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> tuple[Any, Any, SimpleNamespace]:
        with torch.no_grad():   # as a model's forward runs under generate(): no autograd bookkeeping
            return self._forward(layer_id, k, v)

    def _forward(self, layer_id: Any, k: Any, v: Any) -> tuple[Any, Any, SimpleNamespace]:
        q_len = k.shape[-2]
        embeds = torch.zeros((k.shape[0], q_len, 1), dtype=k.dtype)   # masking_utils reads batch, q_len, dtype
        mask = self._mask_for[self.config.layer_types[layer_id]](
            config=self.config, inputs_embeds=embeds, attention_mask=None, past_key_values=self.cache,
            position_ids=None, layer_idx=layer_id)
        keys, values = self.cache.update(k, v, layer_id)
        return keys, values, SimpleNamespace(kind="EXPLICIT", mask=attended_rows(mask, q_len, keys.shape[-2]))

    def used(self, layer_id: int) -> int:
        return int(self.cache.get_seq_length(layer_id))

    def reset(self) -> None:
        self.cache.reset()


class HFCroppableCache(HFCache):
    """A cache whose `crop` rolls back the newest tokens: one that says `is_croppable` (DynamicCache,
    QuantizedCache), which assisted and speculative decoding crop (generation/candidate_generator.py)."""

    def trim(self, n: int) -> None:
        self.cache.crop(-n)


def _dynamic(allowed: frozenset[str]) -> Callable[[JsonConfig], Any]:
    def build(cfg: JsonConfig) -> Any:
        config = _pretrained_config(cfg, allowed)
        return HFCroppableCache(config, importlib.import_module("transformers").DynamicCache(config=config))
    return build


def _static(allowed: frozenset[str]) -> Callable[[JsonConfig], Any]:
    def build(cfg: JsonConfig) -> Any:
        config = _pretrained_config(cfg, allowed)
        cache = importlib.import_module("transformers").StaticCache(config=config, max_cache_len=cfg["capacity"])
        return HFCache(config, cache)
    return build


def _quantized(backend: str) -> Callable[[JsonConfig], Any]:
    def build(cfg: JsonConfig) -> Any:
        config = _pretrained_config(cfg, frozenset({FULL}))
        return HFCroppableCache(config, importlib.import_module("transformers").QuantizedCache(backend, config))
    return build


def _quantized_scope(backend: str) -> tuple[str, ...]:
    """A group of q_group_size channels must divide each width: the suite's MLA configs (a value width of
    head_dim + 1) are outside what the integer backends serve, so `mla` is not declared. `trim`: its layers are
    DynamicLayer's (`is_croppable` True), so assisted decoding crops a QuantizedCache as it crops a DynamicCache."""
    return ("flat", "batch", "trusted-args", "lazy-shapes", "unbounded", "trim",
            f"lossy={QUANTIZED_TOLERANCE[backend]}", f"min_head_dim={QUANTIZED_MIN_HEAD_DIM}")


_target = functools.partial(library_target, tensors="torch")   # transformers' caches take torch tensors
dynamic_full = _target("dynamic_full", _dynamic(frozenset({FULL})), ("flat", *COMMON_SCOPE, "unbounded", "trim"),
                        "DynamicCache(config=...) over full-attention layers (Llama's).")
dynamic_sliding = _target("dynamic_sliding", _dynamic(frozenset({FULL, SLIDING})),
                           ("flat", "ring", *COMMON_SCOPE, "unbounded", "trim"),
                           "DynamicCache(config=...) over sliding and full layers (Mistral's, Gemma's hybrids).")
static_full = _target("static_full", _static(frozenset({FULL})), ("flat", *COMMON_SCOPE, "user-config=capacity"),
                       "StaticCache(config=..., max_cache_len=capacity) over full-attention layers.")
static_sliding = _target("static_sliding", _static(frozenset({SLIDING})), ("ring", *COMMON_SCOPE, "unbounded"),
                          "StaticCache(config=..., max_cache_len=capacity) over sliding layers (Mistral's).")
quantized_quanto = _target("quantized_quanto", _quantized("quanto"), _quantized_scope("quanto"),
                            "QuantizedCache('quanto', config) with its defaults (4 bits, groups of 64, residual 128).")
quantized_hqq = _target("quantized_hqq", _quantized("hqq"), _quantized_scope("hqq"),
                         "QuantizedCache('hqq', config) with its defaults (4 bits, groups of 64, residual 128).")
quantized_fp8 = _target("quantized_fp8", _quantized("fp8"), _quantized_scope("fp8"),
                         "QuantizedCache('fp8', config): float8_e4m3 with a per-tensor scale frozen at the first update.")

TARGETS = ("dynamic_full", "dynamic_sliding", "static_full", "static_sliding", "quantized_quanto", "quantized_hqq",
           "quantized_fp8")
