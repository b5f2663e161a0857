"""A standalone repro through SGLang 0.5.23's own classes (docs/sglang.md, "Outside the scope: pure sliding-window
models"): with PureSWARadixCache over PureSWATokenToKVPoolAllocator (page size 1, prefix caching on) and no
prefill-aware floor (req.kv.swa_evict_floor 0, as for every model but one whose is_prefill_aware_swa() is True), a
finished request's release inserts into the tree the positions whose window slots the decode steps already freed:
those slots are then both hittable on the tree and on the allocator's free list: a prompt sharing a shorter prefix
hits them (its window reads them), and once another request holds them, evicting the tree frees them again. The steps are the scheduler's:
init_next_round_input (match), lock, alloc_token_slots, checkpoint_kv_cache after the prefill; per decode step
ScheduleBatch.maybe_evict_swa's `tree_cache.evict_sliding_windows(req, req.seqlen - 1)` before alloc_token_slots;
release_kv_cache(req, tree_cache, checkpoint=True) at the end.

Nothing of the paged face or the adapter is used but the torchvision stand-in (an import only). If SGLang stops
doing this, the test fails, and the page is brought up to date.

Needs the `sglang` extra: skipped with the reason without it, a failure under KVCACHE_NO_SKIPS=1.
"""

from __future__ import annotations

import importlib.util
import warnings
from array import array

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: bash .ci/install-serving.sh VENV", allow_module_level=True)

from kvcache_spec.conformance.libraries import _sglang_torchvision  # noqa: E402

_sglang_torchvision.install()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch  # noqa: E402
    from sglang.srt.managers.schedule_batch import Req  # noqa: E402
    from sglang.srt.mem_cache.allocation import alloc_token_slots  # noqa: E402
    from sglang.srt.mem_cache.allocator.swa import PureSWATokenToKVPoolAllocator  # noqa: E402
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
    from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache  # noqa: E402
    from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams  # noqa: E402
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning")


def test_a_released_pure_swa_request_leaves_freed_window_slots_hittable_on_the_tree() -> None:
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1, device="cpu"))
    slots, window = 16, 2
    pool = SWAKVPool(slots, slots, 1, torch.float32, 1, 1, [0], [], "cpu")     # every layer sliding-window
    allocator = PureSWATokenToKVPoolAllocator(slots, 1, torch.float32, "cpu", pool, False)
    rows = ReqToTokenPool(4, 32, "cpu", False)
    tree = PureSWARadixCache(CacheInitParams(disable=False, req_to_token_pool=rows,
                                             token_to_kv_pool_allocator=allocator, page_size=1,
                                             sliding_window_size=window))

    req = Req("a", "", array("q", [1, 2, 3]), SamplingParams(max_new_tokens=100))
    req.init_next_round_input(tree)                                   # the prefix match (nothing cached yet)
    req.lock, req.extend_end = tree.lock(req.last_node), 3            # PrefillAdder._commit_prefill_admission
    rows.alloc([req])
    rows.write((req.kv.req_pool_idx, slice(0, 3)), alloc_token_slots(tree, 3).to(torch.int32))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = 3
    checkpoint_kv_cache(req, tree)                                    # the prompt inserted after the prefill
    for token in (4, 5, 6, 7, 8):                                     # five decode steps
        req.output_ids.append(token)
        req.refresh_fill_ids()
        position = req.seqlen - 1
        tree.evict_sliding_windows(req, position)                     # maybe_evict_swa (decode)
        rows.write((req.kv.req_pool_idx, slice(position, position + 1)),
                   alloc_token_slots(tree, 1).to(torch.int32))
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
    row = rows.req_to_token[req.kv.req_pool_idx, :req.seqlen].tolist()
    freed_by_the_window = set(row) & set(allocator.swa_attn_allocator.free_pages.tolist())
    assert freed_by_the_window, "the decode steps freed no window slot"

    release_kv_cache(req, tree, checkpoint=True)                      # the request finished
    on_tree = {int(slot) for slot in tree.all_values_flatten().tolist()}
    free = set(allocator.swa_attn_allocator.free_pages.tolist())
    assert freed_by_the_window <= on_tree & free, (sorted(on_tree), sorted(free))

    # A new prompt sharing the first five tokens hits them: its window reads positions 3 and 4, whose slots are free.
    hit = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 99]))))
    assert hit.device_prefix_len == 5 and freed_by_the_window <= set(tree.path_device_indices(hit.last_device_node)
                                                                    .tolist())
    # Another request takes every free slot, those included; evicting the unlocked tree then frees them again:
    # slots a live request holds go back on the free list, to be handed out twice.
    other = alloc_token_slots(tree, allocator.available_size())
    assert freed_by_the_window <= set(other.tolist())
    tree.evict(EvictParams(num_tokens=slots))
    assert freed_by_the_window <= set(allocator.swa_attn_allocator.free_pages.tolist())
