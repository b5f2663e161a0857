"""vLLM 0.33.0's KV-cache bookkeeping (`vllm.v1.core`, CPU) as a target of the paged face, driven as vLLM's
scheduler drives it.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.vllm:manager --strict

Needs the `vllm` extra (.ci/install-serving.sh: the CPU torch pinned, vllm itself with --no-deps). Nothing here stands
in for vLLM: every block id, hit, refusal, table and reference count is `KVCacheManager`'s own.

How the face maps onto vLLM (file:line of the installed package, vllm/v1/...):
- the config: one `KVCacheGroupSpec` per group, a `FullAttentionSpec` or a `SlidingWindowSpec(sliding_window=W)` of
  block size B, in one `KVCacheConfig` of N + 1 blocks: `BlockPool` keeps block 0 as its null block
  (core/block_pool.py:191), so N stay usable, as the face counts them. The manager is built as the scheduler
  builds it (core/sched/scheduler.py:351): scheduler and hash block size B, caching as the config's
  `prefix_caching`, the watermark and retention interval at vLLM's defaults (config/scheduler.py:196,
  config/cache.py:275), and `max_in_flight_tokens` = max_model_len (a step holds at most the budget, and one step
  at a time is in flight here: the face computes every reserved position before its next call).
- a request: an `EngineCoreRequest` made into a `Request` by `Request.from_engine_core_request` with the engine's
  block hasher (engine/core.py:219-230: `init_none_hash` and `get_request_block_hasher` over the configured
  hash, sha256 by default), only when prefix caching is on, as there. The face's keys become vLLM's extra keys:
  the first a LoRA adapter (`LoRARequest`, hashed into every block, core/kv_cache_utils.py:590-607), the rest, as
  JSON, the request's `cache_salt` (hashed into the first block, core/kv_cache_utils.py:662-666); both are
  injective, so two requests' keys are equal exactly when their hash inputs are.
- `admit`: `get_computed_blocks(request)` (the hit h), then `allocate_slots(request, n, h, hit blocks,
  full_sequence_must_fit=True, has_scheduled_reqs=...)` as the waiting loop calls it (core/sched/scheduler.py:1435;
  `scheduler_reserve_full_isl` is True by default, config/scheduler.py:190); None is the refusal (the request
  stays out). On success the request runs with `num_computed_tokens` = h + n (scheduler.py:1572-1573, 1858).
- `extend`: the decoded tokens appended with `Request.append_output_token_ids` (which extends its block hashes),
  then `allocate_slots(request, n)` as the running loop calls it (scheduler.py:914). vLLM has no undo of an
  append: on a refusal (None) the adapter drops the tokens it appended and the hashes of the blocks they filled,
  so the request is as before, as the face's refusal asks; what vLLM itself changed before refusing stays.
- `free`: `KVCacheManager.free(request)` after the request is marked finished (scheduler.py:3064-3089); a free of
  a request the scheduler does not hold is ignored there (scheduler.py:2993-2996), and so here.
- `table`: `KVCacheManager.get_block_ids`; the null block (vLLM's filler for window blocks it released) is None.
- `available`: `BlockPool.get_num_free_blocks()`, free and cached-but-unreferenced blocks alike.
- `ref_counts`: each held block's own `ref_cnt`.

Declared scope: `flat`, `ring`, `trusted-args`. `KVCacheManager` checks none of its arguments: its only caller is
the scheduler, behind the engine's input processing, which validates a request before a `Request` exists
(v1/engine/input_processor.py:557-600 refuses an empty prompt or one longer than max_model_len; :646-647 the token
ids, by the renderer); the scheduler computes each step's token count itself (core/sched/scheduler.py:1845-1859), a
request id seen twice is an assertion (scheduler.py:2936), an unknown free is skipped (scheduler.py:2993-2996), and
the configuration is vLLM's CacheConfig and the model's own. So the suite sends it no malformed call.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Callable, Optional

from ..._extras import missing_line, version_line
from ..configs import JsonConfig

# Without the extra, loading a target names it (the CLI's "cannot load" line, exit 2); on a version of vLLM this
# adapter was not written for, it names both versions (_extras.py).
_MISSING = (missing_line("vllm", "kvcache_spec.conformance.libraries.vllm")
            or version_line("vllm", "kvcache_spec.conformance.libraries.vllm"))
if _MISSING:
    raise ImportError(_MISSING)

# The whole paged face - full groups (`flat`) and window groups (`ring`) - and `trusted-args`: the manager validates
# nothing, its only caller is the scheduler, behind the engine's input processing (module docstring), so the suite
# sends it no malformed call and no invalid configuration.
SCOPE = ("flat", "ring", "trusted-args")
# The model's shape beside the bookkeeping: the manager never reads it (it sizes no tensor), but a spec needs one.
NUM_KV_HEADS, HEAD_SIZE = 1, 64


def _module(name: str) -> Any:
    return importlib.import_module(name)


def _group_spec(group: dict[str, Any], block_size: int) -> Any:
    """The vLLM KV-cache spec of one face group: full attention, or a sliding window of W tokens (the query at p
    reads p - W + 1 .. p, single_type_kv_cache_manager.py's get_num_skipped_tokens)."""
    interface, torch = _module("vllm.v1.kv_cache_interface"), _module("torch")
    shape = {"block_size": block_size, "num_kv_heads": NUM_KV_HEADS, "head_size": HEAD_SIZE, "dtype": torch.float16}
    if group["kind"] == "full":
        return interface.FullAttentionSpec(**shape)
    if group["kind"] == "window":
        return interface.SlidingWindowSpec(sliding_window=group["window"], **shape)
    raise ValueError(f"PAGED-CONFIG: a group is full or window, got {group!r}")


class VllmPagedCache:
    """One `KVCacheManager` and the requests it serves, as the scheduler holds them."""

    def __init__(self, config: JsonConfig) -> None:
        cache = _module("vllm.config.cache")
        interface, utils = _module("vllm.v1.kv_cache_interface"), _module("vllm.v1.core.kv_cache_utils")
        # The user's settings go through vLLM's own CacheConfig, as the engine takes them (its checks and coercions,
        # config/cache.py); the pool is num_gpu_blocks_override blocks, the null block among them.
        defaults = cache.CacheConfig(block_size=config["block_size"], enable_prefix_caching=config["prefix_caching"],
                                     num_gpu_blocks_override=config["num_blocks"] + 1)
        block_size, num_blocks = defaults.block_size, defaults.num_gpu_blocks_override
        self.max_model_len: int = config["max_model_len"]
        self.caching: bool = defaults.enable_prefix_caching
        groups = [interface.KVCacheGroupSpec([f"model.layers.{index}.attn"], _group_spec(group, block_size))
                  for index, group in enumerate(config["groups"])]
        kv_cache_config = interface.KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
            prefix_cache_retention_interval=defaults.prefix_cache_retention_interval)
        self.manager: Any = _module("vllm.v1.core.kv_cache_manager").KVCacheManager(
            kv_cache_config=kv_cache_config, max_model_len=self.max_model_len,
            max_in_flight_tokens=self.max_model_len, enable_caching=self.caching,
            scheduler_block_size=block_size, hash_block_size=block_size)
        self.block_size = block_size
        self.hasher: Optional[Callable[[Any], list[Any]]] = None
        if self.caching:   # engine/core.py:219-230
            hash_fn = _module("vllm.utils.hashing").get_hash_fn_by_name(defaults.prefix_caching_hash_algo)
            utils.init_none_hash(hash_fn)
            self.hasher = utils.get_request_block_hasher(block_size, hash_fn)
        self.requests: dict[str, Any] = {}
        self.adapters: dict[str, int] = {}   # LoRA name -> its lora_int_id (unique per adapter, as vLLM asks)

    # --- the engine's request -----------------------------------------------------------------------------------
    def _request(self, request_id: str, tokens: list[int], keys: list[str]) -> Any:
        engine, lora = _module("vllm.v1.engine"), _module("vllm.lora.request")
        sampling = _module("vllm.sampling_params").SamplingParams(max_tokens=self.max_model_len)
        adapter = None
        if keys:
            adapter_id = self.adapters.setdefault(keys[0], len(self.adapters) + 1)
            adapter = lora.LoRARequest(lora_name=keys[0], lora_int_id=adapter_id, lora_path=f"/adapters/{keys[0]}")
        salt = json.dumps(keys[1:]) if len(keys) > 1 else None
        core = engine.EngineCoreRequest(request_id=request_id, prompt_token_ids=list(tokens), mm_features=None,
                                        sampling_params=sampling, pooling_params=None, arrival_time=0.0,
                                        lora_request=adapter, cache_salt=salt, data_parallel_rank=None)
        return _module("vllm.v1.request").Request.from_engine_core_request(core, self.hasher)

    # --- the face -------------------------------------------------------------------------------------------------
    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        if request in self.requests:
            raise AssertionError(f"duplicate request id {request!r} (vLLM's scheduler asserts it, scheduler.py:2936)")
        req = self._request(request, tokens, keys)
        hit_blocks, hit, _ = self.manager.get_computed_blocks(req)
        n = min(req.num_tokens - hit, budget)
        blocks = self.manager.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=hit_blocks,
                                             full_sequence_must_fit=True, has_scheduled_reqs=bool(self.requests))
        if blocks is None:
            return None
        req.status = _module("vllm.v1.request").RequestStatus.RUNNING
        req.num_computed_tokens = hit + n
        self.requests[request] = req
        return int(hit)

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        req = self.requests[request]
        before = (req.num_tokens, len(req.block_hashes))
        if tokens:
            req.append_output_token_ids(list(tokens))
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        try:
            blocks = self.manager.allocate_slots(req, n)
        except BaseException:
            self._drop_appended(req, *before)
            raise
        if blocks is None:
            self._drop_appended(req, *before)
            return None
        req.num_computed_tokens += n
        return int(n)

    @staticmethod
    def _drop_appended(req: Any, num_tokens: int, num_hashes: int) -> None:
        """Undo an append the allocation then refused: the tokens and the block hashes they completed (a hash covers
        whole blocks of the prefix only, so the hashes of the shorter prefix are exactly its first num_hashes)."""
        surplus = req.num_tokens - num_tokens
        if surplus:
            del req._output_token_ids[-surplus:]
            del req._all_token_ids[-surplus:]
        del req.block_hashes[num_hashes:]

    def free(self, request: str) -> None:
        req = self.requests.pop(request, None)
        if req is None:   # scheduler.py:2993-2996: a request it does not hold is skipped
            return
        req.status = _module("vllm.v1.request").RequestStatus.FINISHED_ABORTED
        self.manager.free(req)

    def table(self, request: str) -> list[list[Optional[int]]]:
        blocks = self.manager.get_blocks(request).blocks
        return [[None if block.is_null else int(block.block_id) for block in group] for group in blocks]

    def available(self) -> int:
        return int(self.manager.block_pool.get_num_free_blocks())

    def ref_counts(self) -> dict[int, int]:
        held: dict[int, int] = {}
        for request in self.requests:
            for group in self.manager.get_blocks(request).blocks:
                for block in group:
                    if not block.is_null:
                        held[int(block.block_id)] = int(block.ref_cnt)
        return held


def manager(config: JsonConfig) -> VllmPagedCache:
    """vLLM's KVCacheManager over the config's groups: full attention only, or hybrid full + sliding window."""
    return VllmPagedCache(config)


manager.kvcache_layout = "paged"   # type: ignore[attr-defined]
manager.kvcache_scope = SCOPE   # type: ignore[attr-defined]
