"""Consequences: past a lenient or over-strict step, the program goes on with that step applied.

A lenient step is a call the spec rejects that the target served; the model cannot follow it (it has
no answer for a state the spec never enters). Ending the program there would grade only the entry:
upstream's cell cache lets `seq_rm` run between `declare_step` and `place_step`, the removed id still
gets a cell, and `seq_new()` hands the id out again owning that cell - a cross-sequence leak that a
lenient CELL-FORWARD finding alone does not show. So the harness keeps driving the target and judges
only what must hold *whatever the caller did*: the safety properties below, checked on the target's
own answers and on the harness's data-level pools (every CellStep is still executed). A broken one
is a **wrong** finding under the rule it protects, naming the step that led there (`Finding.after`).

How the rest of the program is driven: arguments resolve against the target's own answers (its
`live()`, `next_pos`, `free_cells()`; a sequence cache's length), not the model's; every answer is
accepted as it is. In the cell layout writers are tracked by *incarnation*: every id the target hands
out (seq_new, seq_clone) starts a new one, so an id handed out again is another sequence; a fork may
read what its source's lineage wrote (the cut is not judged here - that is CELL-FORK's lockstep). In
the sequence layout the harness keeps its own truth - the content last written at each position by
the steps the target accepted, a gap where its length moved past what was written - and executes
every plan on the target's pools against it; bare commits are not replayed (their forged plans come
from the model). A consequence counts only when the program without its entry step is judged and shows no wrong
answer or crash (otherwise it is a defect of its own, reported by the lockstep, or a call outside the declared
scope explains it: the program is unjudged from there; suite/shrink.py, `blame`). Stated in docs/conformance.md,
"How the suite judges a program".
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .engine import CRASH, WRONG, Caller, Finding, Step, Stop, _show
from .targets import Outcome, TargetCrash


# A break's words when a query attends a token that only a call the target did not accept (a refusal) sent: that
# call explains it, whatever the program without it shows (suite/shrink.py, `blame`).
UNACCEPTED_TOKEN = "which no call the target accepted wrote"


@dataclass(frozen=True)
class Safety:
    id: str
    rule: str         # the rule of the spec it protects (a broken one is a wrong finding of this rule)
    statement: str
    why: str


SAFETY: tuple[Safety, ...] = (
    Safety("SAFE-ISOLATION", "CELL-DATA-SOUND",
           "(Cell layout) A query token attends only cells the harness saw written, by its own sequence (this "
           "incarnation "
           "of its id) or a sequence it was forked from, at positions not after its own.",
           "Attending another sequence's cell is the leak every other CELL- rule exists to prevent."),
    Safety("SAFE-SELF", "CELL-MASK",
           "(Cell layout) Each query token attends its own cell, the one its CellStep places it in.",
           "A token's own key is always inside its window and its sequence; attention without it is wrong "
           "whatever came before (the stale mask of a forward a verb interrupted)."),
    Safety("SAFE-NEW-EMPTY", "CELL-ID-REUSE",
           "(Cell layout) A sequence id just handed out by seq_new() owns no cell: seq_len 0, next_pos 0.",
           "An id handed out again with a cell of its previous holder gives that holder's keys to a stranger."),
    Safety("SAFE-NO-STRAY", "CELL-ID-REUSE",
           "(Cell layout) Every occupied cell is owned by a live sequence: capacity - free_cells() <= the sum of "
           "seq_len "
           "over live(), and nothing is occupied once no sequence is live.",
           "An occupied cell no live sequence owns is lost to every sequence, or owned by an id that is "
           "not live and will be handed out again with it."),
    Safety("SAFE-RANGE", "CELL-OWNERS",
           "(Cell layout) Counts and positions stay in range: live() holds distinct ids in [0, max_seqs); "
           "free_cells(), "
           "used_end() and each seq_len in [0, capacity]; each next_pos in [0, INT_MAX].",
           "A runner continues from next_pos and seq_len: an overflowed next_pos (a position INT_MAX "
           "accepted) sends the next token to a negative position."),
    Safety("SAFE-READS", "DATA-SOUND",
           "(Sequence layout) Every row a plan reads holds the content last written at its position by the steps "
           "the target accepted; a position no step wrote (a gap, a length moved by a commit) is never read.",
           "A read of a row never written, or overwritten, is attention over garbage, whatever the caller asked."),
    Safety("SAFE-LENGTH", "LEN-BOUNDS",
           "(Sequence layout) length() stays in [0, capacity].",
           "A runner sizes its next step from the length."),
    Safety("SAFE-OP-ISOLATION", "OP-ATTEND",
           "(Op face) A query attends only rows holding one token's K and V, written for this batch row and head "
           "by an update_and_fetch naming this layer, of the query's own sequence or one it was forked from "
           "(seq_cp), at a position not after the query's.",
           "Attention over another sequence's keys, another layer's or a later position's is a leak or garbage, "
           "whatever the caller did."),
    Safety("SAFE-OP-SELF", "OP-ATTEND",
           "(Op face) Each query at a position in [0, 2**31 - 2] attends its own token: the row holding the K and "
           "V this very update_and_fetch wrote for it on this layer, batch row and head.",
           "A query's own token is always inside its window and its sequence; attention without it is wrong "
           "whatever came before (a reset that kept a stale length left a ring query attending nothing)."),
    Safety("SAFE-OP-COMPLETE", "OP-ATTEND",
           "(Op face) A query attends every token its sequence holds in its span (at a position not after its own, "
           "inside its window) that every layer got from a well-formed update_and_fetch the target accepted, and "
           "that no verb the target accepted removed since (the query's own call's tokens up to it included).",
           "A cache that accepted a step owes every later query what it accepted: silently dropping an in-window "
           "token (a ring that rolls past a bound it never refused) is wrong attention, whatever came before."),
    Safety("SAFE-OP-KEEP", "OP-ATTEND",
           "(Op face, cell cache) A forward never lowers the seq_len of a sequence with no token in it.",
           "A sequence's tokens are its own: a write of other sequences that takes one of its cells makes its "
           "queries miss context it holds."),
    Safety("SAFE-STEP-SHAPE", "CELL-STEP-SHAPE",
           "(Cell layout) A CellStep has one cell per declared token, distinct, inside [0, read_len), "
           "read_len <= capacity, "
           "and length x read_len mask bytes of 0 or 1.",
           "The backend indexes the mask and gathers the cells without checks."),
    Safety("SAFE-PAGED-DATA", "PAGED-DATA-SOUND",
           "(Paged layout) Whatever a call the spec refuses did, every position a live request reads still maps to a "
           "slot holding its own K/V, and the pool's counts still add up (read back from the target's tables).",
           "A double free or a malformed admission served must not hand another request's K/V to a live one."),
    Safety("SAFE-ONE-HISTORY", "CELL-RECOMPUTE",
           "(Cell cache seen through outputs) After a seq_cp onto a destination holding tokens was served, the "
           "destination's next token attends one history: its output is the recompute over its own rows or over the "
           "copied ones.",
           "A query attending two rows at one position (a merged fork) computes attention over a history no "
           "sequence ever had."),
)
BY_ID = {safety.id: safety for safety in SAFETY}


class Consequences:
    """Drives the rest of a program past the entry step of `engine`, judging only SAFETY. The layouts'
    drivers say what the entry did (`after_entry`), how a step runs (`run_step`) and what is judged at
    the end (`check_table`)."""

    atomic_rule = "ATOMIC"   # the rule a call of the drive is made under (a crash there names it)

    def __init__(self, engine: Caller, entry: Finding) -> None:
        self.engine: Caller = engine
        self.entry = entry
        self.call = engine.judged   # the entry's call and its answer
        method = self.call[0] if self.call else "create"
        self.after = f"{entry.kind} {entry.rule} in {method}"   # the kind of entry: part of a cause
        self.entry_text = f"{entry.kind} {entry.rule} step {entry.step_index}, {self._entry_call()}"
        self.steps: list[Step] = list(engine.result.steps)
        self.entry_at = len(self.steps) - 1   # the entry's index in the concrete steps (the last the lockstep ran)

    def _entry_call(self) -> str:
        return f"{self.call[0]}({_show(self.call[1])})" if self.call is not None else "create"

    # --- the verdicts ------------------------------------------------------------------------------------
    def _broken(self, safety: str, message: str, rule: str = "") -> Stop:
        return Stop(Finding(WRONG, rule or BY_ID[safety].rule, f"{safety} broken after the {self.entry_text}: "
                                                               f"{message}", self.engine.index, after=self.after,
                            after_index=self.entry_at, safety=safety))

    def _ask(self, method: str, args: dict[str, Any]) -> Outcome:
        """One call of the drive. Its answer is judged by the SAFE- properties only (not by the lockstep's
        answer types: past a lenient step, a length of True is a value to range-check, not a protocol
        break); a crash is still a crash, naming the entry."""
        self.engine.result.calls += 1
        try:
            return self.engine.target.call(method, args)
        except TargetCrash as crash:
            raise Stop(Finding(CRASH, self.atomic_rule, f"after the {self.entry_text}: {method}({_show(args)}): "
                                                        f"{crash}", self.engine.index, after=self.after,
                               after_index=self.entry_at)) from None

    def _int(self, method: str, args: dict[str, Any]) -> Optional[int]:
        got = self._ask(method, args)
        return got.value if got.ok and type(got.value) is int else None

    # --- the drive -----------------------------------------------------------------------------------
    def drive(self, rest: list[tuple[int, Step]]) -> None:
        """Apply the entry's own effect, then each later step; set the engine's consequence on a breach."""
        engine = self.engine
        try:
            self.after_entry()
            for engine.index, step in rest:
                self.run_step(step)
            engine.index = rest[-1][0] if rest else engine.index
            self.finish()
            self.check_table("at the end of the program")
        except Stop as stop:
            engine.result.consequence = stop.finding
            engine.result.consequence_steps = self.steps
        except (TypeError, ValueError, KeyError, IndexError) as error:
            # answers of a shape the driver cannot follow (the lockstep already reported the entry):
            # said in the report, never a silent pass
            engine.result.skipped.add(f"consequences past a {self.after} step not followed to the end: "
                                      f"{type(error).__name__}: {error}")

    def after_entry(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Past the program's last step: what a runner would do next, when the program stops short of it."""

    def run_step(self, step: Step) -> None:
        raise NotImplementedError

    def check_table(self, context: str) -> None:
        raise NotImplementedError

    @staticmethod
    def rest(program: list[Step], entry: Finding) -> list[tuple[int, Step]]:
        """The steps after the entry, with their indices: what the drive runs."""
        return list(enumerate(program))[entry.step_index + 1:]
