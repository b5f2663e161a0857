"""The golden vectors: committed == generated from the model, well formed, covering every observable
rule and every real-world bug class; the reference replays them all, a broken cache does not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvcache_spec.conformance import vectors
from kvcache_spec.conformance.sequence import vectors as sequence_vectors
from kvcache_spec.conformance.targets import PythonTarget
from kvcache_spec.rules import DECLARATION_RULES, RULES

DOCUMENT: dict[str, Any] = json.loads((vectors.VECTORS_DIR / vectors.VECTORS_FILE).read_text())


def test_committed_vectors_match_the_model() -> None:
    assert vectors.main(["--check"]) == 0, "run `kvcache vectors` and commit spec/vectors/"


def test_check_detects_drift(tmp_path: Path) -> None:
    for name in (*vectors.vector_files(), vectors.SCHEMA_FILE):
        shutil.copy(vectors.VECTORS_DIR / name, tmp_path / name)
    assert vectors.main(["--check", "--out", str(tmp_path)]) == 0
    original = (tmp_path / vectors.VECTORS_FILE).read_text()
    text = original.replace('"result": true', '"result": false', 1)
    assert text != original
    (tmp_path / vectors.VECTORS_FILE).write_text(text)
    assert vectors.main(["--check", "--out", str(tmp_path)]) == 1


DOCUMENTS = {name: json.loads((vectors.VECTORS_DIR / name).read_text()) for name in vectors.vector_files()}


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_the_document_follows_its_schema(name: str) -> None:
    """A structural check of schema.json's required fields (no jsonschema dependency)."""
    DOCUMENT = DOCUMENTS[name]
    schema = json.loads((vectors.VECTORS_DIR / vectors.SCHEMA_FILE).read_text())
    assert set(schema["required"]) <= set(DOCUMENT)
    assert DOCUMENT["formatVersion"] == schema["properties"]["formatVersion"]["const"] == vectors.FORMAT_VERSION
    ids = [t["tcId"] for g in DOCUMENT["testGroups"] for t in g["tests"]]
    assert ids == list(range(1, len(ids) + 1)) and DOCUMENT["numberOfTests"] == len(ids)
    methods = set(schema["$defs"]["call"]["properties"]["method"]["enum"])
    for group in DOCUMENT["testGroups"]:
        for t in group["tests"]:
            assert set(schema["$defs"]["test"]["required"]) <= set(t)
            assert t["result"] in ("valid", "invalid", "acceptable") and t["comment"] and t["flags"]
            assert all(flag in DOCUMENT["notes"] for flag in t["flags"])
            for call in t["calls"]:
                assert call["method"] in methods and len(call["expect"]) == 1
                assert next(iter(call["expect"])) in ("result", "refused", "rejected")
            kinds = {next(iter(c["expect"])) for c in t["calls"]}
            assert t["result"] == ("invalid" if "rejected" in kinds else "acceptable" if "refused" in kinds
                                   else "valid")


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_every_rule_is_covered_or_explained(name: str) -> None:
    """Each file covers its layout's rules; the other layout's rules point to the file that covers them."""
    DOCUMENT = DOCUMENTS[name]
    flags = {flag for g in DOCUMENT["testGroups"] for t in g["tests"] for flag in t["flags"]}
    for rule in RULES:
        if rule.id.startswith("CELL-"):
            continue   # the cell layout's rules: not this (sequence-cache) document's to cover
        assert rule.id in flags or rule.id in DOCUMENT["notCovered"], rule.id
    elsewhere = {rule for rule, why in DOCUMENT["notCovered"].items() if "covers it" in why}
    op_face = {rule.id for rule in RULES if rule.id.startswith("OP-")}   # tensors: the op-face layouts check them
    assert op_face and all("op-face conformance" in DOCUMENT["notCovered"][rule] for rule in op_face)
    # the cell layout seen through its outputs (SPEC.md 5.3): the target's own outputs, no golden answer
    recompute = {"CELL-RECOMPUTE", "CELL-KEEP", "CELL-SHIFT", "CELL-STATE"}
    assert all("seen through its outputs" in DOCUMENT["notCovered"][rule] for rule in recompute)
    # the scope rules that bind the suite, not a call (SPEC.md 6.1): no golden answer either
    declarations = set(DECLARATION_RULES)
    assert all("declaration rule" in DOCUMENT["notCovered"][rule] for rule in declarations)
    # the paged layout (SPEC.md part 7): block ids are the target's own, no golden answer
    paged = {rule.id for rule in RULES if rule.id.startswith("PAGED-")}
    assert paged and all("paged layout" in DOCUMENT["notCovered"][rule] for rule in paged)
    assert set(DOCUMENT["notCovered"]) - elsewhere == {"ET-MAP", "REG-KEYS", "REG-SESSION", "THREADS"} | op_face \
        | recompute | declarations | paged
    for rule in elsewhere:   # covered there, for real
        other = DOCUMENTS[vectors.VECTORS_FILE if name == vectors.CELL_VECTORS_FILE else vectors.CELL_VECTORS_FILE]
        assert any(rule in t["flags"] for g in other["testGroups"] for t in g["tests"]), rule


def test_every_bug_class_has_a_vector() -> None:
    flags = {flag for g in DOCUMENT["testGroups"] for t in g["tests"] for flag in t["flags"]}
    assert set(sequence_vectors.BUG_CLASSES) <= flags, set(sequence_vectors.BUG_CLASSES) - flags


@pytest.mark.parametrize("target", ["python:kvcache:SequenceCache", "python:kvcache_spec.conformance.zoo:faithful"])
def test_conforming_caches_replay_every_vector(target: str) -> None:
    passed, failures, skipped = vectors.replay_vectors(PythonTarget(target), DOCUMENT)
    border = [t for g in DOCUMENT["testGroups"] for t in g["tests"] if "SCOPE-BORDER" in t["flags"]]
    assert failures == [] and passed == DOCUMENT["numberOfTests"] - len(border) and skipped == len(border)


@pytest.mark.parametrize("mutant, flag", [("upstream_floor", "UPSTREAM-UNSOUND-FLOOR"),
                                          ("accepts_gap", "UPSTREAM-NO-APPEND-CHECK"),
                                          ("read_base_off_by_one", "BUG-WINDOW-OFF-BY-ONE"),
                                          ("refuses_exact_capacity", "BUG-EXACT-CAPACITY-REFUSED")])
def test_a_broken_cache_fails_the_vectors_that_target_its_bug(mutant: str, flag: str) -> None:
    target = PythonTarget(f"python:kvcache_spec.conformance.zoo:{mutant}")
    flagged = {t["tcId"] for g in DOCUMENT["testGroups"] for t in g["tests"] if flag in t["flags"]}
    _, failures, _ = vectors.replay_vectors(target, DOCUMENT)
    failed = {int(message.split()[1]) for message in failures}
    assert failed & flagged, (flag, failures[:3])
