"""Broken variants of tests/op_standin.py's contiguous stand-in for the trim verb and attention sinks
(OP-TRIM, OP-SINKS), each shaped like a defect of a real cache (issue 33): mlx-lm 0.32.2's
`ConcatenateKVCache.trim`, `RotatingKVCache.trim` after its ring wrapped, a negative `trim(n)`, sinks a
multi-token step drops, and `RotatingKVCache(max_size, keep >= max_size)` served. Each must be found with
a minimal program (tests/test_op_trim_sinks.py); the stand-in they break is CONFORMING (strict).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.op_standin import ContiguousStandin, StandinError, Token, _factory


class TrimLowersLengthOnly(ContiguousStandin):
    """trim(n) lowers the length and keeps the rows (mlx-lm's ConcatenateKVCache.trim lowers `offset`
    only): the next update appends after them, so the trimmed tokens come back beside the new ones."""

    def trim(self, n: Any) -> None:
        kept = list(self.tokens)
        super().trim(n)
        self.ghosts = [t for t in kept if t not in self.tokens and t.k]   # still in the arrays

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        ghosts, self.ghosts = getattr(self, "ghosts", []), []
        super().update_and_fetch(layer_id, k, v, position)
        self.tokens[:0] = ghosts   # back in the history, this answer's and every later one's
        positions = [int(p) for p in np.asarray(position)[:, 0]]
        return self._answer(int(layer_id), [0] * len(positions), positions)


class RingTrimPastWrap(ContiguousStandin):
    """A ring layer keeps `window` slots (mlx-lm's RotatingKVCache(max_size=window)): once a step is served,
    the slot of position p holds the newest position written there. Its trim lowers the length whatever
    the ring overwrote (mlx-lm's trim after the ring wrapped, past is_trimmable): the next queries read the
    overwritten slots, which hold trimmed tokens' K/V."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        answer = super().update_and_fetch(layer_id, k, v, position)
        layer = int(layer_id)
        keep, slots = self.keeps[layer], self.windows[layer] - self.keeps[layer]   # the sinks stay put
        if self.windows[layer]:   # after the answer: the step's own queries read their rows before the ring wraps
            ring = sorted((t for t in self.tokens if layer in t.k and t.pos >= keep), key=lambda t: t.pos)
            newest = {(t.pos - keep) % slots: t for t in ring}
            for t in ring:
                last = newest[(t.pos - keep) % slots]
                t.k[layer], t.v[layer] = last.k[layer], last.v[layer]
        return answer

    def trim(self, n: Any) -> None:
        self.floors = [0] * self.cfg["n_layers"]   # the bug: whatever the ring overwrote
        super().trim(n)


class NegativeTrim(ContiguousStandin):
    """trim(-n) grows the cache by n rows never written (mlx-lm's trim takes min(offset, n), so a negative
    n raises the offset over uninitialised rows)."""

    def trim(self, n: Any) -> None:
        if type(n) is int and n < 0:
            c = self.cfg
            self._abandon()
            held = len(self.tokens)
            for pos in range(held, held - n):
                token = Token(pos, {0})
                for layer in range(c["n_layers"]):
                    token.k[layer] = np.zeros((c["batch_size"], c["n_kv_heads"], c["head_dim"]), np.float32)
                    token.v[layer] = np.zeros((c["batch_size"], c["n_kv_heads"], c["v_head_dim"]), np.float32)
                self.tokens.append(token)
            return
        super().trim(n)


class SinksDroppedByMultiTokenStep(ContiguousStandin):
    """A step of more than one token trims a ring layer to its window as a plain ring would, sinks and all
    (a concatenating path that forgets `keep`): every later query misses the sinks."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        answer = super().update_and_fetch(layer_id, k, v, position)
        layer, window = int(layer_id), self.windows[int(layer_id)]
        newest = int(np.asarray(position)[-1, 0])
        if np.shape(position)[0] > 1 and self.keeps[layer]:
            self.dropped = getattr(self, "dropped", set()) | {
                (layer, t.pos) for t in self.tokens if t.pos < self.keeps[layer] and t.pos <= newest - window}
        return answer

    def _visible(self, layer: int, seq_of: list[int], positions: list[int]) -> np.ndarray:
        mask = super()._visible(layer, seq_of, positions)
        rows = [t for t in self.tokens if layer in t.k]
        for j, t in enumerate(rows):
            if (layer, t.pos) in getattr(self, "dropped", set()):
                mask[:, j] = False   # the sink's row is gone from this layer's window
        return mask

    def reset(self) -> None:
        super().reset()
        self.dropped: set[tuple[int, int]] = set()


class KeepAtWindowServed(ContiguousStandin):
    """Takes keep == window (mlx-lm's RotatingKVCache(max_size, keep=max_size)) and serves it: the window
    part is empty, so no decoded token is ever attended again, not even by its own query."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        loose = [{**entry, "keep": 0} if entry.get("keep") == entry.get("window") else entry
                 for entry in cfg["layers"]]
        super().__init__({**cfg, "layers": loose})
        layers = cfg["layers"] * cfg["n_layers"] if len(cfg["layers"]) == 1 else cfg["layers"]
        self.keeps = [entry.get("keep", 0) for entry in layers]
        if any(type(keep) is not int for keep in self.keeps):
            raise StandinError("keep")


trim_lowers_length_only = _factory(TrimLowersLengthOnly)
ring_trim_past_wrap = _factory(RingTrimPastWrap)
negative_trim = _factory(NegativeTrim)
sinks_dropped_by_multi_token_step = _factory(SinksDroppedByMultiTokenStep)
keep_at_window_served = _factory(KeepAtWindowServed)
