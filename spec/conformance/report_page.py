"""The HTML report: one self-contained static page from a JSON report (`kvcache conformance --html F`, or
`kvcache report REPORT.json --html F` from a saved one). Plain HTML with inline CSS and SVG: no script, no
external asset, nothing fetched - it opens from file://. The verdict, coverage and scope first; then every
cause: its minimal program as a timeline, the attend grid of a wrong answer, the cells at the failing step
(drawing.py), the replay command and the pytest test to copy.

    kvcache report REPORT.json --html REPORT.html
"""

from __future__ import annotations

import argparse
import json
import sys
from html import escape
from typing import Any, Optional

from ..report_files import open_report, report_path_problem
from .drawing import attend_grid, cells_drawing, grid_legend, timeline

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1180px;padding:16px 20px;color:#1d1d1f}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 6px;border-top:1px solid #ccc;padding-top:14px}
code,pre,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f5f5f7;padding:8px;overflow-x:auto;white-space:pre-wrap}
.verdict{display:inline-block;padding:4px 12px;border-radius:4px;font-weight:700;color:#fff}
.v-CONFORMING{background:#2e7d32}.v-NOT-CONFORMING{background:#c62828}.v-INCOMPLETE{background:#ef6c00}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
.c-wrong,.c-crash{color:#b71c1c;font-weight:600}.c-over-strict{color:#6a1b9a;font-weight:600}.c-lenient{color:#e65100}
td.c-wrong,td.c-crash{background:#ffcdd2}td.c-over-strict{background:#e1bee7}td.c-lenient{background:#ffe0b2}
td.c-ok{background:#e8f5e9}
#matrix{font-size:12px} #matrix td,#matrix th{padding:2px 5px}
svg{display:block;margin:6px 0} svg text{font-size:11px;fill:#1d1d1f} svg text.small{font-size:10px}
svg text.head{font-size:13px;font-weight:600} svg text.label{font-size:12px} svg text.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:10px}
.step rect{fill:#e3f2fd;stroke:#90a4ae}.step.refusal rect{fill:#fde0dc}.step.trim rect{fill:#fff3cd}
.step.fork rect{fill:#e8f5e9}.step.reset rect{fill:#eceff1}.step.create rect{fill:#f3e5f5}
.step.failing rect{stroke:#c62828;stroke-width:3}.arrow{stroke:#607d8b;stroke-width:2}
rect.cell{stroke:#fff}.both{fill:#43a047;background:#43a047}.spec-only{fill:#fb8c00;background:#fb8c00}
.target-only{fill:#e53935;background:#e53935}.neither{fill:#eceff1;background:#eceff1}
.failing-query{fill:none;stroke:#212121;stroke-width:2;stroke-dasharray:4 2}
.legend .key{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:-1px}
.cellbox rect{stroke:#78909c}.cellbox.free rect{fill:#fafafa}.cellbox.shared rect{fill:#ffe082}
.own0 rect{fill:#bbdefb}.own1 rect{fill:#c8e6c9}.own2 rect{fill:#f8bbd0}.own3 rect{fill:#d1c4e9}
.own4 rect{fill:#b2ebf2}.own5 rect{fill:#ffccbc} .muted{color:#555}
"""


def page(title: str, body: list[str]) -> str:
    """A whole page: the shared style inline, nothing fetched."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def class_css(kind: str) -> str:
    return "c-" + kind.replace(" ", "-")


def replay_command(target: str, finding: dict[str, Any]) -> str:
    """The shell command that replays a cause's program on the target and prints what it finds (None: the target
    no longer shows it): Python read from a quoted here-document, so nothing in it needs escaping."""
    return (f"python - <<'EOF'\nfrom kvcache_spec.conformance import replay\n"
            f"print(replay({target!r},\n             {finding['config']!r},\n             {finding['steps']!r}))\nEOF")


def cause_section(finding: dict[str, Any], number: int, target: str, heading: str = "", anchor: str = "") -> str:
    """One cause: what broke, its program, what the answer let each query attend, the cells, how to replay it.
    Its anchor on the page is `anchor` (default cause-<number>, its place in the report's order)."""
    kind = finding["class"]
    part = [f'<section class="cause" id="{escape(anchor or f"cause-{number}")}" data-class="{escape(kind)}" '
            f'data-rule="{escape(finding["rule"])}">',
            f'<h2>{escape(heading)}{number}. <span class="{class_css(kind)}">{escape(kind)}</span> '
            f'{escape(finding["rule"])}'
            + (f' <span class="muted">(cause {finding["cause"]} of {finding["causes_of_rule"]} of this rule)</span>'
               if finding.get("causes_of_rule", 1) > 1 else "") + "</h2>",
            f"<p><b>{escape(finding['label'])}</b>" + ("" if finding.get("shrunk", True) else " [NOT SHRUNK]") + "</p>",
            f"<p>{escape(finding['message'])}</p>"]
    if finding.get("statement") and finding.get("cause", 1) == 1:   # a rule's statement once, at its first cause
        part.append(f'<p class="muted">{escape(finding["rule"])}: {escape(finding["statement"])}</p>')
    if finding.get("note"):
        part.append(f"<p>note: {escape(finding['note'])}</p>")
    part.append(f"<p>config {escape(finding['config_name'])}; {len(finding['steps'])} steps; the failing step "
                "outlined:</p>")
    part.append(timeline(finding["steps"], len(finding["steps"]) - 1))
    picture = finding.get("picture", {})
    if "attend" in picture:
        attend = picture["attend"]
        by = "what it may attend past the entry step (safety)" if attend.get("expected_by") == "safety" else "the spec"
        part.append(f"<p>What each query of the failing call attends, by {escape(by)} and by the target "
                    f"(query {attend['query']} is where it was caught, outlined):</p>")
        part.append(attend_grid(attend))
        part.append(grid_legend(attend))
    if "cells" in picture:
        part.append(cells_drawing(picture["cells"]))
    part.append("<p>Replay it (prints None once the target is fixed):</p>")
    part.append(f"<pre>{escape(replay_command(target, finding), quote=False)}</pre>")
    part.append("<details><summary>the pytest test to copy</summary>"
                f"<pre>{escape(finding.get('pytest', ''), quote=False)}</pre></details>")
    part.append("</section>")
    return "\n".join(part)


def render(report: dict[str, Any]) -> str:
    """The page of one JSON report (REPORT_FORMAT)."""
    verdict, target = report["verdict"], report["target"]
    coverage, stats = report["coverage"], report.get("stats", {})
    rules, clauses = coverage["rules"], coverage["clauses"]
    findings = report["semantic"]["findings"]
    scope = report.get("scope") or {}
    body = [f"<h1>kvcache conformance: {escape(target)}</h1>",
            f'<p><span class="verdict v-{verdict.replace(" ", "-")}" id="verdict">{escape(verdict)}</span> '
            f'{"strict, " if report.get("strict") else ""}profile {escape(str(report["profile"]))}, seed '
            f'{report["seed"]}; {stats.get("programs", 0)} programs, {stats.get("calls", 0)} calls in '
            f'{stats.get("seconds", 0)} s</p>',
            "<table><tr><th>coverage</th><th></th></tr>"
            f"<tr><td>programs run</td><td>{coverage['programs']['run']}/{coverage['programs']['planned']}"
            + (f" (+{coverage['programs']['continued']} rerun past a lenient or over-strict step)"
               if coverage["programs"].get("continued") else "") + "</td></tr>"
            f"<tr><td>configurations created</td><td>{coverage['configurations']['created']}/"
            f"{coverage['configurations']['planned']}</td></tr>"
            f"<tr><td>families exercised</td><td>{len(coverage['families']['exercised'])}/"
            f"{len(coverage['families']['planned'])}: {escape(', '.join(coverage['families']['exercised']))}</td></tr>"
            f"<tr><td>rules in scope exercised</td><td>{len(rules['exercised'])}/"
            f"{len(rules['exercised']) + len(rules['not_exercised'])}"
            + (f"; never: {escape(', '.join(rules['not_exercised']))}" if rules["not_exercised"] else "") + "</td></tr>"
            f"<tr><td>argument and configuration cases broken</td><td>{len(clauses['exercised'])}/"
            f"{len(clauses['exercised']) + len(clauses['not_exercised'])}</td></tr>"
            f"<tr><td>scope</td><td>{escape(_scope_words(scope))}</td></tr></table>"]
    for reason in coverage.get("incomplete", []):
        body.append(f"<p><b>INCOMPLETE</b>: {escape(reason)}</p>")
    for note in report.get("skipped", []):
        body.append(f'<p class="muted">skipped: {escape(note)}</p>')
    if findings:
        body.append(f"<h2>{len(findings)} distinct causes</h2><table><tr><th>#</th><th>class</th><th>rule</th>"
                    "<th>cause</th><th>config</th><th>steps</th></tr>")
        for number, finding in enumerate(findings, 1):
            body.append(f'<tr><td><a href="#cause-{number}">{number}</a></td>'
                        f'<td class="{class_css(finding["class"])}">{escape(finding["class"])}</td>'
                        f'<td>{escape(finding["rule"])}</td><td>{escape(finding["label"])}</td>'
                        f'<td>{escape(finding["config_name"])}</td><td>{len(finding["steps"])}</td></tr>')
        body.append("</table>")
    else:
        body.append("<p>No finding.</p>")
    body += [cause_section(finding, number, target) for number, finding in enumerate(findings, 1)]
    return page(f"kvcache conformance: {target}: {verdict}", body)


def _scope_words(scope: dict[str, Any]) -> str:
    if not scope:
        return "the whole layout"
    features = ", ".join(scope.get("features", []))
    return ("full: " if scope.get("full") else "partial: ") + features if features else json.dumps(scope)


def load(path: str) -> dict[str, Any] | str:
    """A saved JSON report (what `kvcache conformance --json` writes), or why it cannot be read as one."""
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    except (OSError, ValueError) as error:
        return f"{path}: {error}"
    if not isinstance(report, dict) or not {"verdict", "target", "semantic", "coverage"} <= set(report):
        return f"{path}: not a kvcache conformance JSON report (--json)"
    return report


def write(report: dict[str, Any], path: str) -> None:
    with open_report(path) as handle:
        handle.write(render(report))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache report", description="Render a saved JSON report (the one "
                                     "kvcache conformance --json writes) as one self-contained HTML page.")
    parser.add_argument("report", help="the JSON report")
    parser.add_argument("--html", metavar="F", required=True, help="write the page to F")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    problem = report_path_problem(args.html, stdout_ok=False)
    if problem:
        print(f"kvcache report: --html {args.html}: {problem}", file=sys.stderr)
        return 2
    report = load(args.report)
    if isinstance(report, str):
        print(f"kvcache report: {report}", file=sys.stderr)
        return 2
    try:
        write(report, args.html)
    except OSError as error:
        print(f"kvcache report: cannot write {args.html}: {error}", file=sys.stderr)
        return 2
    print(f"kvcache report: wrote {args.html}")
    return 0
