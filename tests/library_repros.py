"""Standalone repros of the real defects the op-face suite finds in transformers' and mlx-lm's caches
(docs/hf-findings.md, docs/mlxlm-findings.md): each goes through the library's own model code, a tiny
random-weight model built from a config (no weights downloaded), and answers what a user meets - the error, or
how far the cached forward's logits are from the same tokens run without a cache. Nothing here uses the suite.

    python -m tests.library_repros          # every repro whose library is installed, one line each
"""

from __future__ import annotations

import importlib
import importlib.util   # `import importlib` alone does not load it: find_spec below needs it
from typing import Any, Callable

SEED = 0
VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 32, 2, 1, 16


# --- transformers ------------------------------------------------------------------------------------------------
def _hf_model(kind: str, head_dim: int = HEAD_DIM, **config: Any) -> Any:
    import torch
    transformers = importlib.import_module("transformers")

    torch.manual_seed(SEED)
    Config = getattr(transformers, f"{kind}Config")
    Model = getattr(transformers, f"{kind}ForCausalLM")
    cfg = Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                 num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=head_dim,
                 attn_implementation="sdpa", **config)
    return Model(cfg).eval()


def _hf_tokens(n: int) -> Any:
    import torch

    return torch.arange(3, 3 + n).reshape(1, n) % VOCAB


def hf_static_overflow() -> dict[str, Any]:
    """StaticLayer.update counts a step before writing it: an overflowing step raises IndexError after
    `cumulative_length` grew, and every later step raises too, even one that fits."""
    import torch
    transformers = importlib.import_module("transformers")

    model = _hf_model("Llama")
    cache = transformers.StaticCache(config=model.config, max_cache_len=4)
    ids = _hf_tokens(6)
    with torch.no_grad():
        model(ids[:, :3], past_key_values=cache, use_cache=True)
        out: dict[str, Any] = {"held_before": int(cache.get_seq_length())}
        try:
            model(ids[:, 3:5], past_key_values=cache, use_cache=True)   # 3 + 2 > 4: refused
            out["overflow"] = "accepted"
        except Exception as error:   # what the user meets
            out["overflow"] = type(error).__name__
        out["held_after_refusal"] = int(cache.get_seq_length())
        try:
            model(ids[:, 3:4], past_key_values=cache, use_cache=True)   # 3 + 1 <= 4: fits
            out["fitting_step_after"] = "served"
        except Exception as error:
            out["fitting_step_after"] = type(error).__name__
    return out


def hf_static_zero_length() -> dict[str, Any]:
    """StaticCache(max_cache_len=0) - a user's own argument when building a static cache for torch.compile - is
    built without a word; the first forward through it then raises a RuntimeError about storage sizes."""
    import torch
    transformers = importlib.import_module("transformers")

    model = _hf_model("Llama")
    cache = transformers.StaticCache(config=model.config, max_cache_len=0)
    out: dict[str, Any] = {"built": True}
    with torch.no_grad():
        try:
            model(_hf_tokens(1), past_key_values=cache, use_cache=True)
            out["first_token"] = "served"
        except Exception as error:   # what the user meets, far from the argument that caused it
            out["first_token"] = type(error).__name__
    return out


def _last_logits_gap(model: Any, cache: Any, prefill: int, decode: int) -> float:
    """The largest difference between the cached decode's logits and the same tokens run at once, no cache."""
    import torch

    ids = _hf_tokens(prefill + decode)
    with torch.no_grad():
        model(ids[:, :prefill], past_key_values=cache, use_cache=True)
        for i in range(prefill, prefill + decode):
            cached = model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0, -1]
        full = model(ids, use_cache=False).logits[0, -1]
    return float((cached - full).abs().max())


