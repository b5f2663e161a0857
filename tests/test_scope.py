"""Declared scope (SCOPE-BORDER): a flat-only target passes strictly inside its scope with what it
left out listed, a target that serves ring layers as flat is caught at the border, the scope comes
from the factory, the handshake or the CLI, and the golden vectors carry it in their flags. Also
the forged plans that keep a step's span and move its rows (COMMIT-ISSUED)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance import cli, run_program, run_suite, vectors
from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.configs import SUITE_CONFIGS, config, layer
from kvcache_spec.conformance.engine import CRASH, LENIENT, WRONG
from kvcache_spec.conformance.sequence.engine import ROW_FORGERIES
from kvcache_spec.conformance.sequence.programs import BAD_CALLS, step
from kvcache_spec.conformance.targets import PythonTarget, SubprocessTarget, TargetCrash

ZOO = "python:kvcache_spec.conformance.zoo:{}"
REFERENCE = "python:kvcache:SequenceCache"
DOCUMENT: dict[str, Any] = json.loads((vectors.VECTORS_DIR / vectors.VECTORS_FILE).read_text())


def test_a_flat_only_target_passes_strictly_with_the_unexercised_scope_listed(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "report.json"
    code = cli.main(["--target", ZOO.format("flat_only"), "--strict", "--json", str(report_path), "-v"])
    out = capsys.readouterr().out   # -v: every skipped note on its own line (by default one line counts them)
    assert code == 0, out
    assert "CONFORMING (strict) within the scope flat only" in out
    report = json.loads(report_path.read_text())
    scope = report["scope"]
    assert scope["features"] == ["flat"] and scope["full"] is False
    assert scope["source"] == "the factory's kvcache_scope"
    outside = [cfg for cfg in SUITE_CONFIGS if cfg["layers"][0]["kind"] == "ring" or len(cfg["layers"]) > 1]
    assert scope["configs_driven"] == len(SUITE_CONFIGS) - len(outside) and scope["configs_outside"] == len(outside)
    left = scope["unexercised"]
    assert set(left["families"]) == {"ring", "ring+max_write", "flat+ring", "flat+ring+max_write"}
    assert "STEP-T-MAX" in left["rules"] and "BUG-WINDOW-OFF-BY-ONE" in left["bug_classes"]
    assert any(note.startswith("scope: rules exercised only outside the scope: ") and "STEP-T-MAX" in note
               for note in report["skipped"])
    assert "configuration family ring not exercised: cap 20, ring(4)" in out


def test_the_skipped_notes_fold_into_one_counted_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first screen (issue 41.7): without -v the skipped notes are one line with their count; the JSON report
    holds them all."""
    report_path = tmp_path / "report.json"
    assert cli.main(["--target", ZOO.format("flat_only"), "--strict", "--json", str(report_path)]) == 0
    out = capsys.readouterr().out
    notes = json.loads(report_path.read_text())["skipped"]
    skipped = [line for line in out.splitlines() if line.startswith("  skipped:")]
    assert len(notes) > 1 and skipped == [f"  skipped: {len(notes)} parts of the spec not judged here (the scope, the "
                                          "relaxations, what the target is not sent): -v prints them, the JSON report "
                                          "lists them under 'skipped'"]
    assert "configuration family ring not exercised" not in out


def test_a_full_scope_lists_nothing_unexercised() -> None:
    result = run_suite(PythonTarget(ZOO.format("faithful")), "quick", seed=0)
    assert result.declared["full"] is True and "unexercised" not in result.declared
    assert not any(note.startswith("scope:") for note in result.skipped)


def test_what_a_partial_scope_leaves_out_is_read_from_its_own_layouts_vectors() -> None:
    """A flat-only scope leaves out ring-only sequence bug classes; a cell target's flat vectors exercise
    every cell rule; the op face has no vectors, so nothing is claimed (before, every layout was read
    against the sequence vectors, so a cell or op report listed sequence bug classes as left out)."""
    flat = scopes.parse(["flat"], "test")
    assert "BUG-WINDOW-OFF-BY-ONE" in scopes.unexercised(flat, [], "sequence")["bug_classes"]
    assert scopes.unexercised(flat, [], "cell") == {"families": {}, "rules": [], "bug_classes": []}
    assert scopes.unexercised(flat, [], "op-cell") == {"families": {}, "rules": [], "bug_classes": []}


