"""The public API for glue around a library's own KV cache (docs/your-library.md), imported from the one place the
page names, `kvcache_spec.conformance.op`: one test per helper, and the page's recipe end to end - a cache with no
length of its own, glued with these helpers only, is CONFORMING, and the same glue over a cache that drops a row
is not."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvcache_spec.conformance.op as public
from kvcache_spec.conformance.op import (EVERY_ROW, LOWER_RIGHT, UPPER_LEFT, LayerLengths, attended_rows,
                                         explicit_spec, layer_policies, library_target, refuse_outside_scope)
from kvcache_spec.conformance.engine import LENIENT, WRONG
from kvcache_spec.conformance.op.programs import op_config
from kvcache_spec.conformance.suite import CONFORMING, NOT_CONFORMING, replay, report_json, run_suite
from kvcache_spec.conformance.targets import PythonTarget

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_resolves_and_is_documented() -> None:
    """What the page lists is what the module exports, and each helper says what it does."""
    page = (ROOT / "docs" / "your-library.md").read_text()
    for name in public.__all__:
        assert hasattr(public, name), name
        assert f"`{name}" in page, f"docs/your-library.md does not name {name}"
        value = getattr(public, name)
        if callable(value) and name != "JsonConfig":
            assert (value.__doc__ or "").strip(), f"{name} has no docstring"


def test_library_target_declares_what_the_suite_reads() -> None:
    """library_target: the factory the user names after the colon - its name and doc, the contiguous op layout, the
    scope, the tensor kind only when asked - and calling it builds through `build` with the config."""
    built: list[dict[str, Any]] = []

    def build(cfg: dict[str, Any]) -> str:
        built.append(cfg)
        return "the cache"

    factory = library_target("mine", build, ("flat", "trusted-args"), "My library's cache.", tensors="torch")
    assert (factory.__name__, factory.__doc__) == ("mine", "My library's cache.")
    assert factory.kvcache_layout == "op-contiguous"   # type: ignore[attr-defined]
    assert factory.kvcache_scope == ("flat", "trusted-args", "spec=2")   # type: ignore[attr-defined]   # SCOPE-VERSION: written against spec 2
    assert factory.kvcache_tensors == "torch"   # type: ignore[attr-defined]
    assert factory({"n_layers": 1}) == "the cache" and built == [{"n_layers": 1}]
    assert not hasattr(library_target("plain", build, ("flat",), "numpy in"), "kvcache_tensors")


def test_layer_policies_gives_one_policy_per_layer() -> None:
    flat, ring = {"kind": "flat", "window": 0}, {"kind": "ring", "window": 3}
    assert layer_policies({"n_layers": 3, "layers": [ring]}) == [ring, ring, ring]
    assert layer_policies({"n_layers": 2, "layers": [flat, ring]}) == [flat, ring]
    with pytest.raises(ValueError, match="OP-CONFIG: layers"):
        layer_policies({"n_layers": 2, "layers": []})


def test_refuse_outside_scope_refuses_what_the_scope_leaves_out() -> None:
    """SCOPE-BORDER: a ring config for a flat-only scope, a keep without sinks, batch rows without batch are refused
    naming what is missing; a config inside the scope passes (a lazy-shapes config has no sizes to check)."""
    ring = {"n_layers": 1, "layers": [{"kind": "ring", "window": 2}], "batch_size": 1, "max_write": None}
    with pytest.raises(ValueError, match="SCOPE-BORDER: the config needs ring"):
        refuse_outside_scope(ring, ("flat", "trusted-args"))
    refuse_outside_scope(ring, ("flat", "ring", "trusted-args"))
    sinks = {**ring, "layers": [{"kind": "ring", "window": 3, "keep": 1}]}
    with pytest.raises(ValueError, match="needs sinks"):
        refuse_outside_scope(sinks, ("ring",))
    with pytest.raises(ValueError, match="needs batch"):
        refuse_outside_scope({**ring, "batch_size": 2}, ("ring",))
    refuse_outside_scope({"n_layers": 1, "layers": [{"kind": "flat", "window": 0}], "max_write": None},
                         ("flat", "lazy-shapes"))


def test_attended_rows_without_a_mask_follows_the_attention_call() -> None:
    """None: every row, torch SDPA's upper-left causal, or mlx's lower-right one (a step sees its history)."""
    assert attended_rows(None, 2, 3).all()
    assert attended_rows(None, 2, 3, UPPER_LEFT).tolist() == [[True, False, False], [True, True, False]]
    assert attended_rows(None, 2, 3, LOWER_RIGHT).tolist() == [[True, True, False], [True, True, True]]
    assert attended_rows(None, 1, 2, EVERY_ROW).tolist() == [[True, True]]
    with pytest.raises(ValueError, match="without_mask"):
        attended_rows(None, 1, 1, "causal")


def test_attended_rows_reads_bool_and_additive_masks_broadcast() -> None:
    """A bool mask as it is; an additive one blocks -inf, the dtype's minimum and -1e9, and attends 0 and a small
    bias; a [batch, 1, q_len, rows] mask is read for every head, and a shape that cannot broadcast raises."""
    bools = np.array([[[[True, False, True]]], [[[True, False, True]]]])   # batch 2, one head row
    assert attended_rows(bools, 1, 3).tolist() == [[True, False, True]]
    lowest = float(np.finfo(np.float32).min)
    additive = np.array([[0.0, -math.inf, lowest, -1e9, -0.5]], dtype=np.float32)
    assert attended_rows(additive, 1, 5).tolist() == [[True, False, False, False, True]]
    with pytest.raises(ValueError):
        attended_rows(np.ones((2, 4), dtype=bool), 2, 3)


def test_attended_rows_refuses_a_mask_that_differs_across_batch_rows() -> None:
    padded = np.array([[[True, True]], [[False, True]]])   # batch row 1 is left-padded
    with pytest.raises(ValueError, match="differs across batch rows"):
        attended_rows(padded, 1, 2)


def test_attended_rows_reads_a_torch_tensor() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the hf and upstream extras bring it)")
    mask = torch.tensor([[0.0, float("-inf")]], dtype=torch.bfloat16)
    assert attended_rows(mask, 1, 2).tolist() == [[True, False]]


def test_explicit_spec_is_an_explicit_attend_spec() -> None:
    rows = np.array([[True, False]])
    spec = explicit_spec(rows)
    assert spec.kind == "EXPLICIT" and spec.mask is rows


def test_layer_lengths_counts_what_the_caller_placed() -> None:
    lengths = LayerLengths(2)
    assert [lengths.position(0), lengths.used(1)] == [0, 0]
    lengths.advance(0, 3)
    lengths.advance(1, 3)
    lengths.advance(0, 1)
    assert [lengths.used(0), lengths.used(1), lengths.position(0)] == [4, 3, 4]
    lengths.trim(2)
    assert [lengths.used(0), lengths.used(1)] == [2, 1]
    with pytest.raises(ValueError, match="LayerLengths.trim"):
        lengths.trim(2)   # layer 1 holds 1: refused, nothing changed
    assert [lengths.used(0), lengths.used(1)] == [2, 1]
    with pytest.raises(ValueError, match="q_len"):
        lengths.advance(0, True)   # a bool is not a count
    lengths.reset()
    assert [lengths.used(0), lengths.used(1)] == [0, 0]
    with pytest.raises(ValueError, match="n_layers"):
        LayerLengths(0)


# --- the page's recipe end to end: a library whose cache keeps no length --------------------------------------

class PositionedBuffer:
    """A stand-in library cache in the style of litgpt's: a preallocated buffer, the caller passes the positions to
    write (no length of its own), and answers the whole buffer; the caller's mask says which rows hold tokens."""

    def __init__(self, rows: int, drop_first: bool = False) -> None:
        self.rows, self.drop_first = rows, drop_first
        self.k: Any = None
        self.v: Any = None

    def write(self, positions: list[int], k: Any, v: Any) -> tuple[Any, Any]:
        if self.k is None:
            self.k = np.zeros((*k.shape[:2], self.rows, k.shape[3]), np.float32)
            self.v = np.zeros((*v.shape[:2], self.rows, v.shape[3]), np.float32)
        self.k[:, :, positions] = k
        self.v[:, :, positions] = v
        if self.drop_first and positions[-1] >= 2:   # the defect: the first row is lost once a third token comes
            self.k[:, :, 0] = 0
        return self.k, self.v


