"""The op face's value types (upstream's `reference_cache` names): sizing, mask kinds, layer policies, the
attend spec and the op-face config. Immutable and validated on creation (OP-CONFIG, OP-MASK).

Why a second `CacheConfig` and `LayerPolicy`: upstream's op face configures tensors (heads, dims, dtype,
batch) where the integer layouts (`kvcache.CacheConfig`) configure rows; `kvcache.op` keeps upstream's
names so `from kvcache.op import CacheConfig, ...` replaces upstream's import line, and translates to the
integer layouts' config inside each cache (`layout_config`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import icontract
import numpy as np
from numpy.typing import NDArray

from ._errors import ArgumentValueError, ConfigError, ConfigTypeError
from ._ints import INT_MAX, in_range, is_int
from ._op_arrays import ArrayKind, array_kind, to_kind, to_numpy
from ._types import CacheConfig as LayoutConfig
from ._types import LayerConfig
from ._types import LayerPolicy as LayoutPolicy


class CacheSizing(enum.Enum):
    """How the byte layer allocates: STATIC preallocates every row a layer can need; DYNAMIC grows by
    doubling. Both bound hard at the same rows, so they answer every call alike (OP-CAP)."""

    STATIC = "static"
    DYNAMIC = "dynamic"


class MaskKind(enum.Enum):
    """The mask semantic of an AttendSpec (OP-MASK)."""

    NONE = "none"          # every query attends every returned row
    CAUSAL = "causal"      # torch's is_causal: upper-left aligned, meaningful only when q_len == rows
    EXPLICIT = "explicit"  # the spec's bool mask [q_len, rows], true = attend


class LayerKind(enum.Enum):
    """A layer's attention policy: FLAT attends the whole history, RING the newest `window` positions (of
    which the first `keep` positions of the sequence, its sinks, when it keeps any: OP-SINKS), CHUNK the
    query's own chunk of `chunk` positions (OP-CHUNK)."""

    FLAT = "flat"
    RING = "ring"
    CHUNK = "chunk"


def _config_int(owner: str, name: str, value: Any, low: int) -> None:
    """OP-CONFIG: value is an int (not a bool) in [low, INT_MAX]."""
    if not is_int(value):
        raise ConfigTypeError("OP-CONFIG", f"{owner}.{name}", "must be an int (bool is not an int here)",
                              value=value, type=type(value).__name__)
    if not in_range(value, low):
        raise ConfigError("OP-CONFIG", f"{owner}.{name}", f"must lie in [{low}, {INT_MAX}]", value=value)


@dataclass(frozen=True)
class LayerPolicy:
    """A layer's policy: `flat()` (window 0), `ring(window, keep=0)` (window >= 1; keep in [0, window)) or
    `chunked(chunk)` (window 0, chunk >= 1)."""

    kind: LayerKind = LayerKind.FLAT
    window: int = 0
    keep: int = 0   # OP-SINKS: a ring layer's sinks, the first `keep` positions every query attends
    chunk: int = 0  # OP-CHUNK: a chunk layer's chunk size (0 on every other kind)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, LayerKind):
            raise ConfigTypeError("OP-CONFIG", "LayerPolicy.kind", "must be a LayerKind", value=self.kind)
        _config_int("LayerPolicy", "window", self.window, 0)
        if self.kind in (LayerKind.FLAT, LayerKind.CHUNK) and self.window != 0:
            raise ConfigError("OP-CONFIG", "LayerPolicy.window", f"a {self.kind.value} layer's window must be 0",
                              value=self.window)
        if self.kind is LayerKind.RING and self.window < 1:
            raise ConfigError("OP-CONFIG", "LayerPolicy.window", "a ring layer needs a window >= 1", value=self.window)
        _config_int("LayerPolicy", "keep", self.keep, 0)
        if self.keep >= max(self.window, 1):
            raise ConfigError("OP-CONFIG", "LayerPolicy.keep", "OP-SINKS: keep must be below the window (a flat "
                                                               "layer keeps 0): the window needs a position of its own",
                              keep=self.keep, window=self.window)
        _config_int("LayerPolicy", "chunk", self.chunk, 0)
        if (self.chunk < 1) if self.kind is LayerKind.CHUNK else (self.chunk != 0):
            raise ConfigError("OP-CONFIG", "LayerPolicy.chunk", "OP-CHUNK: a chunk layer's chunk is >= 1 (a chunk of 0 "
                                                                "holds no query); another kind of layer has none",
                              chunk=self.chunk, kind=self.kind.value)

    @classmethod
    def flat(cls) -> LayerPolicy:
        """Attend the whole history."""
        return cls(LayerKind.FLAT, 0)

    @classmethod
    def ring(cls, window: int, keep: int = 0) -> LayerPolicy:
        """Attend `window` positions: the first `keep` (sinks) and the newest `window - keep`, the query's own
        included."""
        return cls(LayerKind.RING, window, keep)

    @classmethod
    def chunked(cls, chunk: int) -> LayerPolicy:
        """Attend the query's own chunk: the positions from chunk * (p // chunk) up to the query's own p."""
        return cls(LayerKind.CHUNK, 0, 0, chunk)


