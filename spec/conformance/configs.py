"""Cache configurations as JSON values, and their translations to the model and to kvcache.

The suite speaks JSON everywhere (programs, reports, vectors, the subprocess protocol), so a
configuration is a JSON object; see spec/PROTOCOL.md for its fields.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from .. import model

JsonConfig = dict[str, Any]
KINDS = {"flat": model.FLAT, "ring": model.RING}


def layer(kind: str, window: int = 0, n_kv_heads: int = 1, head_dim: int = 1) -> dict[str, Any]:
    return {"kind": kind, "window": window, "n_kv_heads": n_kv_heads, "head_dim": head_dim}


def config(capacity: int, layers: list[dict[str, Any]], n_layers: Optional[int] = None,
           max_write: Optional[int] = None, initial_capacity: int = 512) -> JsonConfig:
    return {"capacity": capacity, "n_layers": len(layers) if n_layers is None else n_layers, "layers": layers,
            "initial_capacity": initial_capacity, "max_write": max_write}


def to_model(cfg: JsonConfig) -> Union[model.Config, model.Rejected]:
    """The model's reading of a JSON config (a Rejected for a config the spec rejects)."""
    try:
        layers = [(KINDS.get(entry["kind"], entry["kind"]) if isinstance(entry["kind"], str) else entry["kind"],
                   entry["window"], entry["n_kv_heads"], entry["head_dim"]) for entry in cfg["layers"]]
        return model.make_config(cfg["capacity"], cfg["n_layers"], layers, cfg.get("initial_capacity", 512),
                                 cfg.get("max_write"))
    except (KeyError, TypeError, ValueError):
        return model.Rejected("CFG-TYPE", "config")


def to_kvcache(cfg: JsonConfig) -> Any:
    """A kvcache.CacheConfig (raises kvcache's ConfigError for a config the spec rejects)."""
    import kvcache

    layers = [kvcache.LayerConfig(kvcache.LayerPolicy(kvcache.Kind.RING if entry["kind"] == "ring" else
                                                      kvcache.Kind.FLAT, entry["window"]),
                                  entry["n_kv_heads"], entry["head_dim"]) for entry in cfg["layers"]]
    return kvcache.CacheConfig(cfg["capacity"], cfg["n_layers"], layers, cfg.get("initial_capacity", 512),
                               cfg.get("max_write"))


def describe(cfg: JsonConfig) -> str:
    """A short human name: 'cap 20, ring(4) m=2 x1'."""
    parts = [f"ring({entry['window']})" if entry["kind"] == "ring" else "flat" for entry in cfg["layers"]]
    text = f"cap {cfg['capacity']}, " + "+".join(parts)
    if len(cfg["layers"]) == 1 and cfg["n_layers"] > 1:
        text += f" x{cfg['n_layers']}"
    if cfg.get("max_write") is not None:
        text += f", max_write {cfg['max_write']}"
    return text


# The configurations the suite drives: every layout family and the edges between them.
SUITE_CONFIGS: tuple[JsonConfig, ...] = (
    config(8, [layer("flat")]),                                           # flat
    config(1, [layer("flat")]),                                           # the smallest cache
    config(20, [layer("ring", 4)]),                                       # ring, max_write = window
    config(20, [layer("ring", 4)], max_write=2),                          # max_write below the window
    config(24, [layer("ring", 3)], max_write=6),                          # max_write above the window
    config(5, [layer("ring", 4)]),                                        # capacity below the ring: depth = capacity
    config(7, [layer("ring", 4)]),                                        # capacity exactly the ring
    config(6, [layer("ring", 1)]),                                        # window 1
    config(16, [layer("flat"), layer("ring", 4)]),                        # mixed, the MLX shape
    config(20, [layer("ring", 2), layer("ring", 5), layer("flat")], max_write=3),  # mixed windows
    config(12, [layer("ring", 3)], n_layers=4, max_write=1),              # broadcast, decode only
)
