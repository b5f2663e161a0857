"""The runnable examples of spec/examples/ run, and do what they claim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvcache import SequenceCache
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
