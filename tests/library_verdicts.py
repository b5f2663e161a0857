"""What docs/hf-findings.md and docs/mlxlm-findings.md state of each library target at strict pre-merge: its
verdict, and every distinct cause the suite finds (its class, rule and label), each of a named kind, and each
kind classed with the library's own evidence (issue 41): `defect` - a defect of the library under its documented
use (its standalone repro in tests/library_repros.py named); `stricter` - the spec asks more than the library's
documented contract, with the doc or source line that makes it so (file:line in the installed package); or
`uncertain` - neither the docs nor the source settle it. (`false alarm` - the suite's own reasoning wrong - is a
class too; no shipped cause has it.) The findings pages and the README count "real" as `defect` only.
tests/test_library_targets.py holds every target to exactly these; tests/test_library_pages.py holds the pages
and the README to what is generated here (a kind without a class, or a class without evidence, fails there).

    python -m tests.library_verdicts hf:static_sliding    # the causes a target gives now, as entries to class
    python -m tests.library_verdicts --page hf            # the page's list of causes, by kind, from fresh runs
"""

from __future__ import annotations

import json
import sys
from typing import Any, NamedTuple

PROFILE = "pre-merge"
LIBRARY_MODULES = {"hf": "kvcache_spec.conformance.libraries.hf",
                   "hf_batch": "kvcache_spec.conformance.libraries.hf_batch",
                   "mlxlm": "kvcache_spec.conformance.libraries.mlxlm",
                   "mlxlm_batch": "kvcache_spec.conformance.libraries.mlxlm_batch"}


def cause_key(finding: dict[str, Any]) -> str:
    """A distinct cause as the report names it: class, rule and label (the label holds the failing step), and the
    configuration its program was shrunk to. Not its message: the values a shrunk program ends on may differ
    between two runs of one cause."""
    return f"{finding['class']} {finding['rule']}: {finding['label']} | {finding['config_name']}"


# What each class means on the pages, in the order the pages' tables count them.
CLASSES: dict[str, str] = {
    "defect": "a defect of the library under its documented use (a standalone repro through its own model code)",
    "stricter": "the spec stricter than the library's documented contract (the doc or source line says which)",
    "uncertain": "neither the library's docs nor its source settle whether the library or the spec is right",
    "false alarm": "the suite's own reasoning wrong",
}


class Kind(NamedTuple):
    """One kind of cause: its class (CLASSES), what happens, the library's evidence for the class (file:line in
    the installed package, quoted), and the standalone repro that shows it through the library's own model code."""
    cls: str
    what: str
    evidence: str
    repro: str = ""


