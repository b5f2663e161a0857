"""Numpy K/V backends: `NumpyBackend` consumes a sequence cache's plans the way ExecuTorch's MLX runtime
does; `NumpyCellBackend` (at the end) consumes a cell cache's steps.

Per layer and step: `plan(layer, position, T)`, scatter the new K/V rows across the write runs, gather
the read runs in order, attend with the mask the step needs, commit. Pools hold `depth(layer)` rows of
shape [n_kv_heads, head_dim]; they start at `initial_capacity` rows and grow (doubling) up to the
depth, as the MLX runtime's flat pools do.

The backend checks what it can instead of trusting the plan:
- before writing: the plan's shape against the pool (PLAN-SHAPE), that it writes T rows (PLAN-WRITE)
  and reads exactly the span the new tokens attend to (PLAN-READ);
- after gathering: DATA-SOUND, at the data level. Next to each pool it keeps, per row, the logical
  position the row holds and a write stamp (unique per written row); per logical position it keeps
  the stamp of the current branch's write (a write of [p, p + T) makes every later position stale,
  since positions are written in order). Every gathered row must carry the position it is read as
  and that position's current stamp, so a tampered plan, a row overwritten by the ring, a stale
  row from a rolled-back branch, or rows swapped in a pool raise instead of silently changing the
  numbers. (K/V values rewritten in place without their tags cannot be detected: the tags are the
  evidence, not a checksum.)
- PROTO-COMMIT, for the commit-once-per-step pattern: a new step is refused while a step this backend
  executed is still uncommitted.

A failed check raises `BackendError` (with the rule id); the pools are then untrustworthy (the step's
rows may have been written) and the caller should clear and recompute.

This module uses only the public `kvcache` API; it never imports the spec model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from numpy.typing import NDArray

from kvcache import CacheConfig, CellStep, CellStepper, Kind, Run, SeqStepPlan, SequencePlanner

Array = NDArray[np.float64]
Index = NDArray[np.int64]

NEVER = -1  # the tag of a row never written / of a position with no current write


class BackendError(Exception):
    """A check of the backend failed; `rule` is the rule id of kvcache_spec.rules that was broken."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {message}")


@dataclass
class LayerPool:
    """One layer's pool: K and V rows, and for each row the position it holds and its write stamp."""

    keys: Array          # [allocated rows, n_kv_heads, head_dim]
    values: Array        # [allocated rows, n_kv_heads, head_dim]
    row_position: Index  # [allocated rows] logical position held, NEVER if none
    row_stamp: Index     # [allocated rows] write stamp of the row, NEVER if none
    current_stamp: Index  # [capacity] stamp of each logical position's current-branch write
    depth: int           # rows the planner says this layer needs; the pool never grows past it
    window: Optional[int]  # the ring's window; None for a flat layer

    def grow_to(self, rows: int) -> None:
        """Allocate at least `rows` rows (doubling, at most depth); new rows are NEVER-tagged."""
        allocated = len(self.row_position)
        if rows <= allocated:
            return
        new = min(self.depth, max(rows, 2 * allocated, 1))
        extra = new - allocated
        shape = (extra,) + self.keys.shape[1:]
        self.keys = np.concatenate([self.keys, np.zeros(shape)])
        self.values = np.concatenate([self.values, np.zeros(shape)])
        self.row_position = np.concatenate([self.row_position, np.full(extra, NEVER, np.int64)])
        self.row_stamp = np.concatenate([self.row_stamp, np.full(extra, NEVER, np.int64)])


def new_pool(config: CacheConfig, layer: int, depth: int, positions: int) -> LayerPool:
    """Layer `layer`'s empty pool: `initial_capacity` rows (at most depth), stamps for `positions` positions."""
    layer_config = config.layer(layer)
    start = min(depth, config.initial_capacity)
    shape = (start, layer_config.n_kv_heads, layer_config.head_dim)
    window = layer_config.policy.window if layer_config.policy.kind is Kind.RING else None
    return LayerPool(np.zeros(shape), np.zeros(shape), np.full(start, NEVER, np.int64), np.full(start, NEVER, np.int64),
                     np.full(positions, NEVER, np.int64), depth, window)


