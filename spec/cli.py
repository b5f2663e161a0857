"""The `kvcache` command: one entry point, one module per subcommand (imported only when used).

Exit codes, for every subcommand: 0 everything holds, 1 something fails, 2 usage or environment error;
`kvcache conformance` adds 3: INCOMPLETE (the run exercised less than its profile promises).
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Optional

# subcommand -> (module, function, one line of help). Each function takes argv and returns the exit code.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "verify": ("kvcache_proofs.verify", "main", "stateful checks, CrossHair, Z3 and the model checker"),
    "conformance": ("kvcache_spec.conformance.cli", "main", "run the conformance suite against a target"),
    "vectors": ("kvcache_spec.conformance.vectors", "main", "regenerate or check the golden vectors"),
    "trace": ("kvcache_spec.trace", "main", "print the rule -> model, contracts, tests, vectors matrix"),
    "report": ("kvcache_spec.conformance.report_page", "main", "render a saved JSON report as one HTML page"),
    "matrix": ("kvcache_spec.conformance.matrix", "main", "every judged library side by side, from JSON reports"),
    "cpp": ("kvcache_spec.cpp", "main", "print where the installed C++ driver header is (--include, --cmakedir)"),
}


def _usage() -> str:
    lines = ["usage: kvcache SUBCOMMAND [options]", "", "subcommands:"]
    lines += [f"  {name:<12} {text}" for name, (_, _, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] not in SUBCOMMANDS:
        print(f"kvcache: unknown subcommand {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _ = SUBCOMMANDS[args[0]]
    try:
        function: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        print(f"kvcache {args[0]}: not available ({error})", file=sys.stderr)
        return 2
    return function(args[1:])


if __name__ == "__main__":
    sys.exit(main())