def test_serving_ring_layers_as_flat_is_caught_at_the_border() -> None:
    result = run_suite(PythonTarget(ZOO.format("flat_everywhere")), "quick", seed=0)
    assert set(result.findings) == {(WRONG, "SCOPE-BORDER")}, sorted(result.findings)
    message = result.findings[(WRONG, "SCOPE-BORDER")].finding.message
    # which class and why: the feature out of scope, the acceptance, and how it serves it otherwise
    assert "needs ring, outside the declared scope [flat]" in message and "serves it another way" in message
    assert "PLAN-READ" in message or "DATA-SOUND" in message
    assert not result.conforming()


def test_accepting_and_serving_a_config_outside_the_scope_correctly_is_lenient() -> None:
    """The faithful cache serves ring layers right, but --scope flat says it should refuse them."""
    result = run_suite(PythonTarget(ZOO.format("faithful")), "quick", seed=0, scope=scopes.parse_text("flat", "--scope"))
    assert set(result.findings) == {(LENIENT, "SCOPE-BORDER")}
    assert result.conforming() and not result.conforming(strict=True)
    assert "answered as the spec" in result.findings[(LENIENT, "SCOPE-BORDER")].finding.message


def test_a_config_inside_the_scope_is_driven_and_one_outside_refused_is_no_finding() -> None:
    target = PythonTarget(ZOO.format("flat_only"))
    ring = config(20, [layer("ring", 4)])
    assert run_program(target, ring, [step(1)]).finding is None          # refused at create: as required
    assert run_program(target, ring, [step(1)]).calls == 1
    flat = config(8, [layer("flat")])
    assert run_program(target, flat, [step(1)]).calls > 1


@pytest.mark.slow
def test_the_scope_comes_from_the_handshake_of_a_cmd_target() -> None:
    target = SubprocessTarget(f"cmd:{sys.executable} -m kvcache_spec.conformance.serve {ZOO.format('flat_only')}")
    try:
        scope = target.declared_scope()
        assert scope.names() == ["flat"] and scope.source == "declared in the target's hello"
        result = run_suite(target, "quick", seed=0)
    finally:
        target.close()
    assert result.conforming(strict=True), sorted(result.findings)
    assert result.declared["configs_outside"] == 9


@pytest.mark.parametrize("declared, problem", [(["flat"], None), (("flat", "ring"), None), (7, "not 7"),
                                               ("flat", "not 'flat'"), ([1], "as strings")])
def test_parsing_a_declared_scope(declared: Any, problem: Any) -> None:
    if problem is None:
        assert set(scopes.parse(declared, "test").features) <= set(scopes.FEATURES)
    else:
        with pytest.raises(scopes.ScopeError, match=problem):
            scopes.parse(declared, "test")
    parsed = scopes.parse(["flat", "diagonal"], "test")
    assert parsed.features == {"flat"} and parsed.ignored == ("diagonal",)
    assert scopes.parse(["all"], "test").full_for("sequence") and scopes.parse_text("flat, max_write", "--scope").names() == \
        ["flat", "max_write"]


def test_a_hello_with_a_malformed_scope_is_a_protocol_crash(tmp_path: Path) -> None:
    server = tmp_path / "bad_hello.py"
    server.write_text("import json, sys\n"
                      "for line in sys.stdin:\n"
                      "    r = json.loads(line)\n"
                      "    print(json.dumps({'id': r['id'], 'result': {'protocol': 'kvcache-conformance', "
                      "'version': 1, 'scope': 'flat'}}), flush=True)\n")
    target = SubprocessTarget(f"cmd:{sys.executable} {server}")
    try:
        with pytest.raises(TargetCrash, match="scope"):
            target.declared_scope()
    finally:
        target.close()