HF_CACHE = "transformers/cache_utils.py"
MLX_CACHE = "mlx_lm/models/cache.py"
KINDS: dict[str, Kind] = {
    'static_overflow': Kind(
        "stricter", "StaticLayer.update counts a step before writing it: after an overflow it refuses, every later "
        "step raises too",
        f"{HF_CACHE}:2067-2068, StaticCache's docstring: max_cache_len is \"The maximum number of tokens that this Cache "
        "should hold\": a step past it is outside the contract, and generate() sizes it to max_length; OP-ATOMIC "
        "asks more (a refusal that leaves the cache as it was)", "hf_static_overflow"),
    'static_zero': Kind(
        "uncertain", "StaticCache(max_cache_len=0) or a negative max_cache_len, the user's own argument, is built "
        "unchecked; the first forward raises",
        f"{HF_CACHE}:2067-2068 documents max_cache_len as \"The maximum number of tokens that this Cache should "
        "hold\" with no lower bound, and StaticCache.__init__ checks none: whether 0 is a caller's error the library "
        "owes a check for is not said", "hf_static_zero_length"),
    'static_capacity_type': Kind(
        "stricter", "StaticCache(max_cache_len=...) built with a bool, a float, None or a string "
        "(the user's own argument) is accepted unchecked",
        f"{HF_CACHE}:2067 documents max_cache_len as an `int`: another type is the caller's error by the library's "
        "own word, and Python libraries do not as a rule check their arguments' types; the spec asks for the refusal "
        "(OP-CONFIG: a cache that accepts one serves nothing right)"),
    'window1': Kind(
        "defect", "DynamicSlidingWindowLayer(sliding_window=1) never trims: a query attends the whole history, a "
        "2-token step raises",
        f"{HF_CACHE}:246, `full_key_states[:, :, -self.sliding_window + 1 :, :]` is `[0:]` for a window of 1; no doc "
        "bounds sliding_window above 1, and the same model without a cache gives other logits", "hf_sliding_window_one"),
    'static_sliding': Kind(
        "stricter", "StaticCache's sliding layers hold min(sliding_window, max_cache_len) rows: past max_cache_len "
        "tokens they drop in-window ones",
        f"{HF_CACHE}:526, `effective_max_cache_len = min(sliding_window, max_cache_len)`, and {HF_CACHE}:2067-2068: "
        "max_cache_len is \"The maximum number of tokens that this Cache should hold\" - the suite's program (and the "
        "repro) goes past it; the target's `unbounded` scope is what says otherwise",
        "hf_static_sliding_past_max_cache_len"),
    'crop_empty': Kind(
        "defect", "a sliding layer's crop before any token raises AttributeError",
        f"{HF_CACHE}:175, DynamicLayer.crop: \"Nothing to do in these cases: 0 tokens to crop or the layer is not "
        f"initialized\"; the sliding subclass then reads `self.keys.shape` of keys that are None ({HF_CACHE}:313)",
        "hf_sliding_crop_before_any_token"),
    'fp8_saturates': Kind(
        "stricter", "fp8's per-tensor scale, frozen at the first update, saturates every later value above the first "
        "step's amplitude (a K of 2 after a first step of 1s reads back 1)",
        f"{HF_CACHE}:968-969, Fp8QuantizedLayer's docstring: \"The per-tensor scale is frozen after the first "
        "`update`, so new states are appended as-is: no residual cache, no re-quantization\" - documented; the "
        "suite's `lossy` tolerance asks every later value within it"),
    'quantized_crop': Kind(
        "defect", "QuantizedCache says it is croppable, and its crop raises IndexError after a forward (the quantized "
        "layers inherit DynamicLayer's crop, which knows nothing of the quantized storage)",
        f"{HF_CACHE}:111, DynamicLayer's `is_croppable = True`, inherited by BaseQuantizedLayer ({HF_CACHE}:714); "
        f"Cache.is_croppable ({HF_CACHE}:1885-1887): \"Whether `crop` can put the whole cache back as it was, so a "
        "rollback leaves no trace\"; assisted decoding crops the cache (transformers/generation/"
        "candidate_generator.py:298)", "hf_quantized_crop"),
    'quantized_crop_after_empty': Kind(
        "uncertain", "hqq only: after an accepted empty step, a token and a crop of it, a later query attends a row "
        "of a step the cache refused; the suite charges the empty step (which call explains it is a question of blame, "
        "not settled)",
        f"{HF_CACHE}:111 and {HF_CACHE}:714 as for quantized_crop (the crop is DynamicLayer's); an empty step is "
        "nothing model code sends (`trusted-args`), and no standalone repro separates the crop's part from the "
        "empty step's"),
    'pad_after_step': Kind(
        "stricter", "the caller's attention_mask takes leading zeros over tokens the cache already holds (pad after "
        "a step): masking_utils builds the mask from it without a word",
        "transformers/masking_utils.py:237-246, prepare_padding_mask takes the caller's 2D mask as given, documented "
        "as \"The 2D attention mask corresponding to padded tokens of shape (batch_size, "
        "number_of_seen_tokens+q_length)\" (transformers/masking_utils.py:927): padding is an input of every forward, "
        "not a declaration the cache could refuse; OP-PAD asks for the refusal"),
    'rows_after_crop_to_empty': Kind(
        "defect", "a layer `crop` emptied keeps its old batch size: batch_repeat_interleave / batch_select_indices "
        "skip it, and the next forward of the new batch raises",
        f"{HF_CACHE}:183-194, DynamicLayer's row verbs act only `if self.get_seq_length() > 0`, and get_seq_length "
        f"is 0 for an initialized layer of no rows ({HF_CACHE}:148), which crop leaves ({HF_CACHE}:179-181); "
        "after reset() the same verbs and forward are served", "hf_rows_after_crop_to_empty"),
    'quantized_rows': Kind(
        "defect", "QuantizedCache's batch_select_indices and batch_repeat_interleave move the residual only, never "
        "the quantized states: select raises IndexError, repeat leaves the quantized rows at the old batch size",
        f"{HF_CACHE}:183-194, DynamicLayer's row verbs index `self.keys`, inherited by BaseQuantizedLayer "
        f"({HF_CACHE}:714), whose states live in `_quantized_keys` ({HF_CACHE}:724); its reorder_cache is overridden "
        f"for them ({HF_CACHE}:824, {HF_CACHE}:1024), these two are not", "hf_quantized_rows"),
    'sinks_prefill': Kind(
        "defect", "RotatingKVCache's mask for a step longer than the ring ignores keep: the same prompt prefilled at "
        "once attends other tokens than decoded",
        f"mlx_lm/generate.py:343-344, max_kv_size: \"Old entries (except the first 4 tokens) will be overwritten\"; "
        f"{MLX_CACHE}:556-563, make_mask gives N > 1 `create_causal_mask(N, offset, window_size=...)`, a plain window",
        "mlx_prompt_cache_prefill_ignores_sinks"),
    'keep_at_window': Kind(
        "uncertain", "make_prompt_cache(max_kv_size <= 4) builds RotatingKVCache(max_size, keep=4) with keep >= "
        "max_size, unchecked: decoded tokens are never stored",
        f"{MLX_CACHE}:37, `RotatingKVCache(max_size=max_kv_size, keep=4)`; mlx_lm/generate.py:177, --max-kv-size: "
        "\"Set the maximum key-value cache size\" with no lower bound: whether a size of 4 or less is the user's "
        "error is not said", "mlx_prompt_cache_small_ring"),
    'concat_trim': Kind(
        "defect", "ConcatenateKVCache.trim lowers offset only: trimmed tokens come back into every later attention",
        f"{MLX_CACHE}:230-236, `is_trimmable` answers True and `trim` only lowers `self.offset`; "
        "trim_prompt_cache trims every cache that says so", "mlx_concatenate_trim"),
    'chunked_trim_across_chunk': Kind(
        "defect", "ChunkedKVCache stays trimmable after maybe_trim_front dropped its front: a rollback back across a "
        "chunk boundary serves the query's chunk without the positions the front dropped",
        f"{MLX_CACHE}:786-787, `is_trimmable` answers True always; {MLX_CACHE}:737-746, maybe_trim_front (run at "
        f"every llama4 forward, mlx_lm/models/llama4.py:228-231) drops all but the newest chunk_size rows; "
        f"{MLX_CACHE}:1661-1665, the server's LRUPromptCache.fetch_nearest_cache trims a cached prompt back to a "
        "shared prefix, and speculative decoding rolls back rejected drafts (mlx_lm/generate.py:597-599)",
        "mlx_llama4_trim_across_chunk"),
    'chunked_partial_trim': Kind(
        "defect", "ChunkedKVCache.trim(n) trims at most offset - start_position, silently: trim_prompt_cache answers "
        "fewer than n (the first cache's count), its chunked and global layers then disagree on the length, and its "
        "callers do not read the answer",
        f"{MLX_CACHE}:789-791, `n = min(self.offset - self.start_position, n)`; {MLX_CACHE}:138, trim_prompt_cache "
        f"answers `[c.trim(num_tokens) for c in cache][0]`; {MLX_CACHE}:1665 and mlx_lm/generate.py:598 call it "
        "and drop the answer", "mlx_llama4_partial_trim"),
    'state_unchecked': Kind(
        "stricter", "a prompt cache file with one byte changed loads as if whole (no checksum: in a held row, its K "
        "reads back changed); a later query then answers from the loaded cache, which the suite, refusing the load, "
        "does not follow",
        f"{MLX_CACHE}:82-113, load_prompt_cache: `mx.load` (which checks only that the safetensors header's offsets "
        "lie inside the file: a truncated file is refused) then each class's from_state, with nothing compared; its "
        "docstring promises only \"Load a prompt cache from a file\". The safetensors format carries no checksum: "
        "OP-STATE's refusal of a changed byte asks more than the format can", "mlx_prompt_cache_changed_byte"),
    'batch_filter_empty': Kind(
        "defect", "BatchKVCache.filter on a left-padded cache holding nothing yet lowers its write index below 0 "
        "(the shift of the padding every kept row has): the next forward raises",
        f"{MLX_CACHE}:883-899, BatchKVCache's docstring: inputs are left-padded and `left_padding` gives each row's "
        f"amount; {MLX_CACHE}:982-999, filter (\"In-place filter to keep just the given indices\") lowers `_idx` by "
        "the smallest kept pad whether or not keys are stored; BatchGenerator itself never filters an empty padded "
        "cache (its empty merges have no padding, generate.py:826-839)", "mlx_batch_filter_of_padded_empty_cache"),
    'batch_ring_wrap_mask': Kind(
        "defect", "BatchRotatingKVCache's mask for a multi-token step after single-token steps wrapped the ring "
        "masks a left-padded row's oldest real token as a pad",
        f"{MLX_CACHE}:1316, make_mask lowers the pads by `_idx - max_size + 1` with `_idx` the rotated ring's write "
        f"index, while _update_concat first restores temporal order ({MLX_CACHE}:1144, `_idx` becomes the length) "
        f"and trims by that ({MLX_CACHE}:1162); a left-padded row is BatchGenerator's own state (finalize, "
        "generate.py:1219-1236), whose prompt steps follow each prompt's segments (insert_segments, generate.py:1643): "
        "BatchGenerator(max_kv_size=6) serving a left-padded request's one-token segments, then a 2-token one, gives "
        "it other logprobs than alone (repro mlx_batchgenerator_segments_after_wrap)",
        "mlx_batch_rotating_mask_after_wrap"),
    'batch_extend_other_length': Kind(
        "stricter", "BatchKVCache.extend / BatchRotatingKVCache.extend of a batch holding other positions is "
        "served, right-justified: the shorter batch's rows gain left padding",
        f"{MLX_CACHE}:1001-1045 and {MLX_CACHE}:1343-1390, extend: \"Pad the keys and values so they are "
        "right-justified with the index and the same size\" - caches of different lengths are its purpose: "
        "BatchGenerator extends its running generation batch with a newly prefilled one (generate.py:1864, "
        "_extend_cache generate.py:842-849) and its prompt batch with new requests (generate.py:1837); each row keeps "
        "its tokens and offset (the repro's shorter row's next logits equal its run alone). OP-ROWS' extend takes "
        "only a cache of the same positions", "mlx_batch_extend_of_other_length"),
    'batch_extract_empty': Kind(
        "uncertain", "BatchKVCache.extract / BatchRotatingKVCache.extract of a batch holding no keys yet raises "
        "TypeError (changing nothing)",
        f"{MLX_CACHE}:1047-1055 and {MLX_CACHE}:1392-1409, extract slices `self.keys` unguarded, no docstring; its "
        "only caller, BatchGenerator.extract_cache (generate.py:1727-1742), hands an unprocessed request's caches back "
        "as they are (generate.py:1730-1731) and extracts only from batches a forward has filled: whether an empty "
        "batch's extract is owed is not said", "mlx_batch_extract_of_empty_cache"),
    'quantize_bound': Kind(
        "uncertain", "to_quantized / QuantizedKVCache round a row coarser than its bits' half step: mx.quantize's "
        "affine scale is stretched so that 0 is a code (a row of 1..64 at 8 bits reads back 0.12355 off, past "
        "(64 - 1) / (2 * 255) = 0.12353 and float32 rounding)",
        f"{MLX_CACHE}:396-404, to_quantized, and {MLX_CACHE}:296-297, every later update, call `mx.quantize(x, "
        "group_size, bits)`, whose docstring (mlx.core.quantize, affine mode) gives s = (max - min) / (2^b - 1), "
        "code = round((w - min) / s), bias min: half a step at most, the rule's bound; the installed kernel "
        "(mlx/include/mlx/backend/metal/kernels/quantized.h:2771-2779) instead takes the edge of larger magnitude as "
        "the bias and scale = edge / round(edge / s), on purpose (0 exactly representable); mlx's own test "
        "tolerance is half the stored scale (ml-explore/mlx PR 295). Docs and kernel disagree, neither says which "
        "is the contract", "mlx_to_quantized_bound"),
    'quantize_bits7': Kind(
        "stricter", "bits 7, which OP-QUANTIZE takes (and the suite sends to read a row of 64 labels), is refused "
        "by mx.quantize: at the quantize of a non-empty cache, or - an empty cache's to_quantized builds "
        "QuantizedKVCache(bits=7) unchecked - at the first update after it",
        f"{MLX_CACHE}:396-404 and {MLX_CACHE}:296-297 pass bits to mx.quantize, whose docstring's table of modes "
        "lists the affine bits as \"1, 2, 3, 4, 5, 6, 8\" (ValueError \"The supported bits are 1, 2, 3, 4, 5, 6 "
        "and 8\"); mlx_lm/generate.py:200-202, --kv-bits, \"Number of bits for KV cache quantization\", is passed "
        "on to it: 7 is outside mlx's documented contract, OP-QUANTIZE's [2, 8] asks more", "mlx_to_quantized_bits7"),
    'quantize_twice': Kind(
        "stricter", "a second quantize is accepted and changes nothing: maybe_quantize_kv_cache converts only a cache "
        "that has `to_quantized`, which a QuantizedKVCache has not",
        "mlx_lm/generate.py:305-310, maybe_quantize_kv_cache: `if hasattr(c, \"to_quantized\") and c.offset >= "
        "quantized_kv_start` - generate_step calls it after every forward, so skipping a converted cache is its "
        "design; OP-QUANTIZE refuses a second quantize (a caller asking twice is told), asking more", ""),
}

