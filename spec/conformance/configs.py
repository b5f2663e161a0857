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


def describe_paged(cfg: JsonConfig) -> str:
    """A paged config's short name (paged/programs.py)."""
    groups = cfg.get("groups")
    kinds = "+".join(f"window({entry.get('window')!r})" if entry.get("kind") == "window" else str(entry.get("kind"))
                     if isinstance(entry, dict) else repr(entry) for entry in groups) \
        if isinstance(groups, list) else repr(groups)
    caching = "" if cfg.get("prefix_caching") is True else f", prefix_caching {cfg.get('prefix_caching')!r}"
    return (f"B {cfg.get('block_size')!r}, {cfg.get('num_blocks')!r} blocks, max_len {cfg.get('max_model_len')!r}, "
            f"{kinds or 'no groups'}{caching}")


def describe(cfg: JsonConfig) -> str:
    """A short human name: 'cap 20, ring(4) x2, max_write 2' - with 'max_seqs 3' for a cell config
    (its max_seqs decides which ids exist: two configs differing only there are not one). A paged config:
    'B 4, 8 blocks, max_len 32, full+window(3), no prefix caching'."""
    if "groups" in cfg:
        return describe_paged(cfg)
    layers = cfg.get("layers", [])
    if not isinstance(layers, list):   # an invalid configuration's (accepted ones are causes of their own)
        layers = [layers]
    parts = [repr(entry) if not isinstance(entry, dict) else
             (f"ring({entry.get('window')}" + (f", keep {entry['keep']!r})" if "keep" in entry else ")")
              if entry.get("kind") == "ring" else str(entry.get("kind")) + (f"(keep {entry['keep']!r})"
                                                                            if "keep" in entry else ""))
             + (f"(chunk {entry['chunk']!r})" if "chunk" in entry else "")   # an op chunk layer's (OP-CHUNK)
             for entry in layers] or ["no layers"]   # an op ring's sinks (OP-SINKS)
    text = f"cap {cfg.get('capacity')!r}, " + "+".join(parts)
    if len(layers) == 1 and cfg.get("n_layers", 1) != 1:
        text += f" x{cfg['n_layers']}"
    if cfg.get("max_write") is not None:
        text += f", max_write {cfg['max_write']}"
    if "record_past" in cfg:   # OP-RECORD
        text += f", record_past {cfg['record_past']!r}"
    if "max_seqs" in cfg:
        text += f", max_seqs {cfg['max_seqs']!r}"
    # an op-face config's own fields, where they differ from the defaults (op/programs.py, op_config)
    if "v_head_dim" in cfg and cfg["v_head_dim"] != cfg.get("head_dim"):
        text += f", v_head_dim {cfg['v_head_dim']!r}"
    if cfg.get("batch_size", 1) != 1:
        text += f", batch {cfg['batch_size']!r}"
    if cfg.get("sizing", "dynamic") != "dynamic":
        text += f", {cfg['sizing']}"
    return text


# The configurations the suite drives: every layout family and the edges between them.
SUITE_CONFIGS: tuple[JsonConfig, ...] = (
    config(8, [layer("flat")]),                                           # flat
    config(1, [layer("flat")]),                                           # the smallest cache
    config(12, [layer("flat")], n_layers=3),                              # flat, broadcast: all a flat-only scope has
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


# Configurations the spec rejects, with the flag their vectors carry (a CFG-* rule or an upstream gap).
BAD_CONFIGS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("capacity 0", config(0, [layer("flat")]), "CFG-CAPACITY"),
    ("capacity true", {**config(1, [layer("flat")]), "capacity": True}, "CFG-TYPE"),
    ("capacity 2^31", config(2**31, [layer("flat")]), "CFG-CAPACITY"),
    ("n_layers 0", config(4, [layer("flat")], n_layers=0), "CFG-LAYERS"),
    ("layers empty", config(4, [], n_layers=1), "CFG-LAYERS"),
    ("3 layer entries for 8 layers", config(4, [layer("flat")] * 3, n_layers=8), "UPSTREAM-LAYERS-SIZE"),
    ("flat layer with a window", config(4, [layer("flat", 2)]), "CFG-POLICY"),
    ("ring layer with window 0", config(4, [layer("ring", 0)]), "CFG-POLICY"),
    ("unknown kind", config(4, [layer("diagonal", 2)]), "CFG-POLICY"),
    ("n_kv_heads 0", config(4, [layer("flat", 0, 0, 1)]), "CFG-SHAPE"),
    ("head_dim 0", config(4, [layer("flat", 0, 1, 0)]), "CFG-SHAPE"),
    ("initial_capacity -1", config(4, [layer("flat")], initial_capacity=-1), "CFG-INITIAL-CAPACITY"),
    ("max_write 0", config(4, [layer("ring", 2)], max_write=0), "CFG-MAX-WRITE"),
)
