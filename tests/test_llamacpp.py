"""llama.cpp as a cell-recompute target (SPEC.md 5.3; docs/llamacpp-findings.md), one target per memory mode (the
library's defaults first): each known difference found by a minimal program in the modes it shows in, nothing
found where llama.cpp agrees with the spec, and the documented preconditions each target declares kept. Needs
the extra `llamacpp` (llama-cpp-python built from its sdist, gguf): without it these tests are skipped, and CI's
llamacpp stage (.ci/run) installs it and runs them."""

from __future__ import annotations

import sys

import pytest

from kvcache_spec.conformance import scope as scopes
from kvcache_spec.conformance.cell import recompute as r
from kvcache_spec.conformance.targets import SubprocessTarget

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the extra `llamacpp`)")
pytest.importorskip("gguf", reason="gguf is not installed (the extra `llamacpp`)")

MODULE = "kvcache_spec.conformance.cell.llamacpp"
MODES = ("default", "unified", "swa_small", "unified_swa_small")
UNIFIED, SWA_SMALL = ("unified", "unified_swa_small"), ("swa_small", "unified_swa_small")
FLAT, SLIDING, ISWA_LONG = r.recompute_config(256, 0), r.recompute_config(256, 3), r.recompute_config(r.LONG, 4, 0)
UNDECLARED = scopes.Scope(frozenset({"flat", "ring", "seq-state"}))   # the targets' scope without their preconditions


@pytest.fixture(scope="module", params=MODES)
def target(request: pytest.FixtureRequest) -> SubprocessTarget:
    mode = "" if request.param == "default" else request.param
    served = SubprocessTarget(f"cmd:{sys.executable} -m {MODULE} {mode}".rstrip(), timeout=60)
    served.mode = request.param   # type: ignore[attr-defined]
    yield served   # type: ignore[misc]
    served.close()


def mode(target: SubprocessTarget) -> str:
    return target.mode   # type: ignore[attr-defined, no-any-return]


def run(target: SubprocessTarget, cfg: dict, program: list, scope: object = None) -> r.RunResult:   # type: ignore[type-arg]
    return r.run_program(target, cfg, program, scope=scope)


def test_each_target_declares_the_preconditions_its_mode_asserts(target: SubprocessTarget) -> None:
    """ids in range on every target (GGML_ASSERT on every id); a whole-sequence copy with a stream per sequence
    ("seq_cp() is only supported for full KV buffers")."""
    want = {"ids-in-range"} | (set() if mode(target) in UNIFIED else {"whole-copies"})
    scope = target.declared_scope()
    assert scope.requires == want and scope.features == {"flat", "ring", "seq-state"}, scope


def test_agreeing_programs_find_nothing(target: SubprocessTarget) -> None:
    """Isolation in one batch, forks sharing cells, removing a shared cell from one sequence, half-open
    ranges, a full cache refused, a middle removal: llama.cpp answers as the spec (CELL-RECOMPUTE checked)."""
    for cfg in (FLAT, SLIDING, r.recompute_config(256, 3, 0)):
        for name, program in r.edge_programs(cfg)[:12]:
            if name == "fork onto a live sequence":
                continue
            result = run(target, cfg, program)
            assert result.finding is None, (name, result.finding)
            assert "CELL-RECOMPUTE" in result.exercised, name


@pytest.mark.parametrize("cfg", [FLAT, SLIDING])
def test_OP_FORK_a_fork_onto_a_live_destination(target: SubprocessTarget, cfg: dict) -> None:   # type: ignore[type-arg]
    """One stream (unified): the copy merges, and the destination's next token attends two rows at one
    position. A stream per sequence (the default): the copy replaces the destination, one history kept."""
    program = [r.decode(0, 0), r.decode(1, 1), r.cp(0, 1), r.decode(1)]
    result = run(target, cfg, program)
    assert result.finding is not None and (result.finding.kind, result.finding.rule) == ("lenient", "OP-FORK")
    consequence = result.consequence
    if mode(target) in UNIFIED:
        assert consequence is not None and consequence.safety == "SAFE-ONE-HISTORY", consequence
    else:
        assert consequence is None, consequence


