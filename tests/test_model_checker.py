"""The exhaustive model checker: the reference holds; broken variants give shortest counterexamples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvcache
from kvcache_proofs import _mc_broken, model_checker
from kvcache_proofs.model_checker import Bounds, ConfigSpec, check_all, check_config, replay
from kvcache_spec.stateful import CanExtend, Lockstep, Observe, Rewind, Step


@pytest.mark.slow
def test_reference_holds_on_the_quick_bounds() -> None:
    report = check_all(model_checker.PROFILES["quick"], jobs=2, time_budget=120)
    assert report.ok, report.summary()
    assert report.configs_checked == report.configs_total == len(model_checker.PROFILES["quick"].configs())
    assert report.states > 500 and report.checks > report.states * 20


def test_every_reachable_state_of_a_small_ring() -> None:
    """Capacity 3, ring(2), max_write 1 (a ring of 2 slots, wrapped once the length reaches 3)."""
    result = check_config(ConfigSpec(capacity=3, windows=(2,), max_write=1))
    assert result.complete and result.counterexample is None
    assert result.states >= 4  # at least one state per length 0..3


def test_upstream_floor_shortest_counterexample() -> None:
    """ring(1), max_write 1: after two one-token steps upstream's floor (length - window = 1) refuses
    rewind(0), which always succeeds. No shorter program reaches length 2 (T <= max_write = 1)."""
    spec = ConfigSpec(capacity=2, windows=(1,), max_write=1)
    result = check_config(spec, _mc_broken.upstream_floor)
    cx = result.counterexample
    assert cx is not None
    assert len(cx.ops) == 3 and cx.ops[-1] == Rewind(0), cx.ops
    assert cx.problems[0].startswith("REWIND-SOUND")
    assert replay(spec, cx.ops, _mc_broken.upstream_floor) == cx.problems
    assert replay(spec, cx.ops[:-1], _mc_broken.upstream_floor) == []
    assert replay(spec, cx.ops) == []  # the reference runs the same program cleanly


def test_upstream_floor_unsound_direction() -> None:
    """window 3 > max_write 1: upstream lets rewind(1) through at length 4 where the model refuses."""
    spec = ConfigSpec(capacity=4, windows=(3,), max_write=1)
    ops = [Step(p, 1) for p in range(4)] + [Rewind(1)]
    problems = replay(spec, ops, _mc_broken.upstream_floor)
    assert problems and problems[0].startswith("REWIND-SOUND") and "model says False" in problems[0]


@pytest.mark.parametrize("name, rule_id", [("lenient_step", "STEP-APPEND"), ("ring_slot_extra", "DEPTH"),
                                           ("ring_slot_short", "DEPTH")])
def test_broken_variants_are_caught(name: str, rule_id: str) -> None:
    report = check_all(model_checker.PROFILES["quick"], _mc_broken.BROKEN[name], time_budget=60)
    assert not report.ok and report.counterexample is not None
    assert report.counterexample.problems[0].startswith(rule_id), report.summary()
    assert len(report.counterexample.ops) == 1  # seen in the first state already


def test_short_ring_data_level_counterexample() -> None:
    """With the depth check satisfied by construction (observations skipped), the data level still
    catches the short ring: replay its plans on our own pools."""
    spec = ConfigSpec(capacity=6, windows=(2,), max_write=2)
    problems = replay(spec, [Step(0, 2), Step(2, 2)], _mc_broken.ring_slot_short)
    assert any(p.startswith("DATA-SOUND") for p in problems), problems


def test_counterexample_program_replays(tmp_path: Path) -> None:
    report = check_all(Bounds(2, 1, 1, 1), _mc_broken.upstream_floor, time_budget=60)
    assert report.counterexample is not None
    program = report.counterexample.program(report.target)
    assert "resolve_target('python:kvcache_proofs._mc_broken:upstream_floor')" in program
    with pytest.raises(AssertionError):
        exec(program, {})  # noqa: S102 - the program is the product under test


def test_main_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mc.json"
    assert model_checker.main(["--profile", "quick", "--jobs", "1", "--json", str(out),
                               "--target", "python:kvcache_proofs._mc_broken:lenient_step"]) == 1
    data = json.loads(out.read_text())
    assert data["ok"] is False and data["counterexample"]["ops"] == ["Plan(layer=0, position=1, T=1)"]
    assert model_checker.main(["--profile", "nope"]) == 2
    assert model_checker.main(["--target", "python:no_such_module:f"]) == 2
    assert "VIOLATION" in capsys.readouterr().out


def test_time_budget_exhausted_is_not_a_pass() -> None:
    report = check_all(model_checker.PROFILES["deep"], time_budget=0.5)
    assert not report.ok and not report.complete and report.counterexample is None
    assert "INCOMPLETE" in report.summary()


def test_main_out_of_time_is_incomplete_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    """The clock is a safety net: running out is "incomplete" (3), apart from a violation (1)."""
    assert model_checker.main(["--profile", "deep", "--jobs", "1", "--time-budget", "0.2"]) == 3
    out = capsys.readouterr().out
    assert "INCOMPLETE" in out and "VIOLATION" not in out


def test_pre_merge_bounds_are_work_not_time() -> None:
    """pre-merge's verdict is a function of its bounds: a fixed set of configurations, every state of each."""
    bounds = model_checker.PROFILES["pre-merge"]
    assert len(bounds.configs()) == 128
    assert model_checker.DEFAULT_BUDGET["pre-merge"] >= 120  # a safety net, ~9x the measured 14 s of CPU


