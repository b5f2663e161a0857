"""Typed errors. Every error names the argument (or config field), the rule id and the values.

A caller error is not a refusal: `plan` returns None and `rewind` returns False only when the
spec says the request is well-formed but cannot be served (admission, rewind floor). Everything
else - wrong types, negatives, out-of-range layers, steps that break the append rule, forged plans,
broken configs - raises one of these, and the cache is left exactly as it was.

The classes follow upstream's convention (ExecuTorch's op face, OP-ATOMIC): a malformed argument or
config is a ValueError or TypeError; a refusal that the cache's state decides - capacity and admission
(`CapacityError`), the forward protocol's state (`ForwardError`) - is also a RuntimeError, so code
written against upstream's caches catches it where it catches theirs.
"""

from __future__ import annotations

from typing import Any

from ._ints import INT_MAX


class KVCacheError(Exception):
    """Base of every error raised by `kvcache` for bad input.

    Attributes: `rule` (a rule id of `kvcache_spec.rules`), `argument` (the argument or config field
    at fault) and `values` (the values involved, by name).
    """

    def __init__(self, rule: str, argument: str, message: str, **values: Any) -> None:
        self.rule = rule
        self.argument = argument
        self.message = message
        self.values = values
        shown = ", ".join(f"{name}={value!r}" for name, value in values.items())
        super().__init__(f"[{rule}] {argument}: {message}" + (f" ({shown})" if shown else ""))


class ConfigError(KVCacheError, ValueError):
    """A configuration field breaks a CFG-* rule."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration field has the wrong type (bool is not an int here)."""


class ArgumentTypeError(KVCacheError, TypeError):
    """A call argument has the wrong type (bool is not an int here)."""


class ArgumentValueError(KVCacheError, ValueError):
    """A call argument is of the right type but out of its domain (negative, too large)."""


class LayerIndexError(ArgumentValueError, IndexError):
    """A layer index outside [0, n_layers)."""


class StepError(ArgumentValueError):
    """A step breaks its layout's step rule: `plan(layer, position, T)` the append-only rule (gap,
    overlap, other T); `place_step(layer, positions)` the position rule of the cell layout."""


class PlanError(ArgumentValueError):
    """`commit(plan)` got a plan this cache did not issue for the current step, or a malformed one."""


def not_an_int(argument: str, value: Any) -> ArgumentTypeError:
    """ARG-INT: `argument` is not an int (bool is not an int here)."""
    return ArgumentTypeError("ARG-INT", argument, "must be an int (bool is not an int here)",
                             value=value, type=type(value).__name__)


def out_of_range(argument: str, value: int, low: int, high: int = INT_MAX, rule: str = "ARG-RANGE") -> ArgumentValueError:
    """ARG-RANGE (or `rule`): `argument` lies outside [low, high]."""
    return ArgumentValueError(rule, argument, f"must lie in [{low}, {high}]", value=value)


class ForwardError(StepError, RuntimeError):
    """A cell-cache call breaks the forward protocol (CELL-FORWARD): a table-changing verb while a forward
    is open, `place_step` with nothing declared, a layer served twice, or positions other than the
    first layer's. Also a RuntimeError: the refusal is decided by the protocol's state, not the call alone."""


class CapacityError(ArgumentValueError, RuntimeError):
    """A step or a declaration that does not fit the cache's capacity (OP-CAP: admission, decided before
    anything is written). Also a RuntimeError, as upstream raises for a full cache."""


class TrimError(ArgumentValueError, RuntimeError):
    """A trim a ring layer cannot give back (OP-TRIM leaves it optional): a position the next query attends is
    overwritten already. Also a RuntimeError: the cache's state decides it, not the call alone."""
