"""How the op engine reads an answer, and shows calls and rows in its messages: the labels it writes into K and V (each element names its token, layer,
batch row, head and dim exactly; a `lossy=<tol>` target gets row codes instead) and the rows an AttendSpec lets a
query attend. Pure functions of the answer and the config: the engine (engine.py) and the consequences past a
lenient step (consequences.py) read answers alike."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ... import op_model

LABEL_LIMIT = 1 << 24   # float32 holds every integer below it exactly


class Labels:
    """The label of each element: 1 + a mixed-radix number of (uid, layer, batch, head, is_v, dim).

    The dim is the lowest digit, so two rows of different (token, layer, batch row, head, K or V) differ by
    at least the row width W in every element: a row is read by exact match. A target declaring
    `lossy=<tol>` (SPEC.md 6.1) is written *row codes* instead: the row's code c = (((uid L + layer) B + b) H +
    h) 2 + is_v in binary, lowest bit first, one bit per element as 1 + bit, the last element 1 + the rest
    of c (c >> (W - 1)), so every element but the last is 1 or 2 whatever the token - a quantizer's range
    stays 1 - and two rows of different codes differ by at least 1 in some element; a row is read as the
    code whose elements each lie within tol of it (tol < 0.5: at most one does)."""

    def __init__(self, cfg: op_model.OpConfig, tolerance: Optional[float] = None) -> None:
        # one more than each valid value, so a malformed step (a head too many, a wider V) still gets labels
        self.radix = (cfg.n_layers + 1, cfg.batch_size + 1, cfg.n_kv_heads + 1,
                      max(cfg.head_dim, cfg.v_head_dim) + 1)
        self.tolerance = tolerance
        self.bits: Optional[int] = None   # OP-QUANTIZE: exact labels read within quantize(bits)'s bound

    def array(self, uids: list[int], layer: int, shape: tuple[int, ...], is_v: int) -> np.ndarray:
        """[B, H, q, W] labels for the step's tokens `uids` (uid -1 pads a row past them)."""
        L, B, H, W = self.radix
        b = np.arange(shape[0]).reshape(-1, 1, 1, 1) % B
        h = np.arange(shape[1]).reshape(1, -1, 1, 1) % H
        u = np.array([(uids[i] if i < len(uids) else -1) for i in range(shape[2])], dtype=np.int64).reshape(1, 1, -1, 1)
        if self.tolerance is not None:   # row codes: bits, the last element the rest
            code = (((u * L + layer % L) * B + b) * H + h) * 2 + is_v
            width = shape[3]
            d = np.arange(width).reshape(1, 1, 1, -1)
            value = 1 + np.where(d < width - 1, (code >> np.minimum(d, 62)) & 1, code >> max(width - 1, 0))
            return np.broadcast_to(np.where(u < 0, 0, value), tuple(shape)).astype(np.float32)
        d = np.arange(shape[3]).reshape(1, 1, 1, -1) % W
        value = 1 + (((((u * L + layer % L) * B + b) * H + h) * 2 + is_v) * W + d)
        value = np.where(u < 0, 0, value)
        return value.astype(np.float32)

    def uid_of(self, values: np.ndarray, layer: int, b: int, h: int, is_v: int) -> np.ndarray:
        """Per row of values [rows, W]: the uid whose full label vector it holds (lossy: whose row code
        lies within the tolerance of it in every element), or -1."""
        L, B, H, W = self.radix
        if not values.shape[1]:
            return np.full(values.shape[0], -1)
        if self.tolerance is not None:
            return self._uid_of_code(values, layer, b, h, is_v)
        if self.bits is not None:
            return self._uid_within(values, layer, b, h, is_v)
        first = values[:, 0].astype(np.float64) - 1
        guess = first.astype(np.int64) // W // (2 * H * B * L)
        expected = 1 + (((((guess.reshape(-1, 1) * L + layer) * B + b) * H + h) * 2 + is_v) * W
                        + np.arange(values.shape[1]))
        ok = (guess >= 0) & np.all(values == expected.astype(np.float32), axis=1) & (values[:, 0] >= 1)
        return np.where(ok, guess, -1)

    def _uid_within(self, values: np.ndarray, layer: int, b: int, h: int, is_v: int) -> np.ndarray:
        """OP-QUANTIZE: the uid whose labels each element lies within quantize(bits)'s bound of (a row's labels
        span its width less one), plus float32 rounding; the engine sends bits that keep the bound below a half."""
        L, B, H, W = self.radix
        assert self.bits is not None
        width = values.shape[1]
        with np.errstate(invalid="ignore", over="ignore"):
            x = values.astype(np.float64)
            finite = np.all(np.isfinite(x), axis=1)
            first = np.rint(np.where(finite, x[:, 0], 0)) - 1
            first = np.where(finite & (first >= 0), first, -1).clip(-1, 2.0**62)
            guess = first.astype(np.int64) // W // (2 * H * B * L)
            expected = 1 + (((((guess.reshape(-1, 1) * L + layer) * B + b) * H + h) * 2 + is_v) * W
                            + np.arange(width)).astype(np.float64)
            bound = op_model.quantize_bound(self.bits, 0, width - 1) + \
                np.spacing(np.abs(expected).astype(np.float32)).astype(np.float64)
            ok = finite & (guess >= 0) & np.all(np.abs(np.where(np.isfinite(x), x, -1e30) - expected) <= bound, axis=1)
        return np.where(ok, guess, -1)

    def labels_of(self, values: np.ndarray, layer: int, h: int, is_v: int) -> list[Optional[tuple[int, int]]]:
        """OP-ROWS: per row of values [rows, W], the (uid, batch row written for) whose label it holds, or None:
        a batch row may hold tokens written for another (a reorder moved them)."""
        found: list[Optional[tuple[int, int]]] = [None] * values.shape[0]
        for written_for in range(self.radix[1] - 1):
            for row, uid in enumerate(self.uid_of(values, layer, written_for, h, is_v)):
                if uid >= 0:
                    found[row] = (int(uid), written_for)
        return found

    def _uid_of_code(self, values: np.ndarray, layer: int, b: int, h: int, is_v: int) -> np.ndarray:
        L, B, H, _ = self.radix
        tolerance = float(self.tolerance or 0)
        width = values.shape[1]
        with np.errstate(invalid="ignore", over="ignore"):
            x = values.astype(np.float64) - 1
            finite = np.all(np.isfinite(x), axis=1)
            digits = np.rint(np.where(np.isfinite(x), x, -1)).clip(-1, 2.0**62)
            near = np.max(np.abs(x - digits), axis=1) <= tolerance
        bits = digits[:, :width - 1]
        ok = finite & near & np.all((bits == 0) | (bits == 1), axis=1) & (digits[:, -1] >= 0)
        low = min(width - 1, 62)
        # bit d of the code is element d (0 or 1 where ok): a sum over distinct powers of two is their OR
        powers = np.int64(1) << np.arange(low, dtype=np.int64)
        code = np.where(ok[:, None], bits[:, :low], 0).astype(np.int64) @ powers
        rest = np.where(ok, digits[:, -1], 0)
        ok &= rest < 2.0**(62 - low)
        code |= np.where(ok, rest, 0).astype(np.int64) << low
        own = ((layer * B + b) * H + h) * 2 + is_v
        uid = code // (2 * H * B * L)
        return np.where(ok & (code % (2 * H * B * L) == own), uid, -1)


