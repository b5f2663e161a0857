"""The cell model dressed as a cell cache: a target to test the cell harness itself with (before and
independently of the reference), and broken variants of it that the harness must catch.

Not a reference: it answers from `kvcache_spec.cell_model`, so agreeing with the model proves nothing
about an implementation; it shows the lockstep drives every verb and that its checks can fail.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import kvcache
from kvcache_spec import cell_model as cm


class ModelCellCache:
    # No __dict__: the harness then compares every query around each call (its `thorough` snapshot)
    # and dedups model-checker states by the model's state alone - this target's content ids grow forever.
    __slots__ = ("config", "state", "_last_ids")

    def __init__(self, config: kvcache.CacheConfig, max_seqs: int = cm.MAX_SEQS) -> None:
        layers = [(0 if layer.policy.kind is kvcache.Kind.FLAT else cm.RING, layer.policy.window, 1, 1)
                  for layer in config.layers]
        made = cm.make_cell_config(config.capacity, config.n_layers, layers, max_write=config.max_write,
                                   max_seqs=max_seqs)
        assert isinstance(made, cm.CellConfig), made
        self.config = made
        self.state = cm.initial(made)

    def _run(self, result: Any) -> Any:
        if isinstance(result, cm.CellRejected):
            raise kvcache.ArgumentValueError(result.rule, result.argument, "rejected by the model")
        answer, self.state = result
        return answer

    def _ask(self, answer: Any) -> Any:
        if isinstance(answer, cm.CellRejected):
            raise kvcache.ArgumentValueError(answer.rule, answer.argument, "rejected by the model")
        return answer

    def as_batch_control(self) -> ModelCellCache:
        return self

    def as_cell_stepper(self) -> ModelCellCache:
        return self

    def capacity(self) -> int:
        return self.config.capacity

    def can_extend(self, n: Any = 1) -> bool:
        return bool(self._ask(cm.can_extend(self.config, self.state, n)))

    def free_cells(self) -> int:
        return cm.free_cells(self.config, self.state)

    def used_end(self) -> int:
        return cm.used_end(self.state)

    def live(self) -> frozenset[int]:
        return cm.live(self.state)

    def seq_len(self, seq_id: Any) -> int:
        return int(self._ask(cm.seq_len(self.config, self.state, seq_id)))

    def next_pos(self, seq_id: Any) -> int:
        return int(self._ask(cm.next_pos(self.config, self.state, seq_id)))

    def clear(self) -> None:
        self.state = cm.clear(self.config, self.state)

    def seq_new(self) -> Optional[int]:
        return self._run(cm.seq_new(self.config, self.state))  # type: ignore[no-any-return]

    def seq_clone(self, src: Any, upto: Any = None) -> Optional[int]:
        return self._run(cm.seq_clone(self.config, self.state, src, upto))  # type: ignore[no-any-return]

    def seq_rm(self, seq_id: Any, p0: Any, p1: Any = None) -> bool:
        return bool(self._run(cm.seq_rm(self.config, self.state, seq_id, p0, p1)))

    def declare_step(self, seq_ids: Any) -> bool:
        return bool(self._run(cm.declare_step(self.config, self.state, seq_ids)))

    def place_step(self, layer: Any, positions: Any) -> Any:
        return self._run(cm.place_step(self.config, self.state, layer, positions))


class ForkPastCutCache(ModelCellCache):
    """seq_clone ignores `upto`: the fork shares every cell of its source (shares past its cut)."""

    def seq_clone(self, src: Any, upto: Any = None) -> Optional[int]:
        valid = isinstance(upto, int) and not isinstance(upto, bool) and 0 <= upto <= cm.INT_MAX
        return super().seq_clone(src, None if valid else upto)


class RmOffByOneCache(ModelCellCache):
    """seq_rm drops [p0, p1] instead of [p0, p1) (off by one at the end)."""

    def seq_rm(self, seq_id: Any, p0: Any, p1: Any = None) -> bool:
        ok = isinstance(p1, int) and not isinstance(p1, bool) and isinstance(p0, int) and p0 <= p1 < cm.INT_MAX
        return super().seq_rm(seq_id, p0, p1 + 1 if ok else p1)


class WindowInTokensCache(ModelCellCache):
    """The window counted in tokens: a query sees the last w entries of its history, whatever their
    positions (wrong when positions have gaps)."""

    def place_step(self, layer: Any, positions: Any) -> Any:
        step = super().place_step(layer, positions)
        w = self.config.layers[layer].window if self.config.layers[layer].kind == cm.RING else None
        forward = self.state.forward
        if w is None or not isinstance(step, cm.CellStep):
            return step
        placed = forward if forward is not None else None
        seq_ids = placed.seq_ids if placed is not None else self._last_ids
        bits = bytearray()
        for seq_id, q in zip(seq_ids, positions):
            entries = [e for e in cm.history(self.state, seq_id) or () if e[0] <= q][-w:]
            bits += bytes(1 if self.state.written[j] in entries else 0 for j in range(step.read_len))
        return replace(step, mask_bits=bytes(bits))

    def declare_step(self, seq_ids: Any) -> bool:
        answer = super().declare_step(seq_ids)
        if answer:
            self._last_ids = tuple(seq_ids)
        return answer


def fork_past_cut(config: kvcache.CacheConfig, max_seqs: int = cm.MAX_SEQS) -> ModelCellCache:
    return ForkPastCutCache(config, max_seqs)


def rm_off_by_one(config: kvcache.CacheConfig, max_seqs: int = cm.MAX_SEQS) -> ModelCellCache:
    return RmOffByOneCache(config, max_seqs)


def window_in_tokens(config: kvcache.CacheConfig, max_seqs: int = cm.MAX_SEQS) -> ModelCellCache:
    return WindowInTokensCache(config, max_seqs)