def rows_of(runs: tuple[Run, ...]) -> Index:
    """The physical rows of `runs`, in logical order."""
    return np.concatenate([np.arange(run.start, run.start + run.len, dtype=np.int64) for run in runs])


def mask_for(query_positions: Index, key_positions: Index, window: Optional[int]) -> tuple[str, NDArray[np.bool_]]:
    """The mask the MLX runtime would pick, and its boolean form (True = may attend).

    One new token: no mask (every key read is in its window). A multi-token ring step whose span is
    wider than the window: banded, a token at p sees keys q with p - window < q <= p. Otherwise causal.
    """
    queries, keys = query_positions[:, None], key_positions[None, :]
    if len(query_positions) == 1:
        return "none", np.ones((1, len(key_positions)), dtype=bool)
    if window is not None and len(key_positions) > window:
        return "banded", (keys <= queries) & (keys > queries - window)
    return "causal", keys <= queries


def check_tensors(config: CacheConfig, layer: int, tokens: int, queries: object, keys: object,
                  values: object) -> None:
    """ARG-TYPE, before anything changes (the cache's placement, the pools): keys and values are float
    arrays [tokens, n_kv_heads, head_dim] of the layer, queries [tokens, n_heads, head_dim] with n_heads a
    multiple of n_kv_heads. A wrong shape would otherwise fail inside numpy after the step was placed."""
    if not (type(layer) is int and 0 <= layer < config.n_layers):   # the cache's own check names it
        return
    shape = config.layer(layer)
    for name, array in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(array, np.ndarray) or array.ndim != 3 or array.dtype.kind != "f":
            raise BackendError("ARG-TYPE", f"{name} must be a float numpy array [tokens, heads, head_dim], "
                                           f"not {type(array).__name__} {getattr(array, 'shape', '')}")
        heads = array.shape[1]
        if (array.shape[0] != tokens or array.shape[2] != shape.head_dim or heads == 0
                or (name != "queries" and heads != shape.n_kv_heads) or heads % shape.n_kv_heads):
            raise BackendError("ARG-TYPE", f"{name} has shape {array.shape}; layer {layer} needs [{tokens}, "
                                           f"{'a multiple of ' if name == 'queries' else ''}{shape.n_kv_heads}, "
                                           f"{shape.head_dim}]")


