"""The value types of the API: runs, plans, policies and configs. Immutable; validated on creation."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ._errors import ConfigError, ConfigTypeError, PlanError
from ._ints import INT_MAX, in_range, is_int


def _check_int_field(owner: str, name: str, value: Any, low: int, rule: str) -> None:
    """Raise a ConfigError naming `owner.name` unless value is an int in [low, INT_MAX]."""
    if not is_int(value):
        raise ConfigTypeError(rule, f"{owner}.{name}", "must be an int (bool is not an int here)",
                              value=value, type=type(value).__name__)
    if not in_range(value, low):
        raise ConfigError(rule, f"{owner}.{name}", f"must lie in [{low}, {INT_MAX}]", value=value)


@dataclass(frozen=True)
class Run:
    """A span of `len` physical rows starting at physical row `start`."""

    start: int
    len: int

    def __post_init__(self) -> None:
        for name, low in (("start", 0), ("len", 1)):
            value = getattr(self, name)
            if not is_int(value) or not in_range(value, low):
                raise PlanError("PLAN-SHAPE", f"Run.{name}", f"must be an int in [{low}, {INT_MAX}]",
                                value=value)

    @property
    def end(self) -> int:
        """One past the last physical row."""
        return self.start + self.len


def _check_runs(name: str, runs: Any) -> None:
    if not isinstance(runs, tuple) or not 1 <= len(runs) <= 2 or not all(isinstance(r, Run) for r in runs):
        raise PlanError("PLAN-SHAPE", f"SeqStepPlan.{name}", "must be a tuple of one or two Runs",
                        value=runs)


@dataclass(frozen=True)
class SeqStepPlan:
    """The planner-to-backend handoff for one layer and one step.

    `write` and `read` list physical runs in logical order, oldest first (two when a ring wraps).
    `read_base_pos` is the logical position of the first row read - a position, not a row index.
    """

    write: tuple[Run, ...]
    read: tuple[Run, ...]
    read_base_pos: int

    def __post_init__(self) -> None:
        _check_runs("write", self.write)
        _check_runs("read", self.read)
        if not is_int(self.read_base_pos) or not in_range(self.read_base_pos, 0):
            raise PlanError("PLAN-SHAPE", "SeqStepPlan.read_base_pos", f"must be an int in [0, {INT_MAX}]",
                            value=self.read_base_pos)

    @property
    def n_write(self) -> int:
        """Number of write runs (1 or 2), as in the C++ struct."""
        return len(self.write)

    @property
    def n_read(self) -> int:
        """Number of read runs (1 or 2), as in the C++ struct."""
        return len(self.read)

    @property
    def n_written(self) -> int:
        """T: the number of rows written, i.e. the step's new tokens."""
        return sum(run.len for run in self.write)

    @property
    def end(self) -> int:
        """One past the last logical position this step reads: position + T."""
        return self.read_base_pos + sum(run.len for run in self.read)

    @property
    def position(self) -> int:
        """The logical position of the step's first new token."""
        return self.end - self.n_written


class Kind(enum.IntEnum):
    """Layout kind of a layer. The values are serialized upstream: append only."""

    FLAT = 0
    RING = 1


@dataclass(frozen=True)
class LayerPolicy:
    """A layer's layout policy: FLAT (window 0, full history) or RING (sliding window >= 1)."""

    kind: Kind
    window: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            raise ConfigTypeError("CFG-POLICY", "LayerPolicy.kind", "must be a Kind", value=self.kind)
        if self.kind is Kind.FLAT:
            _check_int_field("LayerPolicy", "window", self.window, 0, "CFG-POLICY")
            if self.window != 0:
                raise ConfigError("CFG-POLICY", "LayerPolicy.window", "a flat layer's window must be 0",
                                  value=self.window)
        else:
            _check_int_field("LayerPolicy", "window", self.window, 1, "CFG-POLICY")

    @staticmethod
    def flat() -> LayerPolicy:
        """Full-history layout."""
        return LayerPolicy(Kind.FLAT, 0)

    @staticmethod
    def ring(window: int) -> LayerPolicy:
        """Sliding-window layout: each new token attends to `window` keys, itself included."""
        return LayerPolicy(Kind.RING, window)


@dataclass(frozen=True)
class LayerConfig:
    """One layer's policy and the shape of its K/V rows."""

    policy: LayerPolicy
    n_kv_heads: int = 1
    head_dim: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.policy, LayerPolicy):
            raise ConfigTypeError("CFG-POLICY", "LayerConfig.policy", "must be a LayerPolicy", value=self.policy)
        _check_int_field("LayerConfig", "n_kv_heads", self.n_kv_heads, 1, "CFG-SHAPE")
        _check_int_field("LayerConfig", "head_dim", self.head_dim, 1, "CFG-SHAPE")


@dataclass(frozen=True)
class CacheConfig:
    """The whole model's cache configuration.

    `layers` has one entry (broadcast to every layer) or `n_layers` entries. `max_write` bounds the
    tokens of one step on ring layers; None means each ring layer's own window. `kv_dtype` is
    upstream's element type of the stored K/V (an int >= 0 when given); neither layout's bookkeeping
    depends on it, so it is checked and carried, never interpreted.
    """

    capacity: int
    n_layers: int
    layers: Sequence[LayerConfig]
    initial_capacity: int = 512
    max_write: Optional[int] = None
    kv_dtype: Optional[int] = None

    def __post_init__(self) -> None:
        _check_int_field("CacheConfig", "capacity", self.capacity, 1, "CFG-CAPACITY")
        _check_int_field("CacheConfig", "n_layers", self.n_layers, 1, "CFG-LAYERS")
        if not isinstance(self.layers, (list, tuple)):
            raise ConfigTypeError("CFG-LAYERS", "CacheConfig.layers", "must be a list or tuple of LayerConfig",
                                  value=self.layers)
        object.__setattr__(self, "layers", tuple(self.layers))
        if len(self.layers) not in (1, self.n_layers):
            raise ConfigError("CFG-LAYERS", "CacheConfig.layers", "must have 1 entry (broadcast) or n_layers",
                              size=len(self.layers), n_layers=self.n_layers)
        for index, layer in enumerate(self.layers):
            if not isinstance(layer, LayerConfig):
                raise ConfigTypeError("CFG-LAYERS", f"CacheConfig.layers[{index}]", "must be a LayerConfig",
                                      value=layer)
        _check_int_field("CacheConfig", "initial_capacity", self.initial_capacity, 0, "CFG-INITIAL-CAPACITY")
        if self.max_write is not None:
            _check_int_field("CacheConfig", "max_write", self.max_write, 1, "CFG-MAX-WRITE")
        if self.kv_dtype is not None:
            _check_int_field("CacheConfig", "kv_dtype", self.kv_dtype, 0, "CFG-TYPE")

    def layer(self, index: int) -> LayerConfig:
        """The configuration of layer `index` (broadcast when `layers` has one entry)."""
        return self.layers[0] if len(self.layers) == 1 else self.layers[index]
