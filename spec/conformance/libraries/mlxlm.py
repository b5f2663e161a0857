"""mlx-lm's KV caches (mlx-lm 0.32.2 on mlx 0.32.4, the Linux CPU build) as op-face targets, driven as its model
code drives them.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.mlxlm:prompt_cache --strict

One factory per cache class and setup users build: `kv` (KVCache per layer, what make_prompt_cache builds without
max_kv_size), `llama_sliding` (llama's make_cache: KVCache on full layers, RotatingKVCache(max_size=sliding_window)
on sliding ones), `prompt_cache` (make_prompt_cache(model, max_kv_size=...): RotatingKVCache(max_kv_size, keep=4)
on every layer), `quantized` (QuantizedKVCache with its defaults, group_size 64 and 8 bits), `chunked` (llama4's
ChunkedKVCache(attention_chunk_size), its chunk past every position: spec 2) and `concatenate`
(ConcatenateKVCache); and two judged on spec 3: `llama4_chunked` (llama4's make_cache, ChunkedKVCache at the
config's own chunk beside KVCache global layers: the op face's chunk layer, OP-CHUNK) and `llama_sliding_saved`
(llama_sliding's caches saved and loaded through a prompt cache file: the `state` verbs, OP-STATE, as
MlxSavedCaches says), `prompt_cache_saved` (prompt_cache's rings, keep 4, saved and loaded so); and one judged on
spec 4: `kv_to_quantized` (kv's caches quantized mid-generation as generate's --kv-bits does, OP-QUANTIZE, as
MlxQuantizableCaches says). Needs the `mlx` extra.

One cache object per layer, as make_prompt_cache builds them; what one `update_and_fetch(layer_id, k, v, position)`
does is what a forward of mlx-lm's model code does for that layer:
1. the mask first, as the model builds it from the cache before any layer's update (models/base.py
   `create_attention_mask(h, cache, window_size=...)`, which asks the cache's own `make_mask`; llama4 trims a
   chunked cache's front and builds its chunk mask itself). Every layer of a kind holds the same tokens at a
   forward's start, so the mask is built from the served layer's own cache;
2. then that cache's `update_and_fetch(keys, values)`, whose (keys, values) are the answer's history as they are
   (QuantizedKVCache's packed triples are dequantized with its group size and bits, as quantized_matmul reads
   them);
3. the AttendSpec is what `mx.fast.scaled_dot_product_attention` then attends, spelled out as an EXPLICIT
   `[q_len, rows]` mask: no mask attends every row; "causal" is aligned to the lower right (query i attends
   rows up to rows - q_len + i: a continuation sees its history); an array mask is broadcast over the rows as
   mlx broadcasts it (a shape that cannot be raises, as the forward would).
Nothing is validated here: a call the library accepts is served as it serves it, and what it raises is the
refusal. `position` is not read: a cache places a step at its `offset`, which is also what the model's RoPE
reads, so the scopes leave out `positions` and `steps` (each layer is its own cache object). `used(layer)` is that
cache's `offset`, the tokens it has been given. The config maps onto the caches' constructors: a ring layer's
window is RotatingKVCache's max_size, its `keep` the sinks (INTERFACES.md: w is what the ring holds, keep of them
the first positions). Scope features (SPEC.md section 6.1): every target `trusted-args` (update_and_fetch validates nothing:
model code is its only caller) and `lazy-shapes` (a cache learns its shapes from the first update), `batch` and
`mla`; the growing and rotating caches `unbounded`; `trim` where the cache is trimmable: `trim(n)` is what mlx-lm's
server and speculative decoding call, `trim_prompt_cache(cache, n)`, which answers how many tokens it trimmed - 0, trimming nothing, when a
cache says it cannot (`can_trim_prompt_cache`): an answer other than n is turned into a refusal, the library's
own word.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

from ..._extras import missing_line, version_line
from ..configs import JsonConfig
from ..op.targets import library_target

# Without the extra, loading a target names it (the CLI's "cannot load" line, exit 2), rather than every config
# refused; on a version of the library this adapter was not written for, it names both versions (_extras.py).
_MISSING = (missing_line("mlx", "kvcache_spec.conformance.libraries.mlxlm")
            or version_line("mlx", "kvcache_spec.conformance.libraries.mlxlm"))
if _MISSING:
    raise ImportError(_MISSING)

COMMON_SCOPE = ("batch", "mla", "trusted-args", "lazy-shapes")
PROMPT_CACHE_KEEP = 4            # make_prompt_cache's RotatingKVCache(max_size=max_kv_size, keep=4)
QUANTIZED_GROUP_SIZE, QUANTIZED_BITS = 64, 8   # QuantizedKVCache's defaults
QUANTIZED_TOLERANCE = 0.25
KV_GROUP_SIZE = 64   # generate_step's kv_group_size default (mlx_lm/generate.py:325), --kv-group-size's too
CHUNK = 1 << 16   # the chunked target's attention_chunk_size: past any position a run reaches (see _chunked)


def _mx() -> Any:
    return importlib.import_module("mlx.core")


def _cache_module() -> Any:
    return importlib.import_module("mlx_lm.models.cache")


def _policies(cfg: JsonConfig) -> list[dict[str, Any]]:
    """The config's layer policies, one per layer. mlx-lm's caches have no per-step bound: max_write is refused;
    none records a ring's past beyond its window for a rollback: record_past is refused (spec 3's OP-RECORD)."""
    if cfg.get("max_write") is not None:
        raise ValueError(f"SCOPE-BORDER: mlx-lm's caches have no max_write (got {cfg['max_write']!r})")
    if cfg.get("record_past"):
        raise ValueError(f"SCOPE-BORDER: mlx-lm's rings do not record their past (got {cfg['record_past']!r})")
    layers: list[dict[str, Any]] = list(cfg["layers"])
    return layers if len(layers) == cfg["n_layers"] else layers * cfg["n_layers"]


def _numpy(value: Any) -> Any:
    import numpy as np

    return np.array(value)


def attended_rows(mask: Any, q_len: int, rows: int) -> Any:
    """What mx.fast.scaled_dot_product_attention attends under the model's mask: a bool [q_len, rows] array."""
    import numpy as np

    if mask is None:
        return np.ones((q_len, rows), dtype=bool)
    if isinstance(mask, str):   # "causal": lower-right aligned
        return np.arange(rows)[None, :] <= (rows - q_len + np.arange(q_len))[:, None]
    array = _numpy(mask)
    if array.dtype != np.bool_:   # an additive mask: -inf where not attended
        array = array > np.finfo(array.dtype).min / 2
    return np.broadcast_to(array, (*array.shape[:-2], q_len, rows)).reshape(-1, q_len, rows)[0].copy()