EXPECTED: dict[str, dict[str, Any]] = {
    'hf:dynamic_full': {"verdict": 'CONFORMING', "causes": {
    }},
    'hf:dynamic_sliding': {"verdict": 'NOT CONFORMING', "causes": {
        'over-strict OP-ATTEND: over-strict OP-ATTEND: at fetch; ring | cap 1, ring(1)':
            'window1',
        'over-strict OP-TRIM: over-strict OP-TRIM: at trim; ring | cap 1, ring(1)':
            'crop_empty',
        'wrong OP-ATTEND: wrong OP-ATTEND, after over-strict OP-ATTEND in update_and_fetch: at fetch; ring | cap 1, ring(1)':
            'window1',
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not); ring | cap 1, ring(1)':
            'window1',
    }},
    'hf:static_full': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATOMIC: wrong OP-ATOMIC: at fetch OP-CAP capacity, which the target refused with 'IndexError: index_copy_(): index 1 is out of bounds for dimension 2 with size 1'; flat | cap 1, flat":
            'static_overflow',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity 0); flat | cap 0, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity bool); flat | cap True, flat':
            'static_capacity_type',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity float); flat | cap 4.0, flat':
            'static_capacity_type',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity negative); flat | cap -1, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity null); flat | cap None, flat':
            'static_capacity_type',
        "lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity string); flat | cap '4', flat":
            'static_capacity_type',
    }},
    'hf:static_sliding': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (misses tokens the spec attends); ring | cap 1, ring(2)':
            'static_sliding',
    }},
    'hf:quantized_quanto': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND, after over-strict OP-TRIM in trim: at fetch; flat | cap 1, flat x2':
            'quantized_crop',
        'wrong OP-TRIM: wrong OP-TRIM: at trim; flat | cap 1, flat':
            'quantized_crop',
        'over-strict OP-TRIM: over-strict OP-TRIM: at trim; flat | cap 1, flat':
            'quantized_crop',
    }},
    'hf:quantized_hqq': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND, after lenient OP-ARGS in update_and_fetch: at fetch; flat | cap 1, flat':
            'quantized_crop_after_empty',
        'wrong OP-TRIM: wrong OP-TRIM: at trim; flat | cap 1, flat':
            'quantized_crop',
        'over-strict OP-TRIM: over-strict OP-TRIM: at trim; flat | cap 1, flat':
            'quantized_crop',
    }},
    'hf:quantized_fp8': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATTEND: wrong OP-ATTEND: at fetch (a row not one token's); flat | cap 1, flat":
            'fp8_saturates',
        'over-strict OP-TRIM: over-strict OP-TRIM: at trim; flat | cap 1, flat':
            'quantized_crop',
    }},
    'hf_batch:batch_dynamic_full': {"verdict": 'NOT CONFORMING', "causes": {
        'lenient OP-PAD: lenient OP-PAD: at pad OP-PAD not empty; flat | cap 2, flat, batch 2':
            'pad_after_step',
        'over-strict OP-ATTEND: over-strict OP-ATTEND: at fetch; flat | cap 1, flat':
            'rows_after_crop_to_empty',
    }},
    'hf_batch:batch_dynamic_sliding': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not); ring | cap 1, ring(1)':
            'window1',
        'lenient OP-PAD: lenient OP-PAD: at pad OP-PAD not empty; flat | cap 2, flat, batch 2':
            'pad_after_step',
        'over-strict OP-ATTEND: over-strict OP-ATTEND: at fetch; ring | cap 1, ring(1)':
            'window1',
        'over-strict OP-TRIM: over-strict OP-TRIM: at trim; ring | cap 1, ring(1)':
            'crop_empty',
    }},
    'hf_batch:batch_static_full': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATOMIC: wrong OP-ATOMIC: at fetch OP-CAP capacity, which the target refused with 'IndexError: index_copy_(): index 1 is out of bounds for dimension 2 with size 1'; flat | cap 1, flat":
            'static_overflow',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity 0); flat | cap 0, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity negative); flat | cap -1, flat':
            'static_zero',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity bool); flat | cap True, flat':
            'static_capacity_type',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity float); flat | cap 4.0, flat':
            'static_capacity_type',
        "lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity string); flat | cap '4', flat":
            'static_capacity_type',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (op.create.capacity null); flat | cap None, flat':
            'static_capacity_type',
        'lenient OP-PAD: lenient OP-PAD: at pad OP-PAD not empty; flat | cap 2, flat, batch 2':
            'pad_after_step',
    }},
    'hf_batch:batch_quantized_fp8': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATTEND: wrong OP-ATTEND: at fetch (a row not one token's); flat | cap 1, flat":
            'fp8_saturates',
        'lenient OP-PAD: lenient OP-PAD: at pad OP-PAD not empty; flat | cap 2, flat, batch 2':
            'pad_after_step',
        'over-strict OP-ATTEND: over-strict OP-ATTEND: at fetch; flat | cap 1, flat':
            'quantized_rows',
        'over-strict OP-ROWS: over-strict OP-ROWS: at select; flat | cap 1, flat':
            'quantized_rows',
        'over-strict OP-ROWS: over-strict OP-ROWS: at reorder; flat | cap 1, flat, batch 2':
            'quantized_rows',
        'over-strict OP-TRIM: over-strict OP-TRIM: at trim; flat | cap 1, flat':
            'quantized_crop',
    }},
    'mlxlm:kv': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:llama_sliding': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:prompt_cache': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not and misses some it does); ring | cap 1, ring(5, keep 4)':
            'sinks_prefill',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (keep); ring | cap 4, ring(4, keep 4)':
            'keep_at_window',
    }},
    'mlxlm:quantized': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:kv_to_quantized': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-QUANTIZE: wrong OP-QUANTIZE: at fetch (a row not one token's); flat | cap 1, flat":
            'quantize_bound',
        'over-strict OP-ATTEND: over-strict OP-ATTEND: at fetch; flat | cap 1, flat':
            'quantize_bits7',
        'over-strict OP-QUANTIZE: over-strict OP-QUANTIZE: at quantize; flat | cap 1, flat':
            'quantize_bits7',
        'lenient OP-QUANTIZE: lenient OP-QUANTIZE: at quantize OP-QUANTIZE twice; flat | cap 1, flat':
            'quantize_twice',
    }},
    'mlxlm:chunked': {"verdict": 'CONFORMING', "causes": {
    }},
    'mlxlm:concatenate': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not); flat | cap 1, flat':
            'concat_trim',
    }},
    'mlxlm:llama4_chunked': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATOMIC: wrong OP-ATOMIC: at trim, which the target refused with 'RuntimeError: trim_prompt_cache(cache, 3) trimmed 2'; chunk | cap 1, chunk(chunk 1)":
            'chunked_partial_trim',
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (misses tokens the spec attends); chunk | cap 1, chunk(chunk 3)':
            'chunked_trim_across_chunk',
    }},
    'mlxlm:llama_sliding_saved': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND, after lenient OP-STATE in load_state: at fetch; flat | cap 1, flat':
            'state_unchecked',
        'lenient OP-STATE: lenient OP-STATE: at load OP-STATE state flipped; flat | cap 1, flat':
            'state_unchecked',
    }},
    'mlxlm:prompt_cache_saved': {"verdict": 'NOT CONFORMING', "causes": {
        'wrong OP-ATTEND: wrong OP-ATTEND: at fetch (attends tokens the spec does not and misses some it does); ring | cap 1, ring(5, keep 4)':
            'sinks_prefill',
        'lenient OP-CONFIG: lenient OP-CONFIG: at create (keep); ring | cap 4, ring(4, keep 4)':
            'keep_at_window',
    }},
    'mlxlm_batch:batch': {"verdict": 'NOT CONFORMING', "causes": {
        'over-strict OP-ATTEND: over-strict OP-ATTEND: at fetch; flat | cap 2, flat, batch 2':
            'batch_filter_empty',
        'lenient OP-ROWS: lenient OP-ROWS: at extend OP-ROWS length; flat | cap 1, flat':
            'batch_extend_other_length',
        'over-strict OP-ROWS: over-strict OP-ROWS: at extract; flat | cap 1, flat':
            'batch_extract_empty',
    }},
    'mlxlm_batch:batch_rotating': {"verdict": 'NOT CONFORMING', "causes": {
        "wrong OP-ATTEND: wrong OP-ATTEND: at fetch (a row's history not its own); ring | cap 2, ring(3), batch 2":
            'batch_ring_wrap_mask',
        "wrong OP-ATTEND: wrong OP-ATTEND: at extend (a row's history not its own); ring | cap 3, ring(4), static":
            'batch_ring_wrap_mask',
        "wrong OP-ROWS: wrong OP-ROWS: at fetch (a row's history not its own); ring | cap 2, ring(4)":
            'batch_ring_wrap_mask',
        'lenient OP-ROWS: lenient OP-ROWS: at extend OP-ROWS length; flat | cap 1, flat':
            'batch_extend_other_length',
        'over-strict OP-ROWS: over-strict OP-ROWS: at extract; flat | cap 1, flat':
            'batch_extract_empty',
    }},
}


