"""A small op-face stand-in (numpy), written apart from spec/op_model.py, and broken variants of it.

It exists to test the op-face conformance suite before and besides the project's reference
(`kvcache.op`): the correct stand-in must be CONFORMING (strict), each broken variant NOT CONFORMING
with the rule its defect breaks. Every history is kept as per-token records (sequence ids, position,
K, V per layer), and the mask is always EXPLICIT, built from those records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

MAX_POSITION = 2**31 - 2


class StandinError(ValueError):
    """A refused call."""


@dataclass
class Spec:
    kind: str
    mask: Optional[np.ndarray] = None


@dataclass
class Token:
    pos: int
    owners: set[int]
    k: dict[int, np.ndarray] = field(default_factory=dict)   # layer -> [B, H, D]
    v: dict[int, np.ndarray] = field(default_factory=dict)


def _int(value: Any, low: int, high: int, what: str) -> int:
    if type(value) is not int and not isinstance(value, np.integer) or not low <= int(value) <= high:
        raise StandinError(f"{what} {value!r} not an int in [{low}, {high}]")
    return int(value)


class _Base:
    cell = False

    def __init__(self, cfg: dict[str, Any]) -> None:
        for name in ("capacity", "n_layers", "n_kv_heads", "head_dim", "v_head_dim", "batch_size"):
            if type(cfg[name]) is not int or cfg[name] < 1:
                raise StandinError(f"{name} {cfg[name]!r}")
        layers = cfg["layers"]
        if not isinstance(layers, list) or len(layers) not in (1, cfg["n_layers"]):
            raise StandinError("layers")
        for entry in layers:
            if type(entry["window"]) is not int or (entry["kind"], entry["window"] > 0) not in (("flat", False),
                                                                                                ("ring", True)):
                raise StandinError(f"policy {entry}")
            keep = entry.get("keep", 0)   # sinks: a ring's first positions, below its window; no cell sinks
            if type(keep) is not int or not 0 <= keep < max(entry["window"], 1) or keep and self.cell:
                raise StandinError(f"keep {keep!r}")
        max_write = cfg.get("max_write")
        if max_write is not None and (type(max_write) is not int or max_write < 1):
            raise StandinError(f"max_write {max_write!r}")
        if cfg.get("sizing", "dynamic") not in ("dynamic", "static"):
            raise StandinError(f"sizing {cfg.get('sizing')!r}")
        if self.cell and cfg["batch_size"] != 1:
            raise StandinError("batch_size")
        self.cfg = cfg
        self.windows = [e["window"] for e in (layers * cfg["n_layers"] if len(layers) == 1 else layers)]
        self.keeps = [e.get("keep", 0) for e in (layers * cfg["n_layers"] if len(layers) == 1 else layers)]
        self.floors = [0] * cfg["n_layers"]   # trim: a ring layer may have dropped its positions below (sinks aside)
        self.tokens: list[Token] = []
        self.step: Optional[dict[str, Any]] = None   # {"seqs", "positions", "tokens", "served"}

    def _check_arrays(self, layer_id: Any, k: Any, v: Any, position: Any) -> tuple[int, list[int]]:
        c = self.cfg
        layer = _int(layer_id, 0, c["n_layers"] - 1, "layer_id")
        position = np.asarray(position)
        if position.ndim != 2 or position.shape[1] != 1 or position.dtype.kind not in "iu":
            raise StandinError("position shape")
        q = position.shape[0]
        if np.asarray(k).dtype.kind != "f" or np.asarray(v).dtype.kind != "f":
            raise StandinError("k/v dtype")
        if q < 1 or np.shape(k) != (c["batch_size"], c["n_kv_heads"], q, c["head_dim"]) or \
                np.shape(v) != (c["batch_size"], c["n_kv_heads"], q, c["v_head_dim"]):
            raise StandinError("k/v shape")
        return layer, [_int(p, 0, MAX_POSITION, "position") for p in position[:, 0].tolist()]

    def _abandon(self) -> None:
        if self.step is not None:
            for token in self.step["tokens"]:
                self.tokens.remove(token)
        self.step = None

    def _visible(self, layer: int, seq_of: list[int], positions: list[int]) -> np.ndarray:
        window, keep = self.windows[layer], self.keeps[layer]
        rows = [t for t in self.tokens if layer in t.k]
        mask = np.zeros((len(positions), len(rows)), dtype=bool)
        for i, (s, p) in enumerate(zip(seq_of, positions)):
            for j, t in enumerate(rows):
                mask[i, j] = s in t.owners and t.pos <= p and (window == 0 or t.pos < keep or
                                                                 t.pos > p - (window - keep))
        return mask

    def _answer(self, layer: int, seq_of: list[int], positions: list[int]) -> tuple[np.ndarray, np.ndarray, Spec]:
        c = self.cfg
        rows = [t for t in self.tokens if layer in t.k]
        k = np.zeros((c["batch_size"], c["n_kv_heads"], len(rows), c["head_dim"]), dtype=np.float32)
        v = np.zeros((c["batch_size"], c["n_kv_heads"], len(rows), c["v_head_dim"]), dtype=np.float32)
        for j, t in enumerate(rows):
            k[:, :, j], v[:, :, j] = t.k[layer], t.v[layer]
        return k, v, Spec("EXPLICIT", self._visible(layer, seq_of, positions))

    def _write(self, layer: int, tokens: list[Token], k: Any, v: Any) -> None:
        for i, token in enumerate(tokens):
            token.k[layer] = np.asarray(k, dtype=np.float32)[:, :, i].copy()
            token.v[layer] = np.asarray(v, dtype=np.float32)[:, :, i].copy()
        self.step["served"].add(layer)   # type: ignore[index]
        if len(self.step["served"]) == self.cfg["n_layers"]:   # type: ignore[index]
            self.step = None

    def reset(self) -> None:
        self.tokens, self.step = [], None
        self.floors = [0] * self.cfg["n_layers"]


class ContiguousStandin(_Base):
    bounded = True   # refuses a step past the capacity (OP-CAP); False: grows without bound

    def used(self, layer_id: int) -> int:
        return sum(1 for t in self.tokens if layer_id in t.k)

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        layer, positions = self._check_arrays(layer_id, k, v, position)
        committed = [t for t in self.tokens if not self.step or t not in self.step["tokens"]]
        if self.step is not None and layer not in self.step["served"]:
            if positions != self.step["positions"]:
                raise StandinError("the step's layers disagree")
            tokens = self.step["tokens"]
        else:
            if positions != list(range(len(committed), len(committed) + len(positions))):
                raise StandinError("positions do not continue the history")
            if self.bounded and len(committed) + len(positions) > self.cfg["capacity"]:
                raise StandinError("capacity")
            max_write = self.cfg.get("max_write")
            if max_write is not None and any(self.windows) and len(positions) > max_write:
                raise StandinError("max_write")
            self._abandon()
            lag = [w - keep - 1 + (max_write or 0) for w, keep in zip(self.windows, self.keeps)]
            self.floors = [max(f, positions[-1] + 1 - d) if w else f for f, d, w in zip(self.floors, lag, self.windows)]
            tokens = [Token(p, {0}) for p in positions]
            self.tokens += tokens
            self.step = {"seqs": [0] * len(positions), "positions": positions, "tokens": tokens, "served": set()}
        seqs = list(self.step["seqs"])   # type: ignore[index]
        self._write(layer, tokens, k, v)
        return self._answer(layer, seqs, positions)

    def trim(self, n: Any) -> None:
        """Drop the newest n whole-step tokens (an open step goes first). It keeps every row, yet refuses a
        trim where a ring of the least size may have overwritten a position the query at the new length
        attends - a refusal SPEC.md OP-TRIM allows there (tests/op_trim_standins.py's RingKeepsEveryRow serves it)."""
        held = len([t for t in self.tokens if not self.step or t not in self.step["tokens"]])
        if type(n) is not int or not 0 <= n <= held:
            raise StandinError(f"trim {n!r} of {held}")
        end = held - n
        for w, keep, floor in zip(self.windows, self.keeps, self.floors):
            oldest = max(keep, end - (w - keep) + 1)
            if n and w and oldest < end and oldest < floor:   # trim(0) is owed, even in the middle of a step
                raise StandinError(f"trim to {end}: position {oldest} may be overwritten (floor {floor})")
        self._abandon()
        self.tokens = [t for t in self.tokens if t.pos < end]
        self.floors = [min(f, end) for f in self.floors]


ContiguousStandin.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]


