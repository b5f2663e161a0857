"""Cell caches seen only through their outputs (layout cell-recompute, SPEC.md 5.3), without llama.cpp.

`TinyAttentionCells` is a whole one: a tiny numpy transformer (random weights from a fixed seed, rotary
positions, one attention per layer, flat or sliding by the config) over a cell cache of its own - cells
holding a position, a token and a set of owner ids - with llama.cpp's memory verbs. It refuses what the spec
refuses, so the suite passes it (strict). The subclasses below each break one thing, as a real runtime
might; the tests show the suite finds each through the outputs alone.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Optional

import numpy as np

MAX_SEQS, MAX_POSITION, VOCAB, WIDTH = 63, 2**31 - 2, 32, 8


def _is_int(value: Any) -> bool:
    return type(value) is int


def _rotate(x: np.ndarray, position: int) -> np.ndarray:
    """Rotary positions on pairs of dimensions (as llama-family models place keys and queries)."""
    out = x.copy()
    for i in range(0, WIDTH, 2):
        angle = position / (10.0 ** (i / WIDTH))
        c, s = np.cos(angle), np.sin(angle)
        out[i], out[i + 1] = c * x[i] - s * x[i + 1], s * x[i] + c * x[i + 1]
    return out


class TinyAttentionCells:
    kvcache_layout = "cell-recompute"
    kvcache_scope = ("flat", "ring", "position-gaps", "seq-state")

    def __init__(self, config: dict[str, Any]) -> None:
        sizes = [config.get(key) for key in ("capacity", "n_layers", "n_kv_heads", "head_dim", "batch_size")]
        layers = config.get("layers")
        if not all(_is_int(n) and n >= 1 for n in sizes) or config.get("batch_size") != 1 \
                or not isinstance(layers, list) or len(layers) not in (1, sizes[1]) \
                or not all(isinstance(p, dict) and _is_int(p.get("window")) and p["window"] >= 0
                           and p.get("kind") == ("ring" if p["window"] else "flat") for p in layers):
            raise ValueError(f"OP-CONFIG: {config}")
        self.config = dict(config)
        self.capacity, self.n_layers = sizes[0], sizes[1]
        self.windows = [p["window"] for p in layers] * (self.n_layers // len(layers))
        rng = np.random.default_rng(7)
        self.embed = rng.normal(size=(VOCAB, WIDTH))
        self.weights = [rng.normal(size=(3, WIDTH, WIDTH)) / np.sqrt(WIDTH) for _ in range(self.n_layers)]
        self.unembed = rng.normal(size=(WIDTH, VOCAB))
        self.clear()

    # --- the cells -------------------------------------------------------------------------------------
    # A cell: {"pos": {owner: position}, "k": pre-rotary K per layer, "v": V per layer}. A position per owner,
    # so a shift of one sequence (seq_add) moves a shared cell for that sequence only; the rotary position is
    # applied to K when a query reads it, at the reading sequence's position of the cell.
    def clear(self) -> None:
        self.cells: list[Optional[dict[str, Any]]] = [None] * self.capacity

    def held(self, seq: int) -> list[int]:
        return [cell["pos"][seq] for cell in self.cells if cell is not None and seq in cell["pos"]]

    def next_pos(self, seq: int) -> int:
        self._id(seq, "seq")
        return max(self.held(seq), default=-1) + 1

    def _id(self, value: Any, name: str) -> None:
        if not _is_int(value) or not 0 <= value < MAX_SEQS:
            raise ValueError(f"[OP-STEP] {name} {value!r} is not an id in [0, {MAX_SEQS})")

    def seq_cp(self, src: Any, dst: Any, upto: Any) -> bool:
        self._id(src, "src")
        self._id(dst, "dst")
        if upto is not None and (not _is_int(upto) or upto < 0):
            raise ValueError(f"[OP-FORK] upto {upto!r}")
        if src == dst or self.held(dst):
            raise ValueError("[OP-FORK] a fork needs another, empty destination")
        for cell in self.cells:
            if cell is not None and src in cell["pos"] and (upto is None or cell["pos"][src] < upto):
                cell["pos"][dst] = cell["pos"][src]
        return True

    def seq_rm(self, seq: Any, p0: Any, p1: Any) -> bool:
        self._id(seq, "seq")
        if not _is_int(p0) or p0 < 0 or p1 is not None and (not _is_int(p1) or p1 < p0):
            raise ValueError(f"[OP-RM] range [{p0!r}, {p1!r})")
        for j, cell in enumerate(self.cells):
            if cell is not None and seq in cell["pos"] and cell["pos"][seq] >= p0 and \
                    (p1 is None or cell["pos"][seq] < p1):
                self.drop(j, seq)
        return True

    def drop(self, j: int, seq: int) -> None:
        """seq no longer owns cell j; a cell nobody owns is free."""
        cell = self.cells[j]
        assert cell is not None
        del cell["pos"][seq]
        if not cell["pos"]:
            self.cells[j] = None

    def seq_keep(self, seq: Any) -> bool:
        self._id(seq, "seq")
        for j, cell in enumerate(self.cells):
            if cell is not None:
                cell["pos"] = {seq: cell["pos"][seq]} if seq in cell["pos"] else {}
                if not cell["pos"]:
                    self.cells[j] = None
        return True

    def seq_add(self, seq: Any, p0: Any, p1: Any, delta: Any) -> bool:
        self._id(seq, "seq")
        if not _is_int(p0) or p0 < 0 or p1 is not None and (not _is_int(p1) or p1 < p0) or not _is_int(delta):
            raise ValueError(f"[CELL-SHIFT] range [{p0!r}, {p1!r}), delta {delta!r}")
        moving = [cell for cell in self.cells if cell is not None and seq in cell["pos"]
                  and cell["pos"][seq] >= p0 and (p1 is None or cell["pos"][seq] < p1)]
        after = [cell["pos"][seq] + (delta if any(cell is m for m in moving) else 0)
                 for cell in self.cells if cell is not None and seq in cell["pos"]]
        if any(not 0 <= p <= MAX_POSITION for p in after) or len(set(after)) != len(after):
            raise ValueError(f"[CELL-SHIFT] a position moved by {delta} leaves the range or meets a held one")
        for cell in moving:
            self.move(cell, seq, delta)
        return True

    def move(self, cell: dict[str, Any], seq: int, delta: int) -> None:
        cell["pos"][seq] += delta

    # --- a sequence's state (CELL-STATE): its rows' positions, K and V, behind a SHA-256 of them ------------
    def seq_save(self, seq: Any, file: Any) -> str:
        self._id(seq, "seq")
        rows = [[cell["pos"][seq], [k.tolist() for k in cell["k"]], [v.tolist() for v in cell["v"]]]
                for cell in self.cells if cell is not None and seq in cell["pos"]]
        payload = json.dumps(rows).encode()
        return base64.b64encode(hashlib.sha256(payload).digest() + payload).decode()

    def rows_of(self, data: Any) -> list[Any]:
        """The rows of a state, or a refusal (ValueError) of one cut short or changed (its digest differs)."""
        raw = base64.b64decode(data)
        if hashlib.sha256(raw[32:]).digest() != raw[:32]:
            raise ValueError("[CELL-STATE] the state is truncated or corrupted: its digest does not match")
        return json.loads(raw[32:])   # type: ignore[no-any-return]

    def seq_load(self, seq: Any, data: Any, file: Any) -> bool:
        self._id(seq, "seq")
        rows = self.rows_of(data)
        mine = [j for j, cell in enumerate(self.cells) if cell is not None and set(cell["pos"]) == {seq}]
        if sum(cell is None for cell in self.cells) + len(mine) < len(rows):
            return False   # OP-CAP: nothing changed
        self.seq_rm(seq, 0, None)
        free = [j for j, cell in enumerate(self.cells) if cell is None]
        for j, (pos, ks, vs) in zip(free, rows):
            self.cells[j] = {"pos": {seq: pos}, "k": [np.array(k) for k in ks], "v": [np.array(v) for v in vs]}
        return True

    # --- the model -------------------------------------------------------------------------------------
    def decode(self, seq_ids: Any, positions: Any, tokens: Any) -> Any:
        if not isinstance(seq_ids, list) or not seq_ids or not isinstance(positions, list) \
                or not isinstance(tokens, list) or not len(seq_ids) == len(positions) == len(tokens):
            raise ValueError("[OP-STEP] one id, position and token per token")
        newest: dict[int, int] = {}
        for seq, pos, token in zip(seq_ids, positions, tokens):
            self._id(seq, "seq")
            if not _is_int(pos) or not 0 <= pos <= MAX_POSITION or not _is_int(token) or not 0 <= token < VOCAB:
                raise ValueError(f"[OP-POS] position {pos!r} / token {token!r}")
            if pos <= newest.get(seq, max(self.held(seq), default=-1)):
                raise ValueError(f"[OP-POS] position {pos} is not newer than seq {seq} holds")
            newest[seq] = pos
        free = [j for j, cell in enumerate(self.cells) if cell is None]
        if len(free) < len(seq_ids):
            return False   # OP-CAP: nothing changed
        placed = free[:len(seq_ids)]
        for j, seq, pos in zip(placed, seq_ids, positions):
            self.cells[j] = {"pos": {seq: pos}, "k": [None] * self.n_layers, "v": [None] * self.n_layers}
        h = self.embed[tokens].copy()
        for layer in range(self.n_layers):
            wq, wk, wv = self.weights[layer]
            for i, j in enumerate(placed):
                cell = self.cells[j]
                assert cell is not None
                cell["k"][layer], cell["v"][layer] = h[i] @ wk, h[i] @ wv
            out = np.zeros_like(h)
            for i, (seq, pos) in enumerate(zip(seq_ids, positions)):
                q = _rotate(h[i] @ wq, pos)
                rows = self.attended(seq, pos, self.windows[layer])
                keys = np.array([_rotate(cell["k"][layer], cell["pos"][seq]) for cell in rows])
                scores = keys @ q / np.sqrt(WIDTH)
                weights = np.exp(scores - scores.max())
                out[i] = (weights / weights.sum()) @ np.array([cell["v"][layer] for cell in rows])
            h = h + out
        return [[float(x) for x in row] for row in h @ self.unembed]

    def attended(self, seq: int, pos: int, window: int) -> list[dict[str, Any]]:
        """The cells a query of seq at pos attends on a layer: its own, at positions <= pos, in the window."""
        return [cell for cell in self.cells if cell is not None and seq in cell["pos"] and cell["pos"][seq] <= pos
                and (window == 0 or cell["pos"][seq] > pos - window)]

    def recompute(self, tokens: list[int], positions: list[int]) -> list[float]:
        fresh = type(self)(self.config)
        fresh.__class__ = TinyAttentionCells   # the recompute is the plain computation, whatever the subclass
        outputs = fresh.decode([0] * len(tokens), positions, tokens)
        if outputs is False:
            raise ValueError("[OP-CAP] more rows than cells")
        return outputs[-1]   # type: ignore[no-any-return]


class ForgetsSharedRemoval(TinyAttentionCells):
    """seq_rm leaves a cell another sequence shares untouched: the removed sequence keeps attending it."""

    def drop(self, j: int, seq: int) -> None:
        cell = self.cells[j]
        if cell is not None and len(cell["pos"]) > 1:
            return
        super().drop(j, seq)


class MergingFork(TinyAttentionCells):
    """seq_cp onto a destination that holds tokens adds the source's cells to its own (llama.cpp's seq_cp)."""

    def seq_cp(self, src: Any, dst: Any, upto: Any) -> bool:
        self._id(src, "src")
        self._id(dst, "dst")
        for cell in self.cells:
            if cell is not None and src in cell["pos"] and (upto is None or cell["pos"][src] < upto):
                cell["pos"][dst] = cell["pos"][src]   # a second cell at a position dst already holds
        return True


class IgnoresWindow(TinyAttentionCells):
    """A sliding layer served as a full one in the decode (its recompute keeps the window)."""

    def attended(self, seq: int, pos: int, window: int) -> list[dict[str, Any]]:
        return super().attended(seq, pos, 0)


class IgnoresWindowEverywhere(TinyAttentionCells):
    """Every sliding layer served as a full one, in the decode and in its own recompute alike: the window is the
    target's model, which CELL-RECOMPUTE compares but does not decide (SPEC.md 5.3) - this one conforms."""

    def attended(self, seq: int, pos: int, window: int) -> list[dict[str, Any]]:
        return super().attended(seq, pos, 0)

    def recompute(self, tokens: list[int], positions: list[int]) -> list[float]:
        outputs = IgnoresWindowEverywhere(self.config).decode([0] * len(tokens), positions, tokens)
        if outputs is False:
            raise ValueError("[OP-CAP] more rows than cells")
        return outputs[-1]   # type: ignore[no-any-return]


