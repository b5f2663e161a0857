"""SGLang 0.5.23's KV bookkeeping (RadixCache over its token-to-KV allocator and ReqToTokenPool) as a paged-face
target, driven as its scheduler drives it, on the CPU.

    kvcache conformance --target python:kvcache_spec.conformance.libraries.sglang:radix --strict

Needs the `sglang` extra (pyproject.toml) and sglang itself with --no-deps: `.ci/install-serving.sh VENV`.

What one face call does is what SGLang's scheduler does for one request at that point (read in the installed
package, sglang/srt):
- `admit`: a scheduler `Req` (managers/schedule_batch.py) with the prompt as origin_input_ids and the keys as its
  `extra_key`; `req.init_next_round_input(tree_cache)`, which matches the prefix (mem_cache/common.py
  match_kv_cache: RadixKey(tokens, extra_key), capped at len - 1 by Req._compute_max_prefix_len). Then the
  PrefillAdder's budget check under a lock on the matched node (managers/schedule_policy.py add_one_req /
  _lock_node): the chunk must fit in the allocator's free slots plus the tree's evictable ones, and a request row
  must be free; if not, the lock is dropped and nothing was allocated (a refusal, None). Otherwise the lock is
  kept as `req.lock` (_commit_prefill_admission), and alloc_for_extend's steps for this one request
  (mem_cache/allocation.py): a ReqToTokenPool row, `alloc_token_slots` (evict_from_tree_cache, then the
  allocator's alloc), the matched prefix (`prefix_device_indices`) and the new slots written into the row,
  kv_allocated_len = kv_committed_len = the row's length. After the forward the batch result processor
  checkpoints an unfinished prefill request (`checkpoint_kv_cache`: the computed prefix inserted into the tree,
  duplicates freed, the row repointed, the lock moved to the new node); here that is done before the call returns,
  since the harness computes the reserved slots right after it (the tree records slot ids, not their contents).
- `extend`: the appended tokens become output_ids (`refresh_fill_ids`). While the prompt is not all computed, a
  chunked-prefill continuation (no new match: `init_next_round_input()` without a tree, as scheduler.py calls it
  for its chunked request), its slots allocated as above and checkpointed after; past the prompt, a decode step
  (allocation.py alloc_for_decode_default: `alloc_token_slots`, the row written at the sequence's end, the
  lengths advanced), not checkpointed (the result processor checkpoints prefill only). A refusal is decided
  as at admission, before anything is allocated.
- `free`: `release_kv_cache(req, tree_cache, checkpoint=True)`, what the result processor calls for a finished
  request: the computed sequence inserted, the row's private slots freed, the lock dropped, the row returned.
- A block is one of SGLang's pages (block_size = page_size; slot = page * page_size + offset). At page size 1 the
  allocation is `alloc_token_slots`; above it `alloc_paged_token_slots_extend` (a decode token:
  `alloc_paged_token_slots_decode`), with the row's last slot as last_loc, as alloc_for_extend builds it.
- `table`: the page of each block index of the request's req_to_token row up to what it computed (one group:
  SGLang serves every full-attention layer from that one row). A row whose slot is not at its
  position's offset of its block's page cannot be shown as a table: that raises.
- `available`: (the allocator's available_size() + the tree's evictable_size()) in pages.
- `ref_counts`: a page on the tree counts its node's `lock_ref` (the live requests whose locked path holds it);
  a page only in one row (a partial page or a decode tail not yet inserted) counts once.

prefix_caching false builds RadixCache with its own `disable` flag (a tree that holds and matches nothing);
SGLang's launcher builds a disabled UnifiedRadixCache there instead, which this target does not drive.

Scope (KVCACHE_SCOPE below): `flat` - one full-attention group, any page size. A configuration with a window group
is refused at creation: SGLang's sliding-window caches (pure_swa_radix_cache.py, and unified_radix_cache.py over
allocator/swa.py with a second pool for the window layers) are not driven by this adapter (docs/sglang.md). So is
one with two full groups: SGLang keeps one row for every full-attention layer, one group.
Declared `trusted-args`: the cache's callers are the scheduler's own code, after SGLang's API layer validated the
request (managers/io_struct.py:390-395 refuses a request id seen twice, :499 an empty input_ids;
managers/tokenizer_manager.py:1338 a prompt not shorter than the context), so the suite sends no malformed call,
and this adapter checks none: nothing it is given is wrapped or refused by it.
"""

from __future__ import annotations

import json
import warnings
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..._extras import missing_line, version_line

_MISSING = (missing_line("sglang", "kvcache_spec.conformance.libraries.sglang")
            or version_line("sglang", "kvcache_spec.conformance.libraries.sglang"))
if _MISSING:
    raise ImportError(_MISSING)

from . import _sglang_torchvision  # noqa: E402  (after the extra's check: it imports transformers)

