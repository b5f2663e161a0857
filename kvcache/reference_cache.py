"""The drop-in under upstream's op: `kvcache.op`'s strict caches under the names, and with the spec types, of
ExecuTorch's `executorch.extension.llm.cache.reference_cache` (docs/dropin.md).

Redirecting one import is the whole change a user makes:

    from kvcache.reference_cache import (attend, AttendSpec, CacheConfig, CacheSizing, CellReferenceCache,
                                         ContiguousReferenceCache, flatten_step, LayerKind, LayerPolicy,
                                         MaskKind, MAX_SEQS)

and the caches, installed in upstream's `update_and_attend` op through its `REGISTRY`, give its `attend` specs
it reads right. Upstream's `attend` picks its mechanism by comparing `spec.kind` with its own `MaskKind`
members, so a spec of another class would be read as neither CAUSAL nor EXPLICIT - silently wrong attention.
Hence the interop:

- When upstream's module is importable (torch and executorch installed), `AttendSpec` and `MaskKind` here ARE
  upstream's classes, and both caches answer with upstream's `AttendSpec` (the same kind and mask the
  project's cache decided; only the class changes). `attend` here reads either class by its meaning (OP-MASK)
  and attends with the project's `kvcache.op.attend`.
- Otherwise they are the project's own (`kvcache.op`), and this module is `kvcache.op` plus `flatten_step`.

`USING_UPSTREAM_TYPES` says which. Everything else - `CacheConfig`, `LayerPolicy`, the caches' rules, their
typed errors with rule ids - is the project's: the strictness is the point of the drop-in.

Layers of a cell step that share a window share one mask object, as upstream's do: a mask is handed out
again only while it still holds exactly the values the cache decided for the layer asking, so a caller that
changed the object in place gets a new one.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Mapping, Optional

import icontract
import numpy as np

from . import op
from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError
from ._op_arrays import MAX_POSITION, array_kind, found, to_kind, to_numpy
from ._op_cells import MAX_SEQS, _id_error, _int_error
from ._op_types import CacheConfig, CacheSizing, LayerKind, LayerPolicy

#: Upstream's module, whose `AttendSpec` and `MaskKind` the op's `attend` recognises.
UPSTREAM_MODULE = "executorch.extension.llm.cache.reference_cache"


def _upstream() -> Optional[Any]:
    """Upstream's reference_cache module when it imports (it needs torch and executorch), else None."""
    try:
        return importlib.import_module(UPSTREAM_MODULE)
    except ImportError:
        return None


_UPSTREAM = _upstream()
#: True when `AttendSpec` and `MaskKind` are upstream's classes (executorch importable), False when the project's.
USING_UPSTREAM_TYPES = _UPSTREAM is not None
AttendSpec: Any = _UPSTREAM.AttendSpec if _UPSTREAM is not None else op.AttendSpec
MaskKind: Any = _UPSTREAM.MaskKind if _UPSTREAM is not None else op.MaskKind


def _as_ours(spec: op.AttendSpec) -> Any:
    """The project's spec as this module's `AttendSpec` (upstream's, when it is the one in use)."""
    if not USING_UPSTREAM_TYPES:
        return spec
    return AttendSpec(kind=MaskKind[spec.kind.name], mask=spec.mask)


def _as_project(spec: Any) -> Any:
    """OP-MASK: a spec of either class as the project's (validated there: upstream's dataclass checks nothing,
    so a bad kind or mask is refused with the project's typed error); anything else is passed on unchanged,
    for `kvcache.op.attend` to refuse with its typed error."""
    if isinstance(spec, op.AttendSpec) or not USING_UPSTREAM_TYPES or not isinstance(spec, AttendSpec):
        return spec
    kind = op.MaskKind[spec.kind.name] if isinstance(spec.kind, MaskKind) else spec.kind
    return op.AttendSpec(kind, spec.mask)


def attend(q: Any, k: Any, v: Any, spec: Any, scale: Optional[float] = None, out_dtype: Any = None) -> Any:
    """`kvcache.op.attend` (OP-MASK, OP-ARGS) for a spec of this module's `AttendSpec` class or the project's:
    softmax attention of q over (k, v) with the mask the spec means."""
    return op.attend(q, k, v, _as_project(spec), scale, out_dtype)


class ContiguousReferenceCache(op.ContiguousReferenceCache):
    """`kvcache.op.ContiguousReferenceCache`, answering with this module's `AttendSpec`."""

    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, Any]:
        """`kvcache.op.ContiguousReferenceCache.update_and_fetch`, its spec as this module's `AttendSpec`."""
        k_hist, v_hist, spec = super().update_and_fetch(layer_id, k, v, position)
        return k_hist, v_hist, _as_ours(spec)


class CellReferenceCache(op.CellReferenceCache):
    """`kvcache.op.CellReferenceCache`, answering with this module's `AttendSpec`; the layers of a step that
    share a window share one mask object while it holds what the cache decided (upstream's memo)."""

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        self._step_masks: dict[int, Any] = {}   # window -> the mask object handed out in this step

    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, Any]:
        """`kvcache.op.CellReferenceCache.update_and_fetch`, its spec as this module's `AttendSpec`."""
        if self._placed is None:   # this call places a new step (or is refused): no mask of an old one is shared
            self._step_masks = {}
        k_hist, v_hist, spec = super().update_and_fetch(layer_id, k, v, position)
        window = self.config.window(layer_id)
        shared = self._step_masks.get(window)
        if shared is not None and _same_values(shared, spec.mask):
            mask = shared
        else:
            mask = self._step_masks[window] = spec.mask
        return k_hist, v_hist, _as_ours(op.AttendSpec(spec.kind, mask))