def hf_sliding_window_one() -> dict[str, Any]:
    """DynamicSlidingWindowLayer(sliding_window=1) never trims (`[-1 + 1:]` is `[0:]`): a decode attends the
    whole history; a 2-token step after it raises in SDPA."""
    import torch
    transformers = importlib.import_module("transformers")

    model = _hf_model("Mistral", sliding_window=1)
    gap = _last_logits_gap(model, transformers.DynamicCache(config=model.config), prefill=3, decode=1)
    cache = transformers.DynamicCache(config=model.config)
    ids = _hf_tokens(5)
    with torch.no_grad():
        model(ids[:, :1], past_key_values=cache, use_cache=True)
        try:
            model(ids[:, 1:3], past_key_values=cache, use_cache=True)
            two_token_step = "served"
        except Exception as error:
            two_token_step = type(error).__name__
    return {"decode_logits_gap": gap, "two_token_step": two_token_step}


def hf_sliding_crop_before_any_token() -> dict[str, Any]:
    """DynamicSlidingWindowLayer.crop on a layer that holds nothing (a new cache, or one just reset) reads
    `self.keys.shape` of keys that are None: AttributeError, even for crop(0)."""
    transformers = importlib.import_module("transformers")

    model = _hf_model("Mistral", sliding_window=3)
    cache = transformers.DynamicCache(config=model.config)
    try:
        cache.crop(0)
        return {"crop(0) of a new cache": "served"}
    except Exception as error:
        return {"crop(0) of a new cache": type(error).__name__}


def hf_static_sliding_past_max_cache_len() -> dict[str, Any]:
    """StaticCache's sliding layers hold min(sliding_window, max_cache_len) rows: with a window larger than
    max_cache_len, a decode past max_cache_len silently drops tokens still inside its window."""
    transformers = importlib.import_module("transformers")

    model = _hf_model("Mistral", sliding_window=4)
    cache = transformers.StaticCache(config=model.config, max_cache_len=3)
    return {"decode_logits_gap": _last_logits_gap(model, cache, prefill=3, decode=1)}


def hf_quantized_crop() -> dict[str, Any]:
    """QuantizedCache says `is_croppable` (its layers inherit DynamicLayer's flag, and its `crop`), so assisted
    decoding crops it; after a forward, `crop(-1)` raises and the held length stays. A head_dim of 64: the
    backends quantize groups of 64 channels."""
    import torch
    transformers = importlib.import_module("transformers")

    out: dict[str, Any] = {}
    for backend in ("quanto", "hqq", "fp8"):
        model = _hf_model("Llama", head_dim=64)
        cache = transformers.QuantizedCache(backend, model.config)
        with torch.no_grad():
            model(_hf_tokens(3), past_key_values=cache, use_cache=True)
        try:
            cache.crop(-1)
            cropped = "served"
        except Exception as error:   # what assisted decoding meets
            cropped = type(error).__name__
        out[backend] = {"is_croppable": bool(cache.is_croppable), "crop(-1)": cropped,
                        "held_after": int(cache.get_seq_length())}
    return out


def _hf_step(model: Any, ids: Any, cache: Any) -> str:
    """One forward through the cache: 'served', or the error's type a user meets."""
    import torch

    with torch.no_grad():
        try:
            model(ids, past_key_values=cache, use_cache=True)
            return "served"
        except Exception as error:
            return type(error).__name__


def hf_rows_after_crop_to_empty() -> dict[str, Any]:
    """DynamicLayer.batch_repeat_interleave / batch_select_indices skip a layer holding no rows, but a layer that
    `crop` emptied still holds tensors of the old batch size: the next forward of the new batch raises."""
    transformers = importlib.import_module("transformers")

    model = _hf_model("Llama")
    out: dict[str, Any] = {}
    for verb, before, after in (("batch_repeat_interleave(2)", 1, 2), ("batch_select_indices([0])", 2, 1)):
        cache = transformers.DynamicCache(config=model.config)
        _hf_step(model, _hf_tokens(1).repeat(before, 1), cache)
        cache.crop(-1)   # every token given back: the layers are empty, still initialized
        if after > before:
            cache.batch_repeat_interleave(2)
        else:
            cache.batch_select_indices(_long_tensor([0]))
        out[verb] = {"held": int(cache.get_seq_length()),
                     f"next forward of batch {after}": _hf_step(model, _hf_tokens(1).repeat(after, 1), cache)}
    return out