_sglang_torchvision.install()
with warnings.catch_warnings():
    # Importing the quantization layers warns that CUDA-only methods are unavailable on this CPU build.
    warnings.simplefilter("ignore")
    import torch  # noqa: E402
    from sglang.srt.managers.schedule_batch import Req  # noqa: E402
    from sglang.srt.mem_cache.allocation import (  # noqa: E402
        alloc_paged_token_slots_decode, alloc_paged_token_slots_extend, alloc_token_slots)
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator  # noqa: E402
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
    from sglang.srt.mem_cache.common import (  # noqa: E402
        checkpoint_kv_cache, release_kv_cache)
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
    from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

# What this target declares (SPEC.md section 6.1, spec/conformance/scope.py): of the paged face's features, `flat`
# (full-attention groups; a window group needs `ring`), and `trusted-args`: its callers are the scheduler's own code.
KVCACHE_SCOPE = ("flat", "trusted-args")
# A request's decode length is the scheduler's max_new_tokens; the face ends a request with free, never by length.
_UNBOUNDED_NEW_TOKENS = 1 << 30

_published_page_size: Optional[int] = None


def _publish_server_args(page_size: int) -> None:
    """Req.owned_kv_len and release_kv_cache read the scheduler's published server arguments
    (runtime_context.get_serving / get_spec): published as SGLang's own cache tests do, with the page size, on the
    CPU and with no model (again only when another page size is asked for)."""
    global _published_page_size
    if _published_page_size != page_size:
        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page_size, device="cpu"))
        _published_page_size = page_size


@dataclass
class _Live:
    req: Any
    prompt_len: int
    computed: int


# --- what reaches the scheduler: SGLang's API layer validates a request before the scheduler sees it - the pydantic
# request types (managers/io_struct.py), TokenizerManager's length check (managers/tokenizer_manager.py:1338, a prompt
# not shorter than the context refused), the scheduler's own max_new_tokens cap - and ServerArgs the configuration;
# the cache validates nothing (its only callers are the scheduler's own code). The target declares `trusted-args` for
# that, and checks nothing itself: what the suite sends goes to SGLang as it is.


def _served_groups(config: dict[str, Any]) -> None:
    """This target's scope, not a check of the configuration's form: SGLang serves every full-attention layer from
    one req_to_token row (mem_cache/memory_pool.py:406), so a model's full layers are one group; window groups are
    not driven here (module docstring)."""
    if config["groups"] != [{"kind": "full"}]:
        raise ValueError("groups: this target serves one full-attention group (SGLang's one row for every full "
                         "layer); window groups are outside its scope (PAGED-CONFIG)")


def extra_key(keys: list[str]) -> Optional[str]:
    """The request's keys as SGLang's one `extra_key` string (LoRA id, cache salt ... joined by the engine): no
    keys is no extra key; JSON keeps ["a", "b"] apart from ["ab"]."""
    return json.dumps(keys) if keys else None