def as_array(value: Any) -> np.ndarray:
    """A numpy array from a numpy array or a torch tensor (torch is never imported here)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def mask_kind(spec: Any) -> str:
    """An AttendSpec's kind as 'NONE' / 'CAUSAL' / 'EXPLICIT' (an enum member, its value or a string)."""
    kind = getattr(spec, "kind", None)
    name = getattr(kind, "name", None)
    return str(name if isinstance(name, str) else kind).upper()


def allowed_rows(spec: Any, q: int, rows: int, batch: Optional[int] = None) -> np.ndarray | str:
    """OP-MASK: which of `rows` rows each of `q` queries attends under an AttendSpec ([q, rows] bool; with
    `batch`, a mask per batch row [batch, q, rows] too: OP-PAD), or why the spec cannot be read so."""
    kind = mask_kind(spec)
    if kind == "NONE":
        return np.ones((q, rows), dtype=bool)
    if kind == "CAUSAL":
        if rows != q:
            return f"CAUSAL over {q} queries and {rows} rows: torch's is_causal is upper-left aligned and would " \
                   "hide the history"
        return np.tril(np.ones((q, rows), dtype=bool))
    if kind == "EXPLICIT":
        mask = as_array(getattr(spec, "mask", None))
        if mask.dtype != np.bool_ or mask.shape not in ((q, rows), (batch, q, rows)):
            return f"EXPLICIT mask {list(mask.shape)} {mask.dtype}, not bool [{q}, {rows}]" + \
                (f" or [{batch}, {q}, {rows}]" if batch is not None else "")
        return mask
    return f"AttendSpec kind {kind!r} is not NONE, CAUSAL or EXPLICIT"


def row_text(values: np.ndarray) -> str:
    """A row as a message shows it: its first four elements."""
    return "[" + ", ".join(f"{x:g}" for x in values[:4]) + (", ...]" if len(values) > 4 else "]")


def refusal_text(error: Any) -> str:
    """A refusal's error, short: its type and first words (a refusal answered False has no error)."""
    text = " ".join(str(error).split()) if error else "answered False"
    return text if len(text) <= 90 else text[:87] + "..."


def show_args(args: dict[str, Any]) -> str:
    """A call's arguments as a finding's message shows them: a tensor by its shape, a position by its values, a
    state (OP-STATE) by its size."""
    parts = []
    for name, value in args.items():
        if isinstance(value, (bytes, bytearray)):
            parts.append(f"{name}=<{len(value)} bytes>")
        elif isinstance(value, np.ndarray):
            parts.append(f"{name}={list(value.shape)}" if name != "position" else
                         f"position={value[:, 0].tolist() if value.ndim == 2 and value.shape[1] == 1 else value.tolist()}")
        else:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)