def _check_mask(kind: MaskKind, mask: Any) -> None:
    if kind is MaskKind.EXPLICIT:
        if array_kind(mask) is None:
            raise ConfigTypeError("OP-MASK", "AttendSpec.mask", "an EXPLICIT spec needs a bool numpy array or "
                                                                "torch tensor", type=type(mask).__name__)
        values = to_numpy(mask)
        if values.dtype != np.bool_ or values.ndim not in (2, 3):
            raise ConfigError("OP-MASK", "AttendSpec.mask", "must be a bool mask [q_len, rows] (or [B, q_len, rows]: "
                                                            "one per batch row)",
                              dtype=str(values.dtype), shape=tuple(values.shape))
    elif mask is not None:
        raise ConfigError("OP-MASK", "AttendSpec.mask", f"must be None for kind {kind.name}",
                          type=type(mask).__name__)


@dataclass(frozen=True)
class AttendSpec:
    """How the queries of a step attend the returned history (OP-MASK).

    `mask` is given for EXPLICIT only: bool [q_len, rows], true = attend, broadcast over batch and heads; or
    [B, q_len, rows], one mask per batch row (rows that differ: OP-PAD), broadcast over heads.
    """

    kind: MaskKind
    mask: Optional[Any] = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, MaskKind):
            raise ConfigTypeError("OP-MASK", "AttendSpec.kind", "must be a MaskKind", value=self.kind)
        _check_mask(self.kind, self.mask)


#: The element types the byte layer stores (numpy's names; torch's dtypes of the same names are accepted).
FLOAT_DTYPES = ("float16", "float32", "float64")


def numpy_dtype(dtype: Any) -> np.dtype[Any]:
    """OP-CONFIG: the numpy dtype of a config's `dtype`: a numpy dtype or type, its name, or a torch dtype
    of the same name (read by name, so torch need not be installed to name one)."""
    name = str(dtype).removeprefix("torch.") if type(dtype).__module__ == "torch" else None
    resolved: Optional[np.dtype[Any]] = None
    if dtype is not None:  # np.dtype(None) would quietly mean float64
        try:
            resolved = np.dtype(name if name is not None else dtype)
        except TypeError:
            pass
    if resolved is None or resolved.name not in FLOAT_DTYPES:
        raise ConfigError("OP-CONFIG", "CacheConfig.dtype", f"must be one of {', '.join(FLOAT_DTYPES)}",
                          value=dtype)
    return resolved


