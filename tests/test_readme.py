"""The README's Python examples run as written (so the README cannot drift from the API)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvcache_proofs
import kvcache_spec
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


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_to_its_own_sections_resolve() -> None:
    """The first screen points into the README (the target contract, ...): each link names a heading."""
    text = README.read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links and not set(links) - anchors, set(links) - anchors


def test_readme_links_to_files_resolve() -> None:
    """Links to the project's files (proofs/MEASUREMENTS.md, ...) name files the packages hold, found through
    the imported packages, so the check holds in the checkout and against the installed wheel alike."""
    packages = {"spec": kvcache_spec, "proofs": kvcache_proofs}
    targets = re.findall(r"\]\(([^)#:]+)\)", README.read_text())
    assert targets
    for target in targets:
        folder, _, rest = target.partition("/")
        assert folder in packages, f"{target}: not a file of a package"
        assert (Path(packages[folder].__file__).parent / rest).is_file(), target
