"""Which optional packages each use of the project needs, and the one line a command prints without them.

`pip install kvcache-spec` is the conformance suite (icontract and numpy, the op face's byte layer), so engineers can judge their cache
without a solver stack. Verification (`kvcache verify`, the model checkers, the Z3 proofs, the
CrossHair gate) needs Hypothesis, CrossHair and Z3: the `verify` extra. A command that needs an
extra checks for it before it imports anything of it, and exits 2 with one line that names the extra
(`exit_unless_installed`): never a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib.util
import sys

# extra -> (import name, distribution name) of every package it brings that the code imports itself.
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "verify": (("hypothesis", "hypothesis"), ("crosshair", "crosshair-tool"), ("z3", "z3-solver")),
    # the field's caches as op-face targets (spec/conformance/op/hf.py, mlxlm.py): checked when the module loads
    "hf": (("torch", "torch"), ("transformers", "transformers"), ("optimum.quanto", "optimum-quanto"), ("hqq", "hqq")),
    "mlx": (("mlx", "mlx"), ("mlx_lm", "mlx-lm")),
    "llamacpp": (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf")),
}


def missing(extra: str) -> list[str]:
    """The distributions of `extra` that cannot be imported here, in EXTRAS' order."""
    return [dist for module, dist in EXTRAS[extra] if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:   # a submodule's parent package is missing (optimum for optimum.quanto)
        return False


def missing_line(extra: str, command: str) -> str:
    """The one line a command prints when `extra` is not installed; empty when it is."""
    gone = missing(extra)
    if not gone:
        return ""
    return (f"{command} needs the '{extra}' extra (missing: {', '.join(gone)}): "
            f"pip install 'kvcache-spec[{extra}]'")


def exit_unless_installed(extra: str, command: str) -> None:
    """Exit 2 with one line on stderr unless every package of `extra` can be imported."""
    line = missing_line(extra, command)
    if line:
        print(line, file=sys.stderr)
        raise SystemExit(2)
