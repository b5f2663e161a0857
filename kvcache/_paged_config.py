"""The paged layout's configuration: the JSON object a factory takes, checked field by field.

A bad configuration is refused when the cache is created, with a `ConfigError` (`ConfigTypeError` for a
wrong type) naming the field and the rule, as the other layouts refuse theirs. The checks are plain code
(not contracts), so they hold under `python -O` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ._errors import ConfigError, ConfigTypeError
from ._ints import INT_MAX, in_range, is_int

_FIELDS = ("block_size", "num_blocks", "max_model_len", "groups", "prefix_caching")
_POOLS = ("shared", "per-group")   # the optional field "pools" (PAGED-CONFIG); absent: "shared"


@dataclass(frozen=True)
class PagedConfig:
    """A checked paged configuration. `windows` holds one entry per KV group, in config order: None for a
    full-attention group, W for a sliding-window group whose query at position p reads p-W+1 .. p."""

    block_size: int
    num_blocks: int
    max_model_len: int
    windows: tuple[Optional[int], ...]
    prefix_caching: bool
    per_group_pools: bool = False   # PAGED-CONFIG: each group its own pool of num_blocks blocks, ids per pool

    def pool(self, group: int) -> int:
        """The pool a group's blocks come from."""
        return group if self.per_group_pools else 0


def _int_field(config: Mapping[str, Any], name: str) -> int:
    value = config[name]
    if not is_int(value):
        raise ConfigTypeError("PAGED-CONFIG", name, "must be an int (bool is not an int here)", value=value,
                              type=type(value).__name__)
    if not in_range(value, 1):
        raise ConfigError("PAGED-CONFIG", name, f"must lie in [1, {INT_MAX}]", value=value)
    return value


def _window_of(index: int, group: Any) -> Optional[int]:
    """PAGED-CONFIG: one group, {"kind": "full"} or {"kind": "window", "window": W >= 1}."""
    where = f"groups[{index}]"
    if type(group) is not dict:
        raise ConfigTypeError("PAGED-CONFIG", where, "must be an object", value=group, type=type(group).__name__)
    kind = group.get("kind")
    expected = {"full": {"kind"}, "window": {"kind", "window"}}.get(kind) if isinstance(kind, str) else None
    if expected is None:
        raise ConfigError("PAGED-CONFIG", f"{where}.kind", 'must be "full" or "window"', value=kind)
    if set(group) != expected:
        raise ConfigError("PAGED-CONFIG", where, f"a {kind} group has exactly the fields {sorted(expected)}",
                          fields=sorted(group))
    if kind == "full":
        return None
    window = group["window"]
    if not is_int(window):
        raise ConfigTypeError("PAGED-CONFIG", f"{where}.window", "must be an int (bool is not an int here)",
                              value=window, type=type(window).__name__)
    if not in_range(window, 1):
        raise ConfigError("PAGED-CONFIG", f"{where}.window", f"must lie in [1, {INT_MAX}]", value=window)
    return window


def paged_config(config: Any) -> PagedConfig:
    """PAGED-CONFIG: the checked configuration of a JSON object, or a typed error naming the field at fault."""
    if not isinstance(config, Mapping):
        raise ConfigTypeError("PAGED-CONFIG", "config", "must be a JSON object (a mapping)", value=config,
                              type=type(config).__name__)
    missing = [name for name in _FIELDS if name not in config]
    unknown = sorted(str(name) for name in config if name not in _FIELDS and name != "pools")
    if missing or unknown:   # a typo must not silently fall back on a default
        raise ConfigError("PAGED-CONFIG", "config", f"must have exactly the fields {list(_FIELDS)} (and optionally 'pools')",
                          missing=missing, unknown=unknown)
    block_size, num_blocks, max_model_len = (_int_field(config, name)
                                             for name in ("block_size", "num_blocks", "max_model_len"))
    groups = config["groups"]
    if type(groups) not in (list, tuple):
        raise ConfigTypeError("PAGED-CONFIG", "groups", "must be a list of groups", value=groups,
                              type=type(groups).__name__)
    if not groups:
        raise ConfigError("PAGED-CONFIG", "groups", "must not be empty (a model has at least one KV group)")
    windows = tuple(_window_of(index, group) for index, group in enumerate(groups))
    prefix_caching = config["prefix_caching"]
    if type(prefix_caching) is not bool:
        raise ConfigTypeError("PAGED-CONFIG", "prefix_caching", "must be true or false", value=prefix_caching,
                              type=type(prefix_caching).__name__)
    pools = config.get("pools", "shared")
    if not isinstance(pools, str) or pools not in _POOLS:
        raise ConfigError("PAGED-CONFIG", "pools", 'must be "shared" or "per-group"', value=pools)
    return PagedConfig(block_size, num_blocks, max_model_len, windows, prefix_caching, pools == "per-group")