@dataclass(frozen=True)
class CacheConfig:
    """The op face's configuration (upstream's fields; `v_head_dim` and `max_write` are ours).

    `layers`: one policy for every layer, or one per layer. `v_head_dim` (default `head_dim`) is the width
    of V, which may differ from K's (MLA). `max_write`, when set, makes the contiguous cache keep only a
    ring of `window + max_write - 1` rows on each ring layer, and bounds every step to `max_write` tokens;
    unset, a ring layer keeps its whole history and the window is applied by the mask alone.
    `record_past` (transformers' `activate_past_recording`) makes ring layers keep their past for a later
    trim (OP-RECORD): the contiguous cache then keeps a ring's whole history, `max_write` set or not.
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    capacity: int
    sizing: CacheSizing = CacheSizing.DYNAMIC
    dtype: Any = np.float32
    batch_size: int = 1
    layers: Sequence[LayerPolicy] = field(default=(LayerPolicy.flat(),))
    v_head_dim: Optional[int] = None
    max_write: Optional[int] = None
    record_past: bool = False

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_kv_heads", "head_dim", "capacity", "batch_size"):
            _config_int("CacheConfig", name, getattr(self, name), 1)
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        _config_int("CacheConfig", "v_head_dim", self.v_head_dim, 1)
        if self.max_write is not None:
            _config_int("CacheConfig", "max_write", self.max_write, 1)
        if type(self.record_past) is not bool:
            raise ConfigTypeError("OP-CONFIG", "CacheConfig.record_past", "must be True or False (OP-RECORD)",
                                  value=self.record_past, type=type(self.record_past).__name__)
        if not isinstance(self.sizing, CacheSizing):
            raise ConfigTypeError("OP-CONFIG", "CacheConfig.sizing", "must be a CacheSizing", value=self.sizing)
        numpy_dtype(self.dtype)
        if type(self.layers) not in (list, tuple):
            raise ConfigTypeError("OP-CONFIG", "CacheConfig.layers", "must be a list or tuple of LayerPolicy",
                                  value=self.layers)
        object.__setattr__(self, "layers", tuple(self.layers))
        if len(self.layers) not in (1, self.n_layers):
            raise ConfigError("OP-CONFIG", "CacheConfig.layers", "must hold one policy, or one per layer",
                              size=len(self.layers), n_layers=self.n_layers)
        for index, policy in enumerate(self.layers):
            if not isinstance(policy, LayerPolicy):
                raise ConfigTypeError("OP-CONFIG", f"CacheConfig.layers[{index}]", "must be a LayerPolicy",
                                      value=policy)
            LayerPolicy(policy.kind, policy.window, policy.keep, policy.chunk)  # re-validated: frozen fields yield to object.__setattr__

    def policy_for(self, layer_id: int) -> LayerPolicy:
        """The policy of layer `layer_id` (the broadcast one when `layers` holds one)."""
        return self.layers[0] if len(self.layers) == 1 else self.layers[layer_id]

    def window(self, layer_id: int) -> int:
        """The layer's window in positions; 0 for a flat layer."""
        return self.policy_for(layer_id).window

    def keep(self, layer_id: int) -> int:
        """The layer's sinks (OP-SINKS); 0 for a flat layer or a plain ring."""
        return self.policy_for(layer_id).keep

    def chunk(self, layer_id: int) -> int:
        """The layer's chunk size (OP-CHUNK); 0 for every other kind of layer."""
        return self.policy_for(layer_id).chunk


def validated(config: Any) -> CacheConfig:
    """OP-CONFIG: a fresh, re-validated copy of an op-face config (a cache keeps its own)."""
    if not isinstance(config, CacheConfig):
        raise ConfigTypeError("OP-CONFIG", "config", "must be a kvcache.op.CacheConfig", value=config,
                              type=type(config).__name__)
    return CacheConfig(config.n_layers, config.n_kv_heads, config.head_dim, config.capacity, config.sizing,
                       config.dtype, config.batch_size, tuple(config.layers), config.v_head_dim, config.max_write,
                       config.record_past)


def _is_op_config(config: Any) -> bool:
    return isinstance(config, CacheConfig)


def _not_op_config(config: Any) -> ConfigTypeError:
    return ConfigTypeError("OP-CONFIG", "config", "must be a kvcache.op.CacheConfig", type=type(config).__name__)


# The precondition of both caches' constructors. A named condition, not a lambda: icontract (and the listing of
# spec/CONTRACTS.md) reads a lambda back from its decorator line, which a shared decorator does not have.
takes_op_config = icontract.require(_is_op_config, "OP-CONFIG: config is a kvcache.op.CacheConfig",
                                    error=_not_op_config, enabled=True)


def layout_config(config: CacheConfig, *, ring_rows: bool) -> LayoutConfig:
    """The integer layouts' config of an op config. `ring_rows`: a ring layer is laid out as a ring (its
    window's rows only); otherwise it is laid out flat and its window is the mask's business. A ring with
    sinks is always laid out flat: the integer layouts have no sinks (its rows are bounded by capacity); so is a
    chunk layer (its chunk is the mask's business) and a ring that records its past (OP-RECORD)."""
    def policy(op_policy: LayerPolicy) -> LayoutPolicy:
        if op_policy.kind is LayerKind.RING and ring_rows and not op_policy.keep and not config.record_past:
            return LayoutPolicy.ring(op_policy.window)
        return LayoutPolicy.flat()
    layers = tuple(LayerConfig(policy(p), config.n_kv_heads, config.head_dim) for p in config.layers)
    return LayoutConfig(config.capacity, config.n_layers, layers, max_write=config.max_write)


