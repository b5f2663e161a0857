"""The contiguous op cache's state as bytes (OP-STATE): `state()` writes it, `load_state(data)` reads it back.

The format is this project's own, versioned and checksummed, laid out so that a reader decides what is wrong
with a state before it parses anything into a live cache:

    offset  0  magic            8 bytes  b"KVOPSTAT": a kvcache op state, not another file
    offset  8  format version   u16 LE   FORMAT_VERSION: a later format is named, not misread
    offset 10  total length     u64 LE   the whole state's bytes: a truncated state is named as such
    offset 18  header length    u32 LE
    offset 22  header           JSON     the config the state was taken under, the length, the retained
                                         marks, each batch row's pads (OP-PAD), each layer's K and V rows
    then       rows             raw      per layer K then V, [batch_size, n_kv_heads, rows, dim], C order,
                                         little-endian, the config's dtype: the bytes the cache holds, bit for bit
    last 32    checksum         SHA-256  of everything before it: any byte changed is found

Why this format: a state loaded from a file must be data, never code (so no pickle); the header is JSON, so a
state explains itself and its config compares field by field; the rows are raw, so a round trip is exact; the
checksum covers everything, so a flipped byte anywhere (the header's numbers included) is refused before any of
it is believed; magic, version and total length come first, so the error says which of "not a state",
"another version" and "truncated" it is rather than only "corrupted".

The state is what the cache holds between steps (an open step is abandoned on a copy: OP-STATE); it holds the
layout's retained marks, so a loaded cache refuses and serves the same trims (OP-TRIM) as the one saved, and each
batch row's pads, so its rows' queries attend what the saved rows' did (OP-PAD). Version 1 had no pads: a padded
cache's state loaded with its rows' pads lost (found by the suite's random programs, a save after an extend of
padded rows); a version-1 state is refused as another version's, not read as unpadded.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError
from ._op_types import CacheConfig

MAGIC = b"KVOPSTAT"
FORMAT_VERSION = 2   # 2: each batch row's pads (1 had none)
_FIXED = struct.Struct("<8sHQI")   # magic, format version, total length, header length
_DIGEST = 32                       # SHA-256
RULE = "OP-STATE"


@dataclass(frozen=True)
class Held:
    """What a contiguous cache holds between steps: its length, the layout's retained marks, K and V per layer,
    and each batch row's pads (empty: no row has pads)."""

    length: int
    retained: tuple[int, ...]
    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    pads: tuple[int, ...] = ()


def config_fields(config: CacheConfig) -> dict[str, Any]:
    """The config as JSON values, one policy per layer: two states compare their configs by these."""
    layers = config.layers
    policies = [layers[index if len(layers) > 1 else 0] for index in range(config.n_layers)]
    return {"n_layers": config.n_layers, "n_kv_heads": config.n_kv_heads, "head_dim": config.head_dim,
            "v_head_dim": config.v_head_dim, "capacity": config.capacity, "batch_size": config.batch_size,
            "sizing": config.sizing.value, "dtype": np.dtype(config.dtype).name, "max_write": config.max_write,
            "record_past": config.record_past,
            "layers": [[p.kind.value, p.window, p.keep, p.chunk] for p in policies]}


def encode(config: CacheConfig, held: Held, version: int = FORMAT_VERSION) -> bytes:
    """The state's bytes (`version` other than FORMAT_VERSION only to show the refusal of another version)."""
    header = json.dumps({"config": config_fields(config), "length": held.length, "retained": list(held.retained),
                         "pads": list(held.pads), "rows": [[k.shape[2], v.shape[2]] for k, v in zip(held.k, held.v)]},
                        sort_keys=True, separators=(",", ":")).encode()
    rows = b"".join(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
                    for pair in zip(held.k, held.v) for a in pair)
    total = _FIXED.size + len(header) + len(rows) + _DIGEST
    body = _FIXED.pack(MAGIC, version, total, len(header)) + header + rows
    return body + hashlib.sha256(body).digest()


def _refused(why: str, **values: Any) -> ArgumentValueError:
    return ArgumentValueError(RULE, "data", why, **values)


