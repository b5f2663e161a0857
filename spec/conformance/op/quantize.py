"""OP-QUANTIZE on the op engine: a contiguous cache quantized mid-generation, every later answer read within the bound.

A program's `quantize` step calls the target's `quantize(bits)`. Past it the engine reads every row within the
rule's bound instead of exactly: an element written as the label x of a row whose labels span [low, high] must
read back within (high - low) / (2 (2^bits - 1)) of x, plus float32 rounding (`Labels.bits`). The exact labels
of a row are consecutive integers (its dims), so the span is the row's width less one, and the engine sends
no fewer bits than make that bound below a half (2^bits > width): a row is still read as exactly one token's.
The model (op_model.OpModel.quantize) keeps the positions, lengths and masks as they were, so a conversion
that drops or shifts a row, or rounds coarser than its bits, is wrong at the next observation or answer.

Sent only to a contiguous target declaring the `quantize` feature (scope.py), and not to one declaring
`lossy=<tol>`, whose row codes are read within its own tolerance already (said in the skipped notes); for
another the steps are left out of the program up front (programs.sent_contiguous).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ... import op_model
from .. import scope as scopes
from ..engine import NOT_SENT, Step
from ..malform import case_of, int_value

if TYPE_CHECKING:
    from .engine import OpEngine

FEATURE = QUANTIZE = "quantize"
RULE = "OP-QUANTIZE"
DEFAULT_BITS = 4


def quantize(bits: Any = DEFAULT_BITS, **extra: Any) -> Step:
    """OP-QUANTIZE: quantize(bits) (a well-formed bits is raised, when the step runs, to what the labels need)."""
    return {"op": QUANTIZE, "bits": bits, **extra}


def readable_bits(bits: int, width: int) -> Optional[int]:
    """The least bits >= `bits` whose bound over a row of `width` consecutive labels is below a half (2^bits >
    width), or None past the most bits quantize takes."""
    for candidate in op_model.QUANTIZE_BITS:
        if candidate >= bits and (1 << candidate) > width:
            return candidate
    return None


def quantize_step(engine: "OpEngine", step: Step) -> Optional[Step]:
    """Run a quantize step (OP-QUANTIZE); NOT_SENT when the target is not judged on it."""
    if FEATURE not in engine.scope_features() or engine.kind != op_model.CONTIGUOUS:
        engine.result.skipped.add(f"scope: quantize steps not sent: the target's scope leaves out '{FEATURE}' "
                                  f"({scopes.OP_FEATURES[FEATURE]})")
        return NOT_SENT
    if engine.declared_scope().lossy is not None:
        engine.result.skipped.add(f"scope: quantize steps not sent: the target declares '{scopes.LOSSY}' (its rows "
                                  "are read within its own tolerance)")
        return NOT_SENT
    pending = engine.model.step
    if pending is not None and pending.served and engine._excused("steps", "a quantize in the middle of a step"):
        return None
    case = case_of(step)
    cfg = engine.mcfg
    if case is not None and case.clause.call == QUANTIZE:
        bits = int_value(case.clause, case.variant, above=op_model.QUANTIZE_BITS[-1] + 1)
    else:
        asked = step.get("bits")
        readable = readable_bits(asked, max(cfg.head_dim, cfg.v_head_dim)) if type(asked) is int else asked
        if readable is None:
            engine.result.skipped.add("harness: a quantize of rows wider than 2^8 - 1 labels not judged")
            return None
        bits = readable
    args = {"bits": bits}
    concrete: Step = {**step, "bits": bits}
    engine.current = concrete
    before = engine.model.abandoned
    engine.before_call = engine.model.snapshot()
    rejected = engine.model.quantize(bits)
    engine.result.exercised.add(RULE)
    if rejected is not None and rejected.case != "twice" and scopes.TRUSTED_ARGS in engine.relaxed:
        engine.result.skipped.add("scope: quantize steps with a malformed bits not sent: the target's scope "
                                  f"declares '{scopes.TRUSTED_ARGS}'")
        return NOT_SENT
    if rejected is not None:
        engine._refused(QUANTIZE, args, rejected, concrete)
        return concrete
    if engine.model.abandoned != before and engine._excused("steps", "a step abandoned partway"):
        return None
    engine.labels.bits = bits
    engine.quantized_uids = set(engine.model.held.get(0, {}))
    engine._accepted(QUANTIZE, args, "OP-STEP" if engine.model.abandoned != before else RULE)
    return concrete


def quantize_programs(cfg: dict[str, Any]) -> list[tuple[str, list[Step]]]:
    """OP-QUANTIZE's edges on a contiguous config: a conversion after a prefill, then decodes (past a ring's
    window); one of an empty cache; one mid-step; a trim and a reset after one; a second quantize refused; each
    malformed bits refused, nothing changed, every later answer judged."""
    from ..malform import cases
    from .programs import RESET, fetch, forward, malformed_call, trim_most

    layers, cap = cfg["n_layers"], cfg["capacity"]
    window = max([entry["window"] for entry in cfg["layers"] if entry["kind"] == "ring"], default=1)
    prefill = forward(cfg, min(3, cap - 1))
    decodes = forward(cfg, 1) * max(1, min(cap - 4, window + 1))
    out = [("quantized after a prefill, then decodes", prefill + [quantize()] + decodes),
           ("quantized to 8 bits", forward(cfg, 1) + [quantize(8)] + forward(cfg, 1) * 2),
           ("an empty cache quantized", [quantize(2)] + forward(cfg, min(2, cap - 1)) + forward(cfg, 1)),
           ("a reset keeps the cache quantized", prefill + [quantize(), RESET] + forward(cfg, 2)),
           ("a second quantize refused", forward(cfg, 1) + [quantize(), quantize(8)] + forward(cfg, 1)),
           ("a trim after a quantize", prefill + [quantize(), trim_most(1)] + forward(cfg, 1))]
    if layers > 1:
        out.append(("quantized mid-step", forward(cfg, 1) + [fetch(0), quantize()] + forward(cfg, 1)))
    for case in cases("op-contiguous", cfg):
        if case.clause.call == QUANTIZE:
            out.append((f"malformed {case.name}", forward(cfg, 1) + malformed_call(cfg, case) + forward(cfg, 1)))
    return out