@pytest.mark.parametrize("step", [r.rm(300), r.rm(-2), r.cp(300, 1), r.cp(0, -2), r.keep(300)])
def test_an_id_out_of_range_is_a_declared_precondition_llama_cpp_aborts_on(
        target: SubprocessTarget, step: dict) -> None:   # type: ignore[type-arg]
    """Under the declared scope the call is never sent; sent anyway (the scope without its preconditions),
    llama.cpp aborts on its GGML_ASSERT - the precondition's evidence - and a fresh process serves on."""
    kept = run(target, FLAT, [step, r.decode(0)])
    assert kept.finding is None and any("'ids-in-range' not sent" in note for note in kept.skipped), kept.skipped
    sent = run(target, FLAT, [step], scope=UNDECLARED)
    assert sent.finding is not None and sent.finding.kind == "crash" and "SIGABRT" in sent.finding.message
    after = run(target, FLAT, [r.decode(0, 0), r.decode(0)])
    assert after.finding is None


def test_OP_RM_a_rewind_below_the_small_sliding_cache_is_accepted(target: SubprocessTarget) -> None:
    """After 300 tokens a 256-cell sliding cache (swa_full false) no longer holds positions 0-43: seq_rm(0, 40)
    answers true and next_pos drops to 0 (the dense cache still holds 0-39). With swa_full (the default) the
    sliding cache is as large as the dense one, and the same program is served as the spec says."""
    program = [r.decode(*[0] * 60) for _ in range(5)] + [r.rm(0, 40), r.decode(0), r.decode(0)]
    result = run(target, ISWA_LONG, program)
    if mode(target) in SWA_SMALL:
        assert result.finding is not None and (result.finding.kind, result.finding.rule) == ("wrong", "OP-RM")
        assert "next_pos(0) is 0, the spec says 40" in result.finding.message
    else:
        assert result.finding is None, result.finding


def _repros() -> list[tuple[str, str]]:
    """docs/llamacpp-findings.md's python blocks: (the setup, each repro)."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).parent.parent / "docs" / "llamacpp-findings.md").read_text()
    setup, *repros = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    return [(setup, repro) for repro in repros]


@pytest.mark.parametrize("setup, repro", _repros(), ids=lambda block: block.splitlines()[0][:40])
def test_each_standalone_repro_of_the_findings_page_shows_its_finding(setup: str, repro: str) -> None:
    import subprocess
    expected = [line.split("# expect:", 1)[1].strip() for line in repro.splitlines() if "# expect:" in line]
    assert expected, "every repro says what it shows"
    done = subprocess.run([sys.executable, "-c", setup + "\n" + repro], capture_output=True, text=True, timeout=300)
    for want in expected:
        if want == "SIGABRT":
            assert done.returncode == -6 and "not reached" not in done.stdout, (done.returncode, done.stdout)
        else:
            assert want in done.stdout, (want, done.stdout, done.stderr[-500:])


def test_CELL_SHIFT_a_shift_of_one_sequence_and_the_cells_it_shares(target: SubprocessTarget) -> None:
    """One stream: a cell has one position for all its owners, so shifting seq 1 moves seq 0's shared tokens
    too. A stream per sequence: the fork copied them, and the shift moves seq 1's alone, as the spec says."""
    program = [r.decode(0, 0, 0), r.cp(0, 1), r.add(1, 0, None, 5), r.decode(0)]
    result = run(target, FLAT, program)
    if mode(target) in UNIFIED:
        assert result.finding is not None and (result.finding.kind, result.finding.rule) == ("wrong", "CELL-SHIFT")
        assert "next_pos(0) is 8, the spec says 3" in result.finding.message
    else:
        assert result.finding is None, result.finding


def test_CELL_SHIFT_a_context_shift_is_served_as_the_spec_says_on_flat_and_mixed_models(
        target: SubprocessTarget) -> None:
    program = [r.decode(0, 0, 0, 0, 0, 0), r.rm(0, 1, 3), r.add(0, 3, None, -2), r.decode(0), r.decode(0)]
    for cfg in (FLAT, r.recompute_config(256, 3, 0)):
        result = run(target, cfg, program)
        assert result.finding is None, result.finding
    assert "CELL-RECOMPUTE" in run(target, FLAT, program).exercised


def test_CELL_SHIFT_a_context_shift_on_a_model_of_sliding_layers_only_aborts(target: SubprocessTarget) -> None:
    """A gemma2 model of one (sliding) layer: the iSWA pair's dense cache holds no layer, and the decode after
    the shift aborts in ggml (GGML_ASSERT(buffer)) although llama_memory_can_shift answers true."""
    program = [r.decode(0, 0, 0, 0, 0, 0), r.rm(0, 1, 3), r.add(0, 3, None, -2), r.decode(0)]
    result = run(target, SLIDING, program)
    assert result.finding is not None and result.finding.kind == "crash" and "SIGABRT" in result.finding.message