def _long_tensor(values: list[int]) -> Any:
    import torch

    return torch.tensor(values, dtype=torch.long)


def hf_quantized_rows() -> dict[str, Any]:
    """QuantizedCache's layers inherit DynamicLayer's batch_select_indices and batch_repeat_interleave, which move
    `self.keys` - for a quantized layer the residual, an empty 1-d tensor once a prompt is quantized - and never
    the quantized states: select raises IndexError, repeat leaves the quantized rows at the old batch size (the
    next forward of the repeated batch raises). A head_dim of 64: the backends quantize groups of 64 channels."""
    transformers = importlib.import_module("transformers")

    out: dict[str, Any] = {}
    model = _hf_model("Llama", head_dim=64)
    for backend in ("quanto", "hqq", "fp8"):
        cache = transformers.QuantizedCache(backend, model.config)
        _hf_step(model, _hf_tokens(3).repeat(2, 1), cache)
        try:
            cache.batch_select_indices(_long_tensor([0]))
            selected = "served"
        except Exception as error:
            selected = type(error).__name__
        cache = transformers.QuantizedCache(backend, model.config)
        _hf_step(model, _hf_tokens(3), cache)
        cache.batch_repeat_interleave(2)
        out[backend] = {"batch_select_indices([0])": selected,
                        "forward of batch 2 after batch_repeat_interleave(2)": _hf_step(model, _hf_tokens(1).repeat(2, 1),
                                                                                       cache)}
    return out


# --- mlx-lm ------------------------------------------------------------------------------------------------------
def _mlx_model(kind: str = "llama", **args: Any) -> Any:
    """A tiny random-weight model of mlx-lm's `kind` (llama has make_cache; qwen2 has none, so make_prompt_cache
    builds its caches itself)."""
    mx = importlib.import_module("mlx.core")
    module = importlib.import_module(f"mlx_lm.models.{kind}")

    mx.random.seed(SEED)
    model = module.Model(module.ModelArgs(model_type=kind, hidden_size=HIDDEN, num_hidden_layers=2,
                                          intermediate_size=2 * HIDDEN, num_attention_heads=HEADS, rms_norm_eps=1e-5,
                                          vocab_size=VOCAB, num_key_value_heads=KV_HEADS, **args))
    mx.eval(model.parameters())
    return model


def _mlx_tokens(n: int) -> Any:
    mx = importlib.import_module("mlx.core")

    return (mx.arange(3, 3 + n) % VOCAB).reshape(1, n)


def mlx_prompt_cache_small_ring() -> dict[str, Any]:
    """make_prompt_cache(model, max_kv_size=4) builds RotatingKVCache(max_size=4, keep=4): keep >= max_size.
    Once the ring is full a decode writes at index keep = 4, past the buffer's end: the token is never stored
    (no later query attends it; not even its own query does); a multi-token step then raises."""
    import numpy as np
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model = _mlx_model("qwen2")
    cache = cache_module.make_prompt_cache(model, max_kv_size=4)
    ids = _mlx_tokens(8)
    mx.eval(model(ids[:, :4], cache=cache))
    before = np.array(cache[0].keys)
    for i in range(4, 6):
        mx.eval(model(ids[:, i:i + 1], cache=cache))
    after = np.array(cache[0].keys)
    stored = sum(not any(np.array_equal(row, old) for old in before[0, 0]) for row in after[0, 0])
    out: dict[str, Any] = {"keep": cache[0].keep, "max_size": cache[0].max_size, "decoded_rows_stored": int(stored)}
    try:
        mx.eval(model(ids[:, 6:8], cache=cache))
        out["two_token_step"] = "served"
    except Exception as error:
        out["two_token_step"] = type(error).__name__
    return out