def decode(config: CacheConfig, depths: tuple[int, ...], marks: int, data: Any) -> Union[Held, KVCacheError]:
    """What `data` holds for a cache of `config` whose layers keep at most `depths` rows and whose layout has
    `marks` retained marks, else the error naming what is wrong with it (the checks in the order the format's
    layout allows, nothing believed unchecked)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return ArgumentTypeError(RULE, "data", "must be bytes (a state from state())", type=type(data).__name__)
    data = bytes(data)
    if len(data) < _FIXED.size + _DIGEST:
        return _refused("is truncated: shorter than a state's fixed header and checksum", size=len(data))
    magic, version, total, header_size = _FIXED.unpack_from(data)
    if magic != MAGIC:
        return _refused("is not a kvcache op state (its first bytes are not the format's magic)", magic=magic)
    if version != FORMAT_VERSION:
        return _refused("is of another state format version", version=version, reads=FORMAT_VERSION)
    if len(data) < total:
        return _refused("is truncated", size=len(data), expected=total)
    if len(data) > total:
        return _refused("has bytes past the state's end (or a corrupted length)", size=len(data), expected=total)
    if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        return _refused("is corrupted: its checksum does not match its bytes", size=len(data))
    # the checksum holds: what follows was written by an encoder (a hand-made state is still checked)
    try:
        header = json.loads(data[_FIXED.size:_FIXED.size + header_size])
        theirs, length, retained, rows = header["config"], header["length"], header["retained"], header["rows"]
        pads = header["pads"]
    except (ValueError, KeyError, TypeError):
        return _refused("has a header that is not a state's")
    ours = config_fields(config)
    if theirs != ours:
        differ = sorted(key for key in set(ours) | set(theirs) if ours.get(key) != theirs.get(key))
        return _refused("was taken under another config", fields=differ)
    if not isinstance(pads, list) or pads and (len(pads) != config.batch_size or not all(
            type(pad) is int and 0 <= pad <= config.capacity for pad in pads)):
        return _refused("holds pads its config cannot hold", pads=pads)
    held = _held(config, depths, marks, data, _FIXED.size + header_size, length, retained, rows)
    return held if isinstance(held, KVCacheError) else Held(held.length, held.retained, held.k, held.v, tuple(pads))


def _held(config: CacheConfig, depths: tuple[int, ...], marks: int, data: bytes, offset: int, length: Any,
          retained: Any, rows: Any) -> Union[Held, KVCacheError]:
    """The rows of a checksummed state whose config is this cache's, their counts checked against the config
    (a hand-made state with a valid checksum still cannot make the cache hold what its layout cannot)."""
    if type(length) is not int or not 0 <= length <= config.capacity or not isinstance(retained, list) or \
            len(retained) != marks or not all(type(r) is int and 0 <= r <= length for r in retained) or \
            not isinstance(rows, list) or len(rows) != config.n_layers:
        return _refused("holds a length, retained marks or rows its config cannot hold", length=length)
    dtype = np.dtype(config.dtype).newbyteorder("<")
    arrays: list[np.ndarray] = []
    end = len(data) - _DIGEST
    for layer, pair in enumerate(rows):
        if not isinstance(pair, list) or len(pair) != 2 or any(
                type(r) is not int or not min(length, depths[layer]) <= r <= depths[layer] for r in pair):
            return _refused("holds rows on a layer its config does not keep", layer=layer, rows=pair)
        for count, width in zip(pair, (config.head_dim, config.v_head_dim)):
            assert width is not None
            shape = (config.batch_size, config.n_kv_heads, count, width)
            elements = int(np.prod(shape))
            if offset + elements * dtype.itemsize > end:
                return _refused("holds fewer row bytes than its header says", size=len(data))
            arrays.append(np.frombuffer(data, dtype, elements, offset).reshape(shape).astype(np.dtype(config.dtype)))
            offset += elements * dtype.itemsize
    if offset != end:
        return _refused("holds more row bytes than its header says", size=len(data))
    return Held(length, tuple(retained), tuple(arrays[0::2]), tuple(arrays[1::2]))


def state_error(config: CacheConfig, depths: tuple[int, ...], marks: int, data: Any) -> Optional[KVCacheError]:
    """The error of load_state(data), else None."""
    decoded = decode(config, depths, marks, data)
    return decoded if isinstance(decoded, KVCacheError) else None


def held_now(layout: Any, step_start: Optional[int], k: list[np.ndarray], v: list[np.ndarray],
             pads: tuple[int, ...] = ()) -> Held:
    """What a contiguous cache holds between steps: with a step open (starting at `step_start`), what its
    abandonment would leave - worked out on a copy of the layout, so the live cache keeps its step open."""
    length, _, retained = layout._state()
    if step_start is not None:
        import copy
        layout = copy.deepcopy(layout)
        rewound = layout.rewind(step_start)
        assert rewound   # a step's own start is always a sound rewind target (REWIND-SOUND)
        length, _, retained = layout._state()
    return Held(length, tuple(retained), tuple(a.copy() for a in k), tuple(a.copy() for a in v), tuple(pads))


def restore(layout: Any, pools: Any, held: Held) -> None:
    """Put a decoded state into a cache's layout and pools: its length and retained marks, no step open (as a
    rewind leaves it: the layout's own fields, set here because a layout has no verb that sets them all)."""
    layout._length, layout._open_step, layout._retained = held.length, None, list(held.retained)
    pools.k, pools.v = [a.copy() for a in held.k], [a.copy() for a in held.v]
