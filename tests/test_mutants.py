"""Each rule's tests fail when the rule is broken: source mutants of `kvcache`, run under `python -O`.

Under -O the postconditions and invariants are gone, so a mutant is killed by the tests alone, not by
the implementation's own self-checks. Every mutant breaks one rule the way real caches have broken it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (rule broken, file, original text, mutated text)
MUTANTS = [
    ("REWIND-SOUND (upstream floor max(0, L - w))", "_cache.py",
     "return all(policy.read_base(new_len) >= min(retained, new_len)",
     "return all(new_len >= max(0, self._length - getattr(policy, 'window', self._length))"),
    ("REWIND-SOUND (no floor)", "_cache.py", "or not self._rewind_safe(new_len)", "or False"),
    ("RETAINED (ring one slot short)", "_policies.py", "return max(retained, end - self.n_slots)",
     "return max(retained, end - self.n_slots - 1)"),
    ("LAYOUT-CANON (ring of window + max_write - 2)", "_policies.py",
     "self.n_slots = self.window + self.max_write - 1", "self.n_slots = self.window + self.max_write - 2"),
    ("PLAN-READ (w + 1 keys)", "_policies.py", "return max(0, position - self.window + 1)",
     "return max(0, position - self.window)"),
    ("PLAN-READ (flat reads only the new rows)", "_policies.py", "read=(Run(0, position + T),)",
     "read=(Run(position, T),)"),
    ("STEP-APPEND (gaps and overlaps accepted)", "_cache.py",
     "return position == self._length or self._open_step == (position, T)", "return True"),
    ("STEP-T-MAX (any T on a ring)", "_cache.py", "self._step_limit is None or T <= self._step_limit", "True"),
    ("COMMIT-ISSUED (any plan commits)", "_cache.py", "lambda self, plan: self._issued(plan)",
     "lambda self, plan: True"),
    ("ADMIT (capacity itself refused)", "_cache.py", "if position + T > self._capacity:\n            return None",
     "if position + T >= self._capacity:\n            return None"),
    ("ARG-INT (bool accepted)", "_ints.py", "return type(value) is int", "return isinstance(value, int)"),
    ("DEPTH (ring sized to the window)", "_policies.py", "return min(capacity, self.n_slots)",
     "return min(capacity, self.window)"),
    ("CLEAR (history kept)", "_cache.py",
     "self._open_step = None\n        self._retained = [0] * len(self._policies)", "self._open_step = None"),
    ("LAYER-RANGE (negative layers index from the end)", "_layers.py", "return 0 <= layer < self.n_layers",
     "return layer < self.n_layers"),
    ("COMMIT-ADVANCE (commit not idempotent)", "_cache.py", "if end > self._length:", "if end >= self._length:\n"
     "            end = self._length + plan.n_written if end == self._length else end\n            if end > self._capacity: return"),
]

TESTS = [str(ROOT / "tests" / name) for name in
         ("test_rules.py", "test_upstream.py", "test_bad_input.py", "test_differential.py")]


def run_tests_against(copy: Path) -> subprocess.CompletedProcess[str]:
    """The tests, under -O, importing `kvcache` from `copy` (cwd and append mode keep the checkout behind it)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    # -m "": every one of those tests, the slow ones too (pyproject's addopts leave them out by default)
    return subprocess.run([sys.executable, "-O", "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           "--import-mode=append", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
                           "-m", "", *TESTS], cwd=copy, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("rule,file,original,mutated", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_is_killed(rule: str, file: str, original: str, mutated: str, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "kvcache", tmp_path / "kvcache")
    target = tmp_path / "kvcache" / file
    source = target.read_text()
    assert source.count(original) == 1, f"mutant for {rule} no longer applies: update it"
    target.write_text(source.replace(original, mutated))
    run = run_tests_against(tmp_path)
    assert run.returncode == 1, f"mutant survived ({rule}):\n{run.stdout[-2000:]}"


@pytest.mark.slow
def test_unmutated_copy_passes(tmp_path: Path) -> None:
    """The harness itself: the same run on an unmutated copy passes (so a kill means the mutant)."""
    shutil.copytree(ROOT / "kvcache", tmp_path / "kvcache")
    marker = tmp_path / "imported"
    init = tmp_path / "kvcache" / "__init__.py"
    init.write_text(init.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    run = run_tests_against(tmp_path)
    assert run.returncode == 0, run.stdout[-2000:]
    assert marker.exists(), "the tests imported the checkout's kvcache, not the copy"
