"""The value types of the API: runs, plans, cell steps, policies and configs. Immutable; validated on creation."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ._errors import ArgumentTypeError, ArgumentValueError, ConfigError, ConfigTypeError, KVCacheError, PlanError, \
    StepError
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


#: A plan as plain values: ((start, len) of each write run), ((start, len) of each read run), read_base_pos.
PlanValue = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], int]


def _shape_error(field: str, what: str, value: Any) -> StepError:
    return StepError("CELL-STEP-SHAPE", f"CellStep.{field}", what, value=value)


@dataclass(frozen=True)
class CellStep:
    """The cells and the mask of one forward, for every layer of one window.

    `cells[i]` is the cell query token i writes; the layer reads cells [0, read_len); `mask_bits` holds
    `length * read_len` bytes, row-major: byte `i * read_len + j` is 1 iff token i attends cell j.
    Validated on creation (CELL-STEP-SHAPE), so a forged step cannot be built.
    """

    length: int
    read_len: int
    cells: tuple[int, ...]
    mask_bits: bytes

    def __post_init__(self) -> None:
        for name, low in (("length", 1), ("read_len", 1)):
            value = getattr(self, name)
            if not is_int(value) or not in_range(value, low):
                raise _shape_error(name, f"must be an int in [{low}, {INT_MAX}]", value)
        if not isinstance(self.cells, tuple) or len(self.cells) != self.length:
            raise _shape_error("cells", "must be a tuple of one cell per token", self.cells)
        if not all(is_int(c) and 0 <= c < self.read_len for c in self.cells) or len(set(self.cells)) != self.length:
            raise _shape_error("cells", "must be distinct ints in [0, read_len)", self.cells)
        if not isinstance(self.mask_bits, bytes) or len(self.mask_bits) != self.length * self.read_len:
            raise _shape_error("mask_bits", "must be bytes of length * read_len", type(self.mask_bits).__name__)
        if self.mask_bits.translate(None, b"\x00\x01"):  # what is left is neither 0 nor 1
            raise _shape_error("mask_bits", "every byte must be 0 or 1", self.mask_bits)

    def attends(self, i: int, j: int) -> bool:
        """True iff query token i attends cell j.

        :raises ArgumentTypeError: i or j is not an int (ARG-INT)
        :raises ArgumentValueError: i not in [0, length) or j not in [0, read_len) (ARG-RANGE)
        """
        for name, value, end in (("i", i, self.length), ("j", j, self.read_len)):
            if not is_int(value):
                raise ArgumentTypeError("ARG-INT", name, "must be an int (bool is not an int here)",
                                        value=value, type=type(value).__name__)
            if not 0 <= value < end:
                raise ArgumentValueError("ARG-RANGE", name, f"must lie in [0, {end})", value=value)
        return self.mask_bits[i * self.read_len + j] == 1

    def row(self, i: int) -> bytes:
        """Token i's mask row: read_len bytes, 1 = attend."""
        self.attends(i, 0)  # validates i
        return self.mask_bits[i * self.read_len:(i + 1) * self.read_len]


def _run_values(runs: object) -> Optional[tuple[tuple[int, int], ...]]:
    if type(runs) is not tuple or not 1 <= len(runs) <= 2:
        return None
    values = []
    for run in runs:
        if type(run) is not Run:
            return None
        start, length = run.start, run.len
        if type(start) is not int or type(length) is not int or not (0 <= start <= INT_MAX and 1 <= length <= INT_MAX):
            return None
        values.append((start, length))
    return tuple(values)


def plan_value(plan: object) -> Optional[PlanValue]:
    """ARG-TYPE, PLAN-SHAPE: a plan's fields as plain ints, each read once; None unless `plan` is exactly
    a SeqStepPlan (no subclass) of one or two exact `Run`s per side with int fields in range.

    Why exact types: a subclass (of the plan, a Run or int) could answer its own `==`, or a property
    that changes between two reads; with exact types no code of the caller runs while a plan is
    judged, and the values judged are the values used.
    """
    if type(plan) is not SeqStepPlan:
        return None
    write, read, base = _run_values(plan.write), _run_values(plan.read), plan.read_base_pos
    if write is None or read is None or type(base) is not int or not 0 <= base <= INT_MAX:
        return None
    return write, read, base


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


def _renamed(error: KVCacheError, owner: str, path: str) -> KVCacheError:
    """The same error, naming the field by its place in the config tree (`owner.name` -> `path.name`)."""
    name = error.argument.split(".", 1)[1] if error.argument.startswith(owner + ".") else error.argument
    return type(error)(error.rule, f"{path}.{name}", error.message, **error.values)


def copy_config(config: CacheConfig) -> CacheConfig:
    """CFG-*: a fresh, fully validated copy of `config`, down to every layer's policy.

    The config types are frozen dataclasses, but `object.__setattr__` still reaches their fields: a
    config may have been tampered with after it was validated. Every field is read once, checked by
    the constructors again, and the cache keeps the copy, so a later change to the caller's objects
    cannot reach it either.
    """
    layers = config.layers
    if not isinstance(layers, (list, tuple)):
        raise ConfigTypeError("CFG-LAYERS", "CacheConfig.layers", "must be a list or tuple of LayerConfig",
                              value=layers)
    copied = []
    for index, layer in enumerate(tuple(layers)):
        path = f"CacheConfig.layers[{index}]"
        if not isinstance(layer, LayerConfig):
            raise ConfigTypeError("CFG-LAYERS", path, "must be a LayerConfig", value=layer)
        policy = layer.policy
        if not isinstance(policy, LayerPolicy):
            raise ConfigTypeError("CFG-POLICY", f"{path}.policy", "must be a LayerPolicy", value=policy)
        try:
            fresh_policy = LayerPolicy(policy.kind, policy.window)
        except KVCacheError as error:
            raise _renamed(error, "LayerPolicy", f"{path}.policy") from None
        try:
            copied.append(LayerConfig(fresh_policy, layer.n_kv_heads, layer.head_dim))
        except KVCacheError as error:
            raise _renamed(error, "LayerConfig", path) from None
    return CacheConfig(config.capacity, config.n_layers, tuple(copied), config.initial_capacity, config.max_write)
