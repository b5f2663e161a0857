"""Broken op-face caches for chunk layers and recording (OP-CHUNK, OP-RECORD): each is the reference
(`kvcache.op.ContiguousReferenceCache`) changed in one thing, the way a real chunked or recording cache goes
wrong, and each must be found with a short program (tests/test_op_chunked.py). Use one as a target:
`--target python:kvcache_spec.conformance.zoo.op_chunk:chunk_as_window`.

- `chunk_as_window`: a chunk layer served as a sliding window of the chunk size (a query attends across its
  chunk's start): wrong.
- `chunk_start_kept_after_trim`: the chunk start only moves forward (mlx-lm's ChunkedKVCache keeps a
  `start_position` its trim does not lower): after a trim back across a boundary the query reads nothing before
  the old start: wrong.
- `chunk_zero_served`: a chunk layer of chunk 0 (or below) built as a flat layer: lenient.
- `recording_loses_past`: record_past accepted, but a ring keeps only what a ring of the least size keeps, so
  a trim the recording owes is served over rows it lost: wrong.
- `recording_keeps_window_only`: record_past ignored, a ring laid out as a ring of window + max_write - 1 rows,
  which refuses a trim the recording owes (naming no rule, as transformers' crop does): over-strict OP-RECORD.
- `record_past_truthy`: a record_past of 1 or "yes" taken for true: lenient.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kvcache import TrimError, op
from kvcache._op_arrays import array_kind, to_numpy
from kvcache._op_types import mask_of, spec_for

from .. import scope as scopes
from ..configs import JsonConfig

Entry = dict[str, Any]


def _config(cfg: JsonConfig, entry: Callable[[Entry], Entry] = lambda e: e,
            record_past: Callable[[Any], Any] = lambda value: value) -> op.CacheConfig:
    """The reference's config of a JSON op config (as op/targets.py builds it: the zoo reaches no layout), each
    layer entry and the record_past passed through the stand-in's change first (a key absent stays absent)."""
    policies = [op.LayerPolicy(op.LayerKind(e["kind"]), e["window"], e.get("keep", 0), e.get("chunk", 0))
                for e in map(entry, cfg["layers"])]
    return op.CacheConfig(cfg["n_layers"], cfg["n_kv_heads"], cfg["head_dim"], cfg["capacity"],
                          op.CacheSizing(cfg.get("sizing", "dynamic")), np.float32, cfg["batch_size"], policies,
                          cfg.get("v_head_dim", cfg["head_dim"]), cfg.get("max_write"),
                          **({"record_past": record_past(cfg["record_past"])} if "record_past" in cfg else {}))


def _chunk_as_ring(entry: Entry) -> Entry:
    chunk = entry.get("chunk")
    if entry.get("kind") == "chunk" and entry.get("window") == 0 and type(chunk) is int and chunk >= 1:   # valid
        return {**{key: value for key, value in entry.items() if key != "chunk"}, "kind": "ring",
                "window": entry.get("chunk")}
    return entry


def _chunk_zero_flat(entry: Entry) -> Entry:
    chunk = entry.get("chunk")
    if entry.get("kind") == "chunk" and (type(chunk) is not int or chunk < 1):
        return {key: value for key, value in entry.items() if key != "chunk"} | {"kind": "flat", "window": 0}
    return entry


class _LosesBelowFloor(op.ContiguousReferenceCache):
    """The reference, but each layer's answers attend no row below a floor of its own (sinks aside): the rows a cache of the least size has let go. `_moved` says where a step begun moves a layer's
    floor - for the queries after that step, so its own answers read below the floor the step began with -
    `_trimmed` where a trim to `end` leaves it; without a trim no query reads below such a floor, so only trims
    tell."""

    def __init__(self, config: op.CacheConfig) -> None:
        super().__init__(config)
        self.lost = [0] * config.n_layers      # per layer: the floor below which its rows are gone after the step
        self.serving = [0] * config.n_layers   # the floors the step in progress began with

    def _moved(self, layer: int, first: int, end: int) -> int:
        raise NotImplementedError

    def _trimmed(self, layer: int, end: int) -> int:
        return min(self.lost[layer], end)

    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, op.AttendSpec]:
        step = self._step
        begins = step is None or layer_id in step.served
        k_hist, v_hist, spec = super().update_and_fetch(layer_id, k, v, position)
        positions = [int(p) for p in to_numpy(position).reshape(-1)]
        if begins:   # a step begun moves every layer's floor, as OP-TRIM's floor moves (an abandoned one's undone)
            if step is not None:
                self.lost[:] = self.serving
            self.serving[:] = self.lost
            self.lost[:] = [max(floor, self._moved(layer, positions[0], positions[-1] + 1))
                            for layer, floor in enumerate(self.lost)]
        rows = to_numpy(k_hist).shape[2]
        used = self._used(layer_id)
        kept = np.arange(used - rows, used)   # the rows' positions (without a trim no query needs one below)
        kept = (kept >= self.serving[layer_id]) | (kept < self.config.keep(layer_id))
        mask = mask_of(spec, len(positions), rows) & kept[None, :]
        kind = array_kind(k_hist)
        assert kind is not None
        return k_hist, v_hist, spec_for(mask, kind)

    def trim(self, n: int) -> None:
        held = self._step.start if self._step is not None else self._layout.length()
        super().trim(n)
        self.lost[:] = [self._trimmed(layer, held - n) for layer in range(self.config.n_layers)]

    def reset(self) -> None:
        super().reset()
        self.lost[:] = self.serving[:] = [0] * self.config.n_layers