def test_the_cli_rejects_an_unknown_scope(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--scope", "diagonal"]) == 2
    assert "unknown feature" in capsys.readouterr().err


def test_the_vectors_carry_the_scope_in_their_flags() -> None:
    for group in DOCUMENT["testGroups"]:
        for t in group["tests"]:
            if group["config"] is not None:
                assert set(scopes.needs_flags(group["config"])) <= set(t["flags"]), t["tcId"]
            elif "SCOPE-BORDER" in t["flags"]:
                assert any(flag.startswith("WITHOUT-") for flag in t["flags"])
    flat = scopes.parse(["flat"], "test")
    assert scopes.applies(["NEEDS-FLAT"], flat) and not scopes.applies(["NEEDS-FLAT", "NEEDS-RING"], flat)
    assert scopes.applies(["WITHOUT-RING"], flat) and not scopes.applies(["WITHOUT-RING"], scopes.FULL)


def test_a_flat_only_replay_skips_what_it_does_not_implement_and_checks_the_border() -> None:
    passed, failures, skipped = vectors.replay_vectors(PythonTarget(ZOO.format("flat_only")), DOCUMENT)
    assert failures == [] and skipped > 0 and passed + skipped == DOCUMENT["numberOfTests"]
    _, failures, _ = vectors.replay_vectors(PythonTarget(ZOO.format("flat_everywhere")), DOCUMENT)
    assert failures and all("create" in failure for failure in failures)
    assert any("without ring refuses a ring layer" in failure for failure in failures)


# --- forged plans that keep (position, T) and move the rows ---------------------------------------

def test_a_commit_that_checks_only_the_arithmetic_passes_the_span_forgeries_and_not_the_row_ones() -> None:
    """COMMIT-ISSUED: the span forgeries (stale, shifted base, extra row, ...) all change (position, T)
    and a commit that checks read_base_pos + sum(read lens) rejects them; each row forgery keeps the
    span and is caught, on a flat, a ring and a mixed config."""
    target = PythonTarget(ZOO.format("commit_checks_arithmetic"))
    span_forgeries = [bad for name, bad in BAD_CALLS if name.startswith("commit")
                      and bad["plan"]["forge"] not in ROW_FORGERIES]
    for cfg in (config(8, [layer("flat")]), config(20, [layer("ring", 4)]), config(16, [layer("flat"), layer("ring", 4)])):
        assert run_program(target, cfg, [step(3), *span_forgeries, step(1)]).finding is None
        for kind in ROW_FORGERIES:
            run = run_program(target, cfg, [step(3), {"op": "commit", "plan": {"forge": kind}}])
            assert run.finding is not None and (run.finding.kind, run.finding.rule) == (LENIENT, "COMMIT-ISSUED"), kind
            forged = run.steps[-1]["plan"]
            canonical = run_program(PythonTarget(REFERENCE), cfg, [step(3), step(2)])
            assert canonical.finding is None and forged != canonical.steps[-1]
        assert run_program(PythonTarget(REFERENCE), cfg,
                           [step(3)] + [{"op": "commit", "plan": {"forge": k}} for k in ROW_FORGERIES]).finding is None


@pytest.mark.parametrize("kind", ROW_FORGERIES)
def test_each_row_forgery_keeps_the_span_of_the_next_step(kind: str) -> None:
    run = run_program(PythonTarget(REFERENCE), config(16, [layer("flat"), layer("ring", 4)]),
                      [step(3), {"op": "commit", "plan": {"forge": kind}}])
    assert run.finding is None
    plan = run.steps[-1]["plan"]
    written = sum(n for _, n in plan["write"])
    assert plan["read_base_pos"] + sum(n for _, n in plan["read"]) - written == 3   # position = length
    assert 1 <= written <= 2


class DiesOnRing(PythonTarget):
    """A flat-only target that dies (instead of refusing) when asked for a ring layer."""

    def create(self, cfg: Any) -> Any:
        if any(entry["kind"] == "ring" for entry in cfg["layers"]):
            raise TargetCrash("exited: SIGABRT (an assert on the layer kind)")
        return super().create(cfg)


def test_dying_on_a_config_outside_the_scope_is_a_crash_at_the_border() -> None:
    run = run_program(DiesOnRing(ZOO.format("flat_only")), config(20, [layer("ring", 4)]), [step(1)])
    assert run.finding is not None and (run.finding.kind, run.finding.rule) == (CRASH, "SCOPE-BORDER")
    assert "SIGABRT" in run.finding.message and "outside the declared scope [flat]" in run.finding.message


# --- findings saved as vectors (the C++ replay is in test_cpp_conformance.py) ----------------------

def test_a_border_finding_is_saved_as_a_config_to_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--target", ZOO.format("flat_everywhere"), "--save-findings", str(tmp_path)]) == 1
    assert "reproduces on replay" in capsys.readouterr().out
    [path] = sorted(tmp_path.iterdir())
    assert path.name == "01-wrong-scope-border.json"
    document = json.loads(path.read_text())
    assert document["finding"]["class"] == "wrong" and document["finding"]["rule"] == "SCOPE-BORDER"
    [group] = document["testGroups"]
    [test] = group["tests"]
    assert group["config"] is None and test["flags"] == ["SCOPE-BORDER", "WITHOUT-RING"]
    assert [call["method"] for call in test["calls"]] == ["create"]
    assert test["calls"][0]["expect"] == {"rejected": "SCOPE-BORDER"}
    assert vectors.replay_vectors(PythonTarget(ZOO.format("flat_everywhere")), document)[:2] == \
        (0, [f"tcId 1 ({test['comment']}): call 0 create: an invalid config was accepted "
             "({'rejected': 'SCOPE-BORDER'})"])
    assert vectors.replay_vectors(PythonTarget(ZOO.format("flat_only")), document) == (1, [], 0)
    assert vectors.replay_vectors(PythonTarget(REFERENCE), document) == (0, [], 1)   # not its border


def test_saved_findings_replay_the_calls_the_finding_was_seen_through(tmp_path: Path) -> None:
    """A target without length() was observed through can_extend probes: its saved finding is too."""
    target = PythonTarget(ZOO.format("commit_checks_arithmetic"))
    result = run_suite(target, "quick", seed=0)
    reported = result.findings[(LENIENT, "COMMIT-ISSUED")]
    without_length = frozenset({"depth", "retained_from"})
    document = vectors.finding_document(reported.finding, reported.config, reported.steps, without_length,
                                        scopes.FULL, target.name)
    methods = {call["method"] for group in document["testGroups"] for t in group["tests"] for call in t["calls"]}
    assert "length" not in methods and "can_extend" in methods and "commit" in methods
    assert vectors.replay_vectors(target, document)[1]                      # fails on the mutant
    assert vectors.replay_vectors(PythonTarget(REFERENCE), document) == (1, [], 0)


def test_a_scope_with_no_suite_configuration_inside_is_no_verdict() -> None:
    """A declaration of nothing known (a newer target's features only) must not pass vacuously."""
    result = run_suite(PythonTarget(ZOO.format("faithful")), "quick", seed=0,
                       scope=scopes.parse(["paged"], "declared in the target's hello"))
    assert result.programs == 0 and "nothing to check" in result.aborted
    assert not result.conforming() and not result.conforming(strict=True)


def test_a_border_finding_under_a_scope_override_is_not_claimed_to_reproduce(tmp_path: Path) -> None:
    """--scope flat on a full-scope target: its own replayer skips WITHOUT-RING tests, so the saved
    border finding does not reproduce there, and the report says so instead of claiming it does."""
    result = run_suite(PythonTarget(ZOO.format("faithful")), "quick", seed=0, scope=scopes.parse_text("flat", "--scope"))
    saved = cli.save(result, str(tmp_path), PythonTarget(ZOO.format("faithful")), scopes.parse_text("flat", "--scope"))
    assert saved   # one per cause: each ring-needing configuration family the target accepted
    for one in saved:
        assert one["rule"] == "SCOPE-BORDER" and one["reproduces"] is False and one["replay"].startswith("skipped")
