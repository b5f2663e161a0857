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


class RingTrimOnlyUnwrapped(ContiguousStandin):
    """mlx-lm's RotatingKVCache.is_trimmable (offset < max_size) made exact: once a ring layer may have dropped
    a row (its floor above its keep) it gives back nothing but trim(0), a trim SPEC.md OP-TRIM leaves optional
    there. Valid: CONFORMING (strict) - the suite follows the refusal."""

    def trim(self, n: Any) -> None:
        if n != 0 and any(w and floor > keep for w, keep, floor in zip(self.windows, self.keeps, self.floors)):
            raise StandinError(f"trim {n!r}: the ring has wrapped (not trimmable)")
        super().trim(n)


class RingTrimRefusedEarly(ContiguousStandin):
    """Refuses every trim but trim(0) once a ring layer holds window - 1 tokens (one token before is_trimmable
    says no): the ring has dropped nothing yet, so the trim is owed - over-strict OP-TRIM."""

    def trim(self, n: Any) -> None:
        if n != 0 and any(w and self.used(0) >= w - 1 for w in self.windows):
            raise StandinError(f"trim {n!r}: refused one token early")
        super().trim(n)


class RingTrimRefusalLowersLength(ContiguousStandin):
    """Refuses a trim the spec leaves optional after dropping the tokens anyway (mlx-lm's trim_prompt_cache
    trims what it can, then answers less than asked): a refusal that changed the cache - wrong OP-ATOMIC."""

    def trim(self, n: Any) -> None:
        wrapped = any(w and floor > keep for w, keep, floor in zip(self.windows, self.keeps, self.floors))
        super().trim(n)
        if n != 0 and wrapped:
            raise StandinError(f"trim {n!r}: trimmed, then said no")


class TrimsWhatItCan(ContiguousStandin):
    """mlx-lm's trim_prompt_cache: trims min(n, held) and answers how many, a short answer being the refusal -
    after it trimmed. Validates no n (its caller, model code, never trims more than it holds): CONFORMING
    under `trusted-args`, which sends no n outside [0, held]."""

    def trim(self, n: Any) -> None:
        held = len([t for t in self.tokens if not self.step or t not in self.step["tokens"]])
        super().trim(min(n, held) if type(n) is int and n >= 0 else 0)
        if n != min(n, held):
            raise StandinError(f"trimmed {held} of {n}")


class KeepFour(ContiguousStandin):
    """Builds every ring with keep 4, as mlx-lm's make_prompt_cache does: a config whose ring layers ask for
    another keep is refused at creation. Declares `keep=4` (CONFORMING: those configs lie outside)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        if any(entry.get("kind") == "ring" and entry.get("keep", 0) != 4 for entry in cfg["layers"]):
            raise StandinError("SCOPE-BORDER: rings of keep 4 only")
        super().__init__(cfg)


class KeepFourServesOthers(ContiguousStandin):
    """The same cache, accepting any ring and serving it with keep 4 (where its window allows): a config
    outside the declared keep=4 served another way - wrong SCOPE-BORDER."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        layers = [{**entry, "keep": 4} if entry.get("kind") == "ring" and entry["window"] > 4 else entry
                  for entry in cfg["layers"]]
        super().__init__({**cfg, "layers": layers})


trim_lowers_length_only = _factory(TrimLowersLengthOnly)
keep_four = _factory(KeepFour, ["all", "keep=4"])
keep_four_serves_others = _factory(KeepFourServesOthers, ["all", "keep=4"])
trims_what_it_can = _factory(TrimsWhatItCan, ["all", "trusted-args"])
ring_trim_only_unwrapped = _factory(RingTrimOnlyUnwrapped)
ring_trim_refused_early = _factory(RingTrimRefusedEarly)
ring_trim_refusal_lowers_length = _factory(RingTrimRefusalLowersLength)
ring_trim_past_wrap = _factory(RingTrimPastWrap)
negative_trim = _factory(NegativeTrim)
sinks_dropped_by_multi_token_step = _factory(SinksDroppedByMultiTokenStep)
keep_at_window_served = _factory(KeepAtWindowServed)