def _same_values(shared: Any, mask: Any) -> bool:
    """Whether a mask handed out earlier still holds exactly `mask`'s values (same kind, shape, dtype)."""
    if array_kind(shared) != array_kind(mask):
        return False
    old, new = to_numpy(shared), to_numpy(mask)
    return old.shape == new.shape and old.dtype == new.dtype and bool(np.array_equal(old, new))


def _flatten_error(sequences: Any) -> Optional[KVCacheError]:
    """OP-STEP, OP-ARGS, OP-POS: a mapping of sequence ids in [0, 63) to (tokens, start position): tokens a numpy
    array or torch tensor [1, n >= 1, ...], all of one kind and dtype and trailing shape; start an int >= 0."""
    if not isinstance(sequences, Mapping):
        return ArgumentTypeError("OP-STEP", "sequences", "must be a mapping {seq_id: (tokens, start_pos)}",
                                 type=type(sequences).__name__)
    if not sequences:
        return ArgumentValueError("OP-STEP", "sequences", "must not be empty (a step has at least one token)")
    first: Optional[tuple[Optional[str], Any, tuple[int, ...]]] = None
    for seq_id, entry in sequences.items():
        error = _id_error("OP-STEP", "sequences (a seq_id)", seq_id)
        if error is not None:
            return error
        if type(entry) is not tuple or len(entry) != 2:
            return ArgumentTypeError("OP-ARGS", f"sequences[{seq_id}]", "must be a pair (tokens, start_pos)",
                                     type=type(entry).__name__)
        tokens, start = entry
        kind = array_kind(tokens)
        if kind is None:
            return ArgumentTypeError("OP-ARGS", f"sequences[{seq_id}][0]", "must be a numpy array or torch tensor",
                                     type=type(tokens).__name__)
        shape = tuple(tokens.shape)
        if len(shape) < 2 or shape[0] != 1 or shape[1] < 1:
            return ArgumentValueError("OP-ARGS", f"sequences[{seq_id}][0]", "must be [1, n >= 1, ...] (the token "
                                                                             "axis second)", shape=shape)
        here = (kind, tokens.dtype, shape[2:])
        if first is not None and here != first:
            return ArgumentValueError("OP-ARGS", f"sequences[{seq_id}][0]", "must match the other sequences' "
                                                                             "kind, dtype and trailing shape",
                                      shape=shape, dtype=str(tokens.dtype))
        first = here
        error = _int_error("OP-POS", f"sequences[{seq_id}][1]", start, 0)
        if error is None and start + shape[1] - 1 > MAX_POSITION:
            error = ArgumentValueError("OP-POS", f"sequences[{seq_id}][1]", f"its tokens' positions must lie in "
                                                                             f"[0, {MAX_POSITION}]", value=start)
        if error is not None:
            return error
    return None


@icontract.require(lambda sequences: _flatten_error(sequences) is None,
                   "OP-STEP, OP-ARGS, OP-POS: {seq_id in [0, 63): (tokens [1, n >= 1, ...], start_pos >= 0)}, tokens "
                   "of one kind, dtype and trailing shape",
                   error=lambda sequences: found(_flatten_error(sequences)), enabled=True)
def flatten_step(sequences: Mapping[int, tuple[Any, int]]) -> tuple[Any, Any, list[int], Any]:
    """One step's sequences on a single token axis (a host helper: the cache is given only the ids).

    `sequences`: {seq_id: (tokens, start_pos)}, tokens [1, n, ...] (ids, or embeddings), start_pos the
    position of its first token, in the mapping's order. Returns (tokens, positions [n_tok, 1] int64,
    seq_ids for `begin_step`, logits_indices [n_seqs] int64: each sequence's last token), the arrays of the
    tokens' kind (numpy arrays or torch tensors).
    """
    seq_ids: list[int] = []
    positions: list[int] = []
    last: list[int] = []
    parts = []
    for seq_id, (tokens, start) in sequences.items():
        n = int(tokens.shape[1])
        parts.append(tokens)
        seq_ids += [seq_id] * n
        positions += range(start, start + n)
        last.append(len(seq_ids) - 1)
    kind = array_kind(parts[0])
    assert kind is not None  # the precondition
    if kind == "torch":
        torch = sys.modules["torch"]   # the tokens are torch tensors, so torch is imported
        flat = torch.cat(parts, dim=1)
    else:
        flat = np.concatenate(parts, axis=1)
    where = np.array(positions, dtype=np.int64).reshape(-1, 1)
    return flat, to_kind(where, kind), seq_ids, to_kind(np.array(last, dtype=np.int64), kind)


__all__ = ["MAX_SEQS", "USING_UPSTREAM_TYPES", "AttendSpec", "CacheConfig", "CacheSizing", "CellReferenceCache",
           "ContiguousReferenceCache", "LayerKind", "LayerPolicy", "MaskKind", "attend", "flatten_step"]
