"""SGLang's hybrid sliding-window KV bookkeeping (UnifiedRadixCache with a FULL and an SWA component, over
SWATokenToKVPoolAllocator: the window layers' slots in a pool of their own) as a paged-face target with per-group
pools, driven as its scheduler drives it, on the CPU.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.sglang_swa:hybrid_swa --strict

Needs sglang as the `sglang` module does (`.ci/install-sglang.sh VENV`). The scheduler's steps are those of
`sglang.py` (admit: match, lock, budget check, row, allocation, checkpoint; extend: chunked prefill or decode;
free: release_kv_cache), which this module reuses; what differs (read in the installed package, sglang/srt):
- the cache is what mem_cache/registry.py builds for a hybrid SWA model: UnifiedRadixCache with tree_components
  (FULL, SWA) and CacheInitParams.sliding_window_size, over SWATokenToKVPoolAllocator (mem_cache/allocator/swa.py)
  whose full and SWA sub-allocators have num_blocks pages each, over an SWAKVPool (swa_memory_pool.py) with one
  full and one window layer;
- the window: the face's window W reads positions p - W + 1 .. p; SGLang's sliding_window_size counts the
  positions before p (models convert HF's inclusive window to it minus one), so it is W - 1;
- before a decode step's allocation the scheduler calls ScheduleBatch.maybe_evict_swa (mem_cache/allocation.py,
  managers/schedule_batch.py), whose decode branch is tree_cache.evict_sliding_windows(req, seqlen - 1): done here
  for every decode step (the overlap scheduler's one-step delay and SGLANG_SWA_EVICTION_INTERVAL only defer it);
- the budget check: the chunk's pages must fit both pools, each its free pages plus what the tree can evict of it
  (full_evictable_size, swa_evictable_size);
- `table`: the full group's pages from the req_to_token row as in sglang.py; the window group's the SWA page each
  full slot maps to (full_to_swa_index_mapping), None where the mapping was cleared (slot 0: SGLang's padding) or
  where the slot is on the request's tree path outside the segment its own SWA lock covers (the tree's then);
- `available`: per pool, (available + evictable) in pages: [full, window];
- `ref_counts` is not offered (the tree's per-component locks are not one count per block).

Scope: a full and a window group on per-group pools (`pools`), and `flat`/`ring` for them; one full group alone is
served by sglang.py's RadixCache (what SGLang builds for a model without window layers); every other configuration
is refused at creation. Declared `trusted-args`, on sglang.py's evidence (its docstring): the cache's callers are
the scheduler's own code, so this adapter checks no argument either; what the suite sends goes to SGLang as it is.

The tree core is SGLang's Python one (CacheInitParams.tree_core_backend "python", unified_cache/unified_tree_core.py;
registry.py falls back to it wherever the Rust core is not supported): the window table needs each node's SWA lock,
which the Rust core does not expose (rust_tree_core/adapter.py: root_node, node_by_id "not yet ported"). Both
cores implement one interface (unified_tree_core_interface.py); the Rust one is not judged here.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

from . import sglang as _sglang
from .sglang import SGLangRadix, _declare, _publish_server_args

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch  # noqa: E402
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
    from sglang.srt.mem_cache.common import checkpoint_kv_cache  # noqa: E402
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
    from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402

KVCACHE_SCOPE = ("flat", "ring", "pools", "trusted-args")


def _served_window(config: dict[str, Any]) -> int:
    """This target's scope, not a check of the configuration's form (the target declares `trusted-args`, as
    sglang.py does, on the same evidence): a full and a window group on per-group pools, the shape SGLang's hybrid
    SWA cache always has (SWATokenToKVPoolAllocator keeps the window layers' slots in a pool of their own). Returns
    the window."""
    groups = config["groups"]
    if config.get("pools") != "per-group" or len(groups) != 2 or groups[0] != {"kind": "full"} \
            or groups[1].get("kind") != "window":
        raise ValueError("groups: this target serves a full and a window group on per-group pools (SGLang's "
                         "hybrid SWA cache); other configurations are outside its scope (PAGED-CONFIG)")
    window: int = groups[1]["window"]
    return window


class SGLangHybridSWA(SGLangRadix):
    """One scheduler's hybrid-SWA bookkeeping: ReqToTokenPool, SWATokenToKVPoolAllocator (a full and an SWA pool
    of num_blocks pages each) and UnifiedRadixCache with FULL and SWA components."""

    ref_counts = None   # type: ignore[assignment]   # not offered (module docstring)

    def __init__(self, config: dict[str, Any]) -> None:
        window = _served_window(config)
        self.page = int(config["block_size"])
        _publish_server_args(self.page)
        self.groups = 2
        self.num_blocks = int(config["num_blocks"])
        self.max_model_len = int(config["max_model_len"])
        tokens = self.num_blocks * self.page
        # layer 0 full attention, layer 1 sliding window; the tensors are never read (the harness keeps the data)
        kv_pool = SWAKVPool(tokens, tokens, self.page, torch.float32, 1, 1, [1], [0], "cpu")
        self.allocator = SWATokenToKVPoolAllocator(tokens, tokens, self.page, torch.float32, "cpu", kv_pool, False)
        self.rows = ReqToTokenPool(self.num_blocks, self.max_model_len, "cpu", False)
        self.tree = UnifiedRadixCache(CacheInitParams(
            disable=not config["prefix_caching"], req_to_token_pool=self.rows,
            token_to_kv_pool_allocator=self.allocator, page_size=self.page, sliding_window_size=window - 1,
            tree_components=(ComponentType.FULL, ComponentType.SWA), tree_core_backend="python"))
        self.live = {}
        self._pending: dict[str, Any] = {}   # request -> its Req, whose prefill checkpoint waits (below)
        self._calling: Optional[str] = None

    def table(self, request: str) -> list[list[Optional[int]]]:
        """The full group's pages as sglang.py reads them; the window group's, the SWA page each full slot maps to,
        but None where the mapping was cleared (SWA slot 0 is the padding) and where the slot lies on the request's
        tree path outside its own SWA lock: a checkpointed prefix's SWA before the request's window is the tree's
        (evictable, counted in swa_evictable_size, or locked by another request), no longer this request's."""
        full = self._pages(request)
        entry = self.live[request]
        row = self.rows.req_to_token[entry.req.kv.req_pool_idx, :entry.computed].to(torch.int64)
        swa = self.allocator.full_to_swa_index_mapping[row].tolist()
        on_path, locked = self._swa_path(entry.req)
        window: list[Optional[int]] = [
            int(slot) // self.page if int(slot) > 0 and (int(start) not in on_path or int(start) in locked) else None
            for start, slot in zip(row.tolist()[::self.page], swa[::self.page])]
        return [list(full), window]

    def _swa_path(self, req: Any) -> tuple[set[int], set[int]]:
        """The full slots of the tree path the request's lock node ends, and of the part its SWA lock covers: the
        nodes from the lock node up to the one stamped with the lock's uuid (components/swa.py
        release_component_lock walks the same segment), or to the root without a uuid."""
        lock = getattr(req, "lock", None)
        root = self.tree.root_node
        on_path: set[int] = set()
        locked: set[int] = set()
        if lock is None:
            return on_path, locked
        uuid = None if lock.swa_released else lock.receipt.get_lock_uuid(ComponentType.SWA)
        covering = not lock.swa_released
        node = self.tree.tree_core.node_by_id(lock.node) if isinstance(lock.node, int) else lock.node
        while node is not None and node is not root:
            slots = {int(slot) for slot in node.component_data[ComponentType.FULL].value.tolist()}
            on_path |= slots
            if covering:
                locked |= slots
                if uuid is not None and node.component_data[ComponentType.SWA].metadata.get("uuid") == uuid:
                    covering = False
            node = node.parent
        return on_path, locked

    def available(self) -> list[int]:   # type: ignore[override]   # per-group pools: one count per group
        return [(int(self.allocator.full_available_size()) + int(self.tree.full_evictable_size())) // self.page,
                (int(self.allocator.swa_available_size()) + int(self.tree.swa_evictable_size())) // self.page]

    # --- the checkpoint after the forward ------------------------------------------------------------------------
    # sglang.py checkpoints a prefill before its call returns. Here that would free SWA slots the step's own
    # queries read (SGLang's checkpoint frees the SWA of positions out of the window of what comes next) before the
    # runner wrote them; the scheduler checkpoints after the forward. So it is kept, and done at the request's own
    # next call (extend, at its budget check; free), after the harness - the model runner - wrote the step.
    # That only delays a window release and a prefix becoming hittable, both policy (SPEC.md 7.1), and keeps every
    # table change in a call on the request the call names.

    def _deferred(self, request: str, call: Callable[[], Any]) -> Any:
        # the name sglang.py's steps call, pointed for this call at a recorder (sglang.py is not edited here)
        setattr(_sglang, "checkpoint_kv_cache", lambda req, tree: self._pending.__setitem__(req.rid, req))
        self._calling = request
        try:
            return call()
        finally:
            setattr(_sglang, "checkpoint_kv_cache", checkpoint_kv_cache)
            self._calling = None

    def _settle(self, request: Optional[str]) -> None:
        req = self._pending.pop(request, None) if request is not None else None
        if req is not None:
            checkpoint_kv_cache(req, self.tree)

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        answer: Optional[int] = self._deferred(
            request, lambda: super(SGLangHybridSWA, self).admit(request, tokens, keys, budget))
        return answer

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        answer: Optional[int] = self._deferred(
            request, lambda: super(SGLangHybridSWA, self).extend(request, tokens, budget))
        return answer

    def free(self, request: str) -> None:
        self._settle(request)
        super().free(request)

    def _fits(self, start: int, n: int) -> bool:
        """The budget check: the pending checkpoint of an extend's request first, then
        the chunk's pages within both pools, each its free pages plus what the tree can evict of it."""
        if self._calling in self.live:
            self._settle(self._calling)
        pages = -(-(start + n) // self.page) - -(-start // self.page)
        return pages <= min(self.available())

    def _reserve(self, req: Any, start: int, n: int, decode: bool) -> None:
        if decode:   # ScheduleBatch.maybe_evict_swa, decode branch: before the decode step's allocation, at the
            # decoded token's position: req.seqlen - 1 there, where one token is decoded at a time; `start` here,
            # which is the same but when a face call appends more tokens than its budget computes
            self.tree.evict_sliding_windows(req, start)
        super()._reserve(req, start, n, decode)


def hybrid_swa(config: dict[str, Any]) -> SGLangRadix:
    """SGLang's UnifiedRadixCache over SWATokenToKVPoolAllocator for a full and a window group on per-group pools;
    for one full group (a model without window layers) the RadixCache registry.py builds then (sglang.py), its
    pools key dropped (one group: one pool either way)."""
    if config["groups"] == [{"kind": "full"}]:
        return SGLangRadix({key: value for key, value in config.items() if key != "pools"})
    return SGLangHybridSWA(config)


_declare(hybrid_swa)
setattr(hybrid_swa, "kvcache_scope", KVCACHE_SCOPE)