class SGLangRadix:
    """One scheduler's KV bookkeeping: a ReqToTokenPool, a TokenToKVPoolAllocator over a one-layer CPU KV pool, and
    a RadixCache over both (the tree cache SGLang builds for a full-attention model). A block is one of SGLang's
    pages: at page size 1 the TokenToKVPoolAllocator, above it the PagedTokenToKVPoolAllocator (its torch
    kernels: Triton does not launch on the CPU)."""

    def __init__(self, config: dict[str, Any]) -> None:
        _served_groups(config)
        groups = config["groups"]
        self.page = int(config["block_size"])
        _publish_server_args(self.page)
        self.groups = len(groups)
        self.num_blocks = int(config["num_blocks"])
        tokens = self.num_blocks * self.page
        # The KV tensors themselves are never read: the harness keeps the data (one layer, one head of width 1).
        kv_pool = MHATokenToKVPool(tokens, self.page, torch.float32, 1, 1, 1, "cpu", False)
        self.allocator = (TokenToKVPoolAllocator(tokens, torch.float32, "cpu", kv_pool, need_sort=False)
                          if self.page == 1 else
                          PagedTokenToKVPoolAllocator(tokens, self.page, torch.float32, "cpu", kv_pool, need_sort=False))
        # Every live request holds at least one slot (its last prompt token is always computed), so as many rows
        # as slots never refuse a request for want of a row.
        self.rows = ReqToTokenPool(self.num_blocks, config["max_model_len"], "cpu", False)
        self.tree = RadixCache(CacheInitParams(disable=not config["prefix_caching"], req_to_token_pool=self.rows,
                                               token_to_kv_pool_allocator=self.allocator,
                                               page_size=self.page))
        self.live: dict[str, _Live] = {}

    # --- the face ------------------------------------------------------------------------------------------------

    def admit(self, request: str, tokens: list[int], keys: list[str], budget: int) -> Optional[int]:
        req = Req(request, "", array("q", tokens), SamplingParams(max_new_tokens=_UNBOUNDED_NEW_TOKENS),
                  extra_key=extra_key(keys))
        req.init_next_round_input(self.tree)
        hit = int(req.prefix_len)
        n = min(len(tokens) - hit, budget)
        lock = self.tree.lock(req.last_node)
        if not self._fits(hit, n) or self.rows.available_size() < 1:
            self.tree.unlock(lock)
            return None
        req.lock = lock
        req.extend_end = hit + n
        prefix = self.tree.prefix_device_indices(req)
        self.rows.alloc([req])
        self.rows.write((req.kv.req_pool_idx, slice(0, hit)), prefix)
        self._reserve(req, hit, n, decode=False)
        self.live[request] = _Live(req, len(tokens), hit + n)
        checkpoint_kv_cache(req, self.tree)
        return hit

    def extend(self, request: str, tokens: list[int], budget: int) -> Optional[int]:
        entry = self.live[request]
        req = entry.req
        total = len(req.origin_input_ids) + len(req.output_ids) + len(tokens)
        n = min(total - entry.computed, budget)
        if not self._fits(entry.computed, n):
            return None
        req.output_ids.extend(tokens)
        req.refresh_fill_ids()
        prefill = entry.computed < entry.prompt_len
        if prefill:
            req.extend_end = req.prefix_len + n
        self._reserve(req, entry.computed, n, decode=not prefill and n == 1)
        entry.computed += n
        if prefill:
            checkpoint_kv_cache(req, self.tree)
        return n

    def free(self, request: str) -> None:
        entry = self.live[request]
        del self.live[request]
        release_kv_cache(entry.req, self.tree, checkpoint=True)

    def table(self, request: str) -> list[list[Optional[int]]]:
        blocks: list[Optional[int]] = list(self._pages(request))
        return [list(blocks) for _ in range(self.groups)]

    def available(self) -> int:
        return (int(self.allocator.available_size()) + int(self.tree.evictable_size())) // self.page

    def ref_counts(self) -> dict[int, int]:
        on_tree = self._tree_locks()
        counts: dict[int, int] = {}
        for request in self.live:
            for page in self._pages(request):
                counts[page] = on_tree.get(page, 1) * self.groups
        return counts

    def faces(self) -> list[str]:
        return ["paged"]

    # --- SGLang's steps ------------------------------------------------------------------------------------------

    def _fits(self, start: int, n: int) -> bool:
        """The PrefillAdder's memory check for positions start .. start+n-1: the new pages they need within the
        free pages plus what eviction can free."""
        pages = -(-(start + n) // self.page) - -(-start // self.page)
        return pages <= self.available()

    def _reserve(self, req: Any, start: int, n: int, decode: bool) -> None:
        """The allocation step of alloc_for_extend (or, for one decode token, alloc_for_decode_default) for one
        request, and the row written at start: page size 1 alloc_token_slots; paged, alloc_paged_token_slots_extend
        or _decode with the row's last slot as last_loc (each evicts from the tree first; each raises on a failed
        allocation, as the scheduler does: the budget check above admitted it)."""
        row = self.rows.req_to_token[req.kv.req_pool_idx]
        if self.page == 1:
            slots = alloc_token_slots(self.tree, n)
        else:
            last_loc = torch.tensor([int(row[start - 1]) if start else -1], dtype=torch.int64)
            end = torch.tensor([start + n], dtype=torch.int64)
            if decode:
                slots = alloc_paged_token_slots_decode(self.tree, end, end, last_loc)
            else:
                begin = torch.tensor([start], dtype=torch.int64)
                slots = alloc_paged_token_slots_extend(self.tree, begin, begin, end, end, last_loc, n)
        self.rows.write((req.kv.req_pool_idx, slice(start, start + n)), slots.to(torch.int32))
        req.kv.kv_allocated_len = start + n
        req.kv.kv_committed_len = start + n

    def _pages(self, request: str) -> list[int]:
        """The request's block table: the page of each of its block indexes, read off its req_to_token row. A
        position whose slot is not at its own offset of its block's page is SGLang's row contradicting its page
        layout, which no table can show: it is raised."""
        entry = self.live[request]
        row = self.rows.req_to_token[entry.req.kv.req_pool_idx, :entry.computed].tolist()
        pages = [int(slot) // self.page for slot in row[::self.page]]
        wrong = [p for p, slot in enumerate(row) if slot != pages[p // self.page] * self.page + p % self.page]
        if wrong:
            raise RuntimeError(f"request {request!r}: req_to_token position {wrong[0]} holds slot {row[wrong[0]]}, "
                               f"not offset {wrong[0] % self.page} of page {pages[wrong[0] // self.page]}")
        return pages

    def _tree_locks(self) -> dict[int, int]:
        """page -> the lock_ref of the tree node holding it (the tree holds whole pages)."""
        locks: dict[int, int] = {}
        stack = list(self.tree.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.value is not None:
                for slot in node.value.tolist()[::self.page]:
                    locks[int(slot) // self.page] = int(node.lock_ref)
            stack.extend(node.children.values())
        return locks


def radix(config: dict[str, Any]) -> SGLangRadix:
    """SGLang's RadixCache (block_size = its page size) for one full-attention group."""
    return SGLangRadix(config)


def _declare(factory: Callable[..., Any]) -> None:
    setattr(factory, "kvcache_layout", "paged")
    setattr(factory, "kvcache_scope", KVCACHE_SCOPE)


_declare(radix)