class MlxCaches:
    """One mlx-lm cache object per layer, served one layer call at a time as the model's forward serves them.
    `make_mask(layer, q_len)` is the mask the model builds for that layer's kind."""

    kvcache_layout = "op-contiguous"

    def __init__(self, caches: list[Any], make_mask: Callable[[Any, int], Any], dequantize: bool = False) -> None:
        self.caches, self.make_mask, self.dequantize = caches, make_mask, dequantize

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> tuple[Any, Any, SimpleNamespace]:
        mx = _mx()
        cache = self.caches[layer_id]
        q_len = k.shape[-2]
        mask = self.make_mask(cache, q_len)
        keys, values = cache.update_and_fetch(mx.array(k), mx.array(v))
        if self.dequantize or isinstance(keys, (tuple, list)):
            keys = mx.dequantize(*keys, group_size=cache.group_size, bits=cache.bits)
            values = mx.dequantize(*values, group_size=cache.group_size, bits=cache.bits)
        keys, values = _numpy(keys), _numpy(values)
        return keys, values, SimpleNamespace(kind="EXPLICIT", mask=attended_rows(mask, q_len, keys.shape[-2]))

    def used(self, layer_id: int) -> int:
        return int(self.caches[layer_id].offset)

    def reset(self) -> None:
        """mlx-lm has no reset: a new conversation gets new caches, built as these were."""
        self.caches = [_copy_empty(cache) for cache in self.caches]