class Glue:
    """The page's glue: the library's mask first (here the caller's causal mask over the buffer, as its generate
    loop builds it), then its update; the positions and used() from LayerLengths."""

    def __init__(self, cfg: dict[str, Any], drop_first: bool) -> None:
        self.cfg, self.drop_first, self.rows = cfg, drop_first, cfg["capacity"]
        self.caches = [PositionedBuffer(self.rows, drop_first) for _ in layer_policies(cfg)]
        self.lengths = LayerLengths(cfg["n_layers"])
        self.written = [0] * cfg["n_layers"]   # the rows ever written (what the stale-row stand-in attends)

    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, Any]:
        start, q_len = self.lengths.position(layer_id), k.shape[2]
        if start + q_len > self.rows:
            raise ValueError("the buffer is full")   # the library's own index error, as an exception
        keys, values = self.caches[layer_id].write(list(range(start, start + q_len)), k, v)
        self.written[layer_id] = max(self.written[layer_id], start + q_len)
        self.lengths.advance(layer_id, q_len)
        return keys, values, explicit_spec(attended_rows(self.mask(layer_id, start, q_len), q_len, self.rows))

    def mask(self, layer_id: int, start: int, q_len: int) -> Any:
        """The caller's causal mask over the buffer: query p attends rows 0..p."""
        return np.arange(self.rows)[None, :] <= np.arange(start, start + q_len)[:, None]

    def used(self, layer_id: int) -> int:
        return self.lengths.used(layer_id)

    def trim(self, n: int) -> None:   # a rollback is the caller's positions moving back; the rows are written over
        self.lengths.trim(n)

    def reset(self) -> None:
        self.__init__(self.cfg, self.drop_first)   # type: ignore[misc]   # a new cache, as a new conversation gets


