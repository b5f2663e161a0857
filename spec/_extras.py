"""Which optional packages each use of the project needs, and the one line a command prints without them.

`pip install kvcache-spec` is the conformance suite (icontract and numpy, the op face's byte layer), so engineers can judge their cache
without a solver stack. Verification (`kvcache verify`, the model checkers, the Z3 proofs, the
CrossHair gate) needs Hypothesis, CrossHair and Z3: the `verify` extra. A command that needs an
extra checks for it before it imports anything of it, and exits 2 with one line that names the extra
(`exit_unless_installed`): never a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from typing import Callable, Optional

# extra -> (import name, distribution name) of every package it brings that the code imports itself.
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "verify": (("hypothesis", "hypothesis"), ("crosshair", "crosshair-tool"), ("z3", "z3-solver")),
    # the field's caches as op-face targets (spec/conformance/libraries/hf.py, mlxlm.py): checked when the module loads
    "hf": (("torch", "torch"), ("transformers", "transformers"), ("optimum.quanto", "optimum-quanto"), ("hqq", "hqq")),
    "mlx": (("mlx", "mlx"), ("mlx_lm", "mlx-lm")),
    "llamacpp": (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf")),
    # vLLM's KV-cache bookkeeping as a paged-face target (spec/conformance/libraries/vllm.py)
    "vllm": (("torch", "torch"), ("vllm", "vllm")),
    # SGLang's KV bookkeeping as a paged-face target (spec/conformance/libraries/sglang.py): sglang goes in with
    # --no-deps (.ci/install-serving.sh), so its import chain's packages are checked here too
    "sglang": (("torch", "torch"), ("transformers", "transformers"), ("triton", "triton"), ("sglang", "sglang")),
}


# extra -> (distribution, version) of the library a shipped adapter judges: the version it was written for, whose
# behaviour its scopes and the findings pages describe (the extra pins it). Another version may serve a call
# differently where the adapter relies on its internals, which the suite would report as the library's fault.
WRITTEN_FOR: dict[str, tuple[str, str]] = {
    "upstream": ("executorch", "1.5.1"),
    "hf": ("transformers", "5.23.0"),
    "mlx": ("mlx-lm", "0.32.2"),
    "vllm": ("vllm", "0.33.0"),
    "sglang": ("sglang", "0.5.23"),
}
# Set to 1, a shipped adapter loads on another version of its library too (a user trying an upgrade on purpose).
ANY_VERSION = "KVCACHE_ANY_LIBRARY_VERSION"


def _installed_version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_line(extra: str, command: str,
                 installed: Callable[[str], Optional[str]] = _installed_version) -> str:
    """The one line a shipped adapter's module gives, when it loads, on a version of its library it was not
    written for; empty on the version it supports, when the library is not installed (the extra's own check
    says so), or when ANY_VERSION=1 asks to try anyway."""
    distribution, supported = WRITTEN_FOR[extra]
    found = installed(distribution)
    if found is None or found == supported or os.environ.get(ANY_VERSION) == "1":
        return ""
    return (f"{command} is written for {distribution} {supported}, found {distribution} {found}: "
            f"install {distribution}=={supported}, or set {ANY_VERSION}=1 to judge this version anyway")


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
