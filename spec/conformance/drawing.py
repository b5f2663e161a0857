"""The pictures of a finding, as inline SVG drawn from the JSON report alone (no target, no model): its program as a
timeline of steps, the attend grid of a wrong answer, and the cache's cells at the failing step.

Each layout draws its own cells: `CELL_DRAWINGS` maps the `layout` a finding's `picture["cells"]` names to its
drawing function, so a new layout (a paged cache's blocks and block tables, say) adds one entry - its engine writes
`{"cells": {"layout": "paged", ...}}` into the findings it raises, and `draws_cells("paged")` registers the function
that draws that dict - and nothing else here changes. A picture no drawing knows is shown as its JSON.
"""

from __future__ import annotations

import json
import textwrap
from html import escape
from typing import Any, Callable

CellDrawing = Callable[[dict[str, Any]], str]
CELL_DRAWINGS: dict[str, CellDrawing] = {}

# A grid cell's state: which of the two lets the query attend the token. The colours are the page's CSS classes.
BOTH, SPEC_ONLY, TARGET_ONLY, NEITHER = "both", "spec-only", "target-only", "neither"
GRID_LEGEND = {BOTH: "spec and target", SPEC_ONLY: "spec only", TARGET_ONLY: "target only", NEITHER: "neither"}
# Past a lenient or over-strict step there is no spec answer: the grid is against what the query may attend (safety)
SAFETY_LEGEND = {BOTH: "may attend, attends", SPEC_ONLY: "may attend, does not", TARGET_ONLY: "attends, may not",
                 NEITHER: "neither"}
SIZE = 34          # a grid cell's side, px
STEP_WIDTH = 118   # a timeline step's box width, px


def draws_cells(layout: str) -> Callable[[CellDrawing], CellDrawing]:
    """Register the drawing of the cells picture a layout's findings carry (`picture["cells"]["layout"]`)."""
    def register(function: CellDrawing) -> CellDrawing:
        CELL_DRAWINGS[layout] = function
        return function
    return register


def _text(x: float, y: float, words: Any, css: str = "", anchor: str = "middle") -> str:
    css_class = f' class="{css}"' if css else ""
    return f'<text x="{x:g}" y="{y:g}" text-anchor="{anchor}"{css_class}>{escape(str(words))}</text>'


def _wide(words: str) -> float:
    """A title's width in px, about (12 px bold text)."""
    return 8 + 7.2 * len(words)


