"""One contract for a Python target (issue 11 part 4): `kvcache verify --target` and `kvcache
conformance --target` judge a Python target by `kvcache_spec.target_contract`, and give the same verdict.

The targets are tests/ducktarget.py: an independent cache with its own NamedTuple plans and its own
exceptions, two conforming variants and two broken ones (a semantic bug; plans outside the contract).
"""

from __future__ import annotations

import types
from typing import Any, NamedTuple

import pytest

import kvcache
from kvcache_proofs import verify
from kvcache_spec.conformance import cli as conformance_cli
from kvcache_spec.conformance.targets import plan_to_json
from kvcache_spec.target_contract import forge_plan, forge_run, read_plan

VERDICTS = {"make_cache": 0, "make_namespace_cache": 0, "make_broken_cache": 1, "make_pair_runs_cache": 1}


@pytest.mark.slow
@pytest.mark.parametrize("factory", sorted(VERDICTS))
def test_verify_and_conformance_give_the_same_verdict(factory: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The same target, the same verdict: exit 0 from both for the conforming ones, 1 from both for the broken."""
    target = f"python:tests.ducktarget:{factory}"
    verified = verify.main(["--target", target, "--profile", "quick", "--stages", "stateful,model-checker"])
    conformed = conformance_cli.main(["--target", target, "--profile", "quick", "--strict", "--exact-layout"])
    output = capsys.readouterr()
    assert (verified, conformed) == (VERDICTS[factory], VERDICTS[factory]), output.out[-3000:] + output.err[-3000:]
    if factory == "make_pair_runs_cache":  # failed for the contract, not by accident
        assert "PLAN-SHAPE" in output.out + output.err


class Span(NamedTuple):
    start: int
    len: int


class Plan(NamedTuple):
    write: Any
    read: Any
    read_base_pos: Any


def _ns(**fields: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fields)


class Raising:
    @property
    def write(self) -> Any:
        raise RuntimeError("no")


PLANS_IN_CONTRACT = {
    "named tuples": Plan((Span(0, 2),), (Span(0, 2),), 0),
    "lists of namespaces": _ns(write=[_ns(start=3, len=1)], read=[_ns(start=1, len=2), _ns(start=0, len=1)],
                               read_base_pos=2),
    "kvcache's own types": kvcache.SeqStepPlan((kvcache.Run(0, 1),), (kvcache.Run(0, 1),), 0),
}

PLANS_OUTSIDE = {
    "runs as bare pairs": Plan(((0, 1),), ((0, 1),), 0),
    "no runs": Plan((), (Span(0, 1),), 0),
    "three runs": Plan((Span(0, 1),), (Span(0, 1),) * 3, 0),
    "bool base": Plan((Span(0, 1),), (Span(0, 1),), True),
    "negative start": Plan((Span(-1, 1),), (Span(0, 1),), 0),
    "zero len": Plan((Span(0, 0),), (Span(0, 1),), 0),
    "float len": Plan((Span(0, 1.0),), (Span(0, 1),), 0),  # type: ignore[arg-type]
    "int subclass": Plan((Span(0, kvcache.Kind.RING),), (Span(0, 1),), 0),
    "past INT_MAX": Plan((Span(2**31, 1),), (Span(0, 1),), 0),
    "a generator of runs": Plan((s for s in (Span(0, 1),)), (Span(0, 1),), 0),
    "a dict": {"write": [[0, 1]], "read": [[0, 1]], "read_base_pos": 0},
    "a raising attribute": Raising(),
    "forged kvcache runs": forge_plan((forge_run(0, True),), (kvcache.Run(0, 1),), 0),
}


@pytest.mark.parametrize("name", sorted(PLANS_IN_CONTRACT))
def test_plans_in_the_contract_read_the_same_in_both_commands(name: str) -> None:
    plan = PLANS_IN_CONTRACT[name]
    value = read_plan(plan)
    assert not isinstance(value, str), value
    assert plan_to_json(plan) == {"write": [list(r) for r in value.write], "read": [list(r) for r in value.read],
                                  "read_base_pos": value.read_base_pos}


@pytest.mark.parametrize("name", sorted(PLANS_OUTSIDE))
def test_plans_outside_the_contract_fail_in_both_commands(name: str) -> None:
    """verify's PLAN-SHAPE (read_plan gives a reason) and conformance's (an unreadable plan JSON) agree."""
    plan = PLANS_OUTSIDE[name]
    assert isinstance(read_plan(plan), str)
    assert "unreadable" in plan_to_json(plan)