class LitgptShapedRing(Glue):
    """litgpt 0.5.13's sliding layers in numpy: a ring of `window` rows written at position % window, answered up to
    the rows written, under the caller's causal mask cut by column - not by the positions the rows hold. A rollback
    after the ring wrapped leaves a query attending a rolled-back token's row."""

    def __init__(self, cfg: dict[str, Any], drop_first: bool) -> None:
        super().__init__(cfg, drop_first)
        self.ring_rows = [min(self.rows, p["window"]) if p["kind"] == "ring" else 0 for p in layer_policies(cfg)]
        self.caches = [PositionedBuffer(rows or self.rows) for rows in self.ring_rows]

    def update_and_fetch(self, layer_id: int, k: Any, v: Any, position: Any) -> tuple[Any, Any, Any]:
        rows = self.ring_rows[layer_id]
        if not rows:
            return super().update_and_fetch(layer_id, k, v, position)
        start, q_len = self.lengths.position(layer_id), k.shape[2]
        if start + q_len > self.rows:
            raise ValueError("past max_seq_length")
        keys, values = self.caches[layer_id].write([p % rows for p in range(start, start + q_len)], k, v)
        answered = min(start + q_len, rows)
        self.lengths.advance(layer_id, q_len)
        mask = np.arange(answered)[None, :] <= np.arange(start, start + q_len)[:, None]
        return keys[:, :, :answered], values[:, :, :answered], explicit_spec(attended_rows(mask, q_len, answered))


SCOPE = ("flat", "batch", "mla", "trim", "trusted-args", "lazy-shapes")
RING_SCOPE = ("ring", *SCOPE)


