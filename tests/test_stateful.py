"""The reference runs in lockstep with the spec model; broken variants of it are caught.

The settings profile is "ci" under CI (derandomized), "dev" otherwise; KVCACHE_PROFILE overrides.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

import kvcache
from kvcache_proofs._mc_broken import BROKEN
from kvcache_spec import stateful
from kvcache_spec.stateful import ConfigSpec, Lockstep, Rewind, Step, make_machine, stateful_settings

KVCacheMachine = make_machine()


def test_reference_agrees_with_the_model() -> None:
    run_state_machine_as_test(KVCacheMachine, settings=stateful_settings())


# Each broken variant, and a rule its failure must name (the first check that notices it).
CAUGHT_BY = {
    "upstream_floor": ("REWIND-SOUND",),
    "lenient_step": ("STEP-APPEND", "COMMIT-ISSUED"),
    "ring_slot_extra": ("DEPTH", "LAYOUT-CANON"),
    "ring_slot_short": ("DEPTH", "LAYOUT-CANON", "DATA-SOUND"),
}


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_broken_variant_is_caught(name: str) -> None:
    machine = make_machine(BROKEN[name], name="BrokenMachine")
    # No shrinking: finding the bug is the point here (test_failure_prints_a_pasteable_program shrinks).
    # Derandomized: whether the examples reach the bug is then a fact of the code, not of the seed (the "dev"
    # profile, the README's test command on a machine without CI set, draws a fresh seed per run, and one
    # clean-clone run missed upstream_floor).
    quick = settings(stateful_settings(), phases=[Phase.explicit, Phase.reuse, Phase.generate],
                     report_multiple_bugs=False, derandomize=True, database=None)
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine, settings=quick)
    first_line = str(failure.value).splitlines()[0]
    assert first_line.startswith(CAUGHT_BY[name]), first_line


def test_upstream_floor_is_unsound_at_the_data_level() -> None:
    """max_write < window: upstream's floor L - w lets a rewind through that the next step reads
    stale rows after; the model refuses it, and replaying the target's own plans shows why."""
    lock = Lockstep(ConfigSpec(capacity=8, windows=(3,), max_write=1), BROKEN["upstream_floor"])
    for position in range(5):
        assert lock.apply(Step(position, 1)) == []
    problems = lock.apply(Rewind(2))  # ring of 3 slots holds positions 2..4; a step at 2 reads 0..2
    assert problems and problems[0].startswith("REWIND-SOUND"), problems


def test_short_ring_reads_overwritten_rows() -> None:
    """The data-level check alone (our pools, the target's plans) finds a ring one slot short."""
    lock = Lockstep(ConfigSpec(capacity=12, windows=(3,), max_write=2), BROKEN["ring_slot_short"])
    problems: list[str] = []
    for position in range(0, 8, 2):
        problems += lock.apply(Step(position, 2))
    assert any(p.startswith("DATA-SOUND") for p in problems), problems


def _program(error: BaseException) -> str:
    """The falsifying program Hypothesis prints, from `state = ...` to `state.teardown()`."""
    text = "\n".join(getattr(error, "__notes__", []))
    match = re.search(r"^state = .*?^state\.teardown\(\)$", text, re.MULTILINE | re.DOTALL)
    assert match, text
    return match.group(0)


@pytest.mark.slow
def test_failure_prints_a_pasteable_program() -> None:
    """A failure's printed steps, pasted next to the machine's definition, fail the same way."""
    BrokenMachine = make_machine(BROKEN["lenient_step"], name="BrokenMachine",
                                 configs=st.just(ConfigSpec(capacity=4, windows=(0, 2), max_write=1)))
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(BrokenMachine, settings=settings(
            stateful_settings(), max_examples=50, stateful_step_count=8, report_multiple_bugs=False,
            derandomize=True))  # deterministic: a random run of 50 examples once missed the bug
    program = _program(failure.value)
    assert "BrokenMachine()" in program and "ConfigSpec(capacity=4" in program
    namespace: dict[str, Any] = {"BrokenMachine": BrokenMachine, "ConfigSpec": ConfigSpec}
    with pytest.raises(AssertionError) as replayed:
        exec(program, namespace)  # noqa: S102 - the point of the test
    assert str(replayed.value).splitlines()[0] == str(failure.value).splitlines()[0]


def test_the_reference_passes_the_same_program() -> None:
    """The program is not a failure of the harness: the reference runs it cleanly."""
    lock = Lockstep(ConfigSpec(capacity=8, windows=(0, 3), max_write=1))
    for position in range(5):
        assert lock.apply(Step(position, 1, "per-layer")) == []
    assert lock.apply(Rewind(2)) == [] and lock.state.length == 5  # refused, as the model says
    assert lock.apply(Rewind(4)) == [] and lock.state.length == 4


@pytest.mark.parametrize("env, expected", [({}, "dev"), ({"CI": "true"}, "ci"),
                                           ({"CI": "true", "KVCACHE_PROFILE": "deep"}, "deep")])
def test_profile_choice(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("KVCACHE_PROFILE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert stateful.profile_name() == expected
    assert stateful_settings() == settings.get_profile(expected)
    if expected == "ci":
        assert stateful_settings().derandomize and stateful_settings().deadline is None


def test_harness_flags_a_wrong_error_type() -> None:
    """A caller error answered with a plain ValueError (not a KVCacheError with the rule) is a problem."""
    class UntypedErrors(kvcache.SequenceCache):
        def can_extend(self, n: int = 1) -> bool:
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError("bad n")
            return super().can_extend(n)

    factory: Callable[[kvcache.CacheConfig], Any] = UntypedErrors
    lock = Lockstep(ConfigSpec(capacity=4, windows=(0,)), factory)
    problems = lock.apply(stateful.CanExtend(-1))
    assert problems and problems[0].startswith("ARG-RANGE") and "KVCacheError" in problems[0], problems


# --- derandomized examples depend on the code, not on what else is imported -------------------------

PROBE = Path(__file__).with_name("constant_pool_probe.py")


def _probe(tmp_path: Path, kind: str, pin: str, *modules: str) -> str:
    """Run tests/constant_pool_probe.py in a fresh process that first imports `modules`; `tmp_path` holds
    a module of literals that Hypothesis counts as local code (not in site-packages, not a test file)."""
    (tmp_path / "literals_of_another_module.py").write_text(
        "".join(f"L{i} = {value}\n" for i, value in enumerate([*range(100, 255), *range(300, 10**6, 7919)])))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(PROBE), kind, pin, *modules], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_hypothesis_draws_literals_of_imported_modules_unless_the_pool_is_pinned(tmp_path: Path) -> None:
    """The hazard is real in the installed Hypothesis (if it ever goes away, fixed_constant_pool can go):
    loading a module of literals changes what a derandomized test draws; pinned, it does not."""
    assert _probe(tmp_path, "given", "free") != _probe(tmp_path, "given", "free", "literals_of_another_module")
    assert _probe(tmp_path, "given", "pinned") == _probe(tmp_path, "given", "pinned", "literals_of_another_module")


@pytest.mark.slow
def test_verify_s_state_machine_runs_the_same_examples_whatever_else_is_imported(tmp_path: Path) -> None:
    """Measured before the pin: 102 machines with the state machine's modules alone, 115 with the
    conformance package imported too. Now the pre-merge stage's numbers are one function of the code."""
    alone = _probe(tmp_path, "verify", "pinned")
    assert alone == _probe(tmp_path, "verify", "pinned", "literals_of_another_module", "numpy")
    assert json.loads(alone)["machines run"] >= 100, alone