Mask = NDArray[np.bool_]


def mask_of(spec: AttendSpec, q_len: int, rows: int, batch: Optional[int] = None) -> Mask:
    """OP-MASK: the bool mask [q_len, rows] (true = attend) a spec means for q_len queries over rows rows; a
    per-row mask [B, q_len, rows] as it is (B must be `batch` when given).

    :raises ArgumentValueError: CAUSAL with q_len != rows (torch's upper-left is_causal would hide the
        prior rows), or an EXPLICIT mask of another shape
    :raises ConfigError: a spec whose fields were changed after it was made (frozen fields still yield to
        `object.__setattr__`) into something no spec may hold
    """
    AttendSpec(spec.kind, spec.mask)  # OP-MASK: re-validated, as it is read now
    if spec.kind is MaskKind.NONE:
        return np.ones((q_len, rows), dtype=np.bool_)
    if spec.kind is MaskKind.CAUSAL:
        if q_len != rows:
            raise ArgumentValueError("OP-MASK", "spec", "CAUSAL is torch's upper-left is_causal: it needs q_len == "
                                                        "rows (a continuation needs an EXPLICIT mask)",
                                     q_len=q_len, rows=rows)
        return np.tril(np.ones((q_len, rows), dtype=np.bool_))
    mask = to_numpy(spec.mask)
    if mask.shape[-2:] != (q_len, rows) or mask.ndim == 3 and batch is not None and mask.shape[0] != batch:
        raise ArgumentValueError("OP-MASK", "spec.mask", f"must have shape [q_len, rows] = [{q_len}, {rows}] (or "
                                                         f"[B, q_len, rows], B = {batch})", shape=tuple(mask.shape))
    result: Mask = mask.astype(np.bool_, copy=True)
    return result


def spec_for(mask: Mask, kind: ArrayKind) -> AttendSpec:
    """OP-MASK: the plainest spec that means `mask`: NONE when every query attends every row, CAUSAL when it
    is square and exactly upper-left causal, else EXPLICIT (its mask of the given array kind). A per-row mask
    [B, q_len, rows] whose rows all agree is answered as their one mask (OP-PAD)."""
    if mask.ndim == 3 and (mask == mask[:1]).all():
        mask = mask[0]
    if mask.ndim == 3:
        return AttendSpec(MaskKind.EXPLICIT, to_kind(mask.copy(), kind))
    q_len, rows = mask.shape
    if mask.all():
        return AttendSpec(MaskKind.NONE)
    if q_len == rows and np.array_equal(mask, np.tril(np.ones((q_len, rows), dtype=np.bool_))):
        return AttendSpec(MaskKind.CAUSAL)
    return AttendSpec(MaskKind.EXPLICIT, to_kind(mask.copy(), kind))


def attended_by_formula(query_positions: Sequence[int], key_positions: Sequence[int], window: int,
                        keep: int = 0, chunk: int = 0) -> Mask:
    """OP-ATTEND, OP-SINKS, OP-CHUNK for one sequence, written out: query at p attends key at q iff q <= p and,
    windowed (window > 0), q < keep or q > p - (window - keep); chunked (chunk > 0), q >= chunk * (p // chunk)."""
    queries = np.asarray(query_positions, dtype=np.int64)[:, None]
    keys = np.asarray(key_positions, dtype=np.int64)[None, :]
    attends: Mask = keys <= queries
    if window > 0:
        attends &= (keys < keep) | (keys > queries - (window - keep))
    if chunk > 0:
        attends &= keys >= queries - queries % chunk
    return attends


def hist_shapes_hold(config: CacheConfig, result: tuple[Any, Any, AttendSpec], q_len: int) -> bool:
    """OP-HIST, OP-MASK: the histories' shapes and dtype, and a spec that means a [q_len, rows] mask."""
    k_hist, v_hist = to_numpy(result[0]), to_numpy(result[1])
    rows = k_hist.shape[2]
    b, h = config.batch_size, config.n_kv_heads
    assert config.v_head_dim is not None
    dtype = numpy_dtype(config.dtype)
    return (k_hist.shape == (b, h, rows, config.head_dim) and v_hist.shape == (b, h, rows, config.v_head_dim)
            and k_hist.dtype == dtype and v_hist.dtype == dtype and rows >= q_len
            and mask_of(result[2], q_len, rows, b).shape[-2:] == (q_len, rows))