class MlxTrimmableCaches(MlxCaches):
    def trim(self, n: int) -> None:
        """trim_prompt_cache(cache, n): it answers how many tokens it trimmed (0, trimming nothing, where
        can_trim_prompt_cache says no); an answer other than n is the library's refusal, raised as one."""
        trimmed = _cache_module().trim_prompt_cache(self.caches, n)
        if trimmed != n:
            raise RuntimeError(f"trim_prompt_cache(cache, {n}) trimmed {trimmed}")


class MlxSavedCaches(MlxTrimmableCaches):
    """Prompt caches saved and loaded as mlx-lm's users do (OP-STATE), through its two commands:
    `mlx_lm.cache_prompt` writes `save_prompt_cache(file, cache, metadata)` with metadata["model"] the model it
    ran (cache_prompt.py:143-146); `mlx_lm.generate --prompt-cache-file` reads `load_prompt_cache(file,
    return_metadata=True)` and raises ValueError when the model it is given is not metadata["model"]
    (generate.py:2041-2069), then uses the loaded caches in place of new ones. Here the model is named by the
    suite's config (the model a cache is built for: its layers, windows, capacity), and that check is the only one
    made here; the state's bytes are that safetensors file's. What load_prompt_cache raises is the refusal, and a
    raise leaves the old caches in use, as the caller's assignment never happens."""

    def __init__(self, caches: list[Any], make_mask: Callable[[Any, int], Any], model: str) -> None:
        super().__init__(caches, make_mask)
        self.model = model

    def state(self) -> bytes:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "prompt_cache.safetensors")
            _cache_module().save_prompt_cache(str(path), self.caches, {"model": self.model})
            return path.read_bytes()

    def load_state(self, data: Any) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "prompt_cache.safetensors")
            path.write_bytes(data)
            caches, metadata = _cache_module().load_prompt_cache(str(path), return_metadata=True)
        if metadata.get("model") != self.model:   # generate.py:2065-2069's words
            raise ValueError(f"Providing a different model ({self.model}) than that used to create the prompt cache "
                             f"({metadata.get('model')}) is an error.")
        self.caches = caches


class MlxQuantizableCaches(MlxTrimmableCaches):
    """KVCache per layer, as make_prompt_cache builds them, that generate_step quantizes mid-generation
    (OP-QUANTIZE): `quantize(bits)` is mlx_lm/generate.py:305-310's maybe_quantize_kv_cache(prompt_cache,
    quantized_kv_start, kv_group_size, kv_bits), which generate_step calls after every forward
    (generate.py:388-391): each cache with a `to_quantized` whose offset reached quantized_kv_start is replaced by
    `c.to_quantized(group_size=kv_group_size, bits=kv_bits)` (cache.py:396-404). Here quantized_kv_start is 0 (the
    step the suite quantizes at is the one the caller's flag names) and kv_group_size generate's default, 64
    (generate.py:325, --kv-group-size). From then on each layer is a QuantizedKVCache, read dequantized as
    quantized attention reads it (update_and_fetch above). Nothing is validated: what mx.quantize raises is the
    refusal, and a cache it already replaced stays replaced (the caller's list is changed in place)."""

    def quantize(self, bits: int) -> None:
        generate = importlib.import_module("mlx_lm.generate")
        generate.maybe_quantize_kv_cache(self.caches, quantized_kv_start=0, kv_group_size=KV_GROUP_SIZE,
                                         kv_bits=bits)