class ChunkStartKeptAfterTrim(_LosesBelowFloor):
    """A chunk layer lets go of what lies below the chunk of a step's first query, and its trim leaves that start
    where it was."""

    def _moved(self, layer: int, first: int, end: int) -> int:
        chunk = self.config.chunk(layer)
        return first - first % chunk if chunk else 0

    def _trimmed(self, layer: int, end: int) -> int:
        return self.lost[layer]


class RecordingLosesPast(_LosesBelowFloor):
    """A ring layer keeps what a ring of the least size keeps (w - k - 1 + max_write positions beside its sinks)
    whether it records or not: a trim the recording owes reads rows it lost."""

    def _moved(self, layer: int, first: int, end: int) -> int:
        window, keep = self.config.window(layer), self.config.keep(layer)
        if not (window and self.config.record_past):   # a config that does not record is served as the reference
            return 0
        return end - (window - keep - 1 + (self.config.max_write or 0))


class RecordingKeepsWindowOnly(op.ContiguousReferenceCache):
    """Built without the config's record_past: a ring laid out as a ring (max_write set) refuses a trim past the rows
    it overwrote, with transformers' words for a layer that does not record (no rule named)."""

    def trim(self, n: int) -> None:
        try:
            super().trim(n)
        except TrimError:
            raise RuntimeError("crop was called, but the layer does not track past states and its sliding window "
                               "was already reached") from None


def _factory(name: str, make: Callable[[JsonConfig], Any]) -> Callable[[JsonConfig], Any]:
    def factory(cfg: JsonConfig) -> Any:
        return make(cfg)
    factory.__name__ = factory.__qualname__ = name
    factory.kvcache_layout = "op-contiguous"   # type: ignore[attr-defined]
    factory.kvcache_scope = (f"spec={scopes.CURRENT_VERSION}",)   # type: ignore[attr-defined]   # the reference's
    return factory


chunk_as_window = _factory("chunk_as_window",
                           lambda cfg: op.ContiguousReferenceCache(_config(cfg, entry=_chunk_as_ring)))
chunk_start_kept_after_trim = _factory("chunk_start_kept_after_trim",
                                       lambda cfg: ChunkStartKeptAfterTrim(_config(cfg)))
chunk_zero_served = _factory("chunk_zero_served",
                             lambda cfg: op.ContiguousReferenceCache(_config(cfg, entry=_chunk_zero_flat)))
recording_loses_past = _factory("recording_loses_past", lambda cfg: RecordingLosesPast(_config(cfg)))
recording_keeps_window_only = _factory("recording_keeps_window_only", lambda cfg: RecordingKeepsWindowOnly(
    _config(cfg, record_past=lambda value: False if value is True else value)))
record_past_truthy = _factory("record_past_truthy", lambda cfg: op.ContiguousReferenceCache(
    _config(cfg, record_past=lambda value: bool(value) if type(value) in (int, str) else value)))

# name -> (the finding's class, its rule): what the suite must report on each (tests/test_op_chunked.py)
FOUND_AS: dict[str, tuple[str, str]] = {
    "chunk_as_window": ("wrong", "OP-ATTEND"),
    "chunk_start_kept_after_trim": ("wrong", "OP-ATTEND"),
    "chunk_zero_served": ("lenient", "OP-CONFIG"),
    "recording_loses_past": ("wrong", "OP-ATTEND"),
    "recording_keeps_window_only": ("over-strict", "OP-RECORD"),
    "record_past_truthy": ("lenient", "OP-CONFIG"),
}