class CellStandin(_Base):
    cell = True

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.declared: Optional[list[int]] = None

    def free_cells(self) -> int:
        return self.cfg["capacity"] - len(self.tokens)

    def seq_len(self, seq: int) -> int:
        return sum(1 for t in self.tokens if seq in t.owners)

    def _newest(self, seq: int) -> int:
        return max((t.pos for t in self.tokens if seq in t.owners), default=-1)

    def begin_step(self, seq_ids: Any) -> None:
        if not isinstance(seq_ids, list) or not seq_ids:
            raise StandinError("empty step")
        ids = [_int(s, 0, 62, "seq id") for s in seq_ids]
        pending = len(self.step["tokens"]) if self.step else 0
        if len(ids) > self.free_cells() + pending:
            raise StandinError("cells")
        self._abandon()
        self.declared = ids

    def _verb(self) -> None:
        """A verb abandons the step in progress, a bare declaration too."""
        self._abandon()
        self.declared = None

    def seq_cp(self, src: Any, dst: Any, upto: Any = None) -> None:
        src, dst = _int(src, 0, 62, "src"), _int(dst, 0, 62, "dst")
        if upto is not None:
            _int(upto, 0, 1 << 62, "upto")
        if src == dst or any(dst in t.owners for t in self.tokens if not self.step or t not in self.step["tokens"]):
            raise StandinError("fork destination")
        self._verb()
        for t in self.tokens:
            if src in t.owners and (upto is None or t.pos < upto):
                t.owners.add(dst)

    def seq_rm(self, seq: Any, p0: Any = 0, p1: Any = None) -> None:
        seq, p0 = _int(seq, 0, 62, "seq"), _int(p0, 0, 1 << 62, "p0")
        if p1 is not None:
            _int(p1, p0, 1 << 62, "p1")
        self._verb()
        for t in list(self.tokens):
            if seq in t.owners and t.pos >= p0 and (p1 is None or t.pos < p1):
                t.owners.discard(seq)
                if not t.owners:
                    self.tokens.remove(t)

    def reset(self) -> None:
        super().reset()
        self.declared = None

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        layer, positions = self._check_arrays(layer_id, k, v, position)
        if self.step is None:
            if self.declared is None:
                raise StandinError("no step declared")
            if len(positions) != len(self.declared):
                raise StandinError("count")
            newest = {s: self._newest(s) for s in self.declared}
            for s, p in zip(self.declared, positions):
                if p <= newest[s]:
                    raise StandinError("re-placed position")
                newest[s] = p
            tokens = [Token(p, {s}) for s, p in zip(self.declared, positions)]
            self.tokens += tokens
            self.step = {"seqs": self.declared, "positions": positions, "tokens": tokens, "served": set()}
            self.declared = None
        elif layer in self.step["served"] or positions != self.step["positions"]:
            raise StandinError("layer served twice, or positions differ")
        seqs = list(self.step["seqs"])
        self._write(layer, self.step["tokens"], k, v)
        return self._answer(layer, seqs, positions)


