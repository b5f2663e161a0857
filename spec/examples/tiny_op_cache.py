import numpy as np
from types import SimpleNamespace
from typing import Any


class TinyOpCache:   # one sequence; each layer keeps its whole history, a ring layer attends a window of it
    kvcache_layout, kvcache_scope = "op-contiguous", "flat ring max_write batch mla positions steps".split()   # no trim

    def __init__(self, config: dict[str, Any]) -> None:   # the JSON config (docs/target-contract.md): raise to refuse it
        sizes = [config[key] for key in ("capacity", "n_layers", "batch_size", "n_kv_heads", "head_dim", "v_head_dim")]
        layers, max_write = config["layers"], config["max_write"]   # max_write: None, or the longest step
        if not all(type(n) is int and n >= 1 for n in sizes + ([] if max_write is None else [max_write])) \
                or len(layers) not in (1, sizes[1]) or not all(type(p["window"]) is int and p["window"] >= 0 and
                    p["kind"] == ("ring" if p["window"] else "flat") and not p.get("keep") for p in layers):
            raise ValueError(f"OP-CONFIG: {config}")   # a layer: {"kind": "flat", "window": 0} or a ring, window >= 1
        self.capacity, self.n_layers, self.shapes = sizes[0], sizes[1], [(*sizes[2:4], 0, d) for d in sizes[4:]]
        self.windows = [p["window"] or self.capacity for p in layers] * (self.n_layers // len(layers))   # flat: all
        self.longest = max_write if max_write and any(p["window"] for p in layers) else self.capacity   # OP-MAX-WRITE
        self.reset()

    def reset(self) -> None:
        self.kv = [[np.zeros(shape, np.float32) for shape in self.shapes] for _ in range(self.n_layers)]   # K, V

    def used(self, layer_id: int) -> int:
        return int(self.kv[layer_id][0].shape[2])   # K and V: [batch, heads, rows, head_dim or v_head_dim]

    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, SimpleNamespace]:
        q, used = position.shape[0], [self.used(layer) for layer in range(self.n_layers)]
        held, kinds = min(used), k.dtype.kind + v.dtype.kind + position.dtype.kind   # held: rows of whole steps
        if type(layer_id) is not int or not 0 <= layer_id < self.n_layers or q < 1 or position.shape != (q, 1) \
                or [k.shape, v.shape] != [(*shape[:2], q, shape[3]) for shape in self.shapes] or q > self.longest \
                or held + q > self.capacity or position[:, 0].tolist() != [*range(held, held + q)] or kinds != "ffi" \
                or used[layer_id] == held and any(n not in (held, held + q) for n in used):   # a step: one q_len
            raise ValueError("refused, nothing changed (OP-ARGS, OP-MAX-WRITE, OP-CAP, OP-POS, OP-STEP)")
        if used[layer_id] > held:   # a layer served again begins the next step: an unfinished one leaves every layer
            self.kv = [[x[:, :, :held] for x in pair] for pair in self.kv]
        self.kv[layer_id] = [np.concatenate([old, new], axis=2) for old, new in zip(self.kv[layer_id], (k, v))]
        offset = np.arange(held + q) - np.arange(held, held + q)[:, None]   # [q_len, rows]: row position - query's
        mask = (offset <= 0) & (offset > -self.windows[layer_id])   # causal, within the window
        return self.kv[layer_id][0], self.kv[layer_id][1], SimpleNamespace(kind="EXPLICIT", mask=mask)