def test_observe_is_a_check_of_every_n() -> None:
    assert next(iter(model_checker.checks(model_checker.Lockstep(ConfigSpec(3, (0,)))))) == Observe((0, 1, 2, 3, 4))


def test_time_budget_holds_across_worker_processes() -> None:
    report = check_all(model_checker.PROFILES["deep"], time_budget=1.0, jobs=2)
    assert not report.complete and report.seconds < 10, report.summary()


HOST_WITH_SIGTERM_HANDLER = """
import signal, sys
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(2))  # as `kvcache conformance` installs
from kvcache_proofs import model_checker as mc
for _ in range(20):
    assert not mc.check_all(mc.PROFILES["quick"], time_budget=0.01, jobs=2).complete
"""


def test_pools_stop_in_a_host_with_its_own_sigterm_handler() -> None:
    """Pool.terminate stops the workers with SIGTERM; forked with the host's unwinding handler they could
    survive it blocked on the task queue's lock, and terminate waited forever (measured: 20 stopped pools
    hung within 60 s without the fix; the pytest run of .ci/run hung this way after test_conformance)."""
    done = subprocess.run([sys.executable, "-c", HOST_WITH_SIGTERM_HANDLER], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


class _CountsLengthCalls(kvcache.SequenceCache):
    """length() changes the object (a call counter): observe() calls it without an atomicity check."""

    def length(self) -> int:
        self.length_calls = getattr(self, "length_calls", 0) + 1
        return super().length()


class _BadCanExtendLeaks(kvcache.SequenceCache):
    """A rejected can_extend() changes the object (CELL-ATOMIC's sequence twin, ATOMIC)."""

    def can_extend(self, n: object) -> bool:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            self.leaked = getattr(self, "leaked", 0) + 1
        return super().can_extend(n)  # type: ignore[arg-type]


def test_the_reused_clean_fingerprint_never_hides_or_invents_a_change() -> None:
    """A check's 'before' reuses the fingerprint the previous check verified; any target call in between
    forgets it. An unchecked call that changed the target does not make the next check fail, and a bad
    call that changes the target is caught on every repetition, not only the first."""
    spec = ConfigSpec(capacity=2, windows=(0,))
    lock = Lockstep(spec, _CountsLengthCalls)
    assert lock.apply(CanExtend(-1)) == [] and lock.clean is not None
    assert lock.apply(Observe()) == [] and lock.clean is None
    assert lock.apply(CanExtend(-1)) == []
    twin = lock.twins()()
    assert twin.clean == lock.fingerprint() and twin.apply(CanExtend(True)) == []
    leaky = Lockstep(spec, _BadCanExtendLeaks)
    for _ in range(3):
        assert any(p.startswith("ATOMIC") for p in leaky.apply(CanExtend(-1)))
    assert any(p.startswith("ATOMIC") for p in leaky.twins()().apply(CanExtend(-1)))

