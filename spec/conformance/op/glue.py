"""What glue for a library's KV cache needs besides `library_target` (targets.py): the config's layers one per layer,
a library's attention mask read as the rows each query attends, and the token count a cache without a length of its
own is answered by. Public through `kvcache_spec.conformance.op` (docs/your-library.md); numpy only, so glue for any
library (torch, mlx, jax, ...) can use them, and a torch or mlx tensor is read through numpy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..configs import JsonConfig
from ..scope import parse

# How the attention a library calls treats a missing mask (`without_mask` of attended_rows).
EVERY_ROW = "every-row"        # no mask: every query attends every row (torch SDPA with q_len 1, mlx without "causal")
UPPER_LEFT = "upper-left"      # torch SDPA's is_causal=True: query i attends rows 0..i, whatever the history holds
LOWER_RIGHT = "lower-right"    # mlx's "causal": query i attends rows up to rows - q_len + i (a step sees its history)
WITHOUT_MASK = (EVERY_ROW, UPPER_LEFT, LOWER_RIGHT)

# An additive mask blocks a row with a large negative number: -inf, the dtype's minimum, -1e9 (Keras), -1e4 (some
# fp16 code). Below this the softmax weight is e^-10000, zero in float32; an ALiBi-style bias stays far above it.
BLOCKED_BELOW = -1e4


def layer_policies(cfg: JsonConfig) -> list[dict[str, Any]]:
    """The config's layer policies, one per layer: its `layers` holds either one entry per layer or a single entry for
    every layer (docs/target-contract.md). Each entry is {"kind": "flat" | "ring", "window": int}, a ring's "keep" only
    for a target declaring `sinks`."""
    layers = cfg["layers"]
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"OP-CONFIG: layers is {layers!r}, not a non-empty list")
    entries: list[dict[str, Any]] = list(layers)
    return entries if len(entries) == cfg["n_layers"] else entries * cfg["n_layers"]


def refuse_outside_scope(cfg: JsonConfig, scope: Any) -> None:
    """Raise ValueError("SCOPE-BORDER: ...") when a (valid) config needs what `scope` leaves out - a layer kind,
    `max_write`, a ring's `keep` (sinks), batch rows or an MLA width, a keep other than `keep=N`, a width under
    `min_head_dim=N` - as SCOPE-BORDER owes at creation; nothing when it lies inside. `scope` is the target's
    `kvcache_scope` (the tuple given to library_target). What only the library knows (one sliding window for every
    layer, a width its kernels refuse) the glue still refuses itself."""
    missing = parse(scope, "refuse_outside_scope's scope").missing(cfg)
    if missing:
        raise ValueError(f"SCOPE-BORDER: the config needs {', '.join(sorted(missing))}, outside the scope {scope}")


def _as_numpy(array: Any) -> Any:
    import numpy as np

    if hasattr(array, "detach"):   # a torch tensor (bfloat16 has no numpy dtype: widened first, values unchanged)
        array = array.detach().cpu()
        return np.asarray(array.float() if array.is_floating_point() else array)
    return np.asarray(array)       # numpy, mlx (its arrays implement the buffer protocol), lists


def attended_rows(mask: Any, q_len: int, rows: int, without_mask: str = EVERY_ROW) -> Any:
    """The rows each query attends under the mask a library hands its attention: a bool numpy [q_len, rows] array.

    `mask` is None (then `without_mask` says what the library's attention does: EVERY_ROW, UPPER_LEFT as torch SDPA's
    `is_causal=True`, LOWER_RIGHT as mlx's "causal"), a bool array (True attends) or an additive float array (a value
    below BLOCKED_BELOW blocks the row), of any shape that broadcasts to [..., q_len, rows] as the attention call
    broadcasts it - a shape that does not raises, as the forward would. Every batch row and head must attend the same
    rows (one op-face mask covers them all): a mask that differs across them (padding) raises ValueError."""
    import numpy as np

    if without_mask not in WITHOUT_MASK:
        raise ValueError(f"attended_rows: without_mask is {without_mask!r}, not one of {WITHOUT_MASK}")
    if mask is None:
        if without_mask == EVERY_ROW:
            return np.ones((q_len, rows), dtype=bool)
        last = np.arange(q_len) + (rows - q_len if without_mask == LOWER_RIGHT else 0)
        return np.arange(rows)[None, :] <= last[:, None]
    array = _as_numpy(mask)
    if array.dtype != np.bool_:
        array = array > BLOCKED_BELOW
    spread = np.broadcast_to(array, (*array.shape[:-2], q_len, rows)).reshape(-1, q_len, rows)
    if not (spread == spread[0]).all():
        raise ValueError("attended_rows: the mask differs across batch rows or heads, which one op-face mask cannot carry")
    return spread[0].copy()


def explicit_spec(rows: Any) -> SimpleNamespace:
    """The AttendSpec answering `update_and_fetch`: EXPLICIT, with `rows` (attended_rows' [q_len, rows] bools)."""
    return SimpleNamespace(kind="EXPLICIT", mask=rows)


class LayerLengths:
    """The tokens each layer holds, for a cache with no length of its own: one whose caller passes the positions
    (litgpt's `input_pos`, a `cache_position` tensor, an offset argument) and keeps the count itself, as the library's
    generate loop does. The glue places each step at `position(layer)`, `advance`s it once the library has served the
    step (a call the library refused advances nothing), and answers `used(layer)` with it - the count the library's
    caller would read. `trim(n)` takes n back from every layer, `reset()` starts again at 0."""

    def __init__(self, n_layers: int) -> None:
        if type(n_layers) is not int or n_layers < 1:
            raise ValueError(f"LayerLengths: n_layers is {n_layers!r}, not an int >= 1")
        self.held = [0] * n_layers

    def position(self, layer: int) -> int:
        """The position the layer's next token takes: the tokens it holds."""
        return self.held[layer]

    def used(self, layer: int) -> int:
        return self.held[layer]

    def advance(self, layer: int, q_len: int) -> None:
        """The library served a step of q_len tokens on `layer`."""
        if type(q_len) is not int or q_len < 0:
            raise ValueError(f"LayerLengths.advance: q_len is {q_len!r}, not an int >= 0")
        self.held[layer] += q_len

    def trim(self, n: int) -> None:
        """Take back the n newest tokens of every layer (refused, nothing changed, when a layer holds fewer)."""
        if type(n) is not int or not 0 <= n <= min(self.held):
            raise ValueError(f"LayerLengths.trim: n is {n!r}, not an int in [0, {min(self.held)}]")
        self.held = [held - n for held in self.held]

    def reset(self) -> None:
        self.held = [0] * len(self.held)
