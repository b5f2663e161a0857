"""CrossHair creators for `kvcache.SequenceCache` (every state the class invariants allow) and `CacheConfig`.

CrossHair builds a symbolic instance of a class by calling its `__init__` with symbolic arguments;
for `SequenceCache` that means inventing a `CacheConfig` holding a list of `LayerConfig` objects,
and every condition ended "Unable to meet precondition". `register()` gives CrossHair creators
instead (`crosshair.register_type`), so a method's conditions are checked from a *symbolic state*:

- the configuration (`make_cache_config`, also what `SequenceCache.__init__` is analysed with):
  capacity C in [1, INT_MAX]; one of SHAPES (flat; ring; flat + ring; two rings of different
  windows, as CFG-DEDUP keeps them apart); each ring's window w in [1, INT_MAX]; the config's
  max_write None (each ring's m = w) or M in [1, INT_MAX]. These are the config checks `CacheConfig`
  and `RingPolicy` enforce; other configs are rejected by them and are not generated. The cache's
  policies, layer -> policy map and step limit are derived as `SequenceCache.__init__` derives them.
- the state: the length L, the open step (None, or a pair (p, t)) and one retained mark per policy
  are free symbolic ints. The creator adds no constraint on them: the class invariants (LEN-BOUNDS,
  STEP-APPEND, RETAINED), which CrossHair assumes on entry like preconditions, are the only ones.
  So a confirmed postcondition holds from *every* state the invariants describe - reachable or not:
  an inductive check, stronger than checking the reachable states. (The invariants as written were
  enough: none had to be strengthened to the Z3 proofs' inductive invariant.)

How the fields are set: the creator builds a concrete object of the right shape through the real
constructor (a genuine `SequenceCache`, with icontract's wrappers), then replaces its integers by
symbolic ones with `object.__setattr__` (the frozen config dataclasses refuse plain assignment, and
icontract would re-check the invariants on a half-built state after each field). The creators run
with CrossHair's tracing off, as `register_type` requires; arithmetic on symbolic values resumes it.

Import this module only in a process that may import CrossHair (the gate's workers): importing
CrossHair patches icontract in the importing process (this module imports CrossHair only in
`register` and the creators). `package` names the kvcache copy under analysis (a mutant in tests).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

# The bound of every API integer (kvcache._ints.INT_MAX; restated so that this module imports no
# kvcache: the package under analysis may be another copy, e.g. a mutant in the gate's tests).
INT_MAX = 2**31 - 1

# The layer shapes the creator chooses among, as (kind per layer). Two rings get different windows.
SHAPES: tuple[tuple[str, ...], ...] = (("flat",), ("ring",), ("flat", "ring"), ("ring", "ring"))

_registered: set[str] = set()


def _bounded_int(factory: Any, name: str, low: int, high: int = INT_MAX) -> Any:
    """A symbolic int in [low, high]; CrossHair drops the inputs outside (as for a precondition)."""
    from crosshair.tracers import ResumedTracing
    from crosshair.util import IgnoreAttempt

    value = factory(int, name)
    with ResumedTracing():
        inside = bool(low <= value <= high)
    if not inside:
        raise IgnoreAttempt(f"{name} outside [{low}, {high}]")
    return value


def _free_int(factory: Any, name: str) -> Any:
    return factory(int, name)


def _shape(factory: Any) -> tuple[str, ...]:
    for shape in SHAPES[:-1]:
        if factory.space.smt_fork(desc=f"shape_{'_'.join(shape)}"):
            return shape
    return SHAPES[-1]


def make_cache_config(factory: Any, package: str = "kvcache") -> Any:
    """A CacheConfig of one of SHAPES, with symbolic capacity, windows and max_write (within the config
    checks), built concretely and then given its symbolic integers. For `SequenceCache.__init__`."""
    from crosshair.tracers import ResumedTracing
    from crosshair.util import IgnoreAttempt

    api = importlib.import_module(package)
    shape = _shape(factory)
    has_max_write = factory.space.smt_fork(desc="config_max_write_given")
    layers = [api.LayerConfig(api.LayerPolicy.flat() if kind == "flat" else api.LayerPolicy.ring(1 + index))
              for index, kind in enumerate(shape)]
    config = api.CacheConfig(capacity=1, n_layers=len(shape), layers=layers, max_write=1 if has_max_write else None)
    object.__setattr__(config, "capacity", _bounded_int(factory, "capacity", 1))
    object.__setattr__(config, "max_write", _bounded_int(factory, "max_write", 1) if has_max_write else None)
    windows = []
    for index, kind in enumerate(shape):
        if kind == "ring":
            window = _bounded_int(factory, f"window{index}", 1)
            object.__setattr__(config.layers[index].policy, "window", window)
            windows.append(window)
    if len(windows) == 2:  # equal windows would be one shared policy (CFG-DEDUP): another shape
        with ResumedTracing():
            equal = bool(windows[0] == windows[1])
        if equal:
            raise IgnoreAttempt("two rings of one window are one policy")
    return config


def make_sequence_cache(factory: Any, package: str = "kvcache") -> Any:
    """A SequenceCache with a symbolic configuration and a symbolic state (see the module docstring)."""
    from crosshair.tracers import ResumedTracing

    api = importlib.import_module(package)
    RingPolicy = importlib.import_module(f"{package}._policies").RingPolicy
    symbolic = make_cache_config(factory, package)
    shape = tuple("ring" if layer.policy.kind.name == "RING" else "flat" for layer in symbolic.layers)
    # A concrete cache of this shape, through the real constructor; its integers are replaced below.
    layers = [api.LayerConfig(api.LayerPolicy.flat() if kind == "flat" else api.LayerPolicy.ring(1 + index))
              for index, kind in enumerate(shape)]
    cache = api.SequenceCache(api.CacheConfig(capacity=1, n_layers=len(shape), layers=layers,
                                              max_write=None if symbolic.max_write is None else 1))
    object.__setattr__(cache, "config", symbolic)
    capacity, max_write = symbolic.capacity, symbolic.max_write
    windows = [layer.policy.window for layer in symbolic.layers if layer.policy.kind.name == "RING"]

    # Policies in layer order, one per layer here (the shapes have no two equal layers); each ring
    # policy gets its symbolic window and max_write, and n_slots as RingPolicy.__init__ computes it.
    ring_windows = iter(windows)
    for policy in cache._policies:
        if isinstance(policy, RingPolicy):
            window = next(ring_windows)
            own_max_write = window if max_write is None else max_write
            object.__setattr__(policy, "window", window)
            object.__setattr__(policy, "max_write", own_max_write)
            with ResumedTracing():  # symbolic arithmetic needs CrossHair's tracing
                n_slots = window + own_max_write - 1
            object.__setattr__(policy, "n_slots", n_slots)
    ring_limits = [policy.max_write for policy in cache._policies if isinstance(policy, RingPolicy)]
    if not ring_limits:
        step_limit: Optional[Any] = None
    elif len(ring_limits) == 1 or max_write is not None:
        step_limit = ring_limits[0]
    else:  # two rings, each m = its own window: the smaller one (as __init__'s min())
        with ResumedTracing():
            step_limit = min(ring_limits)
    object.__setattr__(cache, "_capacity", capacity)
    object.__setattr__(cache, "_step_limit", step_limit)

    # The state: free symbolic ints; the class invariants constrain them (CrossHair assumes those).
    length = _free_int(factory, "length")
    open_step: Optional[tuple[Any, Any]] = None
    if factory.space.smt_fork(desc="open_step_present"):
        open_step = (_free_int(factory, "open_position"), _free_int(factory, "open_T"))
    retained = [_free_int(factory, f"retained{index}") for index in range(len(cache._policies))]
    object.__setattr__(cache, "_length", length)
    object.__setattr__(cache, "_open_step", open_step)
    object.__setattr__(cache, "_retained", retained)
    return cache


def register(package: str = "kvcache") -> None:
    """Register the creator for `package`.SequenceCache with CrossHair (once: it refuses duplicates)."""
    if package in _registered:
        return
    import crosshair
    import crosshair.core_and_libs  # noqa: F401  (its registrations first: an early one would skip them)

    api = importlib.import_module(package)
    crosshair.register_type(api.SequenceCache, lambda factory: make_sequence_cache(factory, package))
    crosshair.register_type(api.CacheConfig, lambda factory: make_cache_config(factory, package))
    _registered.add(package)