def _svg(width: float, height: float, body: list[str], label: str, css: str) -> str:
    return (f'<svg class="{css}" role="img" aria-label="{escape(label)}" width="{width:g}" height="{height:g}" '
            f'viewBox="0 0 {width:g} {height:g}" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


# --- the timeline ------------------------------------------------------------------------------------------------
def step_kind(step: dict[str, Any]) -> str:
    """What a step is on the timeline: a refusal (the target refused it), a trim (a verb that removes rows),
    a fork (a verb that shares a sequence's rows), a reset, or a call."""
    op = str(step.get("op", ""))
    if "refused_with" in step:
        return "refusal"
    if op in ("trim", "rm", "rewind", "seq_rm", "seq_keep", "truncate"):
        return "trim"
    if op in ("cp", "fork", "clone", "seq_cp", "seq_clone"):
        return "fork"
    if op in ("reset", "clear"):
        return "reset"
    return "call"


def step_words(step: dict[str, Any]) -> str:
    """A step in a few words: its op, then its other fields as key=value (a malformed call's clause last)."""
    fields = [f"{key}={json.dumps(value)}" for key, value in step.items()
              if key not in ("op", "clause", "variant", "refused_with")]
    broken = f" <{str(step['clause']).removeprefix('op.')} {step.get('variant', '')}>" if step.get("clause") else ""
    return f"{step.get('op', '?')} {' '.join(fields)}{broken}".strip()


def timeline(steps: list[dict[str, Any]], failing: int) -> str:
    """The program left to right: create, then each step as a box coloured by its kind; the failing step outlined."""
    boxes = [("create", "create", "")] + [(step_words(step), step_kind(step), str(step.get("refused_with", "")))
                                          for step in steps]
    per_row = 7
    rows = (len(boxes) + per_row - 1) // per_row
    body = []
    for n, (words, kind, refused) in enumerate(boxes):
        x, y = 4 + (n % per_row) * (STEP_WIDTH + 14), 4 + (n // per_row) * 70
        failed = n - 1 == failing
        body.append(f'<g class="step {kind}{" failing" if failed else ""}" data-step="{n - 1}">'
                    f'<title>{escape(words + (" - refused: " + refused if refused else ""))}</title>'
                    f'<rect x="{x}" y="{y}" width="{STEP_WIDTH}" height="56" rx="6"/>')
        body.append(_text(x + STEP_WIDTH / 2, y + 15, "create" if n == 0 else f"step {n - 1}: {kind}", "small"))
        for line, part in enumerate(_lines(words, 18, 2)):
            body.append(_text(x + STEP_WIDTH / 2, y + 31 + 13 * line, part, "mono"))
        body.append("</g>")
        if n % per_row != per_row - 1 and n + 1 < len(boxes):
            body.append(f'<path class="arrow" d="M{x + STEP_WIDTH + 1},{y + 28} h11"/>')
    width = 8 + min(len(boxes), per_row) * (STEP_WIDTH + 14)
    return _svg(width, rows * 70 + 4, body, f"the program, {len(steps)} steps", "timeline")


def _lines(words: str, width: int, most: int) -> list[str]:
    """At most `most` lines of about `width` characters, broken at spaces where it can; an ellipsis if cut."""
    parts = textwrap.wrap(words, width) or [""]
    return parts[:most - 1] + [parts[most - 1][:width - 1] + "…"] if len(parts) > most else parts


# --- the attend grid ---------------------------------------------------------------------------------------------
def grid_cells(attend: dict[str, Any]) -> list[tuple[int, str, str]]:
    """Every drawn cell of an attend picture as (query, column key, state): a token column is "t<uid>", a row of the
    target's answer that holds no one token's K and V is "row<r>" (the target attends it, the spec cannot)."""
    columns = [f"t{token['token']}" for token in attend["tokens"]] + \
        [f"row{row}" for row in sorted({r for rows in attend["unreadable"] for r in rows})]
    cells = []
    for i in range(len(attend["queries"])):
        spec = set(attend["spec"][i] or [])
        target = set(attend["target"][i]) | {-1 - row for row in attend["unreadable"][i]}
        for key in columns:
            ident = int(key[1:]) if key[0] == "t" else -1 - int(key[3:])
            state = (BOTH if ident in target else SPEC_ONLY) if ident in spec else \
                TARGET_ONLY if ident in target else NEITHER
            cells.append((i, key, state))
    return cells


def attend_grid(attend: dict[str, Any]) -> str:
    """Queries (rows) x tokens (columns) of one answer at one layer, batch row and head, each cell coloured by who
    lets the query attend the token; labelled by position and sequence; the failing query outlined."""
    cells = grid_cells(attend)
    columns = list(dict.fromkeys(key for _, key, _ in cells))
    tokens = {f"t{token['token']}": token for token in attend["tokens"]}
    cell_layout = bool(attend.get("sequences"))   # a cell cache's: label queries and tokens by sequence too
    left, top = 128, 70
    legend = SAFETY_LEGEND if attend.get("expected_by") == "safety" else GRID_LEGEND
    title = f"layer {attend['layer']}, batch row {attend['batch']}, head {attend['head']}: queries x tokens"
    width = max(left + max(len(columns), 1) * SIZE + 12, _wide(title))
    height = top + len(attend["queries"]) * SIZE + 30
    body = [_text(4, 14, title, "head", "start")]
    for c, key in enumerate(columns):
        x = left + c * SIZE + SIZE / 2
        token = tokens.get(key)
        if token is None:
            body.append(_text(x, top - 25, key.replace("row", "r"), "label"))
            body.append(_text(x, top - 8, "?", "label"))
            continue
        body.append(_text(x, top - 40, f"t{token['token']}", "label"))
        body.append(_text(x, top - 25, "p?" if token["position"] is None else f"p{token['position']}", "label"))
        if cell_layout:
            body.append(_text(x, top - 8, "s" + ",".join(str(seq) for seq in token["seqs"]) if token["seqs"] else "-",
                              "label"))
    for i, query in enumerate(attend["queries"]):
        y = top + i * SIZE
        seq = f" s{query['seq']}" if cell_layout and query["seq"] is not None else ""
        body.append(_text(left - 6, y + SIZE / 2 + 4, f"q{i} p{query['position']}{seq}", "label", "end"))
    failing = attend.get("query", -1)
    for i, key, state in cells:
        x, y = left + columns.index(key) * SIZE, top + i * SIZE
        token = tokens.get(key)
        what = f"token {token['token']} at position {token['position']}" if token else f"answer row {key[3:]} (no token's)"
        body.append(f'<rect class="cell {state}" x="{x}" y="{y}" width="{SIZE - 2}" height="{SIZE - 2}" '
                    f'data-query="{i}" data-column="{key}" data-state="{state}"><title>query {i}, {what}: '
                    f'{legend[state]}</title></rect>')
    if 0 <= failing < len(attend["queries"]):
        body.append(f'<rect class="failing-query" x="{left - 2}" y="{top + failing * SIZE - 2}" '
                    f'width="{len(columns) * SIZE + 2}" height="{SIZE + 2}"/>')
    return _svg(width, height, body, f"attend grid, layer {attend['layer']}, batch row {attend['batch']}, head "
                                     f"{attend['head']}", "grid")


def grid_legend(attend: dict[str, Any]) -> str:
    legend = SAFETY_LEGEND if attend.get("expected_by") == "safety" else GRID_LEGEND
    return '<p class="legend">' + " ".join(f'<span class="key {state}"></span>{escape(words)}'
                                            for state, words in legend.items()) + "</p>"


# --- the cells ---------------------------------------------------------------------------------------------------
def cells_drawing(cells: dict[str, Any]) -> str:
    """The cells picture in the drawing its layout registered; its JSON when none did."""
    drawing = CELL_DRAWINGS.get(str(cells.get("layout")))
    if drawing is None:
        return f"<pre>{escape(json.dumps(cells))}</pre>"
    return drawing(cells)


def _owner_css(owners: list[int]) -> str:
    return "free" if not owners else "shared" if len(owners) > 1 else f"own{owners[0] % 6}"


def _cell_boxes(cells: list[dict[str, Any]], title: str, caption: Callable[[dict[str, Any]], list[str]]) -> str:
    per_row = 16
    width, height = max(8 + min(len(cells), per_row) * 56, _wide(title)), 24 + ((len(cells) + per_row - 1) // per_row) * 66
    body = [_text(4, 14, title, "head", "start")]
    for n, cell in enumerate(cells):
        x, y = 4 + (n % per_row) * 56, 22 + (n // per_row) * 66
        owners = cell.get("owners", [])
        body.append(f'<g class="cellbox {_owner_css(owners)}" data-cell="{cell["cell"]}">'
                    f'<title>cell {cell["cell"]}: {escape(", ".join(caption(cell)))}</title>'
                    f'<rect x="{x}" y="{y}" width="52" height="60" rx="4"/>')
        body.append(_text(x + 26, y + 13, f"c{cell['cell']}", "small"))
        for line, words in enumerate(caption(cell)):
            body.append(_text(x + 26, y + 28 + 13 * line, words, "small"))
        body.append("</g>")
    return _svg(width, height, body, title, "cells")


def _owners_words(owners: list[int]) -> str:
    return "free" if not owners else "s" + ",".join(str(seq) for seq in owners)


@draws_cells("cell")
def draw_cell_table(cells: dict[str, Any]) -> str:
    """The cell layout (the cell model's table as the failing step found it): per cell, its position and owners."""
    return _cell_boxes(cells["cells"], "the cells before the failing call (the spec's table): position, owners",
                       lambda cell: ["empty" if cell["position"] is None else f"p{cell['position']}",
                                     _owners_words(cell["owners"])])


@draws_cells("paged")
def draw_paged_blocks(cells: dict[str, Any]) -> str:
    """A paged cache (paged/engine.py): each block the live tables held as the harness last read them, and where -
    request, group, block index."""
    return _cell_boxes(cells["cells"], "the blocks the live tables held at the failing step (as last read): "
                                       "request, group, block index", lambda cell: list(cell["held"])[:3])


@draws_cells("op-cell")
def draw_op_cells(cells: dict[str, Any]) -> str:
    """An op-face cell cache: its answer's rows are its cells; per row, the token read from it and its owners."""
    return _cell_boxes(cells["cells"], "the target's cells (its answer's rows) at the failing call: token, position, "
                                       "owners",
                       lambda cell: ["no token" if cell["token"] is None else f"t{cell['token']} p{cell['position']}",
                                     _owners_words(cell["owners"])])
