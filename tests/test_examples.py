"""The runnable examples of spec/examples/ run, and do what they claim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcache import SequenceCache
from kvcache_spec.conformance import cli
from kvcache_spec.conformance.engine import WRONG
from kvcache_spec.conformance.suite import CONFORMING, NOT_CONFORMING, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget
from kvcache_spec.examples import runner_loop as example


README_RUNNER = Path(example.__file__).with_name("readme_runner.py")


def test_readme_runner_runs_in_a_fresh_namespace() -> None:
    """ADMIT, REWIND-SOUND: the README's runner loop, executed as the README test executes a block."""
    namespace: dict[str, object] = {}
    exec(compile(README_RUNNER.read_text(), str(README_RUNNER), "exec"), namespace)
    stats = namespace["stats"]
    assert isinstance(stats, dict) and stats["accepted"] > 0 and stats["rolled back"] > 0
    assert namespace["sequence"] == _ring_sum_greedy([1, 2, 3, 4, 5, 6], 32)


def _ring_sum_greedy(prompt: list[int], capacity: int) -> list[int]:
    """The README toy model without a cache: the next token is the sum of the last 3, modulo 10."""
    sequence = list(prompt)
    while len(sequence) < capacity:
        sequence.append(sum(sequence[-3:]) % 10)
    return sequence


def make_runner(draft: example.Draft = example.draft_model) -> tuple[SequenceCache, example.Runner]:
    cache = SequenceCache(example.CONFIG)
    return cache, example.Runner(cache, example.ToyBackend(cache.as_planner(), example.CONFIG), draft)


def test_runner_loop_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert example.main([]) == 0
    assert "request 2: 46 tokens, then the cache was full (48 of 48)" in capsys.readouterr().out