def mlx_prompt_cache_prefill_ignores_sinks() -> dict[str, Any]:
    """RotatingKVCache(max_size=6, keep=4), as make_prompt_cache(max_kv_size=6) builds it: a step longer than the
    ring gets create_causal_mask(N, offset, window_size=max_size), a plain window that ignores the 4 sinks, while
    a decode attends the sinks. The same 9 tokens give another last logit prefilled at once than decoded last."""
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model = _mlx_model("qwen2")
    ids = _mlx_tokens(9)
    at_once = model(ids, cache=cache_module.make_prompt_cache(model, max_kv_size=6))[0, -1]
    cache = cache_module.make_prompt_cache(model, max_kv_size=6)
    model(ids[:, :8], cache=cache)
    decoded = model(ids[:, 8:], cache=cache)[0, -1]
    return {"last_logits_gap": float(mx.abs(at_once - decoded).max())}


def _mlx_gap(model: Any, cache: list[Any], ids: Any) -> float:
    mx = importlib.import_module("mlx.core")

    cached = model(ids[:, -1:], cache=cache)[0, -1]
    full = model(ids)[0, -1]
    return float(mx.abs(cached - full).max())


def mlx_concatenate_trim() -> dict[str, Any]:
    """ConcatenateKVCache.trim lowers `offset` only: the next update concatenates onto the untrimmed rows, so
    the trimmed tokens come back into every later attention."""
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model = _mlx_model()
    cache = [cache_module.ConcatenateKVCache() for _ in model.layers]
    ids = _mlx_tokens(6)
    model(ids[:, :5], cache=cache)
    trimmed = cache_module.trim_prompt_cache(cache, 2)   # speculative decoding's rollback of 2 rejected tokens
    mx = importlib.import_module("mlx.core")
    following = mx.concatenate([ids[:, :3], mx.array([[7]])], axis=1)   # the 3 kept tokens, then another
    return {"trimmed": trimmed, "decode_logits_gap": _mlx_gap(model, cache, following)}


def mlx_rotating_trim_after_wrap() -> dict[str, Any]:
    """RotatingKVCache says it is trimmable while offset < max_size; a multi-token step grows it past
    max_size without wrapping, and trim then lowers `offset` and `_idx` over rows in temporal order."""
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model = _mlx_model()
    cache = [cache_module.RotatingKVCache(max_size=4) for _ in model.layers]
    ids = _mlx_tokens(8)
    model(ids[:, :3], cache=cache)
    model(ids[:, 3:4], cache=cache)
    model(ids[:, 4:5], cache=cache)   # wraps: the ring overwrote position 0
    trimmable = cache_module.can_trim_prompt_cache(cache)
    return {"trimmable_after_wrap": trimmable}


def mlx_negative_trim() -> dict[str, Any]:
    """KVCache.trim(-n) is min(offset, -n) = -n: offset grows over rows never written."""
    cache_module = importlib.import_module("mlx_lm.models.cache")
    mx = importlib.import_module("mlx.core")

    cache = cache_module.KVCache()
    cache.update_and_fetch(mx.ones((1, 1, 2, 4)), mx.ones((1, 1, 2, 4)))
    answered = cache.trim(-3)
    return {"answered": answered, "offset": cache.offset}


def mlx_chunked_trim_after_slide() -> dict[str, Any]:
    """ChunkedKVCache is always trimmable, also after maybe_trim_front dropped its front."""
    cache_module = importlib.import_module("mlx_lm.models.cache")
    mx = importlib.import_module("mlx.core")

    cache = cache_module.ChunkedKVCache(2)
    cache.update_and_fetch(mx.ones((1, 1, 3, 4)), mx.ones((1, 1, 3, 4)))
    cache.maybe_trim_front()
    return {"start_position": cache.start_position, "trimmable": cache.is_trimmable()}