class StalePosMax(TinyAttentionCells):
    """next_pos is the newest position ever written, not lowered by a removal at the end."""

    def next_pos(self, seq: int) -> int:
        self._id(seq, "seq")
        self.newest = getattr(self, "newest", {})
        self.newest[seq] = max(self.newest.get(seq, -1), max(self.held(seq), default=-1))
        return self.newest[seq] + 1

    def clear(self) -> None:
        super().clear()
        self.newest: dict[int, int] = {}


class ShiftsEveryOwner(TinyAttentionCells):
    """seq_add moves a shared cell for every sequence holding it (one position per cell, as llama.cpp's)."""

    def move(self, cell: dict[str, Any], seq: int, delta: int) -> None:
        for owner in cell["pos"]:
            cell["pos"][owner] += delta


class MergingForkOnAnEmptyDestinationOnly(MergingFork):
    """MergingFork that documents the preconditions its seq_cp checks nothing of (an empty destination, an
    upto >= 0, as a library's header might): the suite sends it no fork onto a live destination or onto
    itself, and no negative upto."""

    kvcache_scope = ("flat", "ring", "position-gaps", "requires=empty-destination+ordered-ranges")


class ForgetsSharedRemovalRequiringIds(ForgetsSharedRemoval):
    """A precondition declared (ids in range) hides no defect of a call that keeps it."""

    kvcache_scope = ("flat", "ring", "position-gaps", "requires=ids-in-range")