def test_CELL_SHIFT_a_shift_below_0_is_served(target: SubprocessTarget) -> None:
    result = run(target, FLAT, [r.decode(0, 0, 0), r.add(0, 0, None, -1), r.decode(0)])
    assert result.finding is not None and (result.finding.kind, result.finding.rule) == ("lenient", "CELL-SHIFT")


# --- CELL-STATE: a sequence's state saved and restored (issue 42) ------------------------------------------------
ROUND_TRIPS = ("a sequence restored into itself after it went on", "a sequence restored into another, cleared",
               "a sequence restored after a clear", "a sequence restored over a live one", "a fork's state restored",
               "a state file restored into itself", "a state file restored into another")


def state_program(cfg: dict, name: str) -> list:   # type: ignore[type-arg]
    return dict(r.state_programs(cfg))[name]


def test_CELL_STATE_round_trips_are_served_as_the_spec_says(target: SubprocessTarget) -> None:
    """llama_state_seq_get_data / set_data and the state files: a sequence restored into itself after it went on,
    into another (cleared, or live: src/llama-kv-cache.cpp:2354 empties it first), after a clear, a fork's; every
    later decode equals its recompute over the saved rows."""
    for cfg in (FLAT, r.recompute_config(256, 0, 0), r.recompute_config(256, 3, 0)):
        for name in ROUND_TRIPS:
            result = run(target, cfg, state_program(cfg, name))
            assert result.finding is None, (name, cfg["layers"], result.finding)
            assert {"CELL-STATE", "CELL-RECOMPUTE"} <= result.exercised, name


@pytest.mark.parametrize("cfg", [SLIDING, r.recompute_config(256, 3, 0)])
def test_CELL_STATE_a_restored_sliding_sequence_rewound_has_lost_its_rows(target: SubprocessTarget,
                                                                          cfg: dict) -> None:   # type: ignore[type-arg]
    """The state leaves out the cells the sliding window masks (src/llama-kv-cache.cpp:2092): restored, the sliding
    cache holds the window only, and a rewind below it answers true with next_pos 0 while the dense cache keeps 0-1
    (cause 2's path, in every mode: swa_full sizes the cache, not what a state restores)."""
    result = run(target, cfg, state_program(cfg, "a restored sequence rewound"))
    assert result.finding is not None and (result.finding.kind, result.finding.rule) == ("wrong", "OP-RM")
    assert result.finding.detail == "after a state restored"
    assert "next_pos(0) is 0, the spec says 2" in result.finding.message


def test_CELL_STATE_an_empty_sequences_state_leaves_the_destination_as_it_was(target: SubprocessTarget) -> None:
    """A stream whose state holds no cell is skipped (src/llama-kv-cache.cpp:2179) before the destination is emptied
    (:2354): restoring an empty sequence's state over a live one keeps its tokens."""
    result = run(target, FLAT, state_program(FLAT, "an empty sequence's state restored over a live one"))
    assert result.finding is not None and (result.finding.kind, result.finding.rule) == ("wrong", "CELL-STATE")
    assert "next_pos(0) is 6, the spec says 0" in result.finding.message


def test_CELL_STATE_broken_states(target: SubprocessTarget) -> None:
    """A byte flipped is loaded (no checksum); cut short, set_data answers 0 after it changed the destination (one
    stream: emptied it; a stream per sequence: restored it), and a state file cut short aborts the process."""
    flipped = run(target, FLAT, state_program(FLAT, "a flipped state refused by an empty sequence"))
    assert flipped.finding is not None and (flipped.finding.kind, flipped.finding.rule) == ("lenient", "CELL-STATE")
    assert "the target accepted it: True" in flipped.finding.message
    cut = run(target, FLAT, state_program(FLAT, "a truncated state refused by a live sequence"))
    assert cut.finding is not None and (cut.finding.kind, cut.finding.rule) == ("lenient", "CELL-STATE")
    left = "next_pos(0) is 0" if mode(target) in UNIFIED else "next_pos(0) is 6"
    assert f"{left}, the spec says 7" in cut.finding.message, cut.finding.message
    cut_file = run(target, FLAT, state_program(FLAT, "a truncated state (a file) refused by an empty sequence"))
    assert cut_file.finding is not None and cut_file.finding.kind == "crash" and "SIGABRT" in cut_file.finding.message
