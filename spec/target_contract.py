"""The contract of a Python target: one definition, used by `kvcache verify --target python:M:F`
(`stateful.Lockstep`) and by `kvcache conformance --target python:M:F` (`conformance.targets`).

A Python target is `FACTORY(config)`: it receives a `kvcache.CacheConfig` and returns a cache object
with `plan(layer, position, T)`, `commit(plan)`, `can_extend(n)`, `capacity()`, `rewind(new_len)`,
`clear()`, `as_control()`, `as_planner()`, and `length()`, `depth(layer)`, `retained_from(layer)`
(optional for `conformance`, which checks them when present; `verify` compares them after every call,
so it needs them). The cache need not import kvcache's types:

- **plans are duck-typed.** `plan` returns None (the ADMIT refusal) or any object with attributes
  `write` and `read` - each a tuple or a list of one or two runs, a run being any object with int
  attributes `start` >= 0 and `len` >= 1 - and an int `read_base_pos` >= 0; every int is a Python
  int (bool is not) <= INT_MAX. A NamedTuple does it, and so does `kvcache.SeqStepPlan`. Each field
  is read once (`read_plan`); anything else is a PLAN-SHAPE failure;
- **commit gets the target's own plans back.** For a plan the target issued, `commit` receives the very
  object its `plan` returned. Any other argument - a stale plan, a forged or malformed one (built by
  `foreign_plan` as `kvcache.SeqStepPlan` / `kvcache.Run` objects around their constructors, fields
  as they are), or no plan at all - is handed to `commit` only when the spec rejects it, and the
  target must raise;
- **a caller error is any exception** (not `SystemExit`), with the state unchanged: the observable
  answers (length, can_extend, retained_from, depth) and, for `verify`, the cache's attributes
  (`vars(cache)`). Its type and message are not judged: `verify` holds only kvcache's own
  `SequenceCache` (and subclasses of it) to the reference's stronger promise, a `KVCacheError`
  naming the model's rule and kvcache's exact plan types;
- **refusals** are None from `plan` and False from `rewind`;
- `verify` judges exact layout conformance (the canonical runs, LAYOUT-CANON and DEPTH), which is
  `conformance --exact-layout`; `conformance` without it judges semantic conformance only. `verify`'s
  model checker copies caches with `copy.deepcopy`: a target must survive it.

An **op-face** target (`conformance` only) is a factory with `kvcache_layout = "op-contiguous"` or
`"op-cell"`: what it is given (the JSON config and its keys, numpy or torch tensors) and what it answers
(the histories, the AttendSpec forms) is docs/target-contract.md, "The op target contract".
"""

from __future__ import annotations

from typing import Any, Union

import kvcache

from . import model

Pair = tuple[int, int]


def _shown(value: Any) -> str:
    """repr, bounded, and safe against a repr that raises."""
    try:
        return repr(value)[:120]
    except Exception:  # noqa: BLE001 - a target's object may have any repr at all
        return f"<{type(value).__name__} whose repr raises>"


def _is_int(value: Any, low: int) -> bool:
    return type(value) is int and low <= value <= model.INT_MAX


def _read_runs(name: str, runs: Any) -> Union[tuple[Pair, ...], str]:
    if not isinstance(runs, (tuple, list)) or not 1 <= len(runs) <= 2:
        return f"{name} is not a tuple or list of one or two runs: {_shown(runs)}"
    pairs = []
    for run in runs:
        try:
            start, length = run.start, run.len
        except Exception:  # noqa: BLE001 - a missing or raising attribute is a malformed run
            return f"{name} run {_shown(run)} has no start and len"
        if not _is_int(start, 0) or not _is_int(length, 1):
            return f"{name} run {_shown(run)} is not (int start >= 0, int len >= 1)"
        pairs.append((start, length))
    return tuple(pairs)


def read_plan(plan: Any) -> Union[model.Plan, str]:
    """A target's plan (not None) as the model's value, each field read once; or what is wrong with it."""
    try:
        write, read, base = plan.write, plan.read, plan.read_base_pos
    except Exception:  # noqa: BLE001 - a missing or raising attribute is not a plan
        return f"{_shown(plan)} has no write, read and read_base_pos"
    write_pairs = _read_runs("write", write)
    if isinstance(write_pairs, str):
        return write_pairs
    read_pairs = _read_runs("read", read)
    if isinstance(read_pairs, str):
        return read_pairs
    if not _is_int(base, 0):
        return f"read_base_pos {_shown(base)} is not an int >= 0"
    return model.Plan(write_pairs, read_pairs, base)


def forge_run(start: Any, length: Any) -> kvcache.Run:
    """A kvcache.Run built around its constructor's validation: its fields are what they are."""
    run = object.__new__(kvcache.Run)
    object.__setattr__(run, "start", start)
    object.__setattr__(run, "len", length)
    return run


def forge_plan(write: Any, read: Any, read_base_pos: Any) -> kvcache.SeqStepPlan:
    """A kvcache.SeqStepPlan built around its constructor's validation, as a buggy or hostile caller could."""
    plan = object.__new__(kvcache.SeqStepPlan)
    object.__setattr__(plan, "write", write)
    object.__setattr__(plan, "read", read)
    object.__setattr__(plan, "read_base_pos", read_base_pos)
    return plan


def foreign_plan(value: Any) -> Any:
    """What `commit` receives for a JSON plan the target did not issue: a forged kvcache plan with the
    JSON's fields (runs as forged Runs, however wrong their fields); a value that is no JSON plan at all
    is handed over as it is."""
    try:
        def runs(items: Any) -> tuple[kvcache.Run, ...]:
            return tuple(forge_run(start, length) for start, length in items)
        return forge_plan(runs(value["write"]), runs(value["read"]), value["read_base_pos"])
    except (KeyError, TypeError, ValueError):
        return value