def _copy_empty(cache: Any) -> Any:
    """A new cache of the same class and construction arguments (what a caller makes for a new conversation)."""
    module = _cache_module()
    if isinstance(cache, module.RotatingKVCache):
        return module.RotatingKVCache(max_size=cache.max_size, keep=cache.keep)
    if isinstance(cache, module.QuantizedKVCache):
        return module.QuantizedKVCache(group_size=cache.group_size, bits=cache.bits)
    if isinstance(cache, module.ChunkedKVCache):
        return module.ChunkedKVCache(cache.chunk_size)
    return type(cache)()


def _default_mask(window: Optional[int] = None) -> Callable[[Any, int], Any]:
    """models/base.py's create_attention_mask(h, cache, window_size=window): the cache's own make_mask."""
    def make_mask(cache: Any, q_len: int) -> Any:
        base = importlib.import_module("mlx_lm.models.base")
        return base.create_attention_mask(SimpleNamespace(shape=(1, q_len)), cache, window_size=window)
    return make_mask


def _chunk_mask(chunk_size: int) -> Callable[[Any, int], Any]:
    """llama4's forward: trim the chunked cache's front, then its chunk mask over [start_position, offset + q_len)."""
    def make_mask(cache: Any, q_len: int) -> Any:
        mx = _mx()
        cache.maybe_trim_front()
        end = cache.offset + q_len
        linds = mx.arange(cache.start_position, end)
        rinds = mx.arange(cache.offset, end)[:, None]
        block_pos = mx.abs((linds // chunk_size) - (rinds // chunk_size))
        return (block_pos == 0) & (linds <= rinds)
    return make_mask


def _only(cfg: JsonConfig, kind: str) -> list[dict[str, Any]]:
    policies = _policies(cfg)
    if any(entry["kind"] != kind for entry in policies):
        raise ValueError(f"SCOPE-BORDER: this setup serves {kind} layers only, the config has "
                         f"{[entry['kind'] for entry in policies]}")
    return policies


def _kv(cfg: JsonConfig) -> Any:
    return MlxTrimmableCaches([_cache_module().KVCache() for _ in _only(cfg, "flat")], _default_mask())


def _kv_to_quantized(cfg: JsonConfig) -> Any:
    return MlxQuantizableCaches([_cache_module().KVCache() for _ in _only(cfg, "flat")], _default_mask())


def _concatenate(cfg: JsonConfig) -> Any:
    return MlxTrimmableCaches([_cache_module().ConcatenateKVCache() for _ in _only(cfg, "flat")], _default_mask())


def _quantized(cfg: JsonConfig) -> Any:
    module = _cache_module()
    caches = [module.QuantizedKVCache(group_size=QUANTIZED_GROUP_SIZE, bits=QUANTIZED_BITS) for _ in _only(cfg, "flat")]
    return MlxTrimmableCaches(caches, _default_mask(), dequantize=True)


def _chunked(cfg: JsonConfig) -> Any:
    """llama4's chunked layers within one chunk. Chunked attention (a query sees only its own chunk) is no layer
    kind of the op face, so the chunk is set past every position a run reaches (CHUNK): what is judged is what
    ChunkedKVCache serves inside a chunk - a flat, growing, trimmable history - and a chunk boundary is never
    crossed (docs/mlxlm-findings.md, "What the op face cannot say")."""
    module = _cache_module()
    return MlxTrimmableCaches([module.ChunkedKVCache(CHUNK) for _ in _only(cfg, "flat")], _chunk_mask(CHUNK))


def _llama4_chunked(cfg: JsonConfig) -> Any:
    """llama4's make_cache and forward (mlx_lm/models/llama4.py:318-325, 228-254): a chunked layer is
    ChunkedKVCache(attention_chunk_size), its mask llama4's chunk mask after the front is trimmed; a global layer is
    KVCache, its mask create_attention_mask's. The config's chunk is the model's attention_chunk_size, one per model;
    llama4 puts a global layer every fourth, the suite's configs anywhere (each layer is its own cache either way)."""
    module = _cache_module()
    policies = _policies(cfg)
    chunks = {entry.get("chunk") for entry in policies if entry["kind"] == "chunk"}
    if len(chunks) > 1 or any(entry["kind"] not in ("chunk", "flat") for entry in policies):
        raise ValueError(f"SCOPE-BORDER: llama4 has one attention_chunk_size and no sliding layers, the config asks "
                         f"for {policies}")
    chunk = chunks.pop() if chunks else None
    caches = [module.ChunkedKVCache(entry["chunk"]) if entry["kind"] == "chunk" else module.KVCache()
              for entry in policies]
    chunked, full = (_chunk_mask(chunk) if chunk is not None else _default_mask()), _default_mask()
    return MlxTrimmableCaches(caches, lambda cache, q_len: (
        chunked if isinstance(cache, module.ChunkedKVCache) else full)(cache, q_len))


def _llama_sliding_caches(cfg: JsonConfig, saved: bool = False) -> Any:
    """llama.py's make_cache and forward: one sliding_window for every sliding layer, its mask from a sliding cache."""
    module = _cache_module()
    policies = _policies(cfg)
    windows = {entry["window"] for entry in policies if entry["kind"] == "ring"}
    if len(windows) > 1 or any(entry.get("keep", 0) for entry in policies):
        raise ValueError(f"SCOPE-BORDER: llama has one sliding_window and no sinks, the config asks for {policies}")
    if any(entry["kind"] not in ("flat", "ring") for entry in policies):
        raise ValueError(f"SCOPE-BORDER: llama has full and sliding layers only, the config asks for {policies}")
    window = windows.pop() if windows else None
    caches = [module.RotatingKVCache(max_size=entry["window"]) if entry["kind"] == "ring" else module.KVCache()
              for entry in policies]
    full, sliding = _default_mask(), _default_mask(window)

    def make_mask(cache: Any, q_len: int) -> Any:
        return (sliding if isinstance(cache, module.RotatingKVCache) else full)(cache, q_len)
    if saved:
        return MlxSavedCaches(caches, make_mask, json.dumps(cfg, sort_keys=True))
    return MlxTrimmableCaches(caches, make_mask)


def _llama_sliding(cfg: JsonConfig) -> Any:
    return _llama_sliding_caches(cfg)


def _llama_sliding_saved(cfg: JsonConfig) -> Any:
    """llama's make_cache, its prompt cache saved to a file and loaded back (MlxSavedCaches)."""
    return _llama_sliding_caches(cfg, saved=True)


def _prompt_cache(cfg: JsonConfig, saved: bool = False) -> Any:
    """make_prompt_cache(model, max_kv_size=w) for a model without make_cache: every layer a ring of w, keep 4.
    The model is what make_prompt_cache reads of one (its layers); the mask is llama's full-attention one."""
    policies = _only(cfg, "ring")
    sizes = {(entry["window"], entry.get("keep", 0)) for entry in policies}
    if len(sizes) > 1 or next(iter(sizes))[1] != PROMPT_CACHE_KEEP:
        raise ValueError(f"SCOPE-BORDER: make_prompt_cache builds rings of one max_kv_size with keep "
                         f"{PROMPT_CACHE_KEEP}, the config asks for {policies}")
    model = SimpleNamespace(layers=[None] * cfg["n_layers"])
    caches = _cache_module().make_prompt_cache(model, max_kv_size=policies[0]["window"])
    if saved:
        return MlxSavedCaches(caches, _default_mask(), json.dumps(cfg, sort_keys=True))
    return MlxTrimmableCaches(caches, _default_mask())


def _prompt_cache_saved(cfg: JsonConfig) -> Any:
    """`mlx_lm.cache_prompt --max-kv-size w` then `mlx_lm.generate --prompt-cache-file`: make_prompt_cache's rings
    saved and loaded through a file (MlxSavedCaches)."""
    return _prompt_cache(cfg, saved=True)


TRIMMABLE = ("flat", *COMMON_SCOPE, "unbounded", "trim")
kv = library_target("kv", _kv, TRIMMABLE, "KVCache per layer (make_prompt_cache without max_kv_size).")
llama_sliding = library_target("llama_sliding", _llama_sliding, ("flat", "ring", *COMMON_SCOPE, "unbounded", "trim"),
                         "llama's make_cache: KVCache full layers, RotatingKVCache(max_size=sliding_window) sliding ones.")
# Its ring's window is the user's own flag (`mlx_lm.generate --max-kv-size`, passed on unchecked), not model code's:
# `user-config=window` keeps the invalid windows in what is sent (a window of 4 or less under keep 4).
prompt_cache = library_target("prompt_cache", _prompt_cache, ("ring", "sinks", f"keep={PROMPT_CACHE_KEEP}", *COMMON_SCOPE,
                                                       "user-config=window", "unbounded", "trim"),
                        "make_prompt_cache(model, max_kv_size=window): RotatingKVCache(window, keep=4) per layer.")
# mx.quantize takes widths that are multiples of the group size only: the suite's MLA configs (a value width of
# head_dim + 1) are outside what it serves, so `mla` is not declared.
quantized = library_target("quantized", _quantized, ("flat", "batch", "trusted-args", "lazy-shapes", "unbounded", "trim",
                                               f"lossy={QUANTIZED_TOLERANCE}", f"min_head_dim={QUANTIZED_GROUP_SIZE}"),
                     "QuantizedKVCache(group_size=64, bits=8) per layer (mlx-lm's defaults).")
chunked = library_target("chunked", _chunked, TRIMMABLE,
                   "llama4's ChunkedKVCache(chunk_size=CHUNK) per layer, with llama4's chunk mask, within one chunk.")
concatenate = library_target("concatenate", _concatenate, TRIMMABLE, "ConcatenateKVCache per layer.")
# Spec 3's chunk layer is llama4's chunked attention: ChunkedKVCache is trimmable whatever it dropped (cache.py:786).
llama4_chunked = library_target("llama4_chunked", _llama4_chunked,
                                ("flat", "chunk", *COMMON_SCOPE, "unbounded", "trim"),
                                "llama4's make_cache: ChunkedKVCache(attention_chunk_size) on chunked layers, with "
                                "llama4's chunk mask; KVCache on global ones.", spec=3)
# Spec 3's saved state is mlx-lm's prompt cache file (save_prompt_cache / load_prompt_cache).
llama_sliding_saved = library_target("llama_sliding_saved", _llama_sliding_saved,
                                     ("flat", "ring", *COMMON_SCOPE, "unbounded", "trim", "state"),
                                     "llama's make_cache, saved with save_prompt_cache and loaded with "
                                     "load_prompt_cache through a file.", spec=3)
prompt_cache_saved = library_target("prompt_cache_saved", _prompt_cache_saved,
                                    ("ring", "sinks", f"keep={PROMPT_CACHE_KEEP}", *COMMON_SCOPE, "user-config=window",
                                     "unbounded", "trim", "state"),
                                    "make_prompt_cache(model, max_kv_size=window), saved with save_prompt_cache and "
                                    "loaded with load_prompt_cache through a file.", spec=3)

# Spec 4's quantize is generate's --kv-bits: KVCache.to_quantized(group_size=64, bits) mid-generation. mx.quantize
# takes widths that are multiples of the group size only (as `quantized`): min_head_dim=64, and no `mla`.
kv_to_quantized = library_target("kv_to_quantized", _kv_to_quantized,
                                 ("flat", "batch", "trusted-args", "lazy-shapes", "unbounded", "trim", "quantize",
                                  f"min_head_dim={KV_GROUP_SIZE}"),
                                 "KVCache per layer, quantized mid-generation as generate_step's "
                                 "maybe_quantize_kv_cache does (to_quantized(group_size=64, bits)).", spec=4)

TARGETS = ("kv", "llama_sliding", "prompt_cache", "quantized", "chunked", "concatenate", "llama4_chunked",
           "llama_sliding_saved", "prompt_cache_saved", "kv_to_quantized")