CellStandin.kvcache_layout = "op-cell"   # type: ignore[attr-defined]


# --- broken variants: each breaks one rule ------------------------------------------------------------

class CellReplaces(CellStandin):
    """Accepts a re-placed position (OP-POS): a query then sees two tokens at one position."""

    def _newest(self, seq: int) -> int:
        return -1


class CellKeepsStoppedStep(CellStandin):
    """A verb or a new declaration keeps the tokens of a step stopped partway (OP-STEP)."""

    def _abandon(self) -> None:
        self.step = None


class ContiguousCausalAlways(ContiguousStandin):
    """Answers CAUSAL for every multi-token step, a continuation too (OP-MASK)."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        k_hist, v_hist, spec = super().update_and_fetch(layer_id, k, v, position)
        return k_hist, v_hist, Spec("CAUSAL") if np.shape(position)[0] > 1 else spec


class CellWindowOffByOne(CellStandin):
    """A window that keeps one position too many (OP-ATTEND)."""

    def _visible(self, layer: int, seq_of: list[int], positions: list[int]) -> np.ndarray:
        saved = self.windows[layer]
        self.windows[layer] = saved + 1 if saved else 0
        try:
            return super()._visible(layer, seq_of, positions)
        finally:
            self.windows[layer] = saved


class CellMinusOneIsFree(CellStandin):
    """Accepts position -1 (OP-POS) and, like upstream, reads it as the free-cell marker: the next token
    placed takes that token's place, whoever it belongs to. Its consequence: SAFE-OP-KEEP."""

    def _check_arrays(self, layer_id: Any, k: Any, v: Any, position: Any) -> tuple[int, list[int]]:
        flat = np.asarray(position).reshape(-1).tolist()
        if -1 in flat:
            fixed = np.asarray(position).copy()
            fixed[fixed == -1] = 0
            layer, positions = super()._check_arrays(layer_id, k, v, fixed)
            return layer, [-1 if was == -1 else p for was, p in zip(flat, positions)]
        return super()._check_arrays(layer_id, k, v, position)

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        if self.step is None:   # a new step's tokens take the cells of tokens at -1 first
            taken = [t for t in self.tokens if t.pos == -1][:np.shape(position)[0]]
            for token in taken:
                self.tokens.remove(token)
        return super().update_and_fetch(layer_id, k, v, position)

    def free_cells(self) -> int:
        return self.cfg["capacity"] - sum(1 for t in self.tokens if t.pos != -1)

    def _newest(self, seq: int) -> int:
        return max((t.pos for t in self.tokens if seq in t.owners), default=-2)