def _mlx_llama4(chunk: int) -> Any:
    """A tiny random-weight llama4 text model: 4 layers, so make_cache builds ChunkedKVCache(chunk) on layers 0-2
    and KVCache on the global layer 3; no MoE layer (interleave_moe_layer_step 5 > the layer count)."""
    mx = importlib.import_module("mlx.core")
    llama4 = importlib.import_module("mlx_lm.models.llama4")

    mx.random.seed(SEED)
    text = dict(attention_bias=False, attention_chunk_size=chunk, head_dim=HEAD_DIM, hidden_size=HIDDEN,
                interleave_moe_layer_step=5, intermediate_size=2 * HIDDEN, intermediate_size_mlp=2 * HIDDEN,
                max_position_embeddings=128, model_type="llama4_text", num_attention_heads=HEADS,
                num_experts_per_tok=1, num_hidden_layers=4, num_key_value_heads=KV_HEADS, num_local_experts=1,
                rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0, use_qk_norm=False, vocab_size=VOCAB)
    model = llama4.Model(llama4.ModelArgs(model_type="llama4", text_config=text))
    mx.eval(model.parameters())
    return model


def _mlx_rollback_gap(model: Any, steps: list[int], n: int) -> dict[str, Any]:
    """`steps` tokens forwarded step by step through model.make_cache(), then trim_prompt_cache(cache, n) - the
    server's LRUPromptCache.fetch_nearest_cache and speculative decoding roll back so and do not read its answer
    (models/cache.py:1661-1665, generate.py:598) - then a new token: the gap of its logits to the kept tokens and
    it run without a cache."""
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model_cache = model.make_cache()
    ids = _mlx_tokens(sum(steps))
    start = 0
    for size in steps:
        model(ids[:, start:start + size], cache=model_cache)
        start += size
    trimmed = cache_module.trim_prompt_cache(model_cache, n)
    following = mx.concatenate([ids[:, :start - n], mx.array([[7]])], axis=1)
    return {"trimmed": trimmed, "offsets": [c.offset for c in model_cache],
            "decode_logits_gap": _mlx_gap(model, model_cache, following)}


def mlx_llama4_trim_across_chunk() -> dict[str, Any]:
    """llama4 with a chunk of 3: 4 tokens, then a decode, whose forward first slides the chunked caches' front
    (maybe_trim_front drops position 0: start_position 1); trim_prompt_cache(cache, 3) back to 2 tokens answers 3,
    and the next token, at position 2, attends its chunk [0, 2] without position 0. The control: the same 5 tokens
    in one step slide nothing, and the same trim is right."""
    model = _mlx_llama4(3)
    return {"after_a_slide": _mlx_rollback_gap(model, [4, 1], 3), "without_a_slide": _mlx_rollback_gap(model, [5], 3)}


def mlx_llama4_partial_trim() -> dict[str, Any]:
    """llama4 with a chunk of 3: 5 tokens, then a decode (the front slides to start_position 2); a rollback of 5
    trims the chunked layers by offset - start_position = 4 only and the global layer by 5: trim_prompt_cache
    answers the first cache's 4, its layers now disagree on the length, and the next token is placed at 2 on the
    chunked layers."""
    return _mlx_rollback_gap(_mlx_llama4(3), [5, 1], 5)