def _build(cfg: dict[str, Any]) -> Glue:
    refuse_outside_scope(cfg, SCOPE)   # the buffer has no sliding window
    return Glue(cfg, drop_first=False)


def _build_dropping(cfg: dict[str, Any]) -> Glue:
    refuse_outside_scope(cfg, SCOPE)
    return Glue(cfg, drop_first=True)

def _build_ring(cfg: dict[str, Any]) -> Glue:
    refuse_outside_scope(cfg, RING_SCOPE)
    return LitgptShapedRing(cfg, drop_first=False)


positioned = library_target("positioned", _build, SCOPE, "A positioned buffer without a length, glued by the page.")
positioned_dropping = library_target("positioned_dropping", _build_dropping, SCOPE, "The same, losing row 0.")
litgpt_shaped = library_target("litgpt_shaped", _build_ring, RING_SCOPE, "litgpt's sliding layers, in numpy.")


@pytest.mark.slow
def test_the_pages_recipe_judges_a_cache_without_a_length() -> None:
    """OP-ATTEND: glue written with the public helpers only over a cache that keeps no length is CONFORMING (strict,
    whole coverage), and the same glue over a cache that loses a row is NOT CONFORMING, wrong on OP-ATTEND."""
    report = report_json(run_suite(PythonTarget(f"python:{__name__}:positioned"), "quick"), strict=True,
                         exact_layout=False)
    assert report["verdict"] == CONFORMING and report["coverage"]["complete"], (report["verdict"], report["coverage"])
    result = run_suite(PythonTarget(f"python:{__name__}:positioned_dropping"), "quick")
    assert (WRONG, "OP-ATTEND") in result.findings and result.verdict() == NOT_CONFORMING


@pytest.mark.slow
def test_the_litgpt_shaped_ring_is_found_as_litgpt_was() -> None:
    """OP-ATTEND: the page's process finds on litgpt's sliding layers in numpy what it found on litgpt - the chunk
    served from a wrapped ring, the rollback past it - and no other kind of cause than the lenient trim of issue 41
    (tests/test_trim_kept_rows.py), whichever way OP-TRIM's optional trims are settled."""
    result = run_suite(PythonTarget(f"python:{__name__}:litgpt_shaped"), "quick")
    assert (WRONG, "OP-ATTEND") in result.findings, sorted(result.findings)
    assert set(result.findings) <= {(WRONG, "OP-ATTEND"), (LENIENT, "OP-TRIM")}, sorted(result.findings)


class StaleRows(Glue):
    """A caller whose mask covers every row ever written, and a trim that takes any count back to 0."""

    def mask(self, layer_id: int, start: int, q_len: int) -> Any:
        return np.arange(self.rows)[None, :] < max(self.written[layer_id], start + q_len)

    def trim(self, n: int) -> None:
        self.lengths.held = [max(0, held - n) for held in self.lengths.held]


def _build_stale(cfg: dict[str, Any]) -> Glue:
    return StaleRows(cfg, drop_first=False)


stale_rows = library_target("stale_rows", _build_stale, ("flat", "trim", "lazy-shapes"), "Attends given-up rows.")


def test_a_given_up_token_attended_is_named_so_not_as_never_written() -> None:
    """SAFE-OP-ISOLATION's words (met on litgpt): past a lenient trim (n one past the held tokens, accepted), a query
    attending a token its own sequence wrote and gave up is told so - not that the sequence "neither wrote it nor
    was forked from its writer", which is false."""
    steps = [{"op": "fetch", "layer": 0, "positions": [p]} for p in range(3)] + \
        [{"op": "trim", "n": 0, "clause": "op.trim.n", "variant": "above"}, {"op": "fetch", "layer": 0, "positions": [0]}]
    found = replay(PythonTarget(f"python:{__name__}:stale_rows"), op_config(4, (0,)), steps)
    assert found is not None and "after the lenient OP-TRIM" in found["message"], found
    assert "token 1, which sequence 0 wrote and no longer holds" in found["message"], found
    assert "neither wrote it" not in found["message"], found