def counts(target: str) -> dict[str, int]:
    """The target's distinct causes counted by class (CLASSES' order)."""
    kinds = list(EXPECTED[target]["causes"].values())
    return {cls: sum(KINDS[kind].cls == cls for kind in kinds) for cls in CLASSES}


def row(target: str) -> str:
    """The target's row of the findings pages' verdict table: verdict, distinct causes, and how many are of each
    class - real (a defect of the library), the spec stricter than its contract, uncertain, false alarm."""
    expected, by_class = EXPECTED[target], counts(target)
    return (f"| `{target}` | {expected['verdict']} | {len(expected['causes'])} | "
            + " | ".join(str(by_class[cls]) for cls in CLASSES) + " |")


def readme_cell(target: str) -> str:
    """The README's verdict cell for the target: verdict, distinct causes, (real, stricter, uncertain, false alarm)."""
    by_class = counts(target)
    return f"{EXPECTED[target]['verdict']}: {len(EXPECTED[target]['causes'])} ({', '.join(map(str, by_class.values()))})"


def kind_heading(kind: str) -> str:
    """A kind's heading in the page's list of causes: its class, what happens, the evidence, the repro."""
    entry = KINDS[kind]
    repro = f" Repro: `{entry.repro}`." if entry.repro else ""
    return f"**{kind}** - {entry.cls}: {entry.what}. Evidence: {entry.evidence}.{repro}"