def mlx_prompt_cache_changed_byte() -> dict[str, Any]:
    """save_prompt_cache of a KVCache holding two tokens (K 1.0), one byte of row 0's K changed in the file:
    load_prompt_cache loads it as whole, the row reads back changed (no checksum: not a defect, the format's
    design; the findings page's `state_unchecked`)."""
    import json
    import os
    import struct
    import tempfile

    import numpy as np
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")

    cache = cache_module.KVCache()
    cache.update_and_fetch(mx.ones((1, 1, 2, 1)), mx.ones((1, 1, 2, 1)))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "prompt_cache.safetensors")
        cache_module.save_prompt_cache(path, [cache])
        data = open(path, "rb").read()
        header = struct.unpack("<Q", data[:8])[0]
        at = 8 + header + json.loads(data[8:8 + header])["0.0"]["data_offsets"][0] + 3   # row 0's K, its top byte
        with open(path, "wb") as file:
            file.write(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
        loaded = cache_module.load_prompt_cache(path)[0]
    return {"offset": loaded.offset, "k_rows": np.array(loaded.keys)[0, 0, :2, 0].tolist()}


def _mlx_row(mx: Any, low: int, width: int = 64) -> Any:
    return mx.arange(low, low + width, dtype=mx.float32).reshape(1, 1, 1, width)


def mlx_to_quantized_bound() -> dict[str, Any]:
    """generate_step's --kv-bits mid-generation (maybe_quantize_kv_cache: KVCache.to_quantized(64, bits)), read
    back as quantized attention reads it (mx.dequantize): a row of 1..64 at 8 bits is off by more than half the
    step mx.quantize's docstring gives, (max - min) / (2 (2^bits - 1)); 4 bits alike."""
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")
    generate = importlib.import_module("mlx_lm.generate")
    out: dict[str, Any] = {}
    for bits in (8, 4):
        row = _mlx_row(mx, 1)
        cache = [cache_module.KVCache()]
        cache[0].update_and_fetch(row, row)
        generate.maybe_quantize_kv_cache(cache, quantized_kv_start=0, kv_group_size=64, kv_bits=bits)
        keys, _ = cache[0].update_and_fetch(row, row)   # the next token, written quantized
        read = mx.dequantize(*keys, group_size=cache[0].group_size, bits=cache[0].bits)
        error = float(mx.abs(read - mx.concatenate([row, row], axis=-2)).max())
        out[bits] = {"error": round(error, 5), "bound": round(63 / (2 * ((1 << bits) - 1)), 5)}
    return out


def mlx_to_quantized_bits7() -> dict[str, Any]:
    """--kv-bits 7: maybe_quantize_kv_cache's to_quantized raises on a cache holding a token; on an empty one it
    builds QuantizedKVCache(bits=7) and the first update raises."""
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")
    generate = importlib.import_module("mlx_lm.generate")
    out: dict[str, Any] = {}
    for held in (1, 0):
        cache = [cache_module.KVCache()]
        row = _mlx_row(mx, 1)
        if held:
            cache[0].update_and_fetch(row, row)
        try:
            generate.maybe_quantize_kv_cache(cache, quantized_kv_start=0, kv_group_size=64, kv_bits=7)
            cache[0].update_and_fetch(row, row)
            out[held] = "served"
        except ValueError:
            out[held] = f"{'quantize' if type(cache[0]).__name__ == 'KVCache' else 'update'}: ValueError"
    return out


def mlx_batch_filter_of_padded_empty_cache() -> dict[str, Any]:
    """BatchKVCache(left_padding=[2, 2]) (its docstring: inputs left-padded, left_padding the amount per row),
    filter([0]) before the first forward: filter's shift of the padding every row has lowers `_idx` although no
    key is stored (cache.py:992-999), to -2; the next forward, the row's left-padded prompt, then raises."""
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model = _mlx_model()
    cache = [cache_module.BatchKVCache([2, 2]) for _ in model.layers]
    for layer in cache:
        layer.filter(mx.array([0]))
    out: dict[str, Any] = {"idx_after_filter": cache[0]._idx}
    try:
        mx.eval(model(_mlx_tokens(3), cache=cache))
        out["forward"] = "served"
    except Exception as error:
        out["forward"] = type(error).__name__
    return out


def mlx_batch_rotating_mask_after_wrap() -> dict[str, Any]:
    """BatchRotatingKVCache(max_size=3, left_padding=[2, 0]): once single-token decodes wrapped the ring, the mask
    of a multi-token step lowers the pads by `_idx - max_size + 1` (cache.py:1316), `_idx` then the ring's write
    index, while the update first puts the ring in temporal order (`_idx` its length) and drops another count
    (cache.py:1144, 1162): row 0's oldest real token is masked as a pad. Row 0's first query of that step gives
    other logits than the same real tokens of row 0 run alone (no pads, the same steps after them)."""
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model = _mlx_model()
    ids = _mlx_tokens(6)
    rows = mx.concatenate([ids, ids + 1])   # row 0: 2 pads then 4 real tokens; row 1: 6 real tokens
    padded = [cache_module.BatchRotatingKVCache(3, [2, 0]) for _ in model.layers]
    for i in range(4):   # positions 0-3 decoded one by one: the ring of 3 wraps
        mx.eval(model(rows[:, i:i + 1], cache=padded))
    batched = model(rows[:, 4:6], cache=padded)[0, 0]   # row 0's query at position 4
    alone = [cache_module.BatchRotatingKVCache(3, [0]) for _ in model.layers]
    for i in range(2, 4):   # row 0's real tokens, the same steps
        mx.eval(model(ids[:, i:i + 1], cache=alone))
    single = model(ids[:, 4:6], cache=alone)[0, 0]
    return {"first_query_logits_gap": float(mx.abs(batched - single).max())}


def mlx_batchgenerator_segments_after_wrap() -> dict[str, Any]:
    """The same defect through BatchGenerator itself: a qwen2 model, max_kv_size=6 (make_prompt_cache's rings,
    merged into BatchRotatingKVCache(6)), two requests of segments 3+1+1+2+1 and 5+1+1+2+1 tokens: the shorter
    prompt is left-padded by 2 (finalize), the one-token segments wrap the ring, the 2-token one is masked wrong.
    The shorter request's first logprobs differ from the same request run alone; the longer one's (no pads) do not."""
    mx = importlib.import_module("mlx.core")
    generate = importlib.import_module("mlx_lm.generate")

    model = _mlx_model("qwen2")

    def first_logprobs(requests: list[list[list[int]]]) -> list[Any]:
        generator = generate.BatchGenerator(model, max_kv_size=6, max_tokens=1)
        uids = generator.insert_segments(requests)
        out: dict[int, Any] = {}
        for _ in range(40):   # a few prompt steps, then one generated token each
            for response in generator.next()[1]:
                out.setdefault(response.uid, response.logprobs)
            if len(out) == len(uids):
                break
        generator.close()
        return [out[uid] for uid in uids]

    short = [[3, 4, 5], [6], [7], [8, 9], [10]]
    long = [[20, 21, 22, 23, 24], [25], [26], [27, 28], [29]]
    batched = first_logprobs([short, long])
    alone = first_logprobs([short])[0], first_logprobs([long])[0]
    return {"padded_request_gap": float(mx.abs(batched[0] - alone[0]).max()),
            "unpadded_request_gap": float(mx.abs(batched[1] - alone[1]).max())}


def mlx_batch_extract_of_empty_cache() -> dict[str, Any]:
    """BatchKVCache.extract / BatchRotatingKVCache.extract of a batch that holds no keys yet (merged from empty
    request caches, as _merge_caches builds it) raises TypeError on `self.keys[...]` (cache.py:1047-1055, 1392-1409),
    changing nothing; BatchGenerator.extract_cache hands an unprocessed request's caches back without extract
    (generate.py:1730-1731), so it never extracts from an empty batch."""
    cache_module = importlib.import_module("mlx_lm.models.cache")
    generate = importlib.import_module("mlx_lm.generate")

    out: dict[str, Any] = {}
    for name, request in (("BatchKVCache", cache_module.KVCache), ("BatchRotatingKVCache",
                                                                   lambda: cache_module.RotatingKVCache(max_size=4))):
        batch = generate._merge_caches([[request()], [request()]])[0]
        try:
            batch.extract(0)
            out[name] = "served"
        except Exception as error:
            out[name] = type(error).__name__
    return out


def mlx_batch_extend_of_other_length() -> dict[str, Any]:
    """BatchKVCache.extend of a batch holding fewer positions is served, right-justified (cache.py:1021-1045, "Pad
    the keys and values so they are right-justified"): BatchGenerator extends its running generation batch with a
    newly prefilled one of other lengths (generate.py:1864, _extend_cache). The shorter batch's rows gain left
    padding, each row keeping its own tokens (offset), so its next logits equal the row's run alone."""
    mx = importlib.import_module("mlx.core")
    cache_module = importlib.import_module("mlx_lm.models.cache")

    model = _mlx_model()
    ids = _mlx_tokens(5)
    long = [cache_module.BatchKVCache([0]) for _ in model.layers]
    short = [cache_module.BatchKVCache([0]) for _ in model.layers]
    mx.eval(model(ids[:, :4], cache=long), model(ids[:, :2] + 1, cache=short))
    for mine, theirs in zip(long, short):
        mine.extend(theirs)
    batched = model(mx.concatenate([ids[:, 4:5], ids[:, 2:3] + 1]), cache=long)[1, 0]
    alone = [cache_module.BatchKVCache([0]) for _ in model.layers]
    mx.eval(model(ids[:, :2] + 1, cache=alone))
    single = model(ids[:, 2:3] + 1, cache=alone)[0, 0]
    return {"left_padding": long[0].left_padding.tolist(), "offset": long[0].offset.tolist(),
            "short_row_logits_gap": float(mx.abs(batched - single).max())}


HF: dict[str, Callable[[], dict[str, Any]]] = {
    "static overflow": hf_static_overflow, "static cache of zero length": hf_static_zero_length,
    "sliding window 1": hf_sliding_window_one,
    "sliding crop before any token": hf_sliding_crop_before_any_token,
    "static sliding past max_cache_len": hf_static_sliding_past_max_cache_len,
    "quantized crop": hf_quantized_crop, "row verbs after a crop to empty": hf_rows_after_crop_to_empty,
    "quantized row verbs": hf_quantized_rows}
MLX: dict[str, Callable[[], dict[str, Any]]] = {
    "make_prompt_cache(max_kv_size=4)": mlx_prompt_cache_small_ring,
    "make_prompt_cache prefill ignores sinks": mlx_prompt_cache_prefill_ignores_sinks,
    "ConcatenateKVCache.trim": mlx_concatenate_trim,
    "RotatingKVCache trim after wrap": mlx_rotating_trim_after_wrap, "negative trim": mlx_negative_trim,
    "ChunkedKVCache trim after slide": mlx_chunked_trim_after_slide,
    "llama4 trim across a chunk": mlx_llama4_trim_across_chunk, "llama4 partial trim": mlx_llama4_partial_trim,
    "prompt cache file with a changed byte": mlx_prompt_cache_changed_byte,
    "BatchKVCache filter of a padded empty cache": mlx_batch_filter_of_padded_empty_cache,
    "BatchRotatingKVCache mask after wrap": mlx_batch_rotating_mask_after_wrap,
    "BatchGenerator segments after a wrap": mlx_batchgenerator_segments_after_wrap,
    "BatchKVCache extract of an empty batch": mlx_batch_extract_of_empty_cache,
    "BatchKVCache extend by a batch of another length": mlx_batch_extend_of_other_length,
    "to_quantized past its bits' half step": mlx_to_quantized_bound, "to_quantized at 7 bits": mlx_to_quantized_bits7}


# library -> the modules its repros import (a library found whose dependency is not - mlx without mlx-cpu's
# libmlx, transformers without torch - is named, not a traceback from inside a repro)
NEEDS = {"transformers": ("torch", "transformers"), "mlx_lm": ("mlx.core", "mlx_lm")}


if __name__ == "__main__":
    for library, repros in (("transformers", HF), ("mlx_lm", MLX)):
        if importlib.util.find_spec(library) is None:
            print(f"{library}: not installed")
            continue
        try:
            for module in NEEDS[library]:
                importlib.import_module(module)
        except ImportError as error:
            print(f"{library}: cannot be imported ({error})")
            continue
        for name, repro in repros.items():
            print(f"{library}: {name}: {repro()}")
