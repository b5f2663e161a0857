"""The README's Python examples run as written (so the README cannot drift from the API)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvcache_spec.examples

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples() -> None:
    assert EXAMPLES, "README.md lost its Python examples"


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index: int) -> None:
    exec(compile(EXAMPLES[index], f"README.md example {index}", "exec"), {})


def test_readme_runner_loop_is_the_tested_example() -> None:
    """The README's runner loop is spec/examples/readme_runner.py word for word (tested in test_examples)."""
    example = Path(kvcache_spec.examples.__file__).with_name("readme_runner.py").read_text()  # the installed copy
    assert example in EXAMPLES