def attention(queries: Array, keys: Array, values: Array, allowed: NDArray[np.bool_]) -> Array:
    """Scaled dot-product attention with grouped K/V heads.

    queries [T, n_heads, d]; keys and values [n, n_kv_heads, d]; allowed [T, n]. Query head h uses
    K/V head h // (n_heads // n_kv_heads).
    """
    n_heads, n_kv_heads, head_dim = queries.shape[1], keys.shape[1], queries.shape[2]
    group = n_heads // n_kv_heads
    keys_per_head = np.repeat(keys, group, axis=1)       # [n, n_heads, d]
    values_per_head = np.repeat(values, group, axis=1)
    scores = np.einsum("thd,nhd->htn", queries, keys_per_head) / math.sqrt(head_dim)
    scores = np.where(allowed[None, :, :], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    result: Array = np.einsum("htn,nhd->thd", weights, values_per_head)
    return result


class NumpyBackend:
    """Executes the plans of one cache on numpy K/V pools, one layer at a time.

    `commit_per_layer=True` commits after every layer (the MLX runtime's pattern: later layers plan a
    step that is already the open step); False commits once per step, in `finish_step()`.
    """

    def __init__(self, planner: SequencePlanner, config: CacheConfig, *, commit_per_layer: bool = True) -> None:
        self.planner = planner
        self.config = config
        self.commit_per_layer = commit_per_layer
        self.pools = [new_pool(config, layer, planner.depth(layer), config.capacity) for layer in range(config.n_layers)]
        self.next_stamp = 0
        self.pending: Optional[tuple[int, int, SeqStepPlan]] = None  # (position, T, a plan) run, not committed
        self.last_masks: dict[int, str] = {}  # layer -> the mask kind its last step used

    # --- one layer of one step ---------------------------------------------------------------------

    def attend(self, layer: int, position: int, queries: Array, keys: Array, values: Array) -> Array:
        """Write the step's K/V rows for `layer`, read its span, attend. Returns [T, n_heads, head_dim]."""
        T = keys.shape[0] if isinstance(keys, np.ndarray) and keys.ndim == 3 else -1
        check_tensors(self.config, layer, T, queries, keys, values)
        self._check_protocol(position, T)
        plan = self.planner.plan(layer, position, T)
        if plan is None:
            raise BackendError("ADMIT", f"the step ({position}, {T}) does not fit; the runner must check "
                                        f"can_extend({T}) first")
        pool = self.pools[layer]
        self._check_plan(pool, layer, position, T, plan)
        self._scatter(pool, position, plan, keys, values)
        gathered_keys, gathered_values, key_positions = self._gather(pool, layer, plan)
        query_positions = np.arange(position, position + T, dtype=np.int64)
        self.last_masks[layer], allowed = mask_for(query_positions, key_positions, pool.window)
        output = attention(queries, gathered_keys, gathered_values, allowed)
        if self.commit_per_layer:
            self.planner.commit(plan)
        else:
            self.pending = (position, T, plan)
        return output

    def finish_step(self) -> None:
        """Commit the step every layer has run (the commit-once pattern); nothing to do per layer."""
        if self.pending is not None:
            self.planner.commit(self.pending[2])
            self.pending = None

    # --- the checks ----------------------------------------------------------------------------------

    def _check_protocol(self, position: int, T: int) -> None:
        if self.pending is not None and self.pending[:2] != (position, T):
            raise BackendError("PROTO-COMMIT", f"step {self.pending[:2]} ran but was not committed before "
                                               f"step ({position}, {T})")

    def _check_plan(self, pool: LayerPool, layer: int, position: int, T: int, plan: SeqStepPlan) -> None:
        """PLAN-SHAPE, PLAN-WRITE, PLAN-READ: what can be checked before a single row is written."""
        for run in plan.write + plan.read:
            if run.end > pool.depth:
                raise BackendError("PLAN-SHAPE", f"layer {layer}: run {run} ends past depth {pool.depth}")
        written = sum(run.len for run in plan.write)
        if written != T:
            raise BackendError("PLAN-WRITE", f"layer {layer}: the write runs hold {written} rows, not T={T}")
        if len(set(rows_of(plan.write).tolist())) != T:
            raise BackendError("PLAN-WRITE", f"layer {layer}: the write runs overlap")
        expected_base = 0 if pool.window is None else max(0, position - pool.window + 1)
        if plan.read_base_pos != expected_base or plan.end != position + T:
            raise BackendError("PLAN-READ", f"layer {layer}: the plan reads [{plan.read_base_pos}, {plan.end}), "
                                            f"the step attends to [{expected_base}, {position + T})")

    def _scatter(self, pool: LayerPool, position: int, plan: SeqStepPlan, keys: Array, values: Array) -> None:
        rows = rows_of(plan.write)
        pool.grow_to(int(rows.max()) + 1)
        T = len(rows)
        stamps = np.arange(self.next_stamp, self.next_stamp + T, dtype=np.int64)
        self.next_stamp += T
        pool.keys[rows] = keys
        pool.values[rows] = values
        pool.row_position[rows] = np.arange(position, position + T, dtype=np.int64)
        pool.row_stamp[rows] = stamps
        pool.current_stamp[position:position + T] = stamps
        pool.current_stamp[position + T:] = NEVER  # later positions belong to a branch this step replaced

    def _gather(self, pool: LayerPool, layer: int, plan: SeqStepPlan) -> tuple[Array, Array, Index]:
        """The read rows in logical order, after checking each holds the current row of its position."""
        rows = rows_of(plan.read)
        positions = np.arange(plan.read_base_pos, plan.end, dtype=np.int64)
        if int(rows.max()) >= len(pool.row_position):
            raise BackendError("DATA-SOUND", f"layer {layer}: row {int(rows.max())} read was never written")
        held, stamp = pool.row_position[rows], pool.row_stamp[rows]
        bad = (held != positions) | (stamp != pool.current_stamp[positions]) | (stamp == NEVER)
        if bad.any():
            i = int(np.argmax(bad))
            raise BackendError("DATA-SOUND", f"layer {layer}: row {int(rows[i])} read as position "
                                             f"{int(positions[i])} holds position {int(held[i])} "
                                             f"(stamp {int(stamp[i])}, current {int(pool.current_stamp[positions[i]])})")
        return pool.keys[rows], pool.values[rows], positions


class NumpyCellBackend:
    """Executes a cell cache's steps on numpy pools: per layer, one K/V row per cell.

    Per layer of a forward the runner has declared: `place_step(layer, positions)`, scatter the tokens'
    K/V into `step.cells`, gather the rows of cells [0, read_len), attend with `step.mask_bits` as the
    mask. Many sequences share the pools; the mask alone keeps them apart, so the backend checks the
    mask against what it wrote (CELL-DATA-SOUND, as far as a backend can see without the sequence ids):
    every attended cell holds a row written by some forward, at a position inside the query's window
    (p <= q, and p > q - window on a ring layer), and every token attends its own cell (CELL-MASK).
    The K/V rows of a cell are only ever written by the forward that placed it: the cache never
    overwrites a cell that holds history (CELL-PLACE), so nothing here is copied on a fork or moved on
    a removal. The sequence-level truth (no cell of another sequence, none missing) is what a full
    recomputation per sequence checks (tests/test_numpy_backend.py).
    """

    def __init__(self, stepper: CellStepper, config: CacheConfig) -> None:
        self.stepper = stepper
        self.config = config
        # a pool per layer, growing (doubling) from initial_capacity up to the capacity: a cell per row
        self.pools = [new_pool(config, layer, config.capacity, 0) for layer in range(config.n_layers)]
        self.next_stamp = 0
        self.last_step: dict[int, CellStep] = {}

    def attend(self, layer: int, positions: list[int], queries: Array, keys: Array, values: Array) -> Array:
        """Place the declared tokens (at `positions`) on `layer`, write their K/V, attend. Returns
        [length, n_heads, head_dim]."""
        check_tensors(self.config, layer, len(positions) if isinstance(positions, (list, tuple)) else -1,
                      queries, keys, values)
        step = self.stepper.place_step(layer, positions)
        self.last_step[layer] = step
        pool = self.pools[layer]
        cells = np.array(step.cells, dtype=np.int64)
        pool.grow_to(step.read_len)
        pool.keys[cells], pool.values[cells] = keys, values
        pool.row_position[cells] = positions
        pool.row_stamp[cells] = np.arange(self.next_stamp, self.next_stamp + step.length, dtype=np.int64)
        self.next_stamp += step.length
        allowed = np.frombuffer(step.mask_bits, dtype=np.uint8).reshape(step.length, step.read_len).astype(bool)
        self._check_mask(pool, layer, step, np.array(positions, dtype=np.int64), allowed)
        return attention(queries, pool.keys[:step.read_len], pool.values[:step.read_len], allowed)

    def _check_mask(self, pool: LayerPool, layer: int, step: CellStep, queries: Index,
                    allowed: NDArray[np.bool_]) -> None:
        if not allowed[np.arange(step.length), list(step.cells)].all():
            raise BackendError("CELL-MASK", f"layer {layer}: a token does not attend its own cell")
        held = pool.row_position[:step.read_len][None, :]
        stamp = pool.row_stamp[:step.read_len][None, :]
        low = np.zeros_like(queries) if pool.window is None else queries - pool.window + 1
        bad = allowed & ((stamp == NEVER) | (held > queries[:, None]) | (held < low[:, None]))
        if bad.any():
            i, j = (int(x) for x in np.argwhere(bad)[0])
            raise BackendError("CELL-DATA-SOUND", f"layer {layer}: token {i} (position {int(queries[i])}) attends "
                                                  f"cell {j}, which holds position {int(held[0, j])} "
                                                  f"(stamp {int(stamp[0, j])})")
