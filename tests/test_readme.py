"""The README and the pages of docs/ stay true: every Python block of the README (and of each page of docs/
that says its blocks run) runs as written, every shell command of the README is run (here, or by CI's
script), and every link resolves - so neither can drift from the API."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import kvcache_proofs
import kvcache_spec
import kvcache_spec.examples
from kvcache_spec.conformance import cli as conformance_cli, layouts
from kvcache_spec.conformance.targets import PythonTarget

# README.md and docs/ sit beside tests/ (in the checkout, and where CI copies the tests to run them against
# the installed wheel); spec/ and proofs/ are read where the installed packages have them.
ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = {"spec": Path(kvcache_spec.__file__).parent, "proofs": Path(kvcache_proofs.__file__).parent}


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)


# The pages whose Python blocks run as written: the README, and each page of docs/ that says so (a page
# may show a fragment, such as an import to change, that is not a program).
RUNS = "Every Python block of this page runs as written"
EXAMPLES = [(page.relative_to(ROOT).as_posix(), index, block)
            for page in PAGES if page == README or RUNS in " ".join(page.read_text().split())
            for index, block in enumerate(_blocks(page, "python"))]


def test_the_readme_is_a_users_page() -> None:
    """At most 300 lines, and its first section is how to check your own cache."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert re.findall(r"^## (.*)$", text, re.M)[0] == "Check your own cache"


def test_readme_and_docs_have_examples() -> None:
    assert {page for page, _, _ in EXAMPLES} >= {"README.md", "docs/using-the-reference.md"}, "examples were lost"


@pytest.mark.parametrize("page, index, block", EXAMPLES, ids=[f"{page}-{index}" for page, index, _ in EXAMPLES])
def test_example_runs(page: str, index: int, block: str) -> None:
    exec(compile(block, f"{page} example {index}", "exec"), {})


def test_the_readme_op_skeleton_is_the_tested_example() -> None:
    """The README's op-face skeleton is spec/examples/tiny_op_cache.py word for word (its verdict is tested
    in test_examples.py: CONFORMING, strict)."""
    example = Path(kvcache_spec.examples.__file__).with_name("tiny_op_cache.py").read_text()   # the installed copy
    assert example in _blocks(README, "python")


def test_the_runner_loop_is_the_tested_example() -> None:
    """docs/using-the-reference.md's runner loop is spec/examples/readme_runner.py word for word (tested in
    test_examples)."""
    example = Path(kvcache_spec.examples.__file__).with_name("readme_runner.py").read_text()
    assert example in _blocks(ROOT / "docs" / "using-the-reference.md", "python")


def _commands() -> list[tuple[str, str]]:
    """(command, its trailing comment) of every line of the README's sh blocks."""
    lines = [line for block in _blocks(README, "sh") for line in block.splitlines() if line.strip()]
    return [(command.strip(), comment.strip()) for command, _, comment in (line.partition("#") for line in lines)]


def _target_of(command: str) -> str:
    words = shlex.split(command)
    return words[words.index("--target") + 1]


def _target_builds(target: str) -> bool:
    """Whether the target builds a cache here (upstream's needs the upstream extra: torch and executorch)."""
    loaded = PythonTarget(target)
    return loaded.create(layouts.of(loaded).configs[0]).ok


def test_every_readme_command_is_run_here_or_by_ci() -> None:
    """A `kvcache conformance` line is run here when its target builds a cache, and ends as its comment
    says; one whose target needs the upstream extra is run by CI's upstream stage (.ci/run names its target,
    or tests/test_upstream_op.py judges it); every other step - the install and test commands - is one of
    CI's own."""
    ci = (ROOT / ".ci" / "run").read_text() if (ROOT / ".ci" / "run").is_file() else None
    upstream_tests = (Path(__file__).parent / "test_upstream_op.py").read_text()
    expected = {"CONFORMING": 0, "NOT CONFORMING": 1}
    commands = _commands()
    assert any(command.startswith("kvcache conformance") for command, _ in commands)
    for command, comment in commands:
        if command.startswith("kvcache conformance"):
            target = _target_of(command)
            if _target_builds(target):
                assert conformance_cli.main(shlex.split(command)[2:]) == expected[comment], command
            else:
                assert target in (ci or "") or target in upstream_tests, command
        elif ci is not None:   # the checkout only (the installed wheel's copy of the tests has no .ci/run)
            for part in command.split("&&"):   # each step, its words on one line of CI's script (-q aside)
                words = [word for word in shlex.split(part) if word != "-q"]
                assert any(all(word in line for word in words) for line in ci.splitlines()), part


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _where(page: Path, link: str) -> Path:
    """The file a relative link of `page` names: spec/ and proofs/ through the imported packages (so the check
    holds in the checkout and against the installed wheel alike), README.md and docs/ beside tests/."""
    relative = (page.parent / link).resolve().relative_to(ROOT).as_posix()
    folder, _, rest = relative.partition("/")
    return PACKAGES[folder] / rest if folder in PACKAGES else ROOT / relative


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_links_resolve(page: Path) -> None:
    """Every relative link of the README and of docs/ names a file that exists, and its #anchor a heading
    of that file (a link to the page's own heading too)."""
    prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)   # code blocks hold no links
    links = re.findall(r"\]\(([^)\s]+)\)", prose)
    assert links or page != README, "the README lost its links"
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = _where(page, path) if path else page
        assert target.is_file(), f"{page.name}: {link}"
        if anchor:
            anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", target.read_text(), re.M)}
            assert anchor in anchors, f"{page.name}: {link}"


def test_the_readme_names_the_dropins_deliberate_differences_as_docs_dropin_does() -> None:
    """Issue 25: upstream's op tests that fail on the drop-in on purpose are named in the README, each with its
    rule; CI's peer run (tests/upstream_peer.py) holds docs/dropin.md's table to the run, and this holds the
    README's to that table."""
    from .upstream_peer import deliberate_differences

    named = deliberate_differences(README)
    assert named and named == deliberate_differences(README.parent / "docs" / "dropin.md")
