"""The paged layout's argument checks: each returns None for a well-formed argument, else a `Fault` (a builder of
the typed error naming the argument and the rule). The preconditions of `PagedCache` ask `... is None` and raise
the built error before the body runs, so a malformed call changes nothing, under `python -O` too.

Building the error only when the check fails keeps the check free of formatting (see `_cells`, "typed errors").
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from ._errors import ArgumentTypeError, ArgumentValueError, KVCacheError
from ._ints import INT_MAX, in_range, is_int

Fault = Callable[[], KVCacheError]


def found(fault: Optional[Fault]) -> KVCacheError:
    """The error a failed precondition found (its condition is `fault is None`, so never None here)."""
    if fault is None:
        raise RuntimeError("a precondition failed without naming its error")
    return fault()


def request_fault(request: Any, live: Mapping[str, Any], must_be_live: bool, rule: str = "PAGED-ARGS") -> Optional[Fault]:
    """`request` is a str, live (extend, free, table) or not (admit)."""
    if type(request) is not str:
        return lambda: ArgumentTypeError(rule, "request", "must be a str", value=request, type=type(request).__name__)
    if (request in live) != must_be_live:
        state = "is not a live request" if must_be_live else "is live already (free it first)"
        return lambda: ArgumentValueError(rule, "request", state, value=request)
    return None


def tokens_fault(tokens: Any, allow_empty: bool) -> Optional[Fault]:
    """`tokens` is a list (or tuple) of ints in [0, INT_MAX] (bool is not an int); non-empty for a prompt."""
    if type(tokens) not in (list, tuple):   # exactly: a subclass could iterate differently after the check
        return lambda: ArgumentTypeError("PAGED-ARGS", "tokens", "must be a list of token ids", value=tokens,
                                         type=type(tokens).__name__)
    if not tokens and not allow_empty:
        return lambda: ArgumentValueError("PAGED-ARGS", "tokens", "must not be empty (a prompt has a token)",
                                          value=tokens)
    for index, token in enumerate(tokens):
        # Each fault is returned at once, so its lambda sees this iteration's index and token.
        if not is_int(token):
            return lambda: ArgumentTypeError("PAGED-ARGS", f"tokens[{index}]", "must be an int (bool is not an int "
                                             "here)", value=token, type=type(token).__name__)
        if not in_range(token, 0):
            return lambda: ArgumentValueError("PAGED-ARGS", f"tokens[{index}]", f"must lie in [0, {INT_MAX}]",
                                              value=token)
    return None


def keys_fault(keys: Any) -> Optional[Fault]:
    """`keys` (the request's extra keys: adapter, media, salt) is a list (or tuple) of str."""
    if type(keys) not in (list, tuple):
        return lambda: ArgumentTypeError("PAGED-ARGS", "keys", "must be a list of str", value=keys,
                                         type=type(keys).__name__)
    for index, key in enumerate(keys):
        if type(key) is not str:
            return lambda: ArgumentTypeError("PAGED-ARGS", f"keys[{index}]", "must be a str", value=key,
                                             type=type(key).__name__)
    return None


def budget_fault(budget: Any) -> Optional[Fault]:
    """`budget` (the most tokens to reserve in this call) is an int in [1, INT_MAX]."""
    if not is_int(budget):
        return lambda: ArgumentTypeError("PAGED-ARGS", "budget", "must be an int (bool is not an int here)",
                                         value=budget, type=type(budget).__name__)
    if not in_range(budget, 1):
        return lambda: ArgumentValueError("PAGED-ARGS", "budget", f"must lie in [1, {INT_MAX}]", value=budget)
    return None


def length_fault(length: int, max_model_len: int) -> Optional[Fault]:
    """A request's tokens never outgrow the model's maximum length."""
    if length > max_model_len:
        return lambda: ArgumentValueError("PAGED-ARGS", "tokens", "would make the request longer than max_model_len",
                                          length=length, max_model_len=max_model_len)
    return None


def first_fault(*faults: Callable[[], Optional[Fault]]) -> Optional[Fault]:
    """The first fault of checks run in order (a later check may assume the earlier ones passed)."""
    for check in faults:
        fault = check()
        if fault is not None:
            return fault
    return None
