"""The byte layer both op-face caches share: per layer one numpy array for K, [batch, n_kv_heads, rows,
head_dim], and one for V ([..., v_head_dim]), in the config's dtype. STATIC sizing allocates every row a
layer can need up front; DYNAMIC starts empty and doubles up to the same bound. A row's index is what the
integer layout named it (a plan's row, a cell), so growing appends rows and never moves one.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import icontract
import numpy as np
from numpy.typing import NDArray

from ._errors import KVCacheError
from ._op_arrays import ArrayKind, found, layer_error, step_args, to_numpy
from ._op_types import CacheConfig, CacheSizing, hist_shapes_hold, numpy_dtype


def checked_step(config: CacheConfig, layer_id: Any, k: Any, v: Any,
                 position: Any) -> tuple[NDArray[Any], NDArray[Any], list[int], ArrayKind]:
    """OP-ARGS, OP-POS: an update_and_fetch call's layer and arrays against the config (raises the typed
    error of the first bad argument); returns k's and v's values, the positions and the answer's kind."""
    error = layer_error(layer_id, config.n_layers)
    if error is not None:
        raise error
    assert config.v_head_dim is not None
    return step_args(k, v, position, config.batch_size, config.n_kv_heads, config.head_dim, config.v_head_dim)


def step_positions_or_error(config: CacheConfig, layer_id: Any, k: Any, v: Any,
                            position: Any) -> list[int] | KVCacheError:
    """`checked_step`'s positions, or the error it raises (for the preconditions, which return errors)."""
    try:
        return checked_step(config, layer_id, k, v, position)[2]
    except KVCacheError as error:
        return error


_Method = TypeVar("_Method", bound=Callable[..., Any])


# The contracts both caches' update_and_fetch share, on named functions rather than lambdas (icontract and the
# listing (spec/CONTRACTS.md) read a lambda back from its decorator line, which a shared decorator has not).
def _fetch_valid(self: Any, layer_id: Any, k: Any, v: Any, position: Any) -> bool:
    return bool(self._fetch_error(layer_id, k, v, position) is None)


def _fetch_fault(self: Any, layer_id: Any, k: Any, v: Any, position: Any) -> KVCacheError:
    return found(self._fetch_error(layer_id, k, v, position))


def _hist_holds(self: Any, k: Any, result: Any) -> bool:
    return hist_shapes_hold(self.config, result, to_numpy(k).shape[2])


def fetch_contracts(description: str) -> Callable[[_Method], _Method]:
    """The precondition (`description`: the rules the cache's `_fetch_error` checks, before anything changes)
    and the OP-HIST postcondition of an update_and_fetch."""
    checks = (icontract.require(_fetch_valid, description, error=_fetch_fault, enabled=True),
              icontract.ensure(_hist_holds, "OP-HIST: k_hist [B, Hkv, rows, D], v_hist [B, Hkv, rows, Dv], the "
                                            "config's dtype; the spec means a [q_len, rows] mask"))

    def decorate(method: _Method) -> _Method:
        for check in reversed(checks):
            method = check(method)
        return method
    return decorate


class KVPools:
    """Per layer, the K and V rows; `depths[layer]` bounds the rows of each."""

    def __init__(self, config: CacheConfig, depths: tuple[int, ...]) -> None:
        self.config = config
        self.depths = depths
        self.dtype = numpy_dtype(config.dtype)
        self.k: list[NDArray[Any]] = []
        self.v: list[NDArray[Any]] = []
        self.reset()

    def reset(self) -> None:
        """Every layer at its initial rows (all its depth for STATIC, none for DYNAMIC)."""
        config = self.config
        assert config.v_head_dim is not None
        self.k, self.v = [], []
        for depth in self.depths:
            rows = depth if config.sizing is CacheSizing.STATIC else 0
            self.k.append(np.zeros((config.batch_size, config.n_kv_heads, rows, config.head_dim), self.dtype))
            self.v.append(np.zeros((config.batch_size, config.n_kv_heads, rows, config.v_head_dim), self.dtype))

    def write(self, layer: int, rows: NDArray[np.int64], k: NDArray[Any], v: NDArray[Any]) -> None:
        """K and V of a step's tokens into `rows` of `layer` (cast to the config's dtype), growing the layer
        (doubling, at most its depth) to hold them."""
        need = int(rows.max()) + 1
        have = self.k[layer].shape[2]
        if need > have:
            new = min(self.depths[layer], max(need, 2 * have))
            self.k[layer] = _padded(self.k[layer], new)
            self.v[layer] = _padded(self.v[layer], new)
        self.k[layer][:, :, rows] = k.astype(self.dtype)
        self.v[layer][:, :, rows] = v.astype(self.dtype)

    def read(self, layer: int, rows: NDArray[np.int64]) -> tuple[NDArray[Any], NDArray[Any]]:
        """Copies of `rows` of `layer`, in the order given."""
        return self.k[layer][:, :, rows], self.v[layer][:, :, rows]

    def within_depths(self) -> bool:
        """K and V of each layer have the same rows, at most its depth."""
        return all(k.shape[2] == v.shape[2] <= depth for k, v, depth in zip(self.k, self.v, self.depths))

    def snapshot(self) -> tuple[tuple[tuple[int, ...], bytes, tuple[int, ...], bytes], ...]:
        """Every byte, as values."""
        return tuple((k.shape, k.tobytes(), v.shape, v.tobytes()) for k, v in zip(self.k, self.v))


def _padded(array: NDArray[Any], rows: int) -> NDArray[Any]:
    pad = np.zeros(array.shape[:2] + (rows - array.shape[2],) + array.shape[3:], dtype=array.dtype)
    return np.concatenate([array, pad], axis=2)