class ReplacingFork(TinyAttentionCells):
    """seq_cp onto a live destination replaces its history by the copy (llama.cpp with a stream per sequence):
    lenient OP-FORK, and one history kept - its next token attends the copy's rows only."""

    def seq_cp(self, src: Any, dst: Any, upto: Any) -> bool:
        self._id(src, "src")
        self._id(dst, "dst")
        if src != dst:
            for j, cell in enumerate(self.cells):
                if cell is not None and dst in cell["pos"]:
                    self.drop(j, dst)
        for cell in self.cells:
            if cell is not None and src in cell["pos"] and (upto is None or cell["pos"][src] < upto):
                cell["pos"][dst] = cell["pos"][src]
        return True


class UncheckedState(TinyAttentionCells):
    """seq_load reads a state without its digest: a changed byte is loaded (lenient CELL-STATE)."""

    def rows_of(self, data: Any) -> list[Any]:
        return json.loads(base64.b64decode(data)[32:])   # type: ignore[no-any-return]


class EmptiesBeforeChecking(TinyAttentionCells):
    """seq_load removes the destination's tokens before it checks the state (llama.cpp's order): a refused load
    has emptied a live destination (lenient CELL-STATE: it served part of the call)."""

    def seq_load(self, seq: Any, data: Any, file: Any) -> bool:
        self.seq_rm(seq, 0, None)
        return super().seq_load(seq, data, file)


class RestoresWindowOnly(TinyAttentionCells):
    """seq_save keeps, of a sliding model, only the rows the next token's window attends (llama.cpp drops the
    cells its sliding cache masks): a restored sequence rewound attends rows it no longer has."""

    def seq_save(self, seq: Any, file: Any) -> str:
        window = max(self.windows)
        if window and min(self.windows):
            newest = max(self.held(seq), default=-1)
            for j, cell in enumerate(self.cells):
                if cell is not None and seq in cell["pos"] and cell["pos"][seq] <= newest - window:
                    kept = dict(cell)
                    self.cells[j] = None   # left out of the state only: put back below
                    try:
                        return self.seq_save(seq, file)
                    finally:
                        self.cells[j] = kept
        return super().seq_save(seq, file)