MESSAGE_CHARS = 300   # a cause's message on the page, cut past this


def page_line(target: str, finding: dict[str, Any]) -> str:
    """A cause's line in the findings page's list: the target, class and rule, the configuration its program was
    shrunk to, the program, and what the suite saw. tests/test_library_targets.py holds each run's lines on the page."""
    message = finding["message"] if len(finding["message"]) <= MESSAGE_CHARS else \
        finding["message"][:MESSAGE_CHARS] + "..."
    return (f"- `{target.split(':', 1)[1]}`: {finding['class']} {finding['rule']}, {finding['config_name']}, "
            f"{len(finding['steps'])} steps: `{json.dumps(finding['steps'])}`; {message}")


def page_section(reports: dict[str, dict[str, Any]]) -> str:
    """The page's "every distinct cause, by kind" list for these targets' reports, in KINDS' order."""
    by_kind: dict[str, list[str]] = {}
    for target, report in reports.items():
        for finding in report["semantic"]["findings"]:
            kind = EXPECTED[target]["causes"].get(cause_key(finding), "unclassed")
            by_kind.setdefault(kind, []).append(page_line(target, finding))
    return "\n".join((kind_heading(kind) if kind in KINDS else f"**{kind}** - not in KINDS: class it")
                     + "\n\n" + "\n".join(lines) + "\n"
                     for kind, lines in sorted(by_kind.items(), key=lambda item: list(KINDS).index(item[0])
                                               if item[0] in KINDS else len(KINDS)))


def _judge(target: str) -> dict[str, Any]:
    from kvcache_spec.conformance.suite import report_json, run_suite
    from kvcache_spec.conformance.targets import PythonTarget

    return report_json(run_suite(PythonTarget(f"python:kvcache_spec.conformance.libraries.{target}"), PROFILE), True, False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--page"]:   # python -m tests.library_verdicts --page hf: the page's list of causes
        library = sys.argv[2]
        print(page_section({target: _judge(target) for target in EXPECTED if target.startswith(library + ":")}))
        sys.exit(0)
    for target in sys.argv[1:]:
        report = _judge(target)
        print(f"    {target!r}: {{'verdict': {report['verdict']!r}, 'causes': {{")
        for finding in report["semantic"]["findings"]:
            steps = len(finding["steps"])
            print(f"        {cause_key(finding)!r}: '',   # {steps} steps, shrunk {finding['shrunk']}")
        print("    }},")