def test_runner_loop_as_a_script() -> None:
    result = subprocess.run([sys.executable, "-m", "kvcache_spec.examples.runner_loop"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_cached_model_is_the_model() -> None:
    """DATA-SOUND: the backend's step outputs equal recomputation over the whole sequence."""
    cache, runner = make_runner()
    tokens = [4, 8, 15, 16, 23, 42, 1, 2, 3]
    predictions = runner.backend.forward(0, tokens[:4]) + runner.backend.forward(4, tokens[4:8])
    predictions += runner.backend.forward(8, tokens[8:])
    assert predictions == example.recompute(example.CONFIG, tokens)


def _oracle(context: list[int], k: int) -> list[int]:
    guesses: list[int] = []
    for _ in range(k):
        guesses.append(example.recompute(example.CONFIG, context + guesses)[-1])
    return guesses


def _always_wrong(context: list[int], k: int) -> list[int]:
    return [(token + 1) % example.VOCAB for token in _oracle(context, k)]


@pytest.mark.parametrize("draft,rollbacks", [(_oracle, False), (_always_wrong, True), (example.draft_model, True)])
def test_speculation_never_changes_the_output(draft: example.Draft, rollbacks: bool) -> None:
    """REWIND-SOUND: every rollback of rejected drafts is accepted, and the output is plain greedy decoding."""
    prompt = [3, 14, 15, 9, 26, 5, 35]
    _, runner = make_runner(draft)
    assert runner.generate(prompt, max_new=25) == example.greedy_without_cache(example.CONFIG, prompt, 25)
    assert (runner.stats["rollbacks"] > 0) == rollbacks
    if draft is _oracle:
        assert runner.stats["accepted"] == runner.stats["drafted"] > 0


def test_admission_stops_generation_at_capacity() -> None:
    """ADMIT: the runner shrinks its speculation to what fits, then stops when nothing fits."""
    cache, runner = make_runner(_always_wrong)
    output = runner.generate([1, 2, 3], max_new=1000)
    assert cache.length() == example.CONFIG.capacity and not cache.can_extend(1)
    assert len(output) == example.CONFIG.capacity - 3 + 1  # the last token is predicted, never stored


def test_a_prompt_that_does_not_fit_is_refused_before_any_step() -> None:
    """ADMIT: can_extend(len(prompt)) is checked first; nothing is written."""
    cache, runner = make_runner()
    with pytest.raises(ValueError, match="does not fit"):
        runner.prefill(list(range(example.CONFIG.capacity + 1)))
    assert cache.length() == 0 and runner.stats["steps"] == 0


def test_the_toy_backend_checks_every_row_it_reads() -> None:
    """DATA-SOUND: a row that does not hold the position it is read as stops the step."""
    _, runner = make_runner()
    runner.backend.forward(0, [1, 2, 3, 4])
    runner.backend.pools[0][1] = (7, 0)
    with pytest.raises(RuntimeError, match="the rows read are not positions"):
        runner.backend.forward(4, [5])


# --- the README's op-face skeleton (spec/examples/tiny_op_cache.py) ---------------------------------------

TINY_OP = "python:kvcache_spec.examples.tiny_op_cache:TinyOpCache"


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    """A module of factories written to tmp_path and importable from there (as a user's own package is)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_the_op_skeleton_is_forty_lines_and_conforming_strict() -> None:
    """OP-ATTEND, OP-STEP, OP-CONFIG...: the README's op-face skeleton is a complete cache: CONFORMING
    (strict) at the quick profile, every planned program run and every rule of its layout exercised."""
    source = Path(example.__file__).with_name("tiny_op_cache.py").read_text()
    assert len(source.splitlines()) <= 40
    report = report_json(run_suite(PythonTarget(TINY_OP), "quick"), strict=True, exact_layout=False)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], report["coverage"]
    assert report["coverage"]["programs"]["run"] == report["coverage"]["programs"]["planned"] > 200


def test_the_op_skeleton_with_its_window_one_too_wide_is_not_conforming(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """OP-ATTEND: the skeleton's verdict is earned - a ring layer attending one token too many is wrong."""
    name = _module(tmp_path, monkeypatch, "wider_op", (
        "from kvcache_spec.examples.tiny_op_cache import TinyOpCache\n"
        "class Wider(TinyOpCache):\n"
        "    def reset(self):\n"
        "        super().reset()\n"
        "        self.windows = [w + 1 if w < self.capacity else w for w in self.windows]\n"))
    result = run_suite(PythonTarget(f"python:{name}:Wider"), "quick")
    assert (WRONG, "OP-ATTEND") in result.findings and result.verdict() == NOT_CONFORMING


UNDECLARED_OP = ("from kvcache_spec.examples.tiny_op_cache import TinyOpCache\n"
                 "def make_op(config):\n"
                 "    return TinyOpCache(config)\n"
                 "make_op.kvcache_scope = TinyOpCache.kvcache_scope\n")
HINT = ('it builds op-contiguous caches (update_and_fetch, used), not sequence ones: '
        'kvcache_layout = "op-contiguous" on the factory')


def test_an_op_cache_judged_as_another_layout_gets_a_one_line_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A factory without kvcache_layout runs the sequence suite; when it builds op-face caches the report
    says so in one line naming kvcache_layout (summary and JSON), and the verdict stays what the run found.
    A conforming run, or a sequence factory that refuses everything, has no hint."""
    name = _module(tmp_path, monkeypatch, "undeclared_op", UNDECLARED_OP)
    report = tmp_path / "report.json"
    # NOT CONFORMING: its refusals of every sequence config are over-strict CFG-TYPE, which fail a run
    # without --strict (issue 26); the run is also INCOMPLETE (nothing created)
    assert cli.main(["--target", f"python:{name}:make_op", "--json", str(report)]) == 1
    assert f"  hint: {HINT}\n" in capsys.readouterr().out and json.loads(report.read_text())["hint"] == HINT
    assert cli.main(["--target", f"python:{name}:make_op", "--layout", "op-contiguous", "--json", str(report)]) == 0
    assert "hint" not in json.loads(report.read_text())
    assert cli.main(["--target", "python:kvcache_spec.conformance.zoo:never_creates", "--json", str(report)]) == 1
    assert "hint" not in json.loads(report.read_text())


@pytest.mark.slow
def test_the_pytest_plugin_gives_the_layout_hint(tmp_path: Path) -> None:
    (tmp_path / "undeclared_op.py").write_text(UNDECLARED_OP)
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--kvcache-target=python:undeclared_op:make_op"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plugin.returncode == 1 and f"hint: {HINT}" in plugin.stdout, plugin.stdout[-2000:]
