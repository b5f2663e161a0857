"""CrossHair creators for `kvcache.SequenceCache` (every state the class invariants allow), `CacheConfig`
and `kvcache.CellCache` (the states of small cell tables the class invariants allow).

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

CellCache (`make_cell_cache`), built the same way (a genuine CellCache, then its fields replaced):
- covered: two sequence ids (max_seqs 2, concrete); a flat layer and a windowed layer (the window
  symbolic in [1, INT_MAX]); a symbolic capacity; the cell table one of CELL_TABLES (empty; one cell; a
  cell shared by both ids then a cell of id 0; a hole below an occupied cell), its owner bitsets
  concrete and every position symbolic; the newest position of each id symbolic; the live ids those
  the owners name, plus (a fork) id 1 live with an empty history; the forward closed, or (a fork)
  declared with one token per live id, lowest first, not yet placed. The cell counts and the occupied
  count are set as the owners determine them; the class invariants (CELL-OWNERS, CELL-USED-END,
  CELL-FORWARD, ...) constrain the symbolic values, so a confirmed condition holds from every state of
  these shapes the invariants allow, reachable or not.
- not covered: more than two ids or cells (larger tables cost paths: six tables and two layer shapes
  took 652 paths and 8 s of CPU for free_cells alone, against 156 paths and 1.5-2 s now); symbolic
  owner bitsets (every `>>` and `&` of the contracts would realise them); a placed forward (a later
  layer of a forward: place_step's second call) and memoized steps; declarations of other id lists. The
  model checker's cell layout (every reachable state of small configurations) and the cell state
  machine cover those.

Import this module only in a process that may import CrossHair (the gate's workers): importing
CrossHair patches icontract in the importing process (this module imports CrossHair only in
`register` and the creators). `package` names the kvcache copy under analysis (a mutant in tests).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional, Sequence

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


# --- CellCache (kvcache._cells, issue 12) ------------------------------------------------------------

#: The sequence ids a symbolic CellCache has (its max_seqs): concrete and small, so the owner bitsets
#: stay concrete ints (a symbolic bitset would be realised by every `>>` and `&` of the contracts).
CELL_MAX_SEQS = 2

#: The cell tables the creator chooses among, as the owner bitset of each cell of the used extent (0: a
#: free cell; the last cell is occupied, as CELL-USED-END makes it): empty; one cell of sequence 0; a
#: cell shared by both sequences (a fork's prefix) followed by a cell of sequence 0 only; a hole below
#: an occupied cell (what a removal leaves). Every position in them is symbolic. Each table costs the
#: gate a share of every condition's paths, so the set is small (measured: six tables and two layer
#: shapes took 652 paths and 8 s of CPU for free_cells alone).
CELL_TABLES: tuple[tuple[int, ...], ...] = ((), (1,), (3, 1), (0, 1))

#: The layers of a symbolic CellCache: a flat layer and a windowed layer (its window symbolic in
#: [1, INT_MAX]), so that every step is built for both kinds of mask.
CELL_LAYERS: tuple[str, ...] = ("flat", "ring")


def _choose(factory: Any, options: Sequence[Any], what: str) -> Any:
    for index, option in enumerate(options[:-1]):
        if factory.space.smt_fork(desc=f"{what}_{index}"):
            return option
    return options[-1]


def make_cell_cache(factory: Any, package: str = "kvcache") -> Any:
    """A CellCache with a symbolic capacity, window and table (see CELL_TABLES and the module docstring)."""
    api = importlib.import_module(package)
    layers_shape = CELL_LAYERS
    owners = list(_choose(factory, CELL_TABLES, "cell_table"))
    layers = [api.LayerConfig(api.LayerPolicy.flat() if kind == "flat" else api.LayerPolicy.ring(1))
              for kind in layers_shape]
    cache = api.CellCache(api.CacheConfig(capacity=1, n_layers=len(layers), layers=layers), CELL_MAX_SEQS)
    capacity = _free_int(factory, "capacity")  # the invariant CELL-USED-END bounds it below by the extent
    object.__setattr__(cache.config, "capacity", capacity)
    object.__setattr__(cache, "_capacity", capacity)
    windows = tuple(None if kind == "flat" else _bounded_int(factory, "window", 1) for kind in layers_shape)
    object.__setattr__(cache, "_layer_window", windows)
    # The table: concrete owners; free symbolic positions and newest positions per id, which the class
    # invariants (CELL-OWNERS, CELL-USED-END) alone constrain. The cell counts and the occupied count
    # are set as the owners determine them (the invariants admit no other value: no state is lost).
    object.__setattr__(cache, "_owners", owners)
    object.__setattr__(cache, "_pos", [_free_int(factory, f"pos{j}") for j in range(len(owners))])
    object.__setattr__(cache, "_count", [sum(bits >> s & 1 for bits in owners) for s in range(CELL_MAX_SEQS)])
    object.__setattr__(cache, "_newest", [_free_int(factory, f"newest{s}") for s in range(CELL_MAX_SEQS)])
    object.__setattr__(cache, "_occupied", sum(1 for bits in owners if bits))
    # Live: every owner, and possibly also a sequence with an empty history (a seq_new not yet used).
    live = 0
    for bits in owners:
        live |= bits
    if not live >> (CELL_MAX_SEQS - 1) & 1 and factory.space.smt_fork(desc="cell_extra_live"):
        live |= 1 << (CELL_MAX_SEQS - 1)
    object.__setattr__(cache, "_live", live)
    # The forward: closed, or declared (one token per live id, lowest first) and not yet placed.
    if live and factory.space.smt_fork(desc="cell_declared"):
        object.__setattr__(cache, "_declared", tuple(s for s in range(CELL_MAX_SEQS) if live >> s & 1))
    return cache


def register(package: str = "kvcache") -> None:
    """Register the creators for `package`.SequenceCache, CellCache, CacheConfig with CrossHair (once: it
    refuses duplicates)."""
    if package in _registered:
        return
    import crosshair
    import crosshair.core_and_libs  # noqa: F401  (its registrations first: an early one would skip them)

    api = importlib.import_module(package)
    crosshair.register_type(api.SequenceCache, lambda factory: make_sequence_cache(factory, package))
    crosshair.register_type(api.CacheConfig, lambda factory: make_cache_config(factory, package))
    if hasattr(api, "CellCache"):
        crosshair.register_type(api.CellCache, lambda factory: make_cell_cache(factory, package))
    _registered.add(package)
