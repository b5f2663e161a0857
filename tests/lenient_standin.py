"""A lenient stand-in per argument clause: the project's reference of a face, except that one call
accepts every malformation of one argument (spec/arguments.py) instead of refusing it.

`accepting(clause_id)` is a python: target factory. The wrapped cache is the reference (`kvcache`'s
SequenceCache or CellCache, `kvcache.op`'s caches); a call of the clause's method that the reference
refuses with a typed error naming the clause's argument is answered instead, with an answer of the
right type that is no refusal (and nothing changed). So the only thing wrong with the stand-in is
that it accepts what the clause forbids - which the suite must find (tests/test_malformations.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

import kvcache
from kvcache import op
from kvcache._errors import KVCacheError
from kvcache_spec.arguments import BY_ID, CONFIG, Clause
from kvcache_spec.conformance import malform
from kvcache_spec.conformance.op import targets as op_targets

# An answer of the right type that is no refusal, per method (the wrapped cache is `inner`).
_ACCEPTED: dict[str, Callable[[Any], Any]] = {
    "update_and_fetch": lambda inner: (np.zeros((1, 1, 0, 1), np.float32), np.zeros((1, 1, 0, 1), np.float32),
                                       op.AttendSpec(op.MaskKind.NONE)),
    "begin_step": lambda inner: None, "seq_cp": lambda inner: None, "seq_rm": lambda inner: True,
    "trim": lambda inner: None, "pad": lambda inner: None, "select": lambda inner: None,
    "reorder": lambda inner: None, "repeat": lambda inner: None, "quantize": lambda inner: None,
    "extract": lambda inner: inner.extract(0),
    "plan": lambda inner: inner.plan(0, inner.length(), 1) if inner.can_extend(1) else None,
    "can_extend": lambda inner: True, "rewind": lambda inner: True, "depth": lambda inner: 0,
    "retained_from": lambda inner: 0, "seq_len": lambda inner: 0, "next_pos": lambda inner: 0,
    "seq_clone": lambda inner: 0, "declare_step": lambda inner: True,
    "place_step": lambda inner: SimpleNamespace(length=1, read_len=0, cells=(), mask_bits=b""),
}


# The clauses the reference keeps with a refusal (False), not a typed error: when the call breaks them.
REFUSALS: dict[str, Callable[..., bool]] = {
    "sequence.rewind.new_len.grow": lambda inner, new_len: type(new_len) is int and new_len > inner.length(),
}


def _names(clause: Clause) -> set[str]:
    return {name.strip() for name in clause.argument.split(",")}


class Lenient:
    """The reference cache `inner`, accepting every malformed value of one clause's argument."""

    def __init__(self, inner: Any, clause: Clause) -> None:
        self.inner, self.clause = inner, clause

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name == "extend":   # (the merge verbs) the side cache is a stand-in too: its cache is taken
            return lambda other: method(other.inner if isinstance(other, Lenient) else other)
        if name == "extract":   # the cache extracted is a stand-in too, lenient on the same clause
            if name == self.clause.call:
                return lambda *args: Lenient(self._lenient(name, method)(*args), self.clause)
            return lambda *args: Lenient(method(*args), self.clause)
        if name != self.clause.call:
            return method
        return self._lenient(name, method)

    def _lenient(self, name: str, method: Any) -> Any:
        def lenient(*args: Any, **kwargs: Any) -> Any:
            if self.clause.argument == "k, v" and not self._joint(*args):   # k and v together, only
                return method(*args, **kwargs)
            refusal = REFUSALS.get(self.clause.id)
            if refusal is not None and refusal(self.inner, *args):   # a clause the reference keeps by a refusal
                return _ACCEPTED[name](self.inner)
            try:
                return method(*args, **kwargs)
            except KVCacheError as error:
                if error.argument.split("[")[0] not in _names(self.clause):
                    raise
                return _ACCEPTED[name](self.inner)
        return lenient

    def _joint(self, layer_id: Any, k: Any, v: Any, position: Any) -> bool:
        """A call whose k and v agree on the clause's axis, at a size the config (or position) does not have."""
        axis, config = self.clause.axis, self.inner.config
        if np.ndim(k) != 4 or np.ndim(v) != 4 or np.shape(k)[axis] != np.shape(v)[axis]:
            return False
        valid = (config.batch_size, config.n_kv_heads, np.shape(position)[0] if np.ndim(position) else -1)[axis]
        return bool(np.shape(k)[axis] != valid)

    # the sequence and cell faces are views of one object: this one, so the lenient call is seen on both
    def as_control(self) -> "Lenient":
        return self

    def as_planner(self) -> "Lenient":
        return self

    def as_batch_control(self) -> "Lenient":
        return self

    def as_cell_stepper(self) -> "Lenient":
        return self


def accepting_config(clause: Clause, face: str) -> Callable[..., Any]:
    """The op reference of `face`, accepting every invalid configuration of one configuration clause: it
    builds its cache from a valid configuration instead (as a cache that reads an unknown kind as flat, or
    a max_write of 0 as none, does)."""
    inner = op_targets.contiguous if face == "op-contiguous" else op_targets.cell
    valid = malform.op_base_config()

    def make(cfg: Any) -> Any:
        case = malform.config_case(face, cfg)
        return inner(valid if case is not None and case.clause == clause else cfg)
    make.kvcache_layout = face   # type: ignore[attr-defined]
    make.kvcache_scope = ("spec=2",)   # type: ignore[attr-defined]   # the reference's: keep configs too
    return make


def accepting(clause_id: str) -> Callable[..., Any]:
    """A python: target factory of the face of the clause, lenient on it."""
    clause = BY_ID[clause_id]
    face = clause.faces[0]
    if clause.kind == CONFIG:
        return accepting_config(clause, face)
    # a call with no accepted answer would raise KeyError inside the target: a refusal, so the stand-in would be
    # lenient on nothing and its test would fail for the stand-in's sake, not the suite's
    assert clause.call in _ACCEPTED or clause.id in REFUSALS, (clause.id, clause.call, "add its answer to _ACCEPTED")
    if face == "sequence":
        def make(config: Any) -> Any:
            return Lenient(kvcache.SequenceCache(config), clause)
    elif face == "cell":
        def make(config: Any, max_seqs: int = 64) -> Any:
            return Lenient(kvcache.CellCache(config, max_seqs), clause)
    else:
        inner = op_targets.contiguous if face == "op-contiguous" else op_targets.cell

        def make(cfg: Any) -> Any:
            return Lenient(inner(cfg), clause)
        make.kvcache_layout = face   # type: ignore[attr-defined]
        # the reference's own scope, so a clause of a later spec's verb (a batch verb's rows: spec 4) is sent at all
        make.kvcache_scope = getattr(inner, "kvcache_scope", ("spec=2",))   # type: ignore[attr-defined]
    if face == "cell":
        make.kvcache_layout = "cell"   # type: ignore[attr-defined]
    return make


def __getattr__(name: str) -> Any:
    """`python:tests.lenient_standin:CLAUSE_ID` is the stand-in lenient on that clause."""
    if name in BY_ID:
        return accepting(name)
    raise AttributeError(name)