class ContiguousBoolLayer(ContiguousStandin):
    """Takes layer_id True for layer 1 (OP-ARGS: bool is not an int). Its consequence: a later query on
    layer 1 attends a token written by a call that named no layer (SAFE-OP-ISOLATION)."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        return super().update_and_fetch(1 if layer_id is True else layer_id, k, v, position)


class ContiguousResetKeepsLength(ContiguousStandin):
    """reset() empties the rows but not the length the positions continue from (issue 26's first mutant):
    after a reset a step at position 0 is refused (over-strict), one at the old length served (a gap:
    lenient OP-POS), and its rows restart at 0 while a ring layer's mask compares them with the caller's
    positions, so a query of a long enough history attends nothing, not even its own token."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.before_reset = 0   # the tokens held before the last reset, still counted in every position

    def reset(self) -> None:
        held = sum(1 for t in self.tokens if not self.step or t not in self.step["tokens"])
        super().reset()
        self.before_reset += held   # the bug: the length should go back to 0

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        rows = np.asarray(position) - self.before_reset   # row = position, counted from the old length
        _, answered = self._check_arrays(layer_id, k, v, position)
        k_hist, v_hist, _ = super().update_and_fetch(layer_id, k, v, rows)
        seqs = [0] * len(answered)
        return k_hist, v_hist, Spec("EXPLICIT", self._visible(int(layer_id), seqs, answered))


class ContiguousRefusesExactFit(ContiguousStandin):
    """A capacity check off by one (issue 26's second mutant): a step that exactly fills the capacity is
    refused. The refusal is classed by the bound it sits on: over-strict OP-CAP."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        committed = [t for t in self.tokens if not self.step or t not in self.step["tokens"]]
        if len(committed) + np.shape(position)[0] >= self.cfg["capacity"]:
            raise StandinError("no room for the step")
        return super().update_and_fetch(layer_id, k, v, position)


class ContiguousServesEmptyStep(ContiguousStandin):
    """Serves a call of no token (q_len 0: lenient OP-ARGS) as a look at its history, changing nothing, with
    a CAUSAL spec. The call has no query, so no consequence may be drawn from it (the consequence drive had
    judged it as its step's positions' tokens and reported a false SAFE-OP-SELF)."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        if np.shape(k)[2:3] == (0,) and np.shape(position)[:1] == (0,):
            k_hist, v_hist, _ = self._answer(_int(layer_id, 0, self.cfg["n_layers"] - 1, "layer_id"), [], [])
            return k_hist, v_hist, Spec("CAUSAL", None)
        return super().update_and_fetch(layer_id, k, v, position)


# --- issue 33: caches shaped like the field's, each declaring the relaxation it needs (SPEC.md 6.1) -------

class _WindowOffByOne:
    """A planted defect: a ring window that keeps one position too many (OP-ATTEND)."""
    windows: list[int]

    def _visible(self, layer: int, seq_of: list[int], positions: list[int]) -> np.ndarray:
        saved = self.windows[layer]
        self.windows[layer] = saved + 1 if saved else 0
        try:
            return super()._visible(layer, seq_of, positions)   # type: ignore[misc]
        finally:
            self.windows[layer] = saved


class ContiguousTrusting(ContiguousStandin):
    """Validates nothing of a call, as a cache whose only caller is model code (HF's `update`, mlx-lm's
    `update_and_fetch`): layer ids index as Python does (-1 is the last layer, True layer 1), K and V are
    stored as they come; a config is taken as given (an invalid one builds a cache of one flat layer, as a
    library builds whatever model config it is handed). Declares `trusted-args`."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        try:
            super().__init__(cfg)
        except StandinError:
            super().__init__({**cfg, "capacity": 4, "n_layers": 1, "layers": [{"kind": "flat", "window": 0}],
                              **{key: 1 for key in ("n_kv_heads", "head_dim", "v_head_dim", "batch_size")}})

    def _check_arrays(self, layer_id: Any, k: Any, v: Any, position: Any) -> tuple[int, list[int]]:
        layer = range(self.cfg["n_layers"])[layer_id]
        return layer, [int(p) for p in np.asarray(position).reshape(-1).tolist()]


class ContiguousGrowing(ContiguousStandin):
    """No capacity: every step is served, as HF's DynamicCache and mlx-lm's KVCache grow. Declares
    `unbounded`."""
    bounded = False


SIZES = ("n_kv_heads", "head_dim", "v_head_dim", "batch_size")


class ContiguousLazy(ContiguousStandin):
    """Knows no sizes until its first update: K and V of that update set batch, heads and the widths, and
    every later update must have them (as HF's lazily initialised layers and mlx-lm's caches). Declares
    `lazy-shapes`: the config it gets has no sizes (given some, it ignores them)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__({**cfg, **{key: 1 for key in SIZES}})
        self.learnt = False

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        if not self.learnt:
            k_shape, v_shape = np.shape(k), np.shape(v)
            if len(k_shape) != 4 or len(v_shape) != 4 or k_shape[:3] != v_shape[:3] or 0 in k_shape + v_shape:
                raise StandinError(f"k {k_shape} / v {v_shape}: no shapes to learn")
            self.cfg = {**self.cfg, "batch_size": k_shape[0], "n_kv_heads": k_shape[1], "head_dim": k_shape[3],
                        "v_head_dim": v_shape[3]}
            self.learnt = True
        return super().update_and_fetch(layer_id, k, v, position)

    def reset(self) -> None:
        super().reset()
        self.learnt = False


def _quantized(values: Any) -> np.ndarray:
    """4 bits per element over each row's own range (scale and offset kept in float32), as quantized caches
    store K and V: an element is off by at most (max - min) / 30."""
    x = np.asarray(values, dtype=np.float32)
    low, high = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    scale = np.where(high > low, (high - low) / 15, 1).astype(np.float32)
    return (low + np.rint((x - low) / scale) * scale).astype(np.float32)


def _across_tokens(values: np.ndarray) -> np.ndarray:
    """4 bits per element over each channel's range across the rows of a history ([B, H, rows, W]; hqq's
    axis 0): an element is off by up to the channel's spread across tokens / 30."""
    x = np.asarray(values, dtype=np.float32)
    if not x.shape[2]:
        return x
    low, high = x.min(axis=2, keepdims=True), x.max(axis=2, keepdims=True)
    scale = np.where(high > low, (high - low) / 15, 1).astype(np.float32)
    return (low + np.rint((x - low) / scale) * scale).astype(np.float32)


def _fp8(values: Any) -> np.ndarray:
    """float8 e4m3's precision: 3 mantissa bits, so an element is off by up to 1/16 of itself."""
    x = np.asarray(values, dtype=np.float32)
    mantissa, exponent = np.frexp(x)
    return np.ldexp(np.rint(mantissa * 16) / 16, exponent).astype(np.float32)


class ContiguousQuantized(ContiguousStandin):
    """Stores K and V quantized to 4 bits per element over each row (a row of width 32 of the lossy row codes,
    1s and 2s, is exact; of the exact labels, off by up to 31/30), and serves only widths of 32 and more
    (refused at creation below). Declares `lossy=0.25` and `min_head_dim=32`."""
    narrowest = 32

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        if cfg["head_dim"] < self.narrowest or cfg["v_head_dim"] < self.narrowest:
            raise StandinError(f"widths below {self.narrowest}: head_dim {cfg['head_dim']}, v_head_dim "
                               f"{cfg['v_head_dim']}")

    def _write(self, layer: int, tokens: list[Token], k: Any, v: Any) -> None:
        super()._write(layer, tokens, _quantized(k), _quantized(v))


class ContiguousQuantizedChannels(ContiguousQuantized):
    """Quantizes each channel across the tokens of the history it answers (as hqq's axis 0 does): its error
    scales with the spread of a channel across tokens, which grows with the token number for the exact
    labels and stays 1 for the lossy row codes. Declares `lossy=0.25` and `min_head_dim=32`."""

    def _write(self, layer: int, tokens: list[Token], k: Any, v: Any) -> None:
        ContiguousStandin._write(self, layer, tokens, k, v)

    def _answer(self, layer: int, seq_of: list[int], positions: list[int]) -> tuple[np.ndarray, np.ndarray, Spec]:
        k, v, spec = super()._answer(layer, seq_of, positions)
        return _across_tokens(k), _across_tokens(v), spec


class ContiguousFp8(ContiguousQuantized):
    """Stores K and V at float8's relative precision (1/16 of each value: hundreds off for the exact labels of
    later tokens, nothing for row codes of 1s and 2s). Declares `lossy=0.25` and `min_head_dim=32`."""

    def _write(self, layer: int, tokens: list[Token], k: Any, v: Any) -> None:
        ContiguousStandin._write(self, layer, tokens, _fp8(k), _fp8(v))


class ContiguousRollsPastCapacity(ContiguousStandin):
    """Accepts a step past the capacity (lenient OP-CAP) and keeps only the newest `capacity` tokens, so a
    flat layer's query silently misses in-window tokens it accepted (as HF StaticCache's sliding layers
    with a window above max_cache_len roll): wrong, by SAFE-OP-COMPLETE."""
    bounded = False

    def _write(self, layer: int, tokens: list[Token], k: Any, v: Any) -> None:
        super()._write(layer, tokens, k, v)
        while len(self.tokens) > self.cfg["capacity"]:
            self.tokens.pop(0)


class ContiguousGrowingRolls(ContiguousRollsPastCapacity):
    """The same rolling, declared `unbounded`: the steps past the capacity are in scope, and wrong."""


# --- issue 33: regression stand-ins for the suite's three false alarms -----------------------------------

class ContiguousLaxCapBroadcastsWidth(ContiguousStandin):
    """Two leniencies: past the capacity it grows (lenient OP-CAP, harmless), and a K of width 1 is broadcast
    to the head width (lenient OP-ARGS, harmful: its rows are no token's). A break after both is the width's,
    not the capacity's (the suite charged it to the earlier OP-CAP)."""
    bounded = False

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        shape = np.shape(k)
        if len(shape) == 4 and shape[3] == 1 and self.cfg["head_dim"] > 1:
            k = np.broadcast_to(k, shape[:3] + (self.cfg["head_dim"],)).copy()
        return super().update_and_fetch(layer_id, k, v, position)


class ContiguousFloat16(ContiguousStandin):
    """Stores K and V as float16, exact only up to 2048: wrong once labels pass it. A refused call before
    that changes nothing - the suite charged the wrong answer to it (OP-ATOMIC) because the refused call
    used up token numbers, so the program without it labelled every later token lower."""

    def _write(self, layer: int, tokens: list[Token], k: Any, v: Any) -> None:
        super()._write(layer, tokens, np.asarray(k).astype(np.float16), np.asarray(v).astype(np.float16))


class ContiguousRefusalGrowsK(ContiguousStandin):
    """A V it refuses after it appended the step's K (mlx-lm concatenates K, then V): K is one row longer
    than V, unseen by `used` (it counts whole tokens), and the next answer's K and V differ in length, its
    mask attending every K row. Past the capacity it grows (lenient OP-CAP): the suite charged the K/V
    mismatch to that lenient step."""
    bounded = False

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.extra_k: dict[int, list[np.ndarray]] = {}   # layer -> K rows whose V was refused

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        c = self.cfg
        if type(layer_id) is int and 0 <= layer_id < c["n_layers"] and np.shape(k) == \
                (c["batch_size"], c["n_kv_heads"], np.shape(position)[0], c["head_dim"]) and \
                np.shape(v)[3:] != (c["v_head_dim"],):
            self.extra_k.setdefault(layer_id, []).extend(np.asarray(k, dtype=np.float32)[:, :, i]
                                                         for i in range(np.shape(k)[2]))
            raise StandinError("v width")
        k_hist, v_hist, spec = super().update_and_fetch(layer_id, k, v, position)
        extra = self.extra_k.get(int(layer_id), [])
        if extra:
            k_hist = np.concatenate([k_hist, np.stack(extra, axis=2)], axis=2)
            spec = Spec("EXPLICIT", np.concatenate([spec.mask, np.ones((spec.mask.shape[0], len(extra)), bool)],
                                                   axis=1))   # the history is every K row
        return k_hist, v_hist, spec

    def reset(self) -> None:
        super().reset()
        self.extra_k = {}


# --- issue 35: defects a smaller configuration than the suite's first shows (the shrinker must find it) ---

class ContiguousRingOneTooWide(ContiguousStandin):
    """A ring layer attends one position more than its window (OP-ATTEND): window 1 and two tokens show it."""

    def _visible(self, layer: int, seq_of: list[int], positions: list[int]) -> np.ndarray:
        saved = self.windows[layer]
        self.windows[layer] = saved + 1 if saved else 0
        try:
            return super()._visible(layer, seq_of, positions)
        finally:
            self.windows[layer] = saved


class ContiguousResetKeepsFlatRows(ContiguousStandin):
    """reset() forgets the ring rows but keeps a flat layer's (OP-ATTEND): each flat answer after it still
    shows the old rows, attended - one flat layer, one token before the reset and one after show it."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.stale: list[Token] = []

    def reset(self) -> None:
        self.stale += [t for t in self.tokens if not self.step or t not in self.step["tokens"]]
        super().reset()

    def _answer(self, layer: int, seq_of: list[int], positions: list[int]) -> tuple[np.ndarray, np.ndarray, Spec]:
        k, v, spec = super()._answer(layer, seq_of, positions)
        old = [t for t in self.stale if layer in t.k] if self.windows[layer] == 0 else []
        if not old:
            return k, v, spec
        k = np.concatenate([np.stack([t.k[layer] for t in old], axis=2), k], axis=2)
        v = np.concatenate([np.stack([t.v[layer] for t in old], axis=2), v], axis=2)
        mask = np.concatenate([np.ones((len(positions), len(old)), dtype=bool), spec.mask], axis=1)
        return k, v, Spec("EXPLICIT", mask)


class ContiguousIgnoresMaxWrite(ContiguousStandin):
    """Serves a step longer than max_write (lenient OP-MAX-WRITE): max_write 1 and a step of 2 show it."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__({**cfg, "max_write": None})


class ContiguousSwapsBatchRows(ContiguousStandin):
    """Answers batch row 0's history for every batch row (OP-ATTEND): batch 2 shows it, one head of width 1."""

    def _answer(self, layer: int, seq_of: list[int], positions: list[int]) -> tuple[np.ndarray, np.ndarray, Spec]:
        k, v, spec = super()._answer(layer, seq_of, positions)
        return np.repeat(k[:1], k.shape[0], axis=0), np.repeat(v[:1], v.shape[0], axis=0), spec


class ContiguousKeepsVAsWideAsK(ContiguousStandin):
    """Keeps only head_dim elements of each V row, padding the rest with zeros (OP-ATTEND): an MLA config
    shows it at head_dim 1 and v_head_dim 2."""

    def _write(self, layer: int, tokens: list[Token], k: Any, v: Any) -> None:
        cut = np.array(v, dtype=np.float32)
        cut[..., self.cfg["head_dim"]:] = 0
        super()._write(layer, tokens, k, cut)


class ContiguousKeepsRefusedRows(ContiguousResetKeepsFlatRows):
    """Refuses a negative position, but only after writing the call's rows (OP-ATOMIC): used() does not count
    them, yet a flat layer's next answer shows them, attended. Only a program that goes on after the
    refused call shows it (issue 35: the exhaustive checker skipped every such program)."""

    def reset(self) -> None:
        ContiguousStandin.reset(self)
        self.stale = []

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        flat = np.asarray(position).reshape(-1).tolist()
        if flat and min(flat) < 0 and type(layer_id) is int and 0 <= layer_id < self.cfg["n_layers"]:
            kept = Token(-1, {0})
            kept.k[layer_id] = np.asarray(k, dtype=np.float32)[:, :, 0].copy()
            kept.v[layer_id] = np.asarray(v, dtype=np.float32)[:, :, 0].copy()
            self.stale.append(kept)
        return super().update_and_fetch(layer_id, k, v, position)


class _Broadcasts(ContiguousStandin):
    """Broadcasts k and v to the step's shape before the checks (as ExecuTorch 1.5.1's cache does by
    assigning into its buffers), where `broadcasts` says so: a malformed pair is then served (OP-ARGS)."""

    def broadcasts(self, k: np.ndarray, v: np.ndarray, q: int) -> bool:
        raise NotImplementedError

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        c, q = self.cfg, np.shape(position)[0]
        k, v = np.asarray(k), np.asarray(v)
        if k.ndim == 4 and v.ndim == 4 and self.broadcasts(k, v, q):
            k = np.broadcast_to(k, (c["batch_size"], c["n_kv_heads"], q, c["head_dim"]))
            v = np.broadcast_to(v, (c["batch_size"], c["n_kv_heads"], q, c["v_head_dim"]))
        return super().update_and_fetch(layer_id, k, v, position)


class ContiguousBroadcastsV(_Broadcasts):
    """Serves V of one token beside K of n (OP-ARGS): the one V row is every token's."""

    def broadcasts(self, k: np.ndarray, v: np.ndarray, q: int) -> bool:
        return v.shape[2] == 1 and k.shape[2] == q > 1


class ContiguousBroadcastsOneToken(_Broadcasts):
    """Serves K and V of one token over n positions (OP-ARGS)."""

    def broadcasts(self, k: np.ndarray, v: np.ndarray, q: int) -> bool:
        return k.shape[2] == v.shape[2] == 1 < q


class ContiguousBroadcastsBatch(_Broadcasts):
    """Serves K and V of batch 1 in a batch-B cache (OP-ARGS): batch row 0 is every row."""

    def broadcasts(self, k: np.ndarray, v: np.ndarray, q: int) -> bool:
        return k.shape[0] == v.shape[0] == 1 < self.cfg["batch_size"]


class CellMergingFork(CellStandin):
    """seq_cp onto a live destination (or onto itself) merges the source's tokens into its own (OP-FORK):
    a query then attends two tokens at one position."""

    def seq_cp(self, src: Any, dst: Any, upto: Any = None) -> None:
        src, dst = _int(src, 0, 62, "src"), _int(dst, 0, 62, "dst")
        if upto is not None:
            _int(upto, 0, 1 << 62, "upto")
        self._verb()
        for t in self.tokens:
            if src in t.owners and (upto is None or t.pos < upto):
                t.owners.add(dst)


def _factory(cls: type, scope: Optional[list[str]] = None) -> Any:
    """A factory of `cls`, declaring `scope` (default: the whole spec) of spec 2, trim and sinks included: the
    stand-ins are written against it (scope.py, SPEC_VERSIONS)."""
    def make(cfg: dict[str, Any]) -> Any:
        return cls(cfg)
    make.kvcache_layout = cls.kvcache_layout   # type: ignore[attr-defined]
    make.kvcache_scope = [*(scope or []), "spec=2"]   # type: ignore[attr-defined]
    return make


contiguous = _factory(ContiguousStandin)
cell = _factory(CellStandin)
cell_replaces = _factory(CellReplaces)
cell_keeps_stopped_step = _factory(CellKeepsStoppedStep)
contiguous_causal_always = _factory(ContiguousCausalAlways)
cell_window_off_by_one = _factory(CellWindowOffByOne)
cell_minus_one_is_free = _factory(CellMinusOneIsFree)
contiguous_bool_layer = _factory(ContiguousBoolLayer)
contiguous_reset_keeps_length = _factory(ContiguousResetKeepsLength)
contiguous_refuses_exact_fit = _factory(ContiguousRefusesExactFit)
contiguous_serves_empty_step = _factory(ContiguousServesEmptyStep)

# issue 33: each declares its relaxation; the `_off_by_one` twins carry one planted defect besides; the
# `_undeclared` ones are the same caches without the declaration (they must still fail)
RELAXED = {"trusting": (ContiguousTrusting, ["trusted-args"]), "growing": (ContiguousGrowing, ["unbounded"]),
           "lazy": (ContiguousLazy, ["lazy-shapes"]),
           "quantized": (ContiguousQuantized, ["lossy=0.25", "min_head_dim=32"]),
           "quantized_channels": (ContiguousQuantizedChannels, ["lossy=0.25", "min_head_dim=32"]),
           "fp8": (ContiguousFp8, ["lossy=0.25", "min_head_dim=32"])}
for _name, (_cls, _scope) in RELAXED.items():
    _broken = type(f"{_cls.__name__}OffByOne", (_WindowOffByOne, _cls), {})
    globals()[f"contiguous_{_name}"] = _factory(_cls, _scope)
    globals()[f"contiguous_{_name}_off_by_one"] = _factory(_broken, _scope)
    globals()[f"contiguous_{_name}_undeclared"] = _factory(_cls)
contiguous_rolls_past_capacity = _factory(ContiguousRollsPastCapacity)
contiguous_growing_rolls = _factory(ContiguousGrowingRolls, ["unbounded"])
contiguous_lax_cap_broadcasts_width = _factory(ContiguousLaxCapBroadcastsWidth)
contiguous_float16 = _factory(ContiguousFloat16)
contiguous_refusal_grows_k = _factory(ContiguousRefusalGrowsK)
contiguous_ring_one_too_wide = _factory(ContiguousRingOneTooWide)
contiguous_reset_keeps_flat_rows = _factory(ContiguousResetKeepsFlatRows)
contiguous_ignores_max_write = _factory(ContiguousIgnoresMaxWrite)
contiguous_swaps_batch_rows = _factory(ContiguousSwapsBatchRows)
contiguous_keeps_v_as_wide_as_k = _factory(ContiguousKeepsVAsWideAsK)
contiguous_keeps_refused_rows = _factory(ContiguousKeepsRefusedRows)
contiguous_broadcasts_v = _factory(ContiguousBroadcastsV)
contiguous_broadcasts_one_token = _factory(ContiguousBroadcastsOneToken)
contiguous_broadcasts_batch = _factory(ContiguousBroadcastsBatch)


class ContiguousWindowSteps(ContiguousStandin):
    """Refuses a step longer than a ring layer's window on that layer, and serves any length on a flat one (issue
    41: a library whose sliding-window layers take at most a window per call). Declaring `window-steps` it is
    CONFORMING; without the declaration its refusal is over-strict."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        window = self.windows[layer_id] if type(layer_id) is int and 0 <= layer_id < len(self.windows) else 0
        if window and getattr(position, "shape", (0,))[0] > window:
            raise StandinError(f"a step of {position.shape[0]} tokens on a ring layer of window {window}")
        return super().update_and_fetch(layer_id, k, v, position)


contiguous_window_steps = _factory(ContiguousWindowSteps, ["window-steps"])
contiguous_window_steps_undeclared = _factory(ContiguousWindowSteps)


class ContiguousNoLength:
    """A cache with no length of its own (issue 41): its caller passes the positions and nothing in it counts
    them, so it has no `used`. Declaring `no-length` it is CONFORMING, judged by its answers; without the
    declaration the suite's observation of used(layer) fails it."""

    kvcache_layout = "op-contiguous"

    def __init__(self, cfg: dict[str, Any]) -> None:
        self._rows = ContiguousStandin(cfg)   # its rows; their count is not asked

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        return self._rows.update_and_fetch(layer_id, k, v, position)

    def trim(self, n: Any) -> None:
        self._rows.trim(n)

    def reset(self) -> None:
        self._rows.reset()


contiguous_no_length = _factory(ContiguousNoLength, ["no-length"])
contiguous_no_length_undeclared = _factory(ContiguousNoLength)


cell_merging_fork = _factory(CellMergingFork)
# the same with its precondition documented (requires=, SPEC.md 6.1, SCOPE-REQUIRES): no fork onto a live destination is sent
cell_merging_fork_requiring_empty = _factory(CellMergingFork, ["flat", "ring", "mla", "positions", "steps",
                                                               "declarations", "requires=empty-destination"])


# --- issue 41: a regression behind a known defect (--baseline must show it NEW) -------------------------------

class ContiguousRingTwoDefects(ContiguousRingOneTooWide):
    """ContiguousRingOneTooWide's defect and a second sliding-window one: a step exactly as long as a ring layer's
    window (2 or more) hides the step's first token from its last query (OP-ATTEND, a token missed). Both are
    wrong OP-ATTEND at a fetch on a ring layer; a run against the first one's report must print the second NEW."""

    def _visible(self, layer: int, seq_of: list[int], positions: list[int]) -> np.ndarray:
        mask = super()._visible(layer, seq_of, positions)
        window = self.windows[layer]
        if window > 1 and len(positions) == window:
            rows = [t for t in self.tokens if layer in t.k]
            for j, t in enumerate(rows):
                if t.pos == positions[0]:
                    mask[-1, j] = False
        return mask


contiguous_ring_two_defects = _factory(ContiguousRingTwoDefects)


# --- issue 41.1: a finding charged to the call that explains it -----------------------------------------------

class ContiguousPositionlessWarmup(ContiguousStandin):
    """Two behaviours of a cache that keeps no positions (its scope leaves `positions` out): it refuses a lone token
    at position 0 on layer 0, changing nothing (over-strict OP-ATTEND), and it reads a call's positions only to size
    the history it answers - rows up to the newest position, the ones it never wrote zero (a layer's first write at
    a later position answers rows of no token). That answer comes from the call alone (the same call on a fresh
    cache answers it too): a suite that blames the refused call before it raises a false SAFE-OP-ISOLATION."""

    def update_and_fetch(self, layer_id: Any, k: Any, v: Any, position: Any) -> Any:
        layer, positions = self._check_arrays(layer_id, k, v, position)
        if layer == 0 and positions == [0]:
            raise StandinError("a lone token at position 0 on layer 0 is refused")
        held = [t for t in self.tokens if not self.step or t not in self.step["tokens"]]
        start = len(held) if self.step is None or layer in self.step["served"] else self.step["positions"][0]
        k_hist, v_hist, spec = super().update_and_fetch(layer, k, v, np.arange(start, start + len(positions))[:, None])
        extra = positions[-1] + 1 - k_hist.shape[2]
        if extra <= 0:
            return k_hist, v_hist, spec
        pad = [(0, 0), (0, 0), (0, extra), (0, 0)]
        rows = k_hist.shape[2] + extra
        causal = np.tril(np.ones((len(positions), rows), dtype=bool), rows - len(positions))
        return np.pad(k_hist, pad), np.pad(v_hist, pad), Spec("EXPLICIT", causal)


contiguous_positionless_warmup = _factory(ContiguousPositionlessWarmup,
                                          ["flat", "ring", "max_write", "batch", "mla", "steps", "trim", "sinks"])
