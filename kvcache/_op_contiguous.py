"""`ContiguousReferenceCache`: the op face (`update_and_fetch`) of one sequence over `SequenceCache`'s plans.

The integer layout decides the rows: each call plans the layer's step with `SequenceCache.plan`, writes
the step's K/V across the plan's write runs, commits, and returns the rows of the read runs in logical
order with the mask of OP-ATTEND. Flat layers keep every row; a ring layer keeps a ring of
`window + max_write - 1` rows when the config sets `max_write`, else its whole history (the window is then
applied by the mask alone, as upstream's reference does); a ring with sinks (OP-SINKS), a ring of a config
recording its past (OP-RECORD) and a chunk layer (OP-CHUNK) keep their whole history too, their masks
attending the sinks and the window, or the query's chunk. The byte layer is one numpy array per layer
for K and one for V, [batch_size, n_kv_heads, rows, dim].

`trim(n)` gives back the newest n tokens (OP-TRIM) whenever its rows allow: a ring laid out as a ring
refuses a trim past the rows it overwrote (the layout's rewind soundness), a trim SPEC.md's OP-TRIM leaves
optional there; every other layer keeps its whole history and serves any n in [0, held].

Preconditions validate the caller's input, raise a typed `KVCacheError` naming the argument and the rule
before anything changes (OP-ATOMIC), and stay enabled under `python -O`; postconditions and invariants
check this implementation and follow `__debug__`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import icontract
import numpy as np

from ._cache import SequenceCache
from ._op_batch import BatchRows, masks_agree, rows_mask
from ._errors import ArgumentTypeError, ArgumentValueError, CapacityError, KVCacheError, StepError, TrimError
from ._op_arrays import found, layer_error, to_kind, to_numpy
from ._op_pools import KVPools, checked_step, fetch_contracts, step_positions_or_error
from ._op_types import AttendSpec, CacheConfig, CacheSizing, attended_by_formula, layout_config, mask_of, \
    spec_for, takes_op_config, validated
from ._op_quantize import bits_error, quantized, within_bound
from ._op_state import decode, encode, held_now, restore, state_error
from .backends.numpy_backend import rows_of


@dataclass(frozen=True)
class _OpenStep:
    """A step that not every layer has served yet: its first position, positions and the layers served."""

    start: int
    positions: tuple[int, ...]
    served: frozenset[int]


@icontract.invariant(lambda self: all(0 <= self._used(layer) <= self.config.capacity
                                     for layer in range(self.config.n_layers)), "OP-CAP: 0 <= used <= capacity")
@icontract.invariant(lambda self: not (self.config.record_past and self._ring_rows),
                     "OP-RECORD: a config recording its past lays no ring out as a ring (every trim is served)")
@icontract.invariant(lambda self: self._pools.within_depths(),
                     "OP-CAP: a layer's K and V rows never exceed its depth (capacity; a kept ring's slots)")
@icontract.invariant(lambda self: self._step is None or (
    self._step.start + len(self._step.positions) == self._layout.length()
    and 0 < len(self._step.served) < self.config.n_layers),
                     "OP-STEP: an open step ends at the length and some layer has not served it yet")
class ContiguousReferenceCache(BatchRows):
    """One sequence's per-layer K/V history, appended in place (upstream's `ContiguousReferenceCache`).

    A step is the tokens of one forward: it begins at the first layer served, and every layer of it takes
    the same positions. Serving a layer the current step has already served begins the next step; a step
    that not every layer served is then abandoned: its tokens leave every layer (OP-STEP).
    """

    @takes_op_config
    def __init__(self, config: CacheConfig) -> None:
        config = validated(config)  # OP-CONFIG: re-validated and copied; the caller's object cannot reach it later
        self.config = config
        self._ring_rows = config.max_write is not None and not config.record_past   # OP-RECORD: the past kept
        self._has_ring = any(config.window(layer) for layer in range(config.n_layers))
        self._layout = SequenceCache(layout_config(config, ring_rows=self._ring_rows))
        self._depth = tuple(self._layout.depth(layer) for layer in range(config.n_layers))
        self._step: Optional[_OpenStep] = None
        self._pools = KVPools(config, self._depth)
        self._bits: Optional[int] = None   # OP-QUANTIZE: the bits every row is held at (None: as written)

    def __delattr__(self, name: str) -> None:
        """Deleting an attribute would break the invariants behind the API's back, so it is refused.

        :raises AttributeError: always
        """
        raise AttributeError(f"ContiguousReferenceCache.{name} cannot be deleted")

    # --- queries ----------------------------------------------------------------------------------------

    @icontract.require(lambda self, layer_id: layer_error(layer_id, self.config.n_layers) is None,
                       "OP-ARGS: layer_id is an int in [0, n_layers)",
                       error=lambda self, layer_id: found(layer_error(layer_id, self.config.n_layers)), enabled=True)
    @icontract.ensure(lambda self, result: 0 <= result <= self.config.capacity, "OP-CAP: 0 <= used <= capacity")
    def used(self, layer_id: int) -> int:
        """The tokens layer `layer_id` holds: the positions [0, used) (a ring layer keeps fewer rows)."""
        return self._used(layer_id)

    def _used(self, layer_id: int) -> int:
        step = self._step
        if step is None:
            return self._layout.length()
        return step.start + len(step.positions) if layer_id in step.served else step.start

    def _state(self) -> tuple[Any, ...]:
        """Everything a later call can observe, as values (the tests' before/after snapshots)."""
        return self._layout._state(), self._step, self._pools.snapshot(), self._batch_state(), self._bits

    # --- validation (before anything changes) -----------------------------------------------------------

    def _fetch_error(self, layer_id: Any, k: Any, v: Any, position: Any) -> Optional[KVCacheError]:
        """OP-ARGS, OP-POS, OP-STEP, OP-CAP: the error of an update_and_fetch call, else None."""
        positions = step_positions_or_error(self.config, layer_id, k, v, position)
        if isinstance(positions, KVCacheError):
            return positions
        step = self._step
        if step is not None and layer_id not in step.served:
            if tuple(positions) != step.positions:
                return StepError("OP-STEP", "position", "must be the positions every other layer of this step took",
                                 positions=positions, step=list(step.positions), layer_id=layer_id)
            return None
        held = step.start if step is not None else self._layout.length()  # a new step abandons the open one
        return self._new_step_error(positions, held)

    def _new_step_error(self, positions: list[int], held: int) -> Optional[KVCacheError]:
        """OP-POS, OP-CAP, OP-MAX-WRITE: a new step continues the `held` tokens with no gap and fits."""
        first, q_len = positions[0], len(positions)
        if first < held:
            return StepError("OP-POS", "position", "re-places a position this sequence already holds (or an older "
                                                   "one): a query would find two tokens at one position",
                             first=first, held=held)
        if first > held:
            return StepError("OP-POS", "position", "leaves a gap: a contiguous step starts at the tokens held",
                             first=first, held=held)
        if positions != list(range(first, first + q_len)):
            return StepError("OP-POS", "position", "must be consecutive: a contiguous row index is its position",
                             positions=positions)
        if held + q_len > self.config.capacity:
            return CapacityError("OP-CAP", "k", "the step does not fit: tokens held + q_len > capacity",
                                 held=held, q_len=q_len, capacity=self.config.capacity)
        max_write = self.config.max_write
        if max_write is not None and self._has_ring and q_len > max_write:
            return ArgumentValueError("OP-MAX-WRITE", "k", "a step writes at most max_write tokens when ring "
                                                           "layers keep only their ring", q_len=q_len,
                                      max_write=max_write)
        return None

    # --- the op face ------------------------------------------------------------------------------------

    @fetch_contracts("OP-ARGS, OP-POS, OP-STEP, OP-CAP, OP-ATOMIC: a valid step for this layer, checked before "
                     "anything changes")
    @icontract.ensure(lambda self, layer_id, position, result: masks_agree(
        mask_of(result[2], len(to_numpy(position)), to_numpy(result[0]).shape[2], self.config.batch_size),
        self._formula(layer_id, [int(p) for p in to_numpy(position).reshape(-1)],
                      range(self._used(layer_id) - to_numpy(result[0]).shape[2], self._used(layer_id)))),
                      "OP-ATTEND, OP-SINKS, OP-CHUNK, OP-PAD: the rows are the newest positions held; a query attends "
                      "exactly those at or before it, inside its window or among its sinks, in its own chunk, and "
                      "none of its row's pads")
    @icontract.ensure(lambda self, layer_id, position: self._used(layer_id) == int(to_numpy(position)[-1, 0]) + 1,
                      "OP-POS: the layer holds the positions up to the step's last")
    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, AttendSpec]:
        """Write the step's K/V on layer `layer_id`; return (k_hist, v_hist, spec) (OP-HIST, OP-MASK).

        k [B, Hkv, q_len, D], v [B, Hkv, q_len, Dv], position [q_len, 1] ints: the positions `used(layer_id)`
        onwards (OP-POS). numpy arrays or torch tensors; the answer has k's kind.
        """
        config = self.config
        k_values, v_values, positions, kind = checked_step(config, layer_id, k, v, position)
        step = self._step
        if step is not None and layer_id in step.served:
            self._abandon()
            step = None
        first, q_len = positions[0], len(positions)
        plan = self._layout.plan(layer_id, first, q_len)
        assert plan is not None  # OP-CAP was checked
        if self._bits is not None:   # OP-QUANTIZE: a quantized cache holds what it writes quantized
            k_values, v_values = self._held_as(k_values, self._bits), self._held_as(v_values, self._bits)
        self._pools.write(layer_id, rows_of(plan.write), k_values, v_values)
        self._layout.commit(plan)
        served = frozenset({layer_id}) if step is None else step.served | {layer_id}
        self._step = None if len(served) == config.n_layers else _OpenStep(first, tuple(positions), served)
        k_hist, v_hist = self._pools.read(layer_id, rows_of(plan.read))
        mask = self._formula(layer_id, positions, range(plan.read_base_pos, plan.end))
        return to_kind(k_hist, kind), to_kind(v_hist, kind), spec_for(mask, kind)

    def _formula(self, layer_id: int, positions: list[int], keys: range) -> Any:
        """OP-ATTEND, OP-SINKS, OP-CHUNK, then OP-PAD: the mask of a step's queries over the rows at `keys`."""
        config = self.config
        return rows_mask(attended_by_formula(positions, keys, config.window(layer_id), config.keep(layer_id),
                                             config.chunk(layer_id)), positions, keys, self.pads())

    def _abandon(self) -> None:
        """OP-STEP: the open step's tokens leave every layer (rows past the length are never read again)."""
        step = self._step
        if step is not None:
            rewound = self._layout.rewind(step.start)
            assert rewound  # a step's own start is always a sound rewind target (REWIND-SOUND)
            self._step = None

    @icontract.ensure(lambda self: all(self._used(layer) == 0 for layer in range(self.config.n_layers)),
                      "OP-STEP: after reset no layer holds a token")
    def reset(self) -> None:
        """Forget every token (and an open step); DYNAMIC sizing also frees the rows."""
        self._layout.clear()
        self._step = None
        self._pads = ()   # OP-PAD: the padding goes with the tokens
        if self.config.sizing is CacheSizing.DYNAMIC:
            self._pools.reset()

    # --- trim (OP-TRIM) ---------------------------------------------------------------------------------

    def _trim_error(self, n: Any) -> Optional[KVCacheError]:
        """OP-TRIM: the error of trim(n), else None. n counts the tokens held before an open step (which
        the trim abandons: its rows are past the new length, so only the retained marks matter)."""
        if type(n) is not int:
            return ArgumentTypeError("OP-TRIM", "n", "must be an int (bool is not an int here)", value=n,
                                     type=type(n).__name__)
        held = self._step.start if self._step is not None else self._layout.length()
        if not 0 <= n <= held:
            return ArgumentValueError("OP-TRIM", "n", "must lie in [0, tokens held]", value=n, held=held)
        if not self._layout._rewind_safe(held - n):   # an optional trim (a ring that wrapped): refused
            return TrimError("OP-TRIM", "n", "a ring layer has overwritten a position the next query attends",
                             n=n, held=held)
        return None

    @icontract.require(lambda self, n: self._trim_error(n) is None,
                       "OP-TRIM: n is an int in [0, held], and every ring layer still holds what the next query "
                       "attends", error=lambda self, n: found(self._trim_error(n)), enabled=True)
    @icontract.snapshot(lambda self: self._step.start if self._step is not None else self._layout.length(),
                        name="held")
    @icontract.ensure(lambda self, OLD, n: all(self._used(layer) == OLD.held - n
                                              for layer in range(self.config.n_layers)) and self._step is None,
                      "OP-TRIM: every layer holds the tokens before the trimmed ones; no step is open")
    def trim(self, n: int) -> None:
        """Drop the newest n tokens of every layer (speculative decoding's rollback); an open step is
        abandoned first (OP-STEP). Refused, changing nothing, past what a ring layer retains (OP-TRIM)."""
        self._abandon()
        rewound = self._layout.rewind(self._layout.length() - n)
        assert rewound  # _trim_error asked the layout the same (REWIND-SOUND)


    # --- state out and in (OP-STATE; the format: _op_state.py) --------------------------------------------

    @icontract.ensure(lambda self, result: state_error(self.config, self._depth, len(self._layout._retained), result)
                      is None, "OP-STATE: the state answered is one this cache loads")
    def state(self) -> bytes:
        """The cache's state as bytes (a versioned, checksummed format of this project's own): what it holds
        between steps - an open step is left out, and stays open here. `load_state` reads it back."""
        step = self._step
        return encode(self.config, held_now(self._layout, None if step is None else step.start,
                                            self._pools.k, self._pools.v, self._pads))

    def _load_error(self, data: Any) -> Optional[KVCacheError]:
        return state_error(self.config, self._depth, len(self._layout._retained), data)

    @icontract.require(lambda self, data: self._load_error(data) is None,
                       "OP-STATE: data is a whole state of this format version, taken under this config",
                       error=lambda self, data: found(self._load_error(data)), enabled=True)
    @icontract.ensure(lambda self, data: self._step is None and self.state() == bytes(data),
                      "OP-STATE: the cache holds exactly the state loaded, no step open")
    def load_state(self, data: bytes) -> None:
        """Replace everything this cache holds (an open step included) with the state `data` (from `state()` of
        a cache of the same config): every later call answers as the saved cache's would. A truncated,
        corrupted, another config's or another format version's state is refused, naming what is wrong, and
        nothing changes."""
        held = decode(self.config, self._depth, len(self._layout._retained), data)
        assert not isinstance(held, KVCacheError)   # the precondition decoded it already
        self._step = None
        restore(self._layout, self._pools, held)
        self._pads = held.pads   # OP-PAD: the rows' pads are the state's

    # --- quantize (OP-QUANTIZE; the quantizer: _op_quantize.py) --------------------------------------------

    def _held_as(self, values: Any, bits: int) -> Any:
        """OP-QUANTIZE: a step's K or V as this cache, quantized to `bits`, holds it (in its dtype)."""
        return quantized(np.asarray(values).astype(self._pools.dtype), bits)

    def _quantize_error(self, bits: Any) -> Optional[KVCacheError]:
        return bits_error(bits, self._bits)

    @icontract.require(lambda self, bits: self._quantize_error(bits) is None,
                       "OP-QUANTIZE: bits is an int in [2, 8] and the cache is not quantized yet",
                       error=lambda self, bits: found(self._quantize_error(bits)), enabled=True)
    @icontract.snapshot(lambda self: [(k.copy(), v.copy()) for k, v in zip(self._pools.k, self._pools.v)],
                        name="rows")
    @icontract.snapshot(lambda self: self._step.start if self._step is not None else self._layout.length(),
                        name="held")
    @icontract.ensure(lambda self, OLD, bits: self._bits == bits and self._step is None and all(
        self._used(layer) == OLD.held for layer in range(self.config.n_layers)),
                      "OP-QUANTIZE: the cache is quantized, holding the tokens it held between steps")
    @icontract.ensure(lambda self, OLD, bits: all(
        within_bound(k, self._pools.k[layer], bits) and within_bound(v, self._pools.v[layer], bits)
        for layer, (k, v) in enumerate(OLD.rows)), "OP-QUANTIZE: every row held reads back within its bound")
    def quantize(self, bits: int) -> None:
        """Turn this cache into one quantized to `bits` (an int in [2, 8]), as mlx-lm's to_quantized does
        mid-generation: every row held, and every row written later, reads back within (max - min) / (2 (2^bits -
        1)) of what was written (max and min over the row). Positions and lengths stay; an open step is abandoned
        first (OP-STEP); a reset keeps the cache quantized. A bits that is no int or out of range, or a second
        quantize, is refused and nothing changes."""
        self._abandon()
        self._bits = bits
        pools = self._pools
        pools.k = [quantized(k, bits) for k in pools.k]
        pools.v = [quantized(v, bits) for v in pools.v]
