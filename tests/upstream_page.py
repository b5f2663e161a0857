"""The generated parts of docs/upstream-findings.md, from the two JSON reports of its "How to reproduce".

    python -m tests.upstream_page cell.json contiguous.json [--replay] [--check docs/upstream-findings.md]

prints, in Markdown: the coverage block, the counts per class and rule, and every distinct cause of each
report (`semantic.findings`, in the report's order, numbered as the page's root-cause tables cite them).
The page's prose - the root causes, what upstream does and why - stays written by hand; this keeps its
lists mechanical to refresh. With --replay (needs the `upstream` extra), each cause's program is replayed
on its target (`suite.replay`) and a program that does not show its cause's class and rule again is
marked **does not replay**: the report's program is then not the evidence it claims to be. With --check
PAGE, nothing is printed but the generated parts the page does not hold word for word (exit 1 if any): the
page is held to the run.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections import Counter
from typing import Any, Optional

TARGET = "python:kvcache_spec.conformance.op.upstream:"


def _value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def show_step(step: dict[str, Any]) -> str:
    """A program step as the page writes it: `begin [0]`, `fetch L0 [0] ⟨update_and_fetch.k.width 1⟩`,
    `cp(src, dst[, upto])`, `rm(seq, p0[, p1])`, `reset`; ⟨clause variant⟩ names the clause a malformed call
    breaks."""
    op = step.get("op")
    if op == "begin":
        text = f"begin [{', '.join(_value(seq) for seq in step.get('seqs', []))}]"
    elif op == "fetch":
        positions = step.get("positions")
        where = f" [{', '.join(_value(p) for p in positions)}]" if positions is not None else f" n={step.get('n', 1)}"
        text = f"fetch L{_value(step.get('layer'))}{where}"
    elif op == "cp":
        upto = step.get("upto")
        text = f"cp({_value(step.get('src'))}, {_value(step.get('dst'))}{'' if upto is None else ', ' + _value(upto)})"
    elif op == "rm":
        p1 = step.get("p1")
        text = f"rm({_value(step.get('seq'))}, {_value(step.get('p0'))}{'' if p1 is None else ', ' + _value(p1)})"
    else:
        text = str(op)
    if step.get("clause"):
        text += f" ⟨{str(step['clause']).removeprefix('op.')} {step.get('variant', '')}⟩".replace(" ⟩", "⟩")
    return f"`{text}`"


def show_program(steps: list[dict[str, Any]]) -> str:
    return "; ".join(show_step(step) for step in steps) if steps else "`create`"


def class_rule(finding: dict[str, Any]) -> str:
    head = f"{finding['class']} {finding['rule']}"
    if finding.get("after"):
        head += f", after {finding['after']}" + (f" ({finding['safety']})" if finding.get("safety") else "")
    return head


def cause_label(finding: dict[str, Any]) -> str:
    """The label without its leading class and rule (the table's previous column has them)."""
    label = str(finding.get("label", ""))
    return label.split(": ", 1)[1] if ": " in label else label


def coverage_line(name: str, report: dict[str, Any]) -> str:
    cov = report["coverage"]
    programs, configs, families = cov["programs"], cov["configurations"], cov["families"]
    rules, clauses = cov["rules"], cov.get("clauses", {})
    in_scope = len(rules["exercised"]) + len(rules["not_exercised"])
    broken = len(clauses.get("exercised", []))
    line = (f"{name}: {programs['run']}/{programs['planned']} programs (+{programs['continued']} rerun past a "
            f"lenient or over-strict step), {configs['created']}/{configs['planned']} configurations, "
            f"{len(families['exercised'])}/{len(families['planned'])} families, {len(rules['exercised'])}/"
            f"{in_scope} rules in scope exercised, {broken}/{broken + len(clauses.get('not_exercised', []))} "
            f"argument and configuration cases broken")
    never = clauses.get("not_exercised", [])
    if never:
        line += f"; never broken: {', '.join(case.removeprefix('op.') for case in never)}"
    return "\n".join(textwrap.wrap(line, 112, subsequent_indent=" " * (len(name) + 2), break_on_hyphens=False))


def counts_rows(name: str, report: dict[str, Any]) -> list[str]:
    findings = report["semantic"]["findings"]
    causes = Counter((f["class"], f["rule"]) for f in findings)
    unshrunk = Counter((f["class"], f["rule"]) for f in findings if not f.get("shrunk", True))
    rows = [f"| {name} | {kind} {rule} | {n} | {unshrunk[(kind, rule)]} |" for (kind, rule), n in causes.items()]
    rows.append(f"| {name} | **total** | **{len(findings)}** | **{sum(unshrunk.values())}** |")
    return rows


def replays(name: str, finding: dict[str, Any]) -> bool:
    """Whether the cause's program shows its class and rule again (the finding, or what it led to)."""
    from kvcache_spec.conformance.suite import replay

    again = replay(TARGET + name, finding["config"], finding["steps"])
    if again is None:
        return False
    if again.get("after") and not finding.get("after"):   # a lenient call whose answer breaks a property
        return str(again["after"]).startswith(f"{finding['class']} {finding['rule']} ")
    return (again["class"], again["rule"]) == (finding["class"], finding["rule"])


def not_replaying(reports: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each cause whose program does not show its class and rule again on its target (`replays`), as
    `name #number: class, rule` - the causes --replay marks **does not replay**."""
    return [f"{name} #{number}: {class_rule(finding)}" for name, report in reports
            for number, finding in enumerate(report["semantic"]["findings"], 1) if not replays(name, finding)]


def cause_rows(name: str, report: dict[str, Any], replay: bool) -> list[str]:
    rows = []
    for number, finding in enumerate(report["semantic"]["findings"], 1):
        program = show_program(finding["steps"])
        marks = []
        if not finding.get("shrunk", True):
            marks.append("**not shrunk**")
        elif "shrink budget ran out" in str(finding.get("note", "")):
            marks.append("*shrink budget out*")
        if replay and not replays(name, finding):
            marks.append("**does not replay**")
        if marks:
            program = f"{', '.join(marks)}: {program}"
        rows.append(f"| {number} | {class_rule(finding)} | {cause_label(finding)} | {finding['config_name']} | "
                    f"{program} | {finding['programs_hit']} |")
    return rows


def render(reports: list[tuple[str, dict[str, Any]]], replay: bool = False) -> str:
    out = ["```"]
    out += [coverage_line(name, report) for name, report in reports]
    out += ["```", "", "| cache | class, rule | causes | of which not shrunk |", "| --- | --- | ---: | ---: |"]
    for name, report in reports:
        out += counts_rows(name, report)
    for name, report in reports:
        out += ["", f"### {name}: every distinct cause ({len(report['semantic']['findings'])})", "",
                "| # | class, rule | cause (label) | config | minimal program | programs hit |",
                "| ---: | --- | --- | --- | --- | ---: |"]
        out += cause_rows(name, report, replay)
    return "\n".join(out) + "\n"


def not_on_page(page: str, generated: str) -> list[str]:
    """The blocks of the generated parts (the coverage block, the counts table, each cause list), split at
    blank lines, that the page does not hold word for word."""
    return [block for block in generated.strip().split("\n\n") if block not in page]


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    replay = "--replay" in args
    check = args[args.index("--check") + 1] if "--check" in args[:-1] else None
    paths = [arg for arg in args if arg not in ("--replay", "--check", check)]
    if len(paths) != 2 or ("--check" in args and check is None):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    reports = []
    for name, path in zip(("cell", "contiguous"), paths):
        with open(path, encoding="utf-8") as handle:
            reports.append((name, json.load(handle)))
    generated = render(reports, replay)
    if check is None:
        sys.stdout.write(generated)
        return 0
    with open(check, encoding="utf-8") as handle:
        missing = not_on_page(handle.read(), generated)
    sys.stdout.write("".join(f"not on {check}:\n{block}\n\n" for block in missing))
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
